//! The runtime's contract at its edges: engine-owned pools give the same results as owned ones,
//! calls out of sequence or beyond the configuration are typed errors, budgets are checked before
//! anything is allocated, and counters can be turned off.

use hisparse_backend_cpu::CpuDevice;
use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_core::model::{LayerSpec, ModelSpec};
use hisparse_core::{Device, Error, ErrorKind};
use hisparse_runtime::{Counters, Indices, Pools, Runtime, RuntimeConfig, RuntimeError, TopK};

static LAYERS: [LayerSpec; 3] = [
    LayerSpec::sparse_leader(32, 16),
    LayerSpec::sparse_follower(32),
    LayerSpec::sparse_leader(32, 16),
];

fn layout(gpu_blocks: u32) -> KvCacheConfig {
    let model = ModelSpec {
        name: "api",
        block_tokens: 8,
        top_k: 8,
        layers: &LAYERS,
    };
    let mut cfg = HiSparseConfig::new(8, 3 * 8 * 32 * 200);
    cfg.device_buffer_size = Some(16);
    let mut input = LayoutInput::new(&model, &cfg, 0, 128);
    input.num_gpu_blocks_override = Some(gpu_blocks);
    plan_layout(&input).unwrap()
}

fn coordinator(kv: &KvCacheConfig) -> Coordinator {
    Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: 3,
            max_batched_tokens: 64,
            reclaim_min_blocks: 0,
            ..CoordinatorConfig::default()
        },
    )
    .unwrap()
}

/// Row indices of every call, the final bytes of both pools, and the runtime's counters.
type Driven = (Vec<Vec<i32>>, Vec<u8>, Vec<u8>, Counters);

/// Runs three requests to the end on `rt` (tight pool: pages get reclaimed and swapped in) and
/// returns every step's row indices and the final bytes of both pools.
fn drive(mut rt: Runtime<CpuDevice>, kv: &KvCacheConfig) -> Driven {
    let mut coord = coordinator(kv);
    let dev = CpuDevice::new();
    let k = kv.config.top_k as usize;
    let mut topk = dev.alloc(3 * k * 4).unwrap();
    let mut rows = dev.alloc(3 * k * 4).unwrap();
    let mut outputs = Vec::new();
    for id in 1..=3u64 {
        coord
            .admit(
                id,
                &(0..60).map(|t| t + 100 * id as u32).collect::<Vec<_>>(),
            )
            .unwrap();
    }
    let mut step = 0u32;
    while !coord.is_empty() {
        step += 1;
        let cmd = coord.step().unwrap();
        rt.begin_step(&cmd).unwrap();
        // The forward pass: a recognisable byte per (request, token) into each resident page.
        for s in &cmd.scheduled {
            for pos in s.first_token..s.first_token + s.num_tokens {
                let page = (pos / kv.block_size) as usize;
                for b in 0..kv.num_buckets {
                    let blk = rt.resident_row(b, s.slot).unwrap()[page] as u64;
                    let at = blk * kv.bytes_per_block + u64::from(pos % kv.block_size) * 32;
                    let byte = [(s.id as u8) ^ (pos as u8); 32];
                    let (dev, pools) = rt.device_and_pools_mut();
                    dev.upload(&mut pools.device, at as usize, &byte).unwrap();
                }
            }
        }
        let batch: Vec<i32> = cmd.scheduled.iter().map(|s| s.slot as i32).collect();
        rt.set_batch(&batch).unwrap();
        for g in 0..kv.index_groups.len() {
            let sel: Vec<i32> = cmd
                .scheduled
                .iter()
                .flat_map(|s| {
                    let n = s.first_token + s.num_tokens;
                    (0..k as u32).map(move |j| ((j * 7 + step) % n) as i32)
                })
                .collect();
            dev.upload_i32(&mut topk, 0, &sel).unwrap();
            let input = TopK {
                positions: &topk,
                num_tokens: batch.len() as u32,
                state_rows: None,
            };
            rt.resolve_index_group(
                g,
                &input,
                Indices {
                    rows: &mut rows,
                    counts: None,
                },
            )
            .unwrap();
            let mut out = vec![0; sel.len()];
            dev.download_i32(&rows, 0, &mut out).unwrap();
            outputs.push(out);
        }
        rt.end_step(&cmd).unwrap();
        rt.poll_and_report(&mut coord).unwrap();
        let ids: Vec<_> = coord.running_ids().collect();
        for id in ids {
            if coord.num_computed(id) == coord.num_tokens(id) {
                if coord.num_tokens(id).unwrap() >= 80 {
                    coord.finish(id).unwrap();
                } else {
                    coord.append_tokens(id, &[1]).unwrap();
                }
            }
        }
    }
    rt.drain().unwrap();
    let pools = rt.pools();
    (
        outputs,
        pools.device.as_slice().to_vec(),
        pools.host.as_slice().to_vec(),
        *rt.counters(),
    )
}

