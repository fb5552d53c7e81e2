//! Remap, top-k 2048 over 128K-token block tables, at 1, 64, 256 and 1024 tokens, plain, with
//! valid counts and with counts and compaction, warm and cold.

use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaError, CudaStream};
use hisparse_core::Device;
use hisparse_core::ops::remap::remap as ref_remap;
use hisparse_core::ops::{RemapArgs, RemapDesc};
use hisparse_gpu_kernels::plan::{self, RemapLayout};
use hisparse_kernel_lab::remap_lab::{COUNTS, LabRemap, RemapLab, WIDE};

use hisparse_conformance::SplitMix64;

use crate::{Bench, Res, Row, download, upload};

/// A 64 MiB copy (64 MiB read, 64 MiB written) evicts the 60 MB L2 before each cold call.
const FLUSH_BYTES: usize = 64 << 20;

/// Microseconds per call of a graph of `calls` L2-evicting copies.
fn flush_us(
    b: &mut Bench,
    calls: usize,
    replays: usize,
    src: &CudaBuffer,
    dst: &mut CudaBuffer,
) -> Res<f64> {
    b.graph_us(calls, replays, &mut |d, s| {
        for _ in 0..calls {
            d.copy_on_device(s, src, 0, dst, 0, FLUSH_BYTES)?;
        }
        Ok(())
    })
}

/// Top-k entries per row of every remap measurement.
pub(crate) const K: u32 = 2048;
/// Rows per block of the block tables.
const BLOCK: u32 = 64;
/// Blocks per table row (128K-token tables).
const BLOCKS: u32 = 2048;

/// The remap modes measured: `(name, valid counts, compaction)`.
pub(crate) const MODES: [(&str, bool, bool); 3] = [
    ("plain", false, false),
    ("counts", true, false),
    ("counts+compaction", true, true),
];

/// One remap measurement's inputs at `t` tokens: random 128K-token block tables, one row per
/// token, top-k sets with one entry in twenty -1, on the host and uploaded.
pub(crate) struct RemapInputs {
    pub(crate) t: u32,
    pub(crate) table: Vec<i32>,
    pub(crate) req: Vec<i32>,
    pub(crate) topk: Vec<i32>,
    pub(crate) table_b: CudaBuffer,
    pub(crate) req_b: CudaBuffer,
    pub(crate) topk_b: CudaBuffer,
}

impl RemapInputs {
    pub(crate) fn new(b: &Bench, rng: &mut SplitMix64, t: u32) -> Res<RemapInputs> {
        let table: Vec<i32> = (0..t * BLOCKS).map(|_| rng.below(1 << 20) as i32).collect();
        let req: Vec<i32> = (0..t as i32).collect();
        let topk: Vec<i32> = (0..t * K)
            .map(|_| {
                if rng.below(20) == 0 {
                    -1
                } else {
                    rng.below(u64::from(BLOCK * BLOCKS)) as i32
                }
            })
            .collect();
        Ok(RemapInputs {
            t,
            table_b: upload(&b.dev, &table)?,
            req_b: upload(&b.dev, &req)?,
            topk_b: upload(&b.dev, &topk)?,
            table,
            req,
            topk,
        })
    }

    /// The reference remap of these inputs without compaction: the rows, and the valid counts
    /// when `write_counts` (else zeros).
    pub(crate) fn reference(&self, write_counts: bool) -> Res<(Vec<i32>, Vec<i32>)> {
        let mut want = vec![0i32; (self.t * K) as usize];
        let mut want_c = vec![0i32; self.t as usize];
        ref_remap(
            &self.desc(write_counts, false),
            RemapArgs {
                req_id: &self.req[..],
                block_table: &self.table[..],
                topk: &self.topk[..],
                idx_mapping: None,
                out: &mut want[..],
                counts: write_counts.then_some(&mut want_c[..]),
                stats: None,
            },
        )?;
        Ok((want, want_c))
    }

    /// The remap of these inputs with valid counts and compaction as given.
    pub(crate) fn desc(&self, write_counts: bool, compact: bool) -> RemapDesc {
        RemapDesc {
            num_tokens: self.t,
            top_k: K,
            table_rows: self.t,
            max_blocks: BLOCKS,
            block_size: BLOCK,
            block_stride_rows: BLOCK,
            idx_mapping_len: None,
            write_counts,
            compact,
            stats_slot: 0,
        }
    }
}

