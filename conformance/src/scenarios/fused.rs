//! The fused swap-in launch (the inherent `resolve_and_gather` of the CUDA and ROCm backends,
//! reached through a [`Fused`] hook), run by both backends' `tests/fused.rs` through
//! [`main_with`]: it must give exactly what the core's reference gives for a resolve followed by
//! the gather of its miss plan — every output, the hot state (slot_host_rows, LRU) and every byte of the
//! device pool — over several steps of random top-k walks: the decode shape (64 requests × 2048,
//! 4096 slots), speculative rows of one request spread over the batch with padding rows, split
//! rows over 20 layers (a fused launch of 16 layers and a gather launch of the other 4), resident
//! pages, host rows beyond the pool, duplicate entries and a corrupt LRU.

use hisparse_core::Device;
use hisparse_core::ops::copy::gather_rows;
use hisparse_core::ops::resolve::resolve;
use hisparse_core::ops::{GatherArgs, GatherDesc, LayerPair, PageLayout, ResolveArgs, ResolveDesc};

use super::{Res, device_err, upload_i32};
use crate::cases::resolve_io::{DevOutputs, DevState, HostState, Outputs};
use crate::check::Check;
use crate::{CaseError, SplitMix64};

/// A case error as a scenario's message.
fn case_err(e: CaseError) -> String {
    e.to_string()
}

/// How a backend's test reaches its fused launch on `D`. The [`Device`] trait's
/// `resolve_and_gather` may choose the resolve and the gather as two launches for small batches;
/// the hook calls the backend's inherent method, which always fuses, so every scenario tests the
/// fused kernel. A hook is a local type of the test (the backend's device type is foreign there).
pub trait Fused<D: Device> {
    /// The backend's fused `resolve_and_gather` on `dev`.
    #[allow(clippy::too_many_arguments)]
    fn resolve_and_gather(
        &self,
        dev: &D,
        stream: &D::Stream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, D::Buffer>,
        layers: &[LayerPair],
        host: &D::HostBuffer,
        device: &mut D::Buffer,
    ) -> Result<(), D::Error>;
}

/// One shape of the swap-in walked over several steps: batch, hot state, pool layout, and how
/// often pages are resident, beyond the pool or duplicated.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// The scenario's name (`fused/<name>` in the test output).
    pub name: &'static str,
    requests: u32,
    rows_per_request: u32,
    padding_rows: u32,
    top_k: u32,
    hot_slots: u32,
    block_size: u32,
    pages: u32,
    layers: u32,
    split: bool,
    resident_pct: u64,
    beyond_pct: u64,
    dup_pct: u64,
    corrupt: bool,
    steps: u32,
}

/// The scenarios [`run_all`] runs.
pub const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "decode-64x2048",
        requests: 64,
        rows_per_request: 1,
        padding_rows: 0,
        top_k: 2048,
        hot_slots: 4096,
        block_size: 64,
        pages: 512,
        layers: 1,
        split: false,
        resident_pct: 10,
        beyond_pct: 0,
        dup_pct: 0,
        corrupt: false,
        steps: 4,
    },
    Scenario {
        name: "speculative-rows-padding-corrupt-lru",
        requests: 3,
        rows_per_request: 3,
        padding_rows: 2,
        top_k: 128,
        hot_slots: 512,
        block_size: 16,
        pages: 64,
        layers: 3,
        split: false,
        resident_pct: 20,
        beyond_pct: 5,
        dup_pct: 20,
        corrupt: true,
        steps: 4,
    },
    Scenario {
        name: "split-rows-20-layers",
        requests: 4,
        rows_per_request: 1,
        padding_rows: 1,
        top_k: 64,
        hot_slots: 128,
        block_size: 8,
        pages: 32,
        layers: 20,
        split: true,
        resident_pct: 30,
        beyond_pct: 10,
        dup_pct: 10,
        corrupt: false,
        steps: 3,
    },
];

