//! The resolver and the swap-in critical path over a random walk of top-k sets: 1, 64 and 256
//! requests × 2048 top-k, 4096 hot slots, about a tenth of each set replaced per step.

use std::collections::HashSet;

use hisparse_backend_cuda::{
    CudaBuffer, CudaDevice, CudaError, CudaGraph, CudaHostBuffer, CudaStream,
};
use hisparse_core::Device;
use hisparse_core::ops::{
    BufferLen, GatherArgs, GatherDesc, LayerPair, PageLayout, ResolveArgs, ResolveDesc,
};

use hisparse_conformance::SplitMix64;

use crate::{BS, Bench, HOST_BLOCKS, PAGE, ROW, Res, Row, download, host_pool, upload};

const K: u32 = 2048;
const N: u32 = 4096;
const CTX: u32 = 32768;

/// One request set's walk: state, inputs of every step, and per-step outputs (kept apart so the
/// gathers of every step's plan can be replayed alone).
pub(crate) struct Walk {
    r: u32,
    pub(crate) desc: ResolveDesc,
    req: CudaBuffer,
    resident: CudaBuffer,
    host_table: CudaBuffer,
    hot: CudaBuffer,
    slot_host_rows: CudaBuffer,
    lru: CudaBuffer,
    slot_host_rows0: CudaBuffer,
    lru0: CudaBuffer,
    topk: Vec<CudaBuffer>,
    /// Per step: indices, valid, hits, misses, src, dst.
    outs: Vec<[CudaBuffer; 6]>,
}

impl Walk {
    pub(crate) fn new(b: &Bench, r: u32, steps: usize, rng: &mut SplitMix64) -> Res<Walk> {
        let pages = CTX / BS;
        let desc = ResolveDesc {
            num_tokens: r,
            top_k: K,
            num_requests: r,
            max_pages: pages,
            block_size: BS,
            hot_slots: N,
            attention_block_stride: BS,
            host_num_blocks: HOST_BLOCKS,
            num_state_rows: None,
            stats_slot: 0,
        };
        let dev = &b.dev;
        let host_table: Vec<i32> = (0..r * pages).map(|i| (i % HOST_BLOCKS) as i32).collect();
        let hot_w = desc.hot_table_width();
        let hot: Vec<i32> = (0..(r * hot_w) as i32).collect();
        let lru: Vec<u16> = (0..r).flat_map(|_| 0..N as u16).collect();
        let mut lru0 = dev.alloc(lru.len() * 2)?;
        dev.upload_u16(&mut lru0, 0, &lru)?;
        let mut sets: Vec<Vec<i32>> = (0..r)
            .map(|_| {
                let mut seen = HashSet::new();
                let mut v = Vec::with_capacity(K as usize);
                while v.len() < K as usize {
                    let x = rng.below(u64::from(CTX)) as i32;
                    if seen.insert(x) {
                        v.push(x);
                    }
                }
                v
            })
            .collect();
        let mut topk = Vec::new();
        let mut outs = Vec::new();
        for _ in 0..=steps {
            let flat: Vec<i32> = sets.iter().flatten().copied().collect();
            topk.push(upload(dev, &flat)?);
            let tk = (r * K) as usize * 4;
            let t = r as usize * 4;
            outs.push([
                dev.alloc(tk)?,
                dev.alloc(t)?,
                dev.alloc(t)?,
                dev.alloc(t)?,
                dev.alloc(tk)?,
                dev.alloc(tk)?,
            ]);
            for set in sets.iter_mut() {
                let seen: HashSet<i32> = set.iter().copied().collect();
                let mut fresh = HashSet::new();
                for _ in 0..K / 10 {
                    let at = rng.below(u64::from(K)) as usize;
                    loop {
                        let x = rng.below(u64::from(CTX)) as i32;
                        if !seen.contains(&x) && fresh.insert(x) {
                            set[at] = x;
                            break;
                        }
                    }
                }
            }
        }
        Ok(Walk {
            r,
            desc,
            req: upload(dev, &(0..r as i32).collect::<Vec<_>>())?,
            resident: upload(dev, &vec![0; (r * pages) as usize])?,
            host_table: upload(dev, &host_table)?,
            hot: upload(dev, &hot)?,
            slot_host_rows: upload(dev, &vec![-1; (r * N) as usize])?,
            lru: dev.alloc(lru.len() * 2)?,
            slot_host_rows0: upload(dev, &vec![-1; (r * N) as usize])?,
            lru0,
            topk,
            outs,
        })
    }