pub(crate) fn section(b: &mut Bench) -> Res<()> {
    let k = K;
    let mut rng = SplitMix64::new(0x5eed);
    let flush_src = b.dev.alloc(FLUSH_BYTES)?;
    let mut flush_dst = b.dev.alloc(FLUSH_BYTES)?;
    let calls = if b.quick { 4 } else { 20 };
    let replays = if b.quick { 3 } else { 20 };
    println!(
        "L2 flush copy: {:.1} us per call (subtracted from cold figures)",
        flush_us(b, calls, replays, &flush_src, &mut flush_dst)?
    );
    for t in [1u32, 64, 256, 1024] {
        let inputs = RemapInputs::new(b, &mut rng, t)?;
        let RemapInputs {
            table,
            req,
            topk,
            table_b,
            req_b,
            topk_b,
            ..
        } = &inputs;
        let invalid_b = upload(&b.dev, &vec![-1; (t * k) as usize])?;
        let mut out = b.dev.alloc((t * k * 4) as usize)?;
        let mut counts = b.dev.alloc((t * 4) as usize)?;
        let mut modes: Vec<(&str, bool, bool, &CudaBuffer)> = MODES
            .iter()
            .map(|&(name, counts, compact)| (name, counts, compact, topk_b))
            .collect();
        if t == 1 {
            // Every entry -1: no block-table lookup, the launch and the top-k round trip alone.
            modes.push((
                "plain, every entry -1 (no table lookup)",
                false,
                false,
                &invalid_b,
            ));
        }
        for (mode, write_counts, compact, topk_in) in modes {
            let desc = inputs.desc(write_counts, compact);
            let no_lookup = std::ptr::eq(topk_in, &invalid_b);
            let host_topk = if no_lookup {
                vec![-1; (t * k) as usize]
            } else {
                topk.clone()
            };
            let mut want = vec![0i32; (t * k) as usize];
            let mut want_c = vec![0i32; t as usize];
            ref_remap(
                &desc,
                RemapArgs {
                    req_id: &req[..],
                    block_table: &table[..],
                    topk: &host_topk[..],
                    idx_mapping: None,
                    out: &mut want[..],
                    counts: write_counts.then_some(&mut want_c[..]),
                    stats: None,
                },
            )?;
            let warm_with = {
                let call = |d: &CudaDevice,
                            s: &CudaStream,
                            out: &mut CudaBuffer,
                            counts: &mut CudaBuffer|
                 -> Result<(), CudaError> {
                    d.remap(
                        s,
                        &desc,
                        RemapArgs {
                            req_id: req_b,
                            block_table: table_b,
                            topk: topk_in,
                            idx_mapping: None,
                            out,
                            counts: write_counts.then_some(counts),
                            stats: None,
                        },
                    )
                };
                call(&b.dev, &b.s, &mut out, &mut counts)?;
                let got = download(&b.dev, &out, (t * k) as usize)?;
                let got_c = download(&b.dev, &counts, t as usize)?;
                if got != want || (write_counts && got_c != want_c) {
                    return Err(
                        format!("remap {mode} at {t} tokens differs from the reference").into(),
                    );
                }
                let warm = b.graph_us(calls, replays, &mut |d, s| {
                    for _ in 0..calls {
                        call(d, s, &mut out, &mut counts)?;
                    }
                    Ok(())
                })?;
                let warm_mhz = b.clock.get();
                let flush_before = flush_us(b, calls, replays, &flush_src, &mut flush_dst)?;
                let cold_total = {
                    let (src, dst) = (&flush_src, &mut flush_dst);
                    b.graph_us(calls, replays, &mut |d, s| {
                        for _ in 0..calls {
                            d.copy_on_device(s, src, 0, dst, 0, FLUSH_BYTES)?;
                            call(d, s, &mut out, &mut counts)?;
                        }
                        Ok(())
                    })?
                };
                let cold_mhz = b.clock.get();
                let flush_after = flush_us(b, calls, replays, &flush_src, &mut flush_dst)?;
                let flush = (flush_before + flush_after) / 2.0;
                let cold = (cold_total - flush).max(0.0);
                let flush_spread = (flush_before - flush_after).abs();
                let target = match (t, no_lookup) {
                    (_, true) => None,
                    (1, _) => Some(1.2),
                    (64, _) => Some(1.5),
                    (1024, _) => Some(6.0),
                    _ => None,
                };
                let bytes = f64::from(t) * f64::from(k) * 8.0;
                for (l2, us, mhz) in [("warm", warm, warm_mhz), ("cold", cold, cold_mhz)] {
                    b.push(Row {
                        section: "remap",
                        name: format!("remap {t} tok x 2048, {mode}, L2 {l2}"),
                        path: "-".into(),
                        value: us,
                        unit: "us",
                        ceiling: bytes / b.d2d / 1e3 + b.empty_us,
                        ceiling_name: "empty launch + top-k read and written at D2D",
                        target: match (l2, target) {
                            ("warm", Some(x)) => format!("<= {x} us"),
                            _ => "-".into(),
                        },
                        met: match (l2, target) {
                            ("warm", Some(x)) => Some(us <= x),
                            _ => None,
                        },
                        note: if l2 == "cold" {
                            format!(
                                "{:.0} GB/s top-k in+out; flush {flush:.1} us subtracted \
                                 (before/after differ by {flush_spread:.2} us)",
                                bytes / us / 1e3
                            )
                        } else {
                            format!("{:.0} GB/s top-k in+out", bytes / us / 1e3)
                        },
                        sm_mhz: mhz,
                    });
                }
                warm
            };
            if mode == "plain" {
                layout_rows(b, &inputs, &want, calls, replays)?;
            }
            if compact {
                // Compaction's cost over counts alone (warm).
                let with = warm_with;
                let counts_only = b
                    .rows
                    .iter()
                    .rev()
                    .find(|r| r.name == format!("remap {t} tok x 2048, counts, L2 warm"))
                    .map(|r| r.value);
                if let Some(c) = counts_only {
                    b.push(Row {
                        section: "remap",
                        name: format!("remap {t} tok: compaction over counts alone"),
                        path: "-".into(),
                        value: with / c,
                        unit: "x",
                        ceiling: 1.0,
                        ceiling_name: "counts alone",
                        target: "<= 1.10x".into(),
                        met: Some(with / c <= 1.10),
                        note: String::new(),
                        sm_mhz: 0.0,
                    });
                }
            }
        }
    }
    // Between the decode sizes: both layouts only, the rows that place the rule's crossover.
    for t in REMAP_LAYOUT_ONLY_TOKENS {
        let inputs = RemapInputs::new(b, &mut rng, t)?;
        let (want, _) = inputs.reference(false)?;
        layout_rows(b, &inputs, &want, calls, replays)?;
    }
    let lab = std::rc::Rc::new(RemapLab::load(&b.dev, 0)?);
    for t in LAB_TOKENS {
        lab_rows(b, &lab, &mut rng, t, calls, replays)?;
    }
    Ok(())
}

