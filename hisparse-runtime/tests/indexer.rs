//! Indexer keys and the ops an engine drives around the decode path, through the runtime:
//! the compressed slot mapping of both indexer caches, indexer backups in the transfer
//! batches (an engine writes keys where the device-side mapping says, and finds them in the
//! indexer host cache where the host-side mapping says once the batch is durable), and the
//! resident remap with its modes (decode context parallelism, a prefill workspace) against
//! the reference op over the runtime's own tables.

use hisparse_backend_cpu::CpuDevice;
use hisparse_core::Device;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::model::ModelSpec;
use hisparse_core::ops::remap::remap_modes as reference_remap_modes;
use hisparse_core::ops::{
    DcpSplit, LayerPair, RemapArgs, RemapDesc, RemapModesArgs, RemapModesDesc, SlotMappingArgs,
    SlotMappingDesc, slot_mapping::compressed_slot_mapping,
};
use hisparse_core::presets::DEEPSEEK_V4;
use hisparse_runtime::plan::{LayoutRequest, ModelSource, plan_model};
use hisparse_runtime::{
    CompressedSlots, IndexerCacheSide, Indices, PrefillWorkspace, RemapModes, Runtime,
    RuntimeConfig, TopK,
};

const ROWS: u32 = 2;
const PROMPT: u32 = 700;

/// DeepSeek V4's first 4 layers (one compressed-indexer layer) in a small pool.
fn v4() -> KvCacheConfig {
    let req = LayoutRequest {
        gpu_mem: 64 << 20,
        host_mem: 64 << 20,
        max_model_len: 4096,
        ..LayoutRequest::new(ModelSource::Preset("deepseek-v4"))
    };
    let model = ModelSpec {
        layers: &DEEPSEEK_V4.layers[..4],
        ..DEEPSEEK_V4
    };
    plan_model(&model, &req).unwrap()
}

/// [`v4`] with a coordinator scheduling up to `max_batched_tokens` tokens a step, a runtime, and
/// request 1 of `PROMPT` tokens admitted.
fn engine(max_batched_tokens: u32) -> (KvCacheConfig, Coordinator, Runtime<CpuDevice>) {
    let kv = v4();
    let mut coord = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: ROWS,
            max_batched_tokens,
            ..CoordinatorConfig::default()
        },
    )
    .unwrap();
    let rt = Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(ROWS, 4)).unwrap();
    coord.admit(1, &(0..PROMPT).collect::<Vec<_>>()).unwrap();
    (kv, coord, rt)
}

