//! Index remap with its modes (contract §5.1; `hisparse_core::ops::remap` module docs): decode
//! context parallelism (`dcp_size`, `dcp_rank`, `dcp_interleave`) and prefill rows mapped into a
//! gathered prefill workspace — random inputs with and without counts and compaction, every rank
//! of a split, and hand-computed values. A backend without a mode answers `Unsupported`, which
//! counts as skipped (never as passing).

use hisparse_core::Device;
use hisparse_core::ops::remap::remap_modes as reference;
use hisparse_core::ops::{DcpSplit, RemapArgs, RemapDesc, RemapModesArgs, RemapModesDesc};

use super::unsupported_is_skip;
use crate::util::{Ctx, SENTINEL, dev_i32, read_i32, same};
use crate::{Case, CaseResult, SplitMix64};

#[derive(Clone, Copy, Debug)]
struct Params {
    dcp: bool,
    workspace: bool,
    counts: bool,
    compact: bool,
}

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    for (dcp, workspace) in [(true, false), (false, true), (true, true)] {
        for counts in [false, true] {
            for compact in [false, true] {
                let p = Params {
                    dcp,
                    workspace,
                    counts,
                    compact,
                };
                let name = format!(
                    "remap_modes/{}{}{}",
                    match (dcp, workspace) {
                        (true, false) => "dcp",
                        (false, true) => "prefill-workspace",
                        _ => "dcp+prefill-workspace",
                    },
                    if counts { "/counts" } else { "" },
                    if compact { "/compact" } else { "" },
                );
                v.push(Case::seeded(name, move |d: &D, seed| random(d, seed, p)));
            }
        }
    }
    v.push(Case::fixed(
        "remap_modes/fixed/dcp-known-values",
        dcp_known::<D>,
    ));
    v.push(Case::fixed(
        "remap_modes/fixed/workspace-known-values",
        workspace_known::<D>,
    ));
    v.push(Case::fixed(
        "remap_modes/fixed/every-token-on-one-rank",
        every_token_once::<D>,
    ));
}

struct Inputs {
    desc: RemapModesDesc,
    req_id: Vec<i32>,
    table: Vec<i32>,
    topk: Vec<i32>,
    prefill: Option<(Vec<i32>, Vec<i32>)>,
}

const SLACK: usize = 3;

/// Runs `inp` on the reference and the device; returns the device's outputs (rows, counts).
fn run<D: Device>(dev: &D, inp: &Inputs) -> Result<(Vec<i32>, Vec<i32>), crate::CaseError> {
    let d = &inp.desc.remap;
    let tk = d.num_tokens as usize * d.top_k as usize;
    let t = d.num_tokens as usize;
    let mut want_out = vec![SENTINEL; tk + SLACK];
    let mut want_counts = vec![SENTINEL; t + SLACK];
    reference(
        &inp.desc,
        RemapModesArgs {
            remap: RemapArgs {
                req_id: &inp.req_id[..],
                block_table: &inp.table[..],
                topk: &inp.topk[..],
                idx_mapping: None,
                out: &mut want_out[..],
                counts: d.write_counts.then_some(&mut want_counts[..]),
                stats: None,
            },
            prefill_req_id: inp.prefill.as_ref().map(|p| &p.0[..]),
            workspace_starts: inp.prefill.as_ref().map(|p| &p.1[..]),
        },
    )
    .ctx("reference remap_modes")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let req = dev_i32(dev, &inp.req_id)?;
    let table = dev_i32(dev, &inp.table)?;
    let topk = dev_i32(dev, &inp.topk)?;
    let prefill = match &inp.prefill {
        Some((ids, starts)) => Some((dev_i32(dev, ids)?, dev_i32(dev, starts)?)),
        None => None,
    };
    let mut out = dev_i32(dev, &vec![SENTINEL; tk + SLACK])?;
    let mut counts = dev_i32(dev, &vec![SENTINEL; t + SLACK])?;
    let r = dev.remap_modes(
        &s,
        &inp.desc,
        RemapModesArgs {
            remap: RemapArgs {
                req_id: &req,
                block_table: &table,
                topk: &topk,
                idx_mapping: None,
                out: &mut out,
                counts: d.write_counts.then_some(&mut counts),
                stats: None,
            },
            prefill_req_id: prefill.as_ref().map(|p| &p.0),
            workspace_starts: prefill.as_ref().map(|p| &p.1),
        },
    );
    unsupported_is_skip(r, "remap_modes")?;
    dev.synchronize(&s).ctx("synchronize")?;
    let got_out = read_i32(dev, &out, tk + SLACK)?;
    let got_counts = read_i32(dev, &counts, t + SLACK)?;
    same("out", &got_out, &want_out)?;
    same("counts", &got_counts, &want_counts)?;
    Ok((got_out, got_counts))
}

