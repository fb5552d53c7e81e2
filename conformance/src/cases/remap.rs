//! Index remap (contract §5.1): random inputs over K = 512, 2048 and 2176, with and without counts,
//! compaction, `idx_mapping` and a block stride above the block size; with a stats buffer
//! (`hisparse_core::ops::stats`) at K = 512 and 2176; fixed adversarial inputs.

use hisparse_core::Device;
use hisparse_core::ops::remap::remap as reference;
use hisparse_core::ops::{RemapArgs, RemapDesc};

use super::resolve_io::{STATS_SLOTS, initial_stats};
use crate::util::{Ctx, SENTINEL, dev_i32, read_i32, same};
use crate::{Case, CaseResult, SplitMix64};

#[derive(Clone, Copy, Debug)]
struct Params {
    k: u32,
    counts: bool,
    compact: bool,
    mapping: bool,
    wide_stride: bool,
    /// The call adds to a stats buffer.
    stats: bool,
}

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    for k in [512u32, 2048, 2176] {
        for counts in [false, true] {
            for compact in [false, true] {
                for mapping in [false, true] {
                    for wide_stride in [false, true] {
                        let p = Params {
                            k,
                            counts,
                            compact,
                            mapping,
                            wide_stride,
                            stats: false,
                        };
                        let name = format!(
                            "remap/k{k}{}{}{}{}",
                            if counts { "/counts" } else { "" },
                            if compact { "/compact" } else { "" },
                            if mapping { "/idx_mapping" } else { "" },
                            if wide_stride { "/stride" } else { "" },
                        );
                        v.push(Case::seeded(name, move |d: &D, seed| random(d, seed, p)));
                    }
                }
            }
        }
    }
    for k in [512u32, 2176] {
        for counts in [false, true] {
            for compact in [false, true] {
                let p = Params {
                    k,
                    counts,
                    compact,
                    mapping: true,
                    wide_stride: false,
                    stats: true,
                };
                let name = format!(
                    "remap/k{k}/stats{}{}",
                    if counts { "/counts" } else { "" },
                    if compact { "/compact" } else { "" },
                );
                v.push(Case::seeded(name, move |d: &D, seed| random(d, seed, p)));
            }
        }
    }
    v.push(Case::fixed("remap/fixed/known-values", known_values::<D>));
    v.push(Case::fixed("remap/fixed/bounds", bounds::<D>));
    v.push(Case::fixed("remap/fixed/padding-rows", padding_rows::<D>));
    v.push(Case::fixed("remap/fixed/empty-batch", empty_batch::<D>));
}

/// Inputs of one remap call, kept on the host.
struct Inputs {
    desc: RemapDesc,
    req_id: Vec<i32>,
    table: Vec<i32>,
    topk: Vec<i32>,
    mapping: Option<Vec<i32>>,
    /// The stats words before the call (`desc.stats_slot` names the slot it adds to), when it
    /// is given a stats buffer.
    stats: Option<Vec<i32>>,
}

/// Output slack: entries past the end of each output that must stay untouched.
const SLACK: usize = 5;

/// Runs `inp` on the device and on the reference; compares outputs including the slack.
fn check<D: Device>(dev: &D, inp: &Inputs) -> CaseResult {
    let d = &inp.desc;
    let tk = d.num_tokens as usize * d.top_k as usize;
    let t = d.num_tokens as usize;
    let mut want_out = vec![SENTINEL; tk + SLACK];
    let mut want_counts = vec![SENTINEL; t + SLACK];
    let mut want_stats = inp.stats.clone();
    reference(
        d,
        RemapArgs {
            req_id: &inp.req_id[..],
            block_table: &inp.table[..],
            topk: &inp.topk[..],
            idx_mapping: inp.mapping.as_deref(),
            out: &mut want_out[..],
            counts: d.write_counts.then_some(&mut want_counts[..]),
            stats: want_stats.as_deref_mut(),
        },
    )
    .ctx("reference remap")?;

    let s = dev.create_stream().ctx("create_stream")?;
    let req = dev_i32(dev, &inp.req_id)?;
    let table = dev_i32(dev, &inp.table)?;
    let topk = dev_i32(dev, &inp.topk)?;
    let mapping = match &inp.mapping {
        Some(m) => Some(dev_i32(dev, m)?),
        None => None,
    };
    let mut out = dev_i32(dev, &vec![SENTINEL; tk + SLACK])?;
    let mut counts = dev_i32(dev, &vec![SENTINEL; t + SLACK])?;
    let mut stats = inp.stats.as_ref().map(|w| dev_i32(dev, w)).transpose()?;
    dev.remap(
        &s,
        d,
        RemapArgs {
            req_id: &req,
            block_table: &table,
            topk: &topk,
            idx_mapping: mapping.as_ref(),
            out: &mut out,
            counts: d.write_counts.then_some(&mut counts),
            stats: stats.as_mut(),
        },
    )
    .ctx("remap")?;
    dev.synchronize(&s).ctx("synchronize")?;
    same("out", &read_i32(dev, &out, tk + SLACK)?, &want_out)?;
    same("counts", &read_i32(dev, &counts, t + SLACK)?, &want_counts)?;
    if let (Some(got), Some(want)) = (&stats, &want_stats) {
        same("stats", &read_i32(dev, got, want.len())?, want)?;
    }
    Ok(())
}

