//! `--profile-targets`: the decode-size launches a profiler should look at, each issued three
//! times on the stream (no graphs, no timing), in a fixed order that the profiler's records
//! follow: remap at 1 and 64 tokens (plain, counts, counts + compaction), the resolver at 1 and
//! 64 requests (a first step that fills the hot buffers, then a step with about 9% misses), and the
//! fused resolve-and-gather of that second step (each block copying its own request). Every
//! launch's label is printed after the launches (`profile-target N: label`), so
//! `.ci/gpu/cuda-perf.sh` can name Nsight Compute's records (the N-th record of `hs_remap`,
//! `hs_remap_wide`, `hs_resolve` and `hs_resolve_gather` together is launch N).

use hisparse_backend_cuda::CudaBuffer;
use hisparse_core::Device;
use hisparse_core::ops::{LayerPair, PageLayout, RemapArgs};

use crate::remap::{K, MODES, RemapInputs};
use crate::walk::Walk;
use hisparse_conformance::SplitMix64;

use crate::{BS, Bench, HOST_BLOCKS, PAGE, ROW, Res, host_pool};

/// Calls of each target (the first warms the caches the later ones find warm).
const REPEATS: usize = 3;

pub(crate) fn run(b: &mut Bench) -> Res<()> {
    let mut labels = Vec::new();
    let mut rng = SplitMix64::new(0x5eed);
    remaps(b, &mut rng, &mut labels)?;
    let host = host_pool(b)?;
    // One request: the fixed cost of a decode-size resolve, alone.
    {
        let mut w = Walk::new(b, 1, 2, &mut rng)?;
        for i in 0..REPEATS {
            w.reset(&b.dev, &b.s)?;
            w.resolve(&b.dev, &b.s, 0, None)?;
            labels.push(format!("hs_resolve 1 req, filling step, call {}", i + 1));
            w.resolve(&b.dev, &b.s, 1, None)?;
            labels.push(format!("hs_resolve 1 req, ~9% misses, call {}", i + 1));
        }
    }
    let mut w = Walk::new(b, 64, 2, &mut rng)?;
    let hot_blocks = 64 * w.desc.hot_table_width();
    let layer = [LayerPair {
        host: PageLayout::contiguous(0, PAGE, HOST_BLOCKS, BS, ROW),
        device: PageLayout::contiguous(0, PAGE, hot_blocks, BS, ROW),
    }];
    let mut pool = b.dev.alloc((u64::from(hot_blocks) * PAGE) as usize)?;
    for i in 0..REPEATS {
        w.reset(&b.dev, &b.s)?;
        w.resolve(&b.dev, &b.s, 0, None)?;
        labels.push(format!("hs_resolve 64 req, filling step, call {}", i + 1));
        w.resolve(&b.dev, &b.s, 1, None)?;
        labels.push(format!("hs_resolve 64 req, ~9% misses, call {}", i + 1));
    }
    // The fused launch, each block copying its own request.
    {
        for i in 0..REPEATS {
            w.reset(&b.dev, &b.s)?;
            w.resolve(&b.dev, &b.s, 0, None)?;
            labels.push(format!(
                "hs_resolve 64 req, filling step (before fused), call {}",
                i + 1
            ));
            w.resolve(&b.dev, &b.s, 1, Some((&layer, &host, &mut pool)))?;
            labels.push(format!(
                "hs_resolve_gather 64 req, ~9% misses, call {}",
                i + 1
            ));
        }
    }
    b.dev.synchronize(&b.s)?;
    for (n, l) in labels.iter().enumerate() {
        println!("profile-target {n}: {l}");
    }
    Ok(())
}

/// Remap at 1 and 64 tokens in every mode, REPEATS calls each.
fn remaps(b: &mut Bench, rng: &mut SplitMix64, labels: &mut Vec<String>) -> Res<()> {
    for t in [1u32, 64] {
        let inputs = RemapInputs::new(b, rng, t)?;
        let mut out: CudaBuffer = b.dev.alloc((t * K * 4) as usize)?;
        let mut counts: CudaBuffer = b.dev.alloc((t * 4) as usize)?;
        for (mode, write_counts, compact) in MODES {
            let desc = inputs.desc(write_counts, compact);
            for i in 0..REPEATS {
                b.dev.remap(
                    &b.s,
                    &desc,
                    RemapArgs {
                        req_id: &inputs.req_b,
                        block_table: &inputs.table_b,
                        topk: &inputs.topk_b,
                        idx_mapping: None,
                        out: &mut out,
                        counts: write_counts.then_some(&mut counts),
                        stats: None,
                    },
                )?;
                labels.push(format!("hs_remap {t} tok x 2048, {mode}, call {}", i + 1));
            }
        }
    }
    Ok(())
}