fn random<D: Device>(dev: &D, seed: u64, p: Params) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let num_tokens = rng.u32_in(1, 9);
    let top_k = rng.pick(&[1u32, 7, 64, 512, 2048]);
    let block_size = rng.pick(&[1u32, 16, 64]);
    let max_blocks = rng.u32_in(1, 40);
    let table_rows = rng.u32_in(1, 5);
    let dcp = p.dcp.then(|| {
        let size = rng.pick(&[1u32, 2, 3, 4, 8]);
        DcpSplit {
            size,
            rank: rng.u32_in(0, size),
            interleave: rng.pick(&[1u32, 2, 16, 64]),
        }
    });
    let prefills = rng.u32_in(1, 4);
    let desc = RemapModesDesc {
        remap: RemapDesc {
            num_tokens,
            top_k,
            table_rows,
            max_blocks,
            block_size,
            block_stride_rows: block_size + rng.pick(&[0u32, 0, 3]),
            idx_mapping_len: None,
            write_counts: p.counts,
            compact: p.compact,
            stats_slot: 0,
        },
        dcp,
        prefill_requests: p.workspace.then_some(prefills),
    };
    let table: Vec<i32> = (0..table_rows * max_blocks)
        .map(|_| match rng.below(100) {
            0..8 => -1,
            8..10 => rng.i32_in(i32::MIN, -1),
            10..11 => rng.i32_in(i32::MAX / 2, i32::MAX),
            _ => rng.i32_in(0, 4096),
        })
        .collect();
    let req_id: Vec<i32> = (0..num_tokens)
        .map(|_| {
            if rng.percent(10) {
                rng.pick(&[-1, table_rows as i32, i32::MIN])
            } else {
                rng.i32_in(0, table_rows as i32)
            }
        })
        .collect();
    // Tokens span the global context: on a split, `size` times the local blocks.
    let ranks = dcp.map_or(1, |d| d.size) as i32;
    let span = (max_blocks * block_size) as i32 * ranks;
    let topk: Vec<i32> = (0..num_tokens * top_k)
        .map(|_| match rng.below(100) {
            0..75 => rng.i32_in(0, span),
            75..83 => -1,
            83..87 => rng.i32_in(i32::MIN, 0),
            87..95 => rng.i32_in(span, span.saturating_mul(2).max(span + 1)),
            _ => rng.i32_in(i32::MAX - 8, i32::MAX) + 1,
        })
        .collect();
    let prefill = p.workspace.then(|| {
        let ids = (0..num_tokens)
            .map(|_| match rng.below(10) {
                0..4 => -1,
                4 => rng.pick(&[prefills as i32, i32::MAX, i32::MIN]),
                _ => rng.i32_in(0, prefills as i32),
            })
            .collect();
        let starts = (0..prefills)
            .map(|_| match rng.below(10) {
                0 => rng.i32_in(i32::MIN, 0),
                1 => rng.i32_in(i32::MAX - 1000, i32::MAX),
                _ => rng.i32_in(0, 1 << 20),
            })
            .collect();
        (ids, starts)
    });
    run(
        dev,
        &Inputs {
            desc,
            req_id,
            table,
            topk,
            prefill,
        },
    )
    .map(|_| ())
}

fn small(dcp: Option<DcpSplit>, prefill_requests: Option<u32>, num_tokens: u32) -> RemapModesDesc {
    RemapModesDesc {
        remap: RemapDesc {
            num_tokens,
            top_k: 4,
            table_rows: 1,
            max_blocks: 2,
            block_size: 4,
            block_stride_rows: 10,
            idx_mapping_len: None,
            write_counts: true,
            compact: false,
            stats_slot: 0,
        },
        dcp,
        prefill_requests,
    }
}

/// Hand-computed: rank 1 of 2, interleave 2: tokens 2, 3, 6, 7, 10, … are this rank's, at local
/// indices 0, 1, 2, 3, 4, …; the local block table is `[3, 5]` (4 rows per block, stride 10).
fn dcp_known<D: Device>(dev: &D) -> CaseResult {
    let split = DcpSplit {
        size: 2,
        rank: 1,
        interleave: 2,
    };
    let inp = Inputs {
        desc: small(Some(split), None, 2),
        req_id: vec![0, 0],
        table: vec![3, 5],
        topk: vec![2, 3, 6, 0, 10, 11, 14, -1],
        prefill: None,
    };
    let (out, counts) = run(dev, &inp)?;
    // 2 → local 0 → 30; 3 → 31; 6 → local 2 → 32; 0 is rank 0's; 10 → local 4 → block 1 → 50;
    // 11 → 51; 14 → local 6 → 52.
    same("out", &out[..8], &[30, 31, 32, -1, 50, 51, 52, -1])?;
    same("counts", &counts[..2], &[3, 3])
}

/// Hand-computed: prefill request 1's workspace starts at row 500; a decode row beside it.
fn workspace_known<D: Device>(dev: &D) -> CaseResult {
    let inp = Inputs {
        desc: small(None, Some(2), 2),
        req_id: vec![0, 0],
        table: vec![3, 5],
        topk: vec![0, 5, -1, 7, 0, 5, -1, 7],
        prefill: Some((vec![-1, 1], vec![100, 500])),
    };
    let (out, counts) = run(dev, &inp)?;
    same("out", &out[..8], &[30, 51, -1, 53, 500, 505, -1, 507])?;
    same("counts", &counts[..2], &[3, 3])
}

/// Over every rank of a split, each token of the global context comes out valid on exactly one
/// rank.
fn every_token_once<D: Device>(dev: &D) -> CaseResult {
    let (size, interleave, block) = (3u32, 2u32, 4u32);
    let tokens: Vec<i32> = (0..24).collect();
    let mut valid = vec![0u32; tokens.len()];
    for rank in 0..size {
        let inp = Inputs {
            desc: RemapModesDesc {
                remap: RemapDesc {
                    top_k: 24,
                    max_blocks: 2,
                    block_size: block,
                    block_stride_rows: block,
                    ..small(None, None, 1).remap
                },
                dcp: Some(DcpSplit {
                    size,
                    rank,
                    interleave,
                }),
                prefill_requests: None,
            },
            req_id: vec![0],
            table: vec![0, 1],
            topk: tokens.clone(),
            prefill: None,
        };
        let (out, _) = run(dev, &inp)?;
        for (j, &o) in out[..24].iter().enumerate() {
            if o != -1 {
                valid[j] += 1;
            }
        }
    }
    same("ranks holding each token", &valid, &[1; 24])
}