#[test]
fn engine_owned_pools_give_the_same_results_as_owned_ones() {
    let kv = layout(40);
    let owned = drive(
        Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 3)).unwrap(),
        &kv,
    );
    let dev = CpuDevice::new();
    let pools = Pools {
        device: dev.alloc(kv.gpu_pool_bytes() as usize + 4096).unwrap(),
        host: dev.alloc_pinned(kv.host_pool_bytes() as usize).unwrap(),
    };
    let borrowed = drive(
        Runtime::with_pools(dev, kv.clone(), RuntimeConfig::new(3, 3), pools, None).unwrap(),
        &kv,
    );
    assert!(owned.0.iter().flatten().any(|&r| r >= 0));
    // The pool is tight: pages were reclaimed and rows swapped in from host.
    assert!(
        owned.3.reclaimed_pages > 0 && owned.3.hot_misses > 0,
        "{:?}",
        owned.3
    );
    assert_eq!(owned.3, borrowed.3);
    assert_eq!(owned.0, borrowed.0, "row indices differ");
    assert_eq!(
        owned.1[..],
        borrowed.1[..owned.1.len()],
        "device pools differ"
    );
    assert_eq!(owned.2, borrowed.2, "host pools differ");
}

fn kind<E: Error>(r: Result<impl Sized, RuntimeError<E>>) -> (ErrorKind, String) {
    match r {
        Ok(_) => panic!("accepted"),
        Err(e) => (e.kind(), e.to_string()),
    }
}

#[test]
fn pools_smaller_than_the_layout_are_refused_with_the_size_needed() {
    let kv = layout(40);
    let dev = CpuDevice::new();
    let pools = Pools {
        device: dev.alloc(kv.gpu_pool_bytes() as usize - 1).unwrap(),
        host: dev.alloc_pinned(kv.host_pool_bytes() as usize).unwrap(),
    };
    let (k, msg) = kind(Runtime::with_pools(
        dev,
        kv.clone(),
        RuntimeConfig::new(3, 3),
        pools,
        None,
    ));
    assert_eq!(k, ErrorKind::InvalidArgument);
    assert!(msg.contains(&kv.gpu_pool_bytes().to_string()), "{msg}");
}

#[test]
fn a_layout_beyond_available_memory_fails_before_allocating() {
    // A GPU pool of ~2 TiB on the CPU backend, whose device memory is host RAM.
    let mut kv = layout(40);
    kv.num_gpu_blocks = u32::MAX / 2;
    kv.bytes_per_block = 1 << 10;
    let t = std::time::Instant::now();
    let (k, msg) = kind(Runtime::new(CpuDevice::new(), kv, RuntimeConfig::new(3, 3)));
    assert_eq!(k, ErrorKind::OutOfDeviceMemory, "{msg}");
    assert!(msg.contains("free"), "{msg}");
    assert!(
        t.elapsed().as_secs() < 2,
        "the check must come before any allocation"
    );
}