/// Token rows at which the lab's stripped remaps ([`hisparse_kernel_lab::remap_lab`]) are timed
/// beside the production kernels.
const LAB_TOKENS: [u32; 6] = [1, 16, 32, 64, 128, 256];

/// The lab's stripped remaps at `t` tokens beside the production kernels on the same inputs,
/// each checked against the reference first, all L2 warm: the production plain layouts with and
/// without stats, the production counting remap with stats (as the runtime calls it), and each
/// lab kernel.
fn lab_rows(
    b: &mut Bench,
    lab: &std::rc::Rc<RemapLab>,
    rng: &mut SplitMix64,
    t: u32,
    calls: usize,
    replays: usize,
) -> Res<()> {
    let inputs = RemapInputs::new(b, rng, t)?;
    let (want, want_c) = inputs.reference(true)?;
    let mut out = b.dev.alloc((t * K * 4) as usize)?;
    let mut counts = b.dev.alloc((t * 4) as usize)?;
    let mut stats = b.dev.alloc(64)?;
    let r = LabRemap {
        req_id: &inputs.req_b,
        table: &inputs.table_b,
        topk: &inputs.topk_b,
        rows: t,
        top_k: K,
        table_rows: t,
        max_blocks: BLOCKS,
        shift: BLOCK.trailing_zeros(),
        stride: BLOCK,
    };
    // (name, counts written, launch)
    type Launch<'a> = Box<
        dyn Fn(
                &CudaDevice,
                &CudaStream,
                &mut CudaBuffer,
                &mut CudaBuffer,
                &mut CudaBuffer,
            ) -> Res<()>
            + 'a,
    >;
    let mut cases: Vec<(String, bool, Launch<'_>)> = Vec::new();
    for (layout, with_stats, counting) in [
        (RemapLayout::Wide, false, false),
        (RemapLayout::Wide, true, false),
        (RemapLayout::Vectors, true, false),
        (RemapLayout::Vectors, true, true),
    ] {
        let desc = inputs.desc(counting, false);
        let r = &r;
        cases.push((
            format!(
                "production {layout:?}{}{}",
                if counting { ", counts" } else { "" },
                if with_stats { ", stats" } else { "" }
            ),
            counting,
            Box::new(move |d, s, out, counts, stats| {
                d.remap_as(
                    s,
                    &desc,
                    RemapArgs {
                        req_id: r.req_id,
                        block_table: r.table,
                        topk: r.topk,
                        idx_mapping: None,
                        out,
                        counts: counting.then_some(counts),
                        stats: with_stats.then_some(stats),
                    },
                    layout,
                )?;
                Ok(())
            }),
        ));
    }
    for name in WIDE {
        let (lab, r) = (lab.clone(), &r);
        cases.push((
            name.to_owned(),
            false,
            Box::new(move |_, s, out, _, stats| {
                Ok(lab.launch_wide(name, r, out, Some(stats), s)?)
            }),
        ));
    }
    for (name, vectors) in COUNTS {
        let (lab, r) = (lab.clone(), &r);
        cases.push((
            name.to_owned(),
            true,
            Box::new(move |_, s, out, counts, stats| {
                Ok(lab.launch_counts(name, vectors, r, out, counts, Some(stats), s)?)
            }),
        ));
    }
    for (name, counting, launch) in &cases {
        launch(&b.dev, &b.s, &mut out, &mut counts, &mut stats)?;
        let got = download(&b.dev, &out, (t * K) as usize)?;
        let got_c = download(&b.dev, &counts, t as usize)?;
        if got != want || (*counting && got_c != want_c) {
            b.failures.push(format!(
                "remap lab {name} at {t} tokens differs from the reference"
            ));
            continue;
        }
        let warm = b.graph_us(calls, replays, &mut |d, s| {
            for _ in 0..calls {
                launch(d, s, &mut out, &mut counts, &mut stats)
                    .map_err(|e| CudaError::Unsupported(e.to_string()))?;
            }
            Ok(())
        })?;
        b.push(Row {
            section: "remap-lab",
            name: format!("remap {t} tok x 2048, L2 warm: {name}"),
            path: "-".into(),
            value: warm,
            unit: "us",
            ceiling: b.empty_us,
            ceiling_name: "empty launch",
            target: "-".into(),
            met: None,
            note: String::new(),
            sm_mhz: b.clock.get(),
        });
    }
    Ok(())
}

/// Token rows between the decode sizes at which only the two plain layouts are timed
/// ([`layout_rows`]): where [`plan::REMAP_WIDE_MAX_ROWS`] is set from.
const REMAP_LAYOUT_ONLY_TOKENS: [u32; 4] = [8, 16, 24, 32];

/// The plain remap of `inputs` in each layout the planner chooses between
/// ([`plan::remap_layout`]), with the call counted in a stats slot as the runtime's remap is:
/// checked against the reference (`want`), then timed warm beside the rule's rows, so the rule's
/// row count can be set from one run.
fn layout_rows(
    b: &mut Bench,
    inputs: &RemapInputs,
    want: &[i32],
    calls: usize,
    replays: usize,
) -> Res<()> {
    let t = inputs.t;
    let desc = inputs.desc(false, false);
    let mut out = b.dev.alloc((t * K * 4) as usize)?;
    let mut stats = b.dev.alloc(64)?;
    let rule = plan::remap_layout(&desc);
    for (layout, kernel) in [
        (RemapLayout::Vectors, "hs_remap"),
        (RemapLayout::Wide, "hs_remap_wide"),
    ] {
        let (req_id, block_table, topk) = (&inputs.req_b, &inputs.table_b, &inputs.topk_b);
        let call = |d: &CudaDevice,
                    s: &CudaStream,
                    out: &mut CudaBuffer,
                    stats: &mut CudaBuffer|
         -> Result<(), CudaError> {
            let args = RemapArgs {
                req_id,
                block_table,
                topk,
                idx_mapping: None,
                out,
                counts: None,
                stats: Some(stats),
            };
            d.remap_as(s, &desc, args, layout)
        };
        call(&b.dev, &b.s, &mut out, &mut stats)?;
        if download(&b.dev, &out, (t * K) as usize)? != want {
            b.failures.push(format!(
                "remap at {t} tokens in layout {layout:?} differs from the reference"
            ));
            continue;
        }
        let warm = b.graph_us(calls, replays, &mut |d, s| {
            for _ in 0..calls {
                call(d, s, &mut out, &mut stats)?;
            }
            Ok(())
        })?;
        let bytes = f64::from(t) * f64::from(K) * 8.0;
        b.push(Row {
            section: "remap",
            name: format!("remap {t} tok x 2048, plain with stats, L2 warm"),
            path: format!(
                "{kernel}{}",
                if layout == rule { " (the rule's)" } else { "" }
            ),
            value: warm,
            unit: "us",
            ceiling: bytes / b.d2d / 1e3 + b.empty_us,
            ceiling_name: "empty launch + top-k read and written at D2D",
            target: "-".into(),
            met: None,
            note: format!("{:.0} GB/s top-k in+out", bytes / warm / 1e3),
            sm_mhz: b.clock.get(),
        });
    }
    Ok(())
}
