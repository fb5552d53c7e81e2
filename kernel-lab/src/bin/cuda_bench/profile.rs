//! `--profile-targets`: the decode-size launches a profiler should look at, each issued three
//! times on the stream (no graphs, no timing), in a fixed order that the profiler's records
//! follow: remap at 1 and 64 tokens (plain, counts, counts + compaction), the resolver at 1 and
//! 64 requests (a first step that fills the hot buffers, then a step with about 9% misses), and the
//! fused resolve-and-gather of that second step (each block copying its own request); then,
//! where the lab's resolver experiments load (sm_90), each of them on that second step at 1 and
//! 64 requests (after `hs_resolve`'s filling step). Every launch's label is printed after the
//! launches (`profile-target N: label`), so `.ci/gpu/cuda-perf.sh` can name Nsight Compute's
//! records (the N-th record of `hs_remap`, `hs_resolve`, `hs_resolve_gather` and the lab's
//! `lab_resolve_*` together is launch N).
//!
//! `--lab-walk` measures nothing either: it runs each lab experiment over short walks of 1 and 3
//! requests and compares every output and the hot state with `hs_resolve`'s (what
//! compute-sanitizer runs it under).

use hisparse_backend_cuda::CudaBuffer;
use hisparse_core::Device;
use hisparse_core::ops::{LayerPair, PageLayout, RemapArgs};

use crate::remap::{K, MODES, RemapInputs};
use crate::walk::{LabScratch, Walk, lab_walk_matches};
use hisparse_conformance::SplitMix64;
use hisparse_kernel_lab::resolve_cluster;

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
    // The lab's experiments, each on the second step of the 1- and 64-request walks.
    if let Some(lab) = b.cluster.clone() {
        for r in [1u32, 64] {
            let mut w = Walk::new(b, r, 2, &mut rng)?;
            let scratch = LabScratch::new(b, &w)?;
            for v in resolve_cluster::VARIANTS {
                for i in 0..REPEATS {
                    w.reset(&b.dev, &b.s)?;
                    w.resolve(&b.dev, &b.s, 0, None)?;
                    labels.push(format!(
                        "hs_resolve {r} req, filling step (before {}), call {}",
                        v.symbol,
                        i + 1
                    ));
                    w.resolve_cluster(&lab, &b.s, 1, &v, &scratch)?;
                    labels.push(format!("{} {r} req, ~9% misses, call {}", v.symbol, i + 1));
                }
            }
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

/// `--lab-walk`: each lab experiment over walks of 1 and 3 requests (three steps), every output
/// and the final hot state compared with `hs_resolve`'s. Fails when the experiments cannot load.
pub(crate) fn lab_walk(b: &mut Bench) -> Res<()> {
    let lab = b
        .cluster
        .clone()
        .ok_or("the lab's resolver experiments did not load (see above)")?;
    let mut rng = SplitMix64::new(0x1ab);
    for r in [1u32, 3] {
        let mut w = Walk::new(b, r, 3, &mut rng)?;
        for v in resolve_cluster::VARIANTS {
            lab_walk_matches(b, &mut w, &lab, &v)?;
            println!(
                "ok: {} over a walk of {r} requests matches hs_resolve",
                v.symbol
            );
        }
    }
    Ok(())
}