/// A random token position: mostly valid, with `-1`, negatives, positions at and past the end
/// of the block table, and values near `i32::MAX`.
fn token(rng: &mut SplitMix64, span: i32) -> i32 {
    match rng.below(100) {
        0..70 => rng.i32_in(0, span),
        70..78 => -1,
        78..83 => rng.i32_in(i32::MIN, 0),
        83..93 => rng.i32_in(span - 2, span + 3).max(0),
        93..97 => rng.i32_in(span, span.saturating_mul(4).max(span + 1)),
        _ => rng.i32_in(i32::MAX - 4, i32::MAX) + 1,
    }
}

fn random<D: Device>(dev: &D, seed: u64, p: Params) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let num_tokens = rng.u32_in(1, 9);
    let block_size = rng.pick(&[1u32, 16, 64, 256]);
    let max_blocks = rng.u32_in(1, 48);
    let table_rows = rng.u32_in(1, 5);
    let block_stride_rows = if p.wide_stride {
        block_size + rng.u32_in(1, 3 * block_size + 1)
    } else {
        block_size
    };
    let map_len = table_rows + 2;
    let desc = RemapDesc {
        num_tokens,
        top_k: p.k,
        table_rows,
        max_blocks,
        block_size,
        block_stride_rows,
        idx_mapping_len: p.mapping.then_some(map_len),
        write_counts: p.counts,
        compact: p.compact,
        stats_slot: 0,
    };
    let table: Vec<i32> = (0..table_rows * max_blocks)
        .map(|_| match rng.below(100) {
            0..8 => -1,
            8..10 => rng.i32_in(i32::MIN, -1),
            10..11 => rng.i32_in(i32::MAX / 2, i32::MAX),
            _ => rng.i32_in(0, 4096),
        })
        .collect();
    let mapping: Vec<i32> = (0..map_len)
        .map(|_| rng.i32_in(-1, table_rows as i32 + 1))
        .collect();
    let id_bound = if p.mapping { map_len } else { table_rows } as i32;
    let req_id: Vec<i32> = (0..num_tokens)
        .map(|_| {
            if rng.percent(15) {
                rng.pick(&[-1, id_bound, id_bound + 7, i32::MIN, i32::MAX])
            } else {
                rng.i32_in(0, id_bound)
            }
        })
        .collect();
    let span = (max_blocks * block_size) as i32;
    let topk: Vec<i32> = (0..num_tokens * p.k)
        .map(|_| token(&mut rng, span))
        .collect();
    // Drawn last, so the cases without stats keep their inputs.
    let (desc, stats) = if p.stats {
        let slot = rng.u32_in(0, STATS_SLOTS);
        let desc = RemapDesc {
            stats_slot: slot,
            ..desc
        };
        (desc, Some(initial_stats(&mut rng)))
    } else {
        (desc, None)
    };
    check(
        dev,
        &Inputs {
            desc,
            req_id,
            table,
            topk,
            mapping: p.mapping.then_some(mapping),
            stats,
        },
    )
}

fn small_desc() -> RemapDesc {
    RemapDesc {
        num_tokens: 2,
        top_k: 4,
        table_rows: 2,
        max_blocks: 2,
        block_size: 4,
        block_stride_rows: 10,
        idx_mapping_len: None,
        write_counts: true,
        compact: false,
        stats_slot: 0,
    }
}