fn run<D: Device>(dev: &D, hook: &impl Fused<D>, sc: &Scenario, seed: u64) -> Res<()> {
    let mut rng = SplitMix64::new(seed);
    let (r, k, n, bs) = (sc.requests, sc.top_k, sc.hot_slots, sc.block_size);
    let host_blocks = r * sc.pages;
    let desc0 = ResolveDesc {
        num_tokens: 0,
        top_k: k,
        num_requests: r,
        max_pages: sc.pages,
        block_size: bs,
        hot_slots: n,
        attention_block_stride: bs,
        host_num_blocks: host_blocks,
        num_state_rows: None,
        stats_slot: 0,
    };
    let w = desc0.hot_table_width();
    // Page p of request q lives in host block q * pages + p (a tenth of them beyond the pool when
    // asked); a few pages are resident in GPU blocks past the hot regions; request q's hot region
    // is GPU blocks 1 + q * w .. (distinct per request, as the layout gives them).
    let host: Vec<i32> = (0..r * sc.pages)
        .map(|i| {
            if rng.percent(sc.beyond_pct) {
                (host_blocks + 5) as i32
            } else {
                i as i32
            }
        })
        .collect();
    let resident_base = 1 + r * w;
    let resident: Vec<i32> = (0..r * sc.pages)
        .map(|_| {
            if rng.percent(sc.resident_pct) {
                (resident_base + rng.below(8) as u32) as i32
            } else {
                0
            }
        })
        .collect();
    let hot: Vec<i32> = (0..r * w).map(|i| 1 + i as i32).collect();
    let dev_blocks = resident_base + 8;
    let row = if sc.split { 48 } else { 32 };
    let value = if sc.split { 32 } else { row };
    let hpage = u64::from(bs * row);
    let layers: Vec<LayerPair> = (0..sc.layers)
        .map(|l| LayerPair {
            host: PageLayout {
                base: u64::from(l) * hpage * u64::from(host_blocks),
                block_stride: hpage,
                num_blocks: host_blocks,
                block_size: bs,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows: bs,
            },
            device: PageLayout {
                base: u64::from(l) * hpage,
                block_stride: hpage * u64::from(sc.layers),
                num_blocks: dev_blocks,
                block_size: bs,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows: bs,
            },
        })
        .collect();
    let host_bytes = (hpage * u64::from(host_blocks) * u64::from(sc.layers)) as usize;
    let dev_bytes = (hpage * u64::from(sc.layers) * u64::from(dev_blocks)) as usize;
    let mut host_pool_bytes = vec![0u8; host_bytes];
    rng.fill(&mut host_pool_bytes);
    let mut want_pool = vec![0u8; dev_bytes];
    rng.fill(&mut want_pool);
    let mut slot_host_rows = vec![-1i32; (r * n) as usize];
    let mut lru: Vec<u16> = (0..r).flat_map(|_| 0..n as u16).collect();
    if sc.corrupt {
        lru[3] = lru[4]; // request 0's LRU is not a permutation
        slot_host_rows[5] = 7;
    }
    let mut h = HostState {
        resident,
        host,
        hot,
        slot_host_rows,
        lru,
        idx_mapping: None,
        stats: None,
    };

    let mut host_buf = dev.alloc_pinned(host_bytes).map_err(device_err)?;
    dev.write_pinned(&mut host_buf, 0, &host_pool_bytes)
        .map_err(device_err)?;
    let mut pool = dev.alloc(dev_bytes).map_err(device_err)?;
    dev.upload(&mut pool, 0, &want_pool).map_err(device_err)?;
    let mut d = DevState::upload(dev, &h).map_err(case_err)?;
    let stream = dev.create_stream().map_err(device_err)?;

    // Token rows: each request's rows and padding rows, shuffled.
    let mut req: Vec<i32> = (0..r)
        .flat_map(|q| std::iter::repeat_n(q as i32, sc.rows_per_request as usize))
        .chain(std::iter::repeat_n(-1, sc.padding_rows as usize))
        .collect();
    rng.shuffle(&mut req);
    let t = req.len() as u32;
    let desc = ResolveDesc {
        num_tokens: t,
        ..desc0
    };
    let span = u64::from(sc.pages * bs);
    let mut topk: Vec<i32> = (0..t * k).map(|_| rng.below(span) as i32).collect();
    for step in 0..sc.steps {
        // A tenth of the entries move on; some duplicate their neighbour; a few are invalid.
        for j in 0..topk.len() {
            if step > 0 && rng.percent(10) {
                topk[j] = rng.below(span) as i32;
            }
            if j > 0 && rng.percent(sc.dup_pct) {
                topk[j] = topk[j - 1];
            }
            if rng.percent(2) {
                topk[j] = -1;
            }
        }
        let (tu, ku) = (t as usize, k as usize);
        let mut want = Outputs::sentinels(tu, ku);
        resolve(&desc, h.slices(&req, &topk, &mut want)).map_err(|x| x.to_string())?;
        gather_rows(
            &GatherDesc {
                num_tokens: t,
                top_k: k,
                layers: &layers,
            },
            GatherArgs {
                plan_src: &want.miss_src,
                plan_dst: &want.miss_dst,
                plan_counts: &want.misses,
                host: &host_pool_bytes,
                device: &mut want_pool,
            },
        )
        .map_err(|x| x.to_string())?;

        let (d_req, d_topk) = (upload_i32(dev, &req)?, upload_i32(dev, &topk)?);
        let mut out = DevOutputs::upload(dev, &Outputs::sentinels(tu, ku)).map_err(case_err)?;
        hook.resolve_and_gather(
            dev,
            &stream,
            &desc,
            d.args(&d_req, &d_topk, &mut out),
            &layers,
            &host_buf,
            &mut pool,
        )
        .map_err(device_err)?;
        dev.synchronize(&stream).map_err(device_err)?;
        let at = format!("{}: step {step}: ", sc.name);
        out.read(dev, tu, ku)
            .and_then(|got| got.expect(&at, &want))
            .and_then(|()| d.expect_hot_state(dev, &at, &h))
            .map_err(case_err)?;
        let mut got_pool = vec![0u8; dev_bytes];
        dev.download(&pool, 0, &mut got_pool).map_err(device_err)?;
        if got_pool != want_pool {
            let at = want_pool
                .iter()
                .zip(&got_pool)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(format!(
                "{}: step {step}: the device pool differs at byte {at}",
                sc.name
            ));
        }
        println!(
            "  {} step {step}: {} misses gathered over {} layers, identical",
            sc.name,
            want.misses[..tu].iter().sum::<i32>(),
            sc.layers
        );
    }
    Ok(())
}

