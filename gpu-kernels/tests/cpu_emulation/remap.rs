//! Remaps (`hs_remap`, `hs_remap_modes`) against the reference.

use super::*;

/// Remaps drawn per seed and mode.
pub(crate) const REMAPS_PER_SEED: usize = 8;

/// A random remap through `hs_remap`, or with `modes` through `hs_remap_modes`: a
/// decode-context-parallel split (1 to 4 ranks, interleave 1 to 3), a prefill workspace (rows of
/// prefill requests, decode rows, requests beyond the workspace, negative starts, starts near
/// `i32::MAX`), or both.
pub(crate) fn check_remap(emu: &Emu, rng: &mut SplitMix64, modes: bool) -> Result<(), String> {
    // Now and then more rows than a small device holds at once (two vectors per thread).
    let t = if rng.percent(15) {
        rng.range_inclusive(33, 40)
    } else {
        rng.range_inclusive(0, 5)
    } as u32;
    let k = *[1u32, 3, 8, 64, 130, 2048, 2052]
        .get(rng.below(7) as usize)
        .unwrap_or(&8);
    let bs = *[1u32, 4, 5, 16, 64]
        .get(rng.below(5) as usize)
        .unwrap_or(&4);
    let m = if rng.percent(20) {
        4100
    } else {
        rng.range_inclusive(1, 40) as u32
    };
    let rows = rng.range_inclusive(1, 6) as u32;
    let stride = bs + rng.below(3) as u32 * if rng.percent(10) { 1 << 20 } else { 1 };
    let map_len = rng.percent(40).then(|| rng.range_inclusive(1, 8) as u32);
    let desc = RemapDesc {
        num_tokens: t,
        top_k: k,
        table_rows: rows,
        max_blocks: m,
        block_size: bs,
        block_stride_rows: stride,
        idx_mapping_len: map_len,
        write_counts: rng.percent(60),
        compact: rng.percent(40),
        stats_slot: 0,
    };
    let (mut want_stats, stats_slot) = maybe_stats(rng, 50);
    let mut got_stats = want_stats.clone();
    let desc = RemapDesc { stats_slot, ..desc };
    let (dcp, prefill_requests) = if modes {
        let which = rng.below(3);
        let size = rng.range_inclusive(1, 4) as u32;
        let dcp = (which != 1).then(|| DcpSplit {
            size,
            rank: rng.below(u64::from(size)) as u32,
            interleave: rng.range_inclusive(1, 3) as u32,
        });
        (dcp, (which != 0).then(|| rng.range_inclusive(1, 3) as u32))
    } else {
        (None, None)
    };
    let spread = dcp.map_or(1, |d| d.size * d.interleave);
    let req: Vec<i32> = (0..t)
        .map(|_| rng.range_inclusive(-1, rows as i64) as i32)
        .collect();
    let table: Vec<i32> = (0..rows * m)
        .map(|_| {
            if rng.percent(10) {
                -1
            } else {
                rng.range_inclusive(0, 5000) as i32
            }
        })
        .collect();
    let topk: Vec<i32> = (0..t * k)
        .map(|_| {
            if rng.percent(10) {
                -rng.range_inclusive(1, 9) as i32
            } else {
                rng.range_inclusive(0, i64::from(m * bs * spread) + 10) as i32
            }
        })
        .collect();
    let map: Vec<i32> = (0..map_len.unwrap_or(1))
        .map(|_| rng.range_inclusive(-1, rows as i64) as i32)
        .collect();
    let p = prefill_requests.unwrap_or(1);
    let prefill: Vec<i32> = (0..t.max(1))
        .map(|_| match rng.below(4) {
            0 => -1,
            1 => rng.range_inclusive(0, i64::from(p) + 2) as i32,
            _ => rng.below(u64::from(p)) as i32,
        })
        .collect();
    let starts: Vec<i32> = (0..p)
        .map(|_| match rng.below(5) {
            0 => -rng.range_inclusive(1, 3) as i32,
            1 => i32::MAX - rng.range_inclusive(0, 40) as i32,
            _ => rng.range_inclusive(0, 1 << 20) as i32,
        })
        .collect();
    let mdesc = RemapModesDesc {
        remap: desc,
        dcp,
        prefill_requests,
    };
    let mut want = vec![7i32; (t * k) as usize];
    let mut want_c = vec![7i32; t as usize];
    let remap_args = RemapArgs {
        req_id: &req[..],
        block_table: &table[..],
        topk: &topk[..],
        idx_mapping: map_len.map(|_| &map[..]),
        out: &mut want[..],
        counts: desc.write_counts.then_some(&mut want_c[..]),
        stats: want_stats.as_deref_mut(),
    };
    if modes {
        remap_modes(
            &mdesc,
            RemapModesArgs {
                remap: remap_args,
                prefill_req_id: prefill_requests.map(|_| &prefill[..t as usize]),
                workspace_starts: prefill_requests.map(|_| &starts[..]),
            },
        )
    } else {
        remap(&desc, remap_args)
    }
    .map_err(|e| e.to_string())?;
    let mut got = vec![7i32; (t * k) as usize];
    let mut got_c = vec![7i32; t as usize];
    let addrs = plan::RemapAddrs {
        req_id: a(&req),
        block_table: a(&table),
        topk: a(&topk),
        idx_mapping: if map_len.is_some() { a(&map) } else { 0 },
        out: am(&mut got),
        counts: if desc.write_counts { am(&mut got_c) } else { 0 },
        stats: am_opt(&mut got_stats),
    };
    // A small device now and then: fewer blocks than rows, each row's inputs loaded one row
    // ahead.
    let tgt = if rng.percent(50) {
        target(1, 48 * 1024)
    } else {
        BIG
    };
    let planned = if modes {
        let addrs = plan::RemapModesAddrs {
            remap: addrs,
            prefill_req_id: if prefill_requests.is_some() {
                a(&prefill)
            } else {
                0
            },
            workspace_starts: if prefill_requests.is_some() {
                a(&starts)
            } else {
                0
            },
        };
        let p = plan::remap_modes(&tgt, &mdesc, &addrs).map_err(|e| e.to_string())?;
        // (An empty batch without stats launches nothing.)
        if p.launches
            .first()
            .is_some_and(|l| l.kernel != Kernel::RemapModes)
        {
            return Err("a remap with modes must launch hs_remap_modes".into());
        }
        p
    } else if !desc.write_counts && !desc.compact && desc.num_tokens > 0 {
        // A plain remap in the rule's layout or either one forced, so both layouts are checked
        // at every row count (the rule gives each only some).
        let layout = match rng.below(3) {
            0 => plan::remap_layout(&desc),
            1 => plan::RemapLayout::Vectors,
            _ => plan::RemapLayout::Wide,
        };
        plan::remap_as(&tgt, &desc, &addrs, layout).map_err(|e| e.to_string())?
    } else {
        plan::remap(&tgt, &desc, &addrs).map_err(|e| e.to_string())?
    };
    emu.execute(planned);
    if got != want || got_c != want_c {
        return Err(format!("remap differs for {mdesc:?} on {tgt:?}"));
    }
    if got_stats != want_stats {
        return Err(format!(
            "remap stats differ for {mdesc:?} on {tgt:?}\n want {want_stats:?}\n  got {got_stats:?}"
        ));
    }
    Ok(())
}