/// Hand-computed outputs, independent of the reference.
fn known_values<D: Device>(dev: &D) -> CaseResult {
    let desc = small_desc();
    let s = dev.create_stream().ctx("create_stream")?;
    let req = dev_i32(dev, &[0, 1])?;
    let table = dev_i32(dev, &[3, 5, 7, -1])?;
    let topk = dev_i32(dev, &[0, 5, -1, 8, 1, 4, 2, 3])?;
    let mut out = dev_i32(dev, &[SENTINEL; 8])?;
    let mut counts = dev_i32(dev, &[SENTINEL; 2])?;
    dev.remap(
        &s,
        &desc,
        RemapArgs {
            req_id: &req,
            block_table: &table,
            topk: &topk,
            idx_mapping: None,
            out: &mut out,
            counts: Some(&mut counts),
            stats: None,
        },
    )
    .ctx("remap")?;
    // tok 0 -> 3*10+0; tok 5 -> 5*10+1; -1; tok 8 -> block 2 beyond the table;
    // tok 1 -> 7*10+1; tok 4 -> block -1; tok 2 -> 72; tok 3 -> 73.
    same(
        "out",
        &read_i32(dev, &out, 8)?,
        &[30, 51, -1, -1, 71, -1, 72, 73],
    )?;
    same("counts", &read_i32(dev, &counts, 2)?, &[2, 3])?;

    // Compacted, through idx_mapping: request 2 maps to -1 (padding), request 0 to row 1.
    let compact = RemapDesc {
        idx_mapping_len: Some(3),
        compact: true,
        ..desc
    };
    let req = dev_i32(dev, &[2, 0])?;
    let table = dev_i32(dev, &[3, 5, 7, 9])?;
    let topk = dev_i32(dev, &[-1, 5, -7, 0, 3, -1, 2, 1])?;
    let map = dev_i32(dev, &[1, 0, -1])?;
    dev.remap(
        &s,
        &compact,
        RemapArgs {
            req_id: &req,
            block_table: &table,
            topk: &topk,
            idx_mapping: Some(&map),
            out: &mut out,
            counts: Some(&mut counts),
            stats: None,
        },
    )
    .ctx("remap (compact)")?;
    same(
        "compact out",
        &read_i32(dev, &out, 8)?,
        &[-1, -1, -1, -1, 73, 72, 71, -1],
    )?;
    same("compact counts", &read_i32(dev, &counts, 2)?, &[0, 3])
}

/// Tokens exactly at and past the table's end, extreme values, negative and huge blocks.
fn bounds<D: Device>(dev: &D) -> CaseResult {
    let desc = RemapDesc {
        num_tokens: 3,
        top_k: 12,
        table_rows: 2,
        max_blocks: 3,
        block_size: 64,
        block_stride_rows: 1 << 16,
        idx_mapping_len: None,
        write_counts: true,
        compact: false,
        stats_slot: 0,
    };
    let span = 3 * 64;
    let row = [
        0,
        63,
        64,
        span - 1,
        span,
        span + 1,
        -1,
        -2,
        i32::MIN,
        i32::MAX,
        i32::MAX - 63,
        128,
    ];
    let mut topk = Vec::new();
    for _ in 0..3 {
        topk.extend_from_slice(&row);
    }
    // Row 0: ordinary blocks. Row 1: a negative block, a block whose physical row overflows
    // i32 (32768 * 65536), and block 0.
    let table = vec![1, 2, 3, -5, 32768, 0];
    let inp = Inputs {
        desc,
        req_id: vec![0, 1, 0],
        table,
        topk,
        mapping: None,
        stats: None,
    };
    check(dev, &inp)?;
    check(
        dev,
        &Inputs {
            desc: RemapDesc {
                compact: true,
                ..desc
            },
            ..inp
        },
    )
}

/// Request ids and mapped rows that are negative or out of range make the whole row padding.
fn padding_rows<D: Device>(dev: &D) -> CaseResult {
    let desc = RemapDesc {
        num_tokens: 8,
        top_k: 4,
        table_rows: 2,
        max_blocks: 2,
        block_size: 4,
        block_stride_rows: 4,
        idx_mapping_len: Some(4),
        write_counts: true,
        compact: false,
        stats_slot: 0,
    };
    let inp = Inputs {
        desc,
        // ids: valid, -1, past the mapping, i32::MIN, i32::MAX, maps to -1, maps past the table,
        // valid.
        req_id: vec![0, -1, 4, i32::MIN, i32::MAX, 2, 3, 1],
        table: vec![1, 2, 3, 4],
        topk: (0..32).map(|i| i % 8).collect(),
        mapping: Some(vec![1, 0, -1, 2]),
        stats: None,
    };
    check(dev, &inp)?;
    check(
        dev,
        &Inputs {
            desc: RemapDesc {
                idx_mapping_len: None,
                ..desc
            },
            mapping: None,
            ..inp
        },
    )
}

fn empty_batch<D: Device>(dev: &D) -> CaseResult {
    for compact in [false, true] {
        check(
            dev,
            &Inputs {
                desc: RemapDesc {
                    num_tokens: 0,
                    compact,
                    ..small_desc()
                },
                req_id: vec![],
                table: vec![1, 2, 3, 4],
                topk: vec![],
                mapping: None,
                stats: None,
            },
        )?;
    }
    Ok(())
}