/// Runs every scenario (whose name contains `filter`) on `dev` through `hook`: one line per scenario, then the
/// summary; `Err` when any failed.
pub fn run_all<D: Device>(
    dev: &D,
    hook: &impl Fused<D>,
    filter: Option<&str>,
) -> Result<usize, usize> {
    let (mut passed, mut failed) = (0, 0);
    for (i, sc) in SCENARIOS.iter().enumerate() {
        let name = format!("fused/{}", sc.name);
        if filter.is_some_and(|f| !name.contains(f)) {
            continue;
        }
        match run(dev, hook, sc, 0xF05E_D000 + i as u64) {
            Ok(()) => {
                passed += 1;
                println!("ok   {name}");
            }
            Err(msg) => {
                failed += 1;
                println!("FAIL {name}: {msg}");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 { Err(failed) } else { Ok(passed) }
}

/// The `main` of a backend's `harness = false` fused test: `--list` names the scenarios, the first
/// free argument filters them, and a device that is not found reports every scenario skipped
/// unless `HISPARSE_REQUIRE_DEVICE=1` ([`Check::device`]). Exits non-zero on any failure, or when
/// the filter selected nothing.
pub fn main_with<D, F>(open: F, hook: impl Fused<D>) -> !
where
    D: Device,
    F: FnOnce() -> Result<D, D::Error>,
{
    let cases: Vec<String> = SCENARIOS
        .iter()
        .map(|sc| format!("fused/{}", sc.name))
        .collect();
    let check = Check::of("fused resolve-and-gather", &cases);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args
        .iter()
        .find(|a| !a.starts_with('-'))
        .map(String::as_str);
    let dev = check.device(open());
    println!("device: {}", dev.device_name());
    let passed = matches!(run_all(&dev, &hook, filter), Ok(n) if n > 0);
    std::process::exit(if passed { 0 } else { 1 })
}