/// The indexer layer pairs of `kv`.
fn indexer_layers(kv: &KvCacheConfig) -> Vec<LayerPair> {
    kv.indexer_layer_pairs()
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

/// The key byte `i` of indexer row `pos` (a token position) of layer `layer`.
fn key(layer: usize, pos: i32, i: usize) -> u8 {
    (pos as usize * 31 + layer * 7 + i) as u8
}

/// Maps `positions` of state row `row` into one indexer cache through the runtime.
fn slots(
    rt: &mut Runtime<CpuDevice>,
    side: IndexerCacheSide,
    row: i32,
    positions: &[i32],
) -> Vec<i32> {
    let dev = CpuDevice::new();
    let n = positions.len();
    let buf = |v: &[i32]| {
        let mut b = dev.alloc(v.len().max(1) * 4).unwrap();
        dev.upload_i32(&mut b, 0, v).unwrap();
        b
    };
    let (pos, own, rows) = (buf(positions), buf(&vec![0; n]), buf(&vec![row; n]));
    let mut out = buf(&vec![7; n]);
    rt.compressed_slot_mapping(
        side,
        CompressedSlots {
            num_tokens: n as u32,
            positions: &pos,
            slot_mapping: &own,
            state_rows: &rows,
            out: &mut out,
        },
    )
    .unwrap();
    rt.device().synchronize(rt.compute_stream()).unwrap();
    let mut got = vec![0; n];
    rt.device().download_i32(&out, 0, &mut got).unwrap();
    // The runtime's mapping is the reference op over its own table.
    let (table, empty) = match side {
        IndexerCacheSide::Device => (rt.indexer_table(), 0),
        IndexerCacheSide::Host => (rt.host_table(), -1),
    };
    let kv = rt.layout().clone();
    let mut t = vec![empty; (ROWS * kv.max_pages_per_request) as usize];
    rt.device().download_i32(table, 0, &mut t).unwrap();
    let rows_per_page = kv.groups[KvCacheConfig::INDEXER_GROUP].layers[0].rows_per_block;
    let mut want = vec![0; n];
    compressed_slot_mapping(
        &SlotMappingDesc {
            num_tokens: n as u32,
            ratio: kv.block_tokens / rows_per_page,
            block_size: kv.block_tokens,
            table_rows: ROWS,
            max_blocks: kv.max_pages_per_request,
        },
        SlotMappingArgs {
            positions,
            slot_mapping: &vec![0; n],
            table_row: &vec![row; n],
            block_table: &t,
            out: &mut want,
        },
    )
    .unwrap();
    assert_eq!(got, want);
    got
}

/// The engine's indexer writes of `cmd`: for every token it computes, the key of its indexer
/// row (if it writes one) at the slot the device-side mapping gives, in every indexer layer.
fn write_keys(rt: &mut Runtime<CpuDevice>, cmd: &OffloadCommand) -> u32 {
    let kv = rt.layout().clone();
    let layers = indexer_layers(&kv);
    let mut written = 0;
    for s in &cmd.scheduled {
        let positions: Vec<i32> = (s.first_token..s.first_token + s.num_tokens)
            .map(|p| p as i32)
            .collect();
        let to = slots(rt, IndexerCacheSide::Device, s.slot as i32, &positions);
        let (dev, pools) = rt.device_and_pools_mut();
        for (&pos, &slot) in positions.iter().zip(&to) {
            let Some((b, o)) = layers[0].device.locate(slot.into()) else {
                continue;
            };
            written += 1;
            for (li, l) in layers.iter().enumerate() {
                let mut at = 0;
                for (off, len) in l.device.row_parts(b, o) {
                    let bytes: Vec<u8> = (0..len as usize).map(|i| key(li, pos, at + i)).collect();
                    dev.upload(&mut pools.device, off as usize, &bytes).unwrap();
                    at += len as usize;
                }
            }
        }
    }
    written
}

#[test]
fn indexer_keys_written_where_the_slot_mapping_says_are_backed_up_where_it_says_on_host() {
    let (kv, mut coord, mut rt) = engine(256);
    assert!(kv.indexer_host_pool_bytes() > 0);
    let mut written = 0;
    for _ in 0..8 {
        let cmd = coord.step().unwrap();
        rt.begin_step(&cmd).unwrap();
        written += write_keys(&mut rt, &cmd);
        rt.end_step(&cmd).unwrap();
        rt.drain().unwrap();
        rt.poll_and_report(&mut coord).unwrap();
        if coord.num_computed(1) == coord.num_tokens(1) {
            break;
        }
    }
    // Every compressed row of the prompt: one per 4 tokens.
    assert_eq!(written, PROMPT / 4);
    assert_eq!(rt.counters().indexer_rows_backed_up, u64::from(written));
    let positions: Vec<i32> = (0..PROMPT as i32).collect();
    let row = 0; // the request's state row: the first given out
    let host = slots(&mut rt, IndexerCacheSide::Host, row, &positions);
    let cache = rt.indexer_host_cache().unwrap();
    let layers = indexer_layers(&kv);
    let mut checked = 0;
    for (&pos, &slot) in positions.iter().zip(&host) {
        let Some((b, o)) = layers[0].host.locate(slot.into()) else {
            assert_ne!(
                (pos + 1) % 4,
                0,
                "token {pos} writes a row but maps to no host slot"
            );
            continue;
        };
        for (li, l) in layers.iter().enumerate() {
            let mut at = 0;
            for (off, len) in l.host.row_parts(b, o) {
                let mut got = vec![0; len as usize];
                rt.device()
                    .read_pinned(cache, off as usize, &mut got)
                    .unwrap();
                let want: Vec<u8> = (0..len as usize).map(|i| key(li, pos, at + i)).collect();
                assert_eq!(got, want, "layer {li} token {pos}");
                at += len as usize;
            }
        }
        checked += 1;
    }
    assert_eq!(checked, PROMPT / 4);
}

#[test]
fn remap_modes_through_the_runtime_match_the_reference_over_its_tables() {
    let (kv, mut coord, mut rt) = engine(512);
    let cmd = coord.step().unwrap();
    rt.begin_step(&cmd).unwrap();
    let dev = CpuDevice::new();
    let k = kv.config.top_k as usize;
    let t = 3usize;
    let buf = |v: &[i32]| {
        let mut b = dev.alloc(v.len().max(1) * 4).unwrap();
        dev.upload_i32(&mut b, 0, v).unwrap();
        b
    };
    // Rows 0 and 2 of request 1 (state row 0), row 1 padding; positions across the context
    // and beyond it.
    let topk_host: Vec<i32> = (0..t * k).map(|i| ((i * 37) % 200) as i32 - 3).collect();
    let state_host = vec![0, -1, 0];
    let (topk, state) = (buf(&topk_host), buf(&state_host));
    let mut table = vec![0; (ROWS * kv.max_pages_per_request) as usize];
    rt.device()
        .download_i32(rt.resident_table(0).unwrap(), 0, &mut table)
        .unwrap();
    let plain = RemapDesc {
        num_tokens: t as u32,
        top_k: kv.config.top_k,
        table_rows: ROWS,
        max_blocks: kv.max_pages_per_request,
        block_size: kv.block_size,
        block_stride_rows: kv.attention_block_stride,
        idx_mapping_len: None,
        write_counts: true,
        compact: false,
        stats_slot: 0,
    };
    let dcp = DcpSplit {
        size: 2,
        rank: 1,
        interleave: 8,
    };
    let request_of_row = vec![-1, -1, 0];
    let starts = vec![1000];
    for (with_dcp, with_workspace) in [(true, false), (false, true), (true, true)] {
        let mut rows = buf(&vec![0; t * k]);
        let mut counts = buf(&vec![0; t]);
        let (ids, st) = (buf(&request_of_row), buf(&starts));
        rt.remap_modes(
            0,
            &TopK {
                positions: &topk,
                num_tokens: t as u32,
                state_rows: Some(&state),
            },
            RemapModes {
                dcp: with_dcp.then_some(dcp),
                workspace: with_workspace.then_some(PrefillWorkspace {
                    requests: 1,
                    request_of_row: &ids,
                    starts: &st,
                }),
            },
            Indices {
                rows: &mut rows,
                counts: Some(&mut counts),
            },
        )
        .unwrap();
        rt.device().synchronize(rt.compute_stream()).unwrap();
        let (mut got, mut got_counts) = (vec![0; t * k], vec![0; t]);
        rt.device().download_i32(&rows, 0, &mut got).unwrap();
        rt.device()
            .download_i32(&counts, 0, &mut got_counts)
            .unwrap();
        let (mut want, mut want_counts) = (vec![0; t * k], vec![0; t]);
        reference_remap_modes(
            &RemapModesDesc {
                remap: plain,
                dcp: with_dcp.then_some(dcp),
                prefill_requests: with_workspace.then_some(1),
            },
            RemapModesArgs {
                remap: RemapArgs {
                    req_id: &state_host,
                    block_table: &table,
                    topk: &topk_host,
                    idx_mapping: None,
                    out: &mut want,
                    counts: Some(&mut want_counts),
                    stats: None,
                },
                prefill_req_id: with_workspace.then_some(&request_of_row[..]),
                workspace_starts: with_workspace.then_some(&starts[..]),
            },
        )
        .unwrap();
        assert_eq!(
            (got, got_counts),
            (want.clone(), want_counts),
            "dcp {with_dcp}, workspace {with_workspace}"
        );
        // The modes did something: some rows valid, some not.
        assert!(want.iter().any(|&r| r >= 0) && want.iter().any(|&r| r < 0));
    }
    rt.end_step(&cmd).unwrap();
}