#[test]
fn calls_out_of_sequence_or_beyond_the_configuration_are_typed_errors() {
    let kv = layout(40);
    let mut rt = Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 2)).unwrap();
    let dev = CpuDevice::new();
    let topk = dev.alloc(4 * 8 * 4).unwrap();
    let mut rows = dev.alloc(4 * 8 * 4).unwrap();
    let cmd = OffloadCommand {
        step: 1,
        ..OffloadCommand::default()
    };
    let input = |n| TopK {
        positions: &topk,
        num_tokens: n,
        state_rows: None,
    };
    macro_rules! out {
        () => {
            Indices {
                rows: &mut rows,
                counts: None,
            }
        };
    }
    assert!(matches!(rt.end_step(&cmd), Err(RuntimeError::Sequence(_))));
    assert!(matches!(
        rt.resolve_index_group(0, &input(1), out!()),
        Err(RuntimeError::Sequence(_))
    ));
    assert!(matches!(rt.set_batch(&[0]), Err(RuntimeError::Sequence(_))));
    rt.begin_step(&cmd).unwrap();
    assert!(matches!(
        rt.begin_step(&cmd),
        Err(RuntimeError::Sequence(_))
    ));
    assert!(matches!(
        rt.set_batch(&[0, 1, 2]),
        Err(RuntimeError::TooManyTokens { tokens: 3, max: 2 })
    ));
    assert!(matches!(
        rt.set_batch(&[3]),
        Err(RuntimeError::StateRow { row: 3, rows: 3 })
    ));
    assert!(matches!(
        rt.resolve_index_group(0, &input(1), out!()),
        Err(RuntimeError::Sequence(_))
    ));
    rt.set_batch(&[0, -1]).unwrap();
    assert!(matches!(
        rt.resolve_index_group(9, &input(1), out!()),
        Err(RuntimeError::NoSuchGroup { value: 9, .. })
    ));
    assert!(matches!(
        rt.resolve_index_group(0, &input(3), out!()),
        Err(RuntimeError::TooManyTokens { .. })
    ));
    assert!(matches!(
        rt.apply_plan(0),
        Err(RuntimeError::NoSuchGroup { value: 0, .. })
    ));
    assert!(matches!(rt.apply_plan(1), Err(RuntimeError::Sequence(_))));
    rt.resolve_leader(0, &input(2), out!()).unwrap();
    rt.apply_plan(1).unwrap();
    let other = OffloadCommand {
        step: 2,
        ..OffloadCommand::default()
    };
    assert!(matches!(
        rt.end_step(&other),
        Err(RuntimeError::Sequence(_))
    ));
    rt.end_step(&cmd).unwrap();
    // A command naming a state row the runtime does not have.
    let mut bad = OffloadCommand {
        step: 2,
        ..OffloadCommand::default()
    };
    bad.started.push(7);
    assert!(matches!(
        rt.begin_step(&bad),
        Err(RuntimeError::StateRow { row: 7, rows: 3 })
    ));
    for (cfg, field) in [
        (RuntimeConfig::new(0, 1), "state_rows"),
        (RuntimeConfig::new(1, 0), "max_step_tokens"),
    ] {
        match Runtime::new(CpuDevice::new(), kv.clone(), cfg) {
            Err(RuntimeError::Config { field: f, .. }) => assert_eq!(f, field),
            _ => panic!("{field} 0 accepted"),
        }
    }
}

#[test]
fn counters_can_be_turned_off() {
    let kv = layout(40);
    let mut cfg = RuntimeConfig::new(3, 3);
    cfg.stats_every = 0;
    let rt = Runtime::new(CpuDevice::new(), kv.clone(), cfg).unwrap();
    let on = Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 3)).unwrap();
    // Same work, so the same outputs; only the sampled counters differ.
    let off = drive(rt, &kv);
    let on = drive(on, &kv);
    assert_eq!(off.0, on.0);
    assert!(
        on.3.sampled_steps > 0 && on.3.hot_hits + on.3.hot_misses > 0,
        "{:?}",
        on.3
    );
    assert_eq!(
        (off.3.sampled_steps, off.3.hot_hits, off.3.hot_misses),
        (0, 0, 0)
    );
    assert_eq!(off.3.resolve_calls, on.3.resolve_calls);
}
