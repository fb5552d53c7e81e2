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
use hisparse_core::ops::{
    GatherArgs, GatherDesc, LayerPair, PageLayout, ResolveArgs, ResolveDesc, ResolveSlices,
};

use super::{Res, device_err, download_i32, upload_i32};
use crate::SplitMix64;
use crate::check::Check;

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

    let mut host_buf = dev.alloc_pinned(host_bytes).map_err(device_err)?;
    dev.write_pinned(&mut host_buf, 0, &host_pool_bytes)
        .map_err(device_err)?;
    let mut pool = dev.alloc(dev_bytes).map_err(device_err)?;
    dev.upload(&mut pool, 0, &want_pool).map_err(device_err)?;
    let (d_res, d_host, d_hot) = (
        upload_i32(dev, &resident)?,
        upload_i32(dev, &host)?,
        upload_i32(dev, &hot)?,
    );
    let mut d_slot_host_rows = upload_i32(dev, &slot_host_rows)?;
    let mut d_lru = dev.alloc(lru.len() * 2).map_err(device_err)?;
    dev.upload_u16(&mut d_lru, 0, &lru).map_err(device_err)?;
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
        let tk = (t * k) as usize;
        let tu = t as usize;
        let (mut ind, mut src, mut dst) = (vec![0; tk], vec![0; tk], vec![0; tk]);
        let (mut vc, mut hc, mut mc) = (vec![0; tu], vec![0; tu], vec![0; tu]);
        resolve(
            &desc,
            ResolveSlices {
                req_id: &req,
                topk: &topk,
                resident_table: &resident,
                host_table: &host,
                hot_table: &hot,
                slot_host_rows: &mut slot_host_rows,
                lru: &mut lru,
                indices: &mut ind,
                valid_counts: &mut vc,
                hit_counts: &mut hc,
                miss_counts: &mut mc,
                miss_src: &mut src,
                miss_dst: &mut dst,
                idx_mapping: None,
                stats: None,
            },
        )
        .map_err(|x| x.to_string())?;
        gather_rows(
            &GatherDesc {
                num_tokens: t,
                top_k: k,
                layers: &layers,
            },
            GatherArgs {
                plan_src: &src,
                plan_dst: &dst,
                plan_counts: &mc,
                host: &host_pool_bytes,
                device: &mut want_pool,
            },
        )
        .map_err(|x| x.to_string())?;

        let (d_req, d_topk) = (upload_i32(dev, &req)?, upload_i32(dev, &topk)?);
        let mut outs: Vec<D::Buffer> = [tk, tu, tu, tu, tk, tk]
            .iter()
            .map(|&len| upload_i32(dev, &vec![9; len]))
            .collect::<Res<_>>()?;
        let [o_ind, o_vc, o_hc, o_mc, o_src, o_dst] = &mut outs[..] else {
            unreachable!("six outputs")
        };
        hook.resolve_and_gather(
            dev,
            &stream,
            &desc,
            ResolveArgs {
                req_id: &d_req,
                topk: &d_topk,
                resident_table: &d_res,
                host_table: &d_host,
                hot_table: &d_hot,
                slot_host_rows: &mut d_slot_host_rows,
                lru: &mut d_lru,
                indices: o_ind,
                valid_counts: o_vc,
                hit_counts: o_hc,
                miss_counts: o_mc,
                miss_src: o_src,
                miss_dst: o_dst,
                idx_mapping: None,
                stats: None,
            },
            &layers,
            &host_buf,
            &mut pool,
        )
        .map_err(device_err)?;
        dev.synchronize(&stream).map_err(device_err)?;
        for (name, want, got) in [
            ("indices", &ind, download_i32(dev, o_ind, tk)?),
            ("valid_counts", &vc, download_i32(dev, o_vc, tu)?),
            ("hit_counts", &hc, download_i32(dev, o_hc, tu)?),
            ("miss_counts", &mc, download_i32(dev, o_mc, tu)?),
            ("miss_src", &src, download_i32(dev, o_src, tk)?),
            ("miss_dst", &dst, download_i32(dev, o_dst, tk)?),
            (
                "slot_host_rows",
                &slot_host_rows,
                download_i32(dev, &d_slot_host_rows, slot_host_rows.len())?,
            ),
        ] {
            if *want != got {
                let at = want.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "{}: step {step}: {name} differs at {at}: want {}, got {}",
                    sc.name, want[at], got[at]
                ));
            }
        }
        let mut got_lru = vec![0u16; lru.len()];
        dev.download_u16(&d_lru, 0, &mut got_lru)
            .map_err(device_err)?;
        if got_lru != lru {
            return Err(format!("{}: step {step}: the LRU differs", sc.name));
        }
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
            mc.iter().sum::<i32>(),
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