    /// Puts the hot state back to empty (all slots free), on the stream.
    pub(crate) fn reset(&mut self, d: &CudaDevice, s: &CudaStream) -> Result<(), CudaError> {
        let (slot_host_rows_len, lru_len) = (
            self.slot_host_rows.byte_len() as usize,
            self.lru.byte_len() as usize,
        );
        d.copy_on_device(
            s,
            &self.slot_host_rows0,
            0,
            &mut self.slot_host_rows,
            0,
            slot_host_rows_len,
        )?;
        d.copy_on_device(s, &self.lru0, 0, &mut self.lru, 0, lru_len)
    }

    /// Step `step`'s resolve, or with `gather` its fused resolve-and-gather into `pool`.
    pub(crate) fn resolve(
        &mut self,
        d: &CudaDevice,
        s: &CudaStream,
        step: usize,
        gather: Option<(&[LayerPair], &CudaHostBuffer, &mut CudaBuffer)>,
    ) -> Result<(), CudaError> {
        let [ind, valid, hits, misses, src, dst] = &mut self.outs[step];
        let args = ResolveArgs {
            req_id: &self.req,
            topk: &self.topk[step],
            resident_table: &self.resident,
            host_table: &self.host_table,
            hot_table: &self.hot,
            slot_host_rows: &mut self.slot_host_rows,
            lru: &mut self.lru,
            indices: ind,
            valid_counts: valid,
            hit_counts: hits,
            miss_counts: misses,
            miss_src: src,
            miss_dst: dst,
            idx_mapping: None,
            stats: None,
        };
        match gather {
            None => d.resolve(s, &self.desc, args),
            Some((layers, host, pool)) => {
                d.resolve_and_gather(s, &self.desc, args, layers, host, pool)
            }
        }
    }

    /// Every output of step `step`, downloaded.
    fn outputs(&self, d: &CudaDevice, step: usize) -> Res<Vec<i32>> {
        let r = self.r;
        let [ind, valid, hits, misses, src, dst] = &self.outs[step];
        let mut v = Vec::new();
        for (buf, n) in [
            (ind, r * K),
            (valid, r),
            (hits, r),
            (misses, r),
            (src, r * K),
            (dst, r * K),
        ] {
            v.extend(download(d, buf, n as usize)?);
        }
        Ok(v)
    }
}

/// The gather of step `step`'s miss plan into the hot rows of `pool`.
fn gather_step(
    d: &CudaDevice,
    s: &CudaStream,
    w: &Walk,
    step: usize,
    layer: &[LayerPair],
    host: &CudaHostBuffer,
    pool: &mut CudaBuffer,
) -> Result<(), CudaError> {
    let [_, _, _, misses, src, dst] = &w.outs[step];
    d.gather_rows(
        s,
        &GatherDesc {
            num_tokens: w.r,
            top_k: K,
            layers: layer,
        },
        GatherArgs {
            plan_src: src,
            plan_dst: dst,
            plan_counts: misses,
            host,
            device: pool,
        },
    )
}

/// Microseconds per step of one replay of `graph` (steps 1..=steps) from the empty state after
/// step 0, averaged over `reps` replays (the state is reset before each, outside the timing;
/// each timed replay follows the warm-up spin, the clock probe follows it).
fn time_walk(
    b: &mut Bench,
    w: &mut Walk,
    reps: usize,
    steps: usize,
    graph: &CudaGraph,
) -> Res<f64> {
    let mut total = 0.0;
    let mut mhz = 0.0;
    for _ in 0..reps {
        w.reset(&b.dev, &b.s)?;
        // Step 0 fills the hot buffers (all misses); the timed graph holds steps 1..=steps.
        w.resolve(&b.dev, &b.s, 0, None)?;
        b.warm()?;
        let a = b.dev.timing_event(&b.s)?;
        b.dev.launch_graph(graph, &b.s)?;
        let e = b.dev.timing_event(&b.s)?;
        mhz += b.read_clock()?;
        total += f64::from(b.dev.elapsed_ms(&a, &e)?) * 1e3;
    }
    b.clock.set(mhz / reps as f64);
    Ok(total / (reps * steps) as f64)
}

/// A swap-in path measured: the resolve then a gather launch, or the fused launch.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    Pair,
    Fused,
}

/// The paths measured, `(name, path)`, each with and without PDL.
const PATHS: [(&str, Path); 2] = [
    ("resolve + gather", Path::Pair),
    (
        "fused, each block its own request (production from 64 rows)",
        Path::Fused,
    ),
];

pub(crate) fn section(b: &mut Bench, resolve: bool, path: bool) -> Res<()> {
    let host = host_pool(b)?;
    let mut rng = SplitMix64::new(0x12e5);
    let steps = if b.quick { 4 } else { 16 };
    let reps = if b.quick { 2 } else { 5 };
    for r in [1u32, 64, 256] {
        let mut w = Walk::new(b, r, steps, &mut rng)?;
        let hot_blocks = r * w.desc.hot_table_width();
        let layer = [LayerPair {
            host: PageLayout::contiguous(0, PAGE, HOST_BLOCKS, BS, ROW),
            device: PageLayout::contiguous(0, PAGE, hot_blocks, BS, ROW),
        }];
        let pool_len = (PAGE * u64::from(hot_blocks)) as usize;
        let mut pool = b.dev.alloc(pool_len)?;
        // The eager walk: the fused launch gives every step's outputs identical to it, and the
        // separate and the fused path leave the pool identical.
        let mut missed_rows = 0u64;
        let mut looked_up = 0u64;
        let reference = {
            w.reset(&b.dev, &b.s)?;
            let mut all = Vec::new();
            for step in 0..=steps {
                w.resolve(&b.dev, &b.s, step, None)?;
                all.push(w.outputs(&b.dev, step)?);
                if step > 0 {
                    let [_, _, hits, misses, _, _] = &w.outs[step];
                    let m = download(&b.dev, misses, r as usize)?;
                    let h = download(&b.dev, hits, r as usize)?;
                    missed_rows += m.iter().map(|&x| x as u64).sum::<u64>();
                    looked_up += m.iter().chain(&h).map(|&x| x as u64).sum::<u64>();
                }
            }
            all
        };
        let zero = b.dev.alloc(pool_len)?;
        // The pair's pool, then the fused launch's: identical.
        let mut pair_pool: Option<Vec<u8>> = None;
        for fused in [false, true] {
            w.reset(&b.dev, &b.s)?;
            b.dev
                .copy_on_device(&b.s, &zero, 0, &mut pool, 0, pool_len)?;
            for (step, want) in reference.iter().enumerate() {
                if fused {
                    w.resolve(&b.dev, &b.s, step, Some((&layer, &host, &mut pool)))?;
                    if w.outputs(&b.dev, step)? != *want {
                        return Err(format!(
                            "the fused resolve differs from the resolve at step {step} of the walk of {r} requests"
                        )
                        .into());
                    }
                } else {
                    w.resolve(&b.dev, &b.s, step, None)?;
                    gather_step(&b.dev, &b.s, &w, step, &layer, &host, &mut pool)?;
                }
            }
            let mut bytes = vec![0u8; pool_len];
            b.dev.download(&pool, 0, &mut bytes)?;
            match &pair_pool {
                None => pair_pool = Some(bytes),
                Some(want) if *want != bytes => {
                    return Err(format!(
                        "the fused launch's gather differs from resolve then gather over the walk of {r} requests"
                    )
                    .into());
                }
                Some(_) => {}
            }
        }
        println!(
            "{r} requests: the fused launch leaves every output and the pool identical to the pair"
        );
        let misses_per_step = missed_rows as f64 / steps as f64;
        let miss_pct = 100.0 * missed_rows as f64 / looked_up.max(1) as f64;
        let bytes = misses_per_step * f64::from(ROW);
        let path_ceiling = 1.2 * bytes / b.h2d / 1e3 + 5.0;
        println!(
            "{r} requests: {misses_per_step:.0} missed rows per step ({miss_pct:.1}% of distinct wanted rows), {:.2} MB",
            bytes / 1e6
        );
        if resolve {
            let wr = &mut w;
            let graph = b.dev.capture(&b.s, |d| {
                for step in 1..=steps {
                    wr.resolve(d, &b.s, step, None)?;
                }
                Ok(())
            })?;
            let us = time_walk(b, &mut w, reps, steps, &graph)?;
            let target = (r == 64).then_some(10.0);
            b.push(Row {
                section: "resolve",
                name: format!("resolve {r} req x 2048, 4096 slots, {miss_pct:.1}% misses"),
                path: "-".into(),
                value: us,
                unit: "us",
                ceiling: b.empty_us,
                ceiling_name: "empty launch",
                target: target.map_or("-".into(), |x| format!("<= {x} us")),
                met: target.map(|x| us <= x),
                note: format!("{steps} steps in one graph, from empty hot buffers"),
                sm_mhz: 0.0,
            });
        }
        if !path {
            continue;
        }
        // The gathers alone (every step's plan from the eager walk).
        let (wr, pr) = (&w, &mut pool);
        let g_us = b.graph_us(steps, reps, &mut |d, s| {
            for step in 1..=steps {
                gather_step(d, s, wr, step, &layer, &host, pr)?;
            }
            Ok(())
        })?;
        b.push(Row {
            section: "path",
            name: format!("gather of the misses alone, {r} req"),
            path: "-".into(),
            value: g_us,
            unit: "us",
            ceiling: bytes / b.h2d / 1e3,
            ceiling_name: "missed bytes at bulk H2D",
            target: "-".into(),
            met: None,
            note: format!("{:.1} GB/s", bytes / g_us / 1e3),
            sm_mhz: 0.0,
        });
        for (name, path) in PATHS {
            for pdl in [false, true] {
                if pdl && !b.dev.set_programmatic_launch(true) {
                    continue;
                }
                let measured = (|| -> Res<f64> {
                    let (wr, pr) = (&mut w, &mut pool);
                    let graph = b.dev.capture(&b.s, |d| {
                        for step in 1..=steps {
                            match path {
                                Path::Pair => {
                                    wr.resolve(d, &b.s, step, None)?;
                                    gather_step(d, &b.s, wr, step, &layer, &host, pr)?;
                                }
                                Path::Fused => {
                                    wr.resolve(d, &b.s, step, Some((&layer, &host, &mut *pr)))?
                                }
                            }
                        }
                        Ok(())
                    })?;
                    time_walk(b, &mut w, reps, steps, &graph)
                })();
                b.dev.set_programmatic_launch(false);
                let tag = format!("{name}{}", if pdl { ", PDL" } else { "" });
                let us = match measured {
                    Ok(x) => x,
                    Err(e) if pdl => {
                        println!("swap-in path {tag} FAILED: {e}");
                        b.failures.push(format!("swap-in path {tag}: {e}"));
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let judged = r == 64;
                b.push(Row {
                    section: "path",
                    name: format!("swap-in path, {r} req x 2048, {miss_pct:.1}% misses"),
                    path: tag,
                    value: us,
                    unit: "us",
                    ceiling: path_ceiling,
                    ceiling_name: "1.2 x missed bytes / bulk H2D + 5 us",
                    target: format!("<= {path_ceiling:.1} us"),
                    met: judged.then_some(us <= path_ceiling),
                    note: format!(
                        "{misses_per_step:.0} rows, {:.2} MB per step; {:.1} GB/s",
                        bytes / 1e6,
                        bytes / us / 1e3
                    ),
                    sm_mhz: 0.0,
                });
            }
        }
    }
    Ok(())
}
