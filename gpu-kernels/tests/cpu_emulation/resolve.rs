//! The resolver (`hs_resolve`) and the fused resolve-and-gather (`hs_resolve_gather`) against
//! the reference, over sequences of steps that carry the hot state.

use super::*;

#[allow(clippy::too_many_lines)]
/// How `check_resolve` has the planner launch `hs_resolve`: the shared table capacity the device
/// leaves room for (`None`: a large device), whether the per-request state is forced into the
/// workspace (global-state mode), a fixed `hot_slots` (`None`: random), and the multiprocessors
/// (fewer than rows halves a block's shared memory).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResolveMode {
    pub(crate) smem_table: Option<u32>,
    pub(crate) global: bool,
    pub(crate) hot_slots: Option<u32>,
    pub(crate) multiprocessors: u32,
}

pub(crate) fn check_resolve(
    emu: &Emu,
    rng: &mut SplitMix64,
    mode: ResolveMode,
) -> Result<(), String> {
    let smem_table = mode.smem_table;
    // Mostly short rows (one pass of the kernel's block); sometimes rows longer than one pass.
    let k = if rng.percent(10) {
        rng.range_inclusive(2049, 2200) as u32
    } else {
        rng.range_inclusive(1, 40) as u32
    };
    let bs = rng.range_inclusive(1, 8) as u32;
    let r = rng.range_inclusive(1, 3) as u32;
    let n = if let Some(n) = mode.hot_slots {
        n
    } else if rng.percent(15) {
        // At least top_k (the core refuses fewer slots than a row has entries).
        (rng.range_inclusive(2049, 2600) as u32).max(k)
    } else {
        k * rng.range_inclusive(1, 3) as u32
    };
    let pages = rng.range_inclusive(1, 12) as u32;
    let host_blocks = rng.range_inclusive(1, 40) as u32;
    let stride = bs + rng.below(3) as u32;
    // Half the sequences in batch-row order: `r` batch rows (host and hot tables) over `sr`
    // state rows (resident table, slot_host_rows, LRU), a fresh idx_mapping every step.
    let batch_order = rng.percent(50);
    let sr = if batch_order {
        r + rng.range_inclusive(0, 3) as u32
    } else {
        r
    };
    let desc = ResolveDesc {
        num_tokens: 0,
        top_k: k,
        num_requests: r,
        max_pages: pages,
        block_size: bs,
        hot_slots: n,
        attention_block_stride: stride,
        host_num_blocks: host_blocks,
        num_state_rows: batch_order.then_some(sr),
        stats_slot: 0,
    };
    let resident: Vec<i32> = (0..sr * pages)
        .map(|_| {
            if rng.percent(20) {
                rng.range_inclusive(1, 50) as i32
            } else {
                0
            }
        })
        .collect();
    let host: Vec<i32> = (0..r * pages)
        .map(|_| {
            if rng.percent(8) {
                -1
            } else {
                rng.range_inclusive(0, i64::from(host_blocks) + 3) as i32
            }
        })
        .collect();
    let w = desc.hot_table_width();
    let hot: Vec<i32> = (0..r * w)
        .map(|_| {
            if rng.percent(5) {
                -1
            } else {
                rng.range_inclusive(0, 60) as i32
            }
        })
        .collect();
    let mut slot_host_rows: Vec<i32> = vec![-1; (sr * n) as usize];
    let mut lru: Vec<u16> = (0..sr).flat_map(|_| 0..n as u16).collect();
    if rng.percent(40) {
        for d in slot_host_rows.iter_mut() {
            *d = rng.range_inclusive(-1, i64::from(host_blocks * bs) + 5) as i32;
        }
        for s in lru.iter_mut() {
            if rng.percent(5) {
                *s = rng.range_inclusive(0, i64::from(n) + 2) as u16;
            }
        }
    }
    let (mut gpu_slot_host_rows, mut glru) = (slot_host_rows.clone(), lru.clone());
    // Half the sequences count into a stats buffer, at a random slot each step.
    let (mut stats, _) = maybe_stats(rng, 50);
    let mut gstats = stats.clone();
    let mut fused_in = FusedInputs {
        resident: resident.clone(),
        host: host.clone(),
        hot: hot.clone(),
        slot_host_rows: slot_host_rows.clone(),
        lru: lru.clone(),
        idx_mapping: None,
        stats: stats.clone(),
    };
    for _step in 0..3 {
        // State rows -1..=sr+1: negative, out of range and repeated ones included.
        let map: Option<Vec<i32>> = batch_order.then(|| {
            (0..r)
                .map(|_| rng.range_inclusive(-1, i64::from(sr) + 1) as i32)
                .collect()
        });
        let t = rng.range_inclusive(0, 6) as u32;
        let d = ResolveDesc {
            num_tokens: t,
            stats_slot: rng.below(3) as u32,
            ..desc
        };
        let req: Vec<i32> = (0..t)
            .map(|_| rng.range_inclusive(-1, i64::from(r)) as i32)
            .collect();
        let topk: Vec<i32> = (0..t * k)
            .map(|_| {
                if rng.percent(5) {
                    -1
                } else {
                    rng.range_inclusive(0, i64::from(pages * bs) + 2) as i32
                }
            })
            .collect();
        let tk = (t * k) as usize;
        let (mut ind, mut src, mut dst) = (vec![9; tk], vec![9; tk], vec![9; tk]);
        let (mut vc, mut hc, mut mc) = (
            vec![9; t as usize],
            vec![9; t as usize],
            vec![9; t as usize],
        );
        resolve(
            &d,
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
                idx_mapping: map.as_deref(),
                stats: stats.as_deref_mut(),
            },
        )
        .map_err(|e| e.to_string())?;
        if t == 0 && stats.is_none() {
            continue;
        }
        let (mut gind, mut gsrc, mut gdst) = (vec![9; tk], vec![9; tk], vec![9; tk]);
        let (mut gvc, mut ghc, mut gmc) = (
            vec![9; t as usize],
            vec![9; t as usize],
            vec![9; t as usize],
        );
        // The device the planner sizes for: room for everything, or exactly enough shared memory
        // for a table of `x` entries (beside the state, unless global-state mode).
        let tgt = match smem_table {
            None => BIG,
            Some(x) => {
                let state = if mode.global {
                    gk::resolve_global_shared_bytes(0)
                } else {
                    gk::resolve_shared_bytes(n, 0)
                };
                target(
                    mode.multiprocessors,
                    gk::RESOLVE_STATIC_SHARED_BYTES + state + 16 * u64::from(x) + 8,
                )
            }
        };
        let shape = plan::resolve_shape(&tgt, &d, mode.global);
        // (With more rows than multiprocessors a block gets half as much: smaller tables.)
        if let Some(x) = smem_table.filter(|_| t <= tgt.multiprocessors) {
            let biggest = gk::resolve_table_goal(t, k) as u32;
            let want = if x >= 16 { x.min(biggest) } else { 0 };
            if shape.shared_table != want {
                return Err(format!(
                    "shared table {} instead of {want} ({mode:?})",
                    shape.shared_table
                ));
            }
        }
        let addrs = plan::ResolveAddrs {
            req_id: a(&req),
            topk: a(&topk),
            resident_table: a(&resident),
            host_table: a(&host),
            hot_table: a(&hot),
            slot_host_rows: am(&mut gpu_slot_host_rows),
            lru: am(&mut glru),
            indices: am(&mut gind),
            valid_counts: am(&mut gvc),
            hit_counts: am(&mut ghc),
            miss_counts: am(&mut gmc),
            miss_src: am(&mut gsrc),
            miss_dst: am(&mut gdst),
            idx_mapping: map.as_deref().map(a),
            stats: gstats.as_deref_mut().map(am),
        };
        let planned = plan::resolve(&tgt, &d, &addrs, mode.global).map_err(|e| e.to_string())?;
        let ws_entries = planned.workspace_bytes / 16;
        let counter = emu.execute(planned);
        check_counter(counter, ws_entries, &format!("resolve ({mode:?}, {d:?})"))?;
        for (name, a, b) in [
            ("indices", &ind, &gind),
            ("miss_src", &src, &gsrc),
            ("miss_dst", &dst, &gdst),
            ("valid_counts", &vc, &gvc),
            ("hit_counts", &hc, &ghc),
            ("miss_counts", &mc, &gmc),
            ("slot_host_rows", &slot_host_rows, &gpu_slot_host_rows),
        ] {
            if a != b {
                return Err(format!(
                    "resolve {name} differs ({shape:?}, {mode:?}) for {d:?} req {req:?} map {map:?}\n want {a:?}\n  got {b:?}"
                ));
            }
        }
        if lru != glru {
            return Err(format!("resolve lru differs ({mode:?}) for {d:?}"));
        }
        if stats != gstats {
            return Err(format!(
                "resolve stats differ ({mode:?}) for {d:?} req {req:?}\n want {stats:?}\n  got {gstats:?}"
            ));
        }
        if t == 0 {
            // Nothing to gather (plan::resolve_gather plans the same launch).
            fused_in.stats.clone_from(&stats);
            continue;
        }
        fused_in.idx_mapping.clone_from(&map);
        fused_step(
            emu,
            rng,
            &tgt,
            mode,
            &d,
            &fused_in,
            &req,
            &topk,
            (&ind, &vc, &hc, &mc, &src, &dst),
            (&slot_host_rows, &lru, &stats),
        )?;
        fused_in.slot_host_rows.clone_from(&slot_host_rows);
        fused_in.lru.clone_from(&lru);
        fused_in.stats.clone_from(&stats);
    }
    Ok(())
}

/// The inputs of a resolve step that stay the same for the fused launch.
pub(crate) struct FusedInputs {
    resident: Vec<i32>,
    host: Vec<i32>,
    hot: Vec<i32>,
    slot_host_rows: Vec<i32>,
    lru: Vec<u16>,
    /// The step's idx_mapping in batch-row order.
    idx_mapping: Option<Vec<i32>>,
    /// The stats words before the step, when the sequence counts.
    stats: Option<Vec<i32>>,
}

pub(crate) type ResolveOuts<'a> = (
    &'a Vec<i32>,
    &'a Vec<i32>,
    &'a Vec<i32>,
    &'a Vec<i32>,
    &'a Vec<i32>,
    &'a Vec<i32>,
);

/// The same step through `hs_resolve_gather` (plan::resolve_gather) from the state before it:
/// every resolve output must equal the reference's (`want`, `want_state`), and the device pool
/// must equal the reference gather of the reference's miss plan, over 1 to 3 layers (17 now and
/// then, so one gather launch follows the fused one).
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_step(
    emu: &Emu,
    rng: &mut SplitMix64,
    tgt: &Target,
    mode: ResolveMode,
    d: &ResolveDesc,
    before: &FusedInputs,
    req: &[i32],
    topk: &[i32],
    want: ResolveOuts<'_>,
    want_state: (&Vec<i32>, &Vec<u16>, &Option<Vec<i32>>),
) -> Result<(), String> {
    let (ind, vc, hc, mc, src, dst) = want;
    let nl = if rng.percent(10) {
        17
    } else {
        rng.range_inclusive(1, 3) as u32
    };
    let k = d.top_k;
    // 16-byte rows (contiguous or split), or rows with 8- and 4-byte scale words, pages padded.
    // The host pool holds every flat row the resolve may name, the device pool (62 blocks) every
    // hot row.
    let (row, value, align) = if rng.percent(60) {
        let row = 16 * rng.range_inclusive(1, 3) as u32;
        let split = row > 16 && rng.percent(30);
        (row, if split { row - 16 } else { row }, 16)
    } else {
        WORD_GEOMETRIES[rng.below(WORD_GEOMETRIES.len() as u64) as usize]
    };
    let split = row != value;
    let host_page = u64::from(d.block_size * row).next_multiple_of(align);
    let device_block = u64::from(d.attention_block_stride * row).next_multiple_of(align);
    let host_layer = u64::from(d.host_num_blocks) * host_page;
    let device_layer = 62 * device_block;
    let layers: Vec<LayerPair> = (0..nl)
        .map(|l| LayerPair {
            host: PageLayout {
                base: u64::from(l) * host_layer,
                block_stride: host_page,
                num_blocks: d.host_num_blocks,
                block_size: d.block_size,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows: d.block_size,
            },
            device: PageLayout {
                base: u64::from(l) * device_layer,
                block_stride: device_block,
                num_blocks: 62,
                block_size: d.block_size,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows: d.attention_block_stride,
            },
        })
        .collect();
    let host_pool = fill(rng, (u64::from(nl) * host_layer) as usize);
    let dev0 = fill(rng, (u64::from(nl) * device_layer) as usize);
    let mut want_dev = dev0.clone();
    gather_rows(
        &GatherDesc {
            num_tokens: d.num_tokens,
            top_k: k,
            layers: &layers,
        },
        GatherArgs {
            plan_src: src,
            plan_dst: dst,
            plan_counts: mc,
            host: &host_pool,
            device: &mut want_dev,
        },
    )
    .map_err(|e| e.to_string())?;
    let tk = (d.num_tokens * k) as usize;
    let t = d.num_tokens as usize;
    let (mut gpu_slot_host_rows, mut glru) = (before.slot_host_rows.clone(), before.lru.clone());
    let (mut gind, mut gsrc, mut gdst) = (vec![9; tk], vec![9; tk], vec![9; tk]);
    let (mut gvc, mut ghc, mut gmc) = (vec![9; t], vec![9; t], vec![9; t]);
    let mut gstats = before.stats.clone();
    let mut gdev = dev0;
    let addrs = plan::ResolveAddrs {
        req_id: a(req),
        topk: a(topk),
        resident_table: a(&before.resident),
        host_table: a(&before.host),
        hot_table: a(&before.hot),
        slot_host_rows: am(&mut gpu_slot_host_rows),
        lru: am(&mut glru),
        indices: am(&mut gind),
        valid_counts: am(&mut gvc),
        hit_counts: am(&mut ghc),
        miss_counts: am(&mut gmc),
        miss_src: am(&mut gsrc),
        miss_dst: am(&mut gdst),
        idx_mapping: before.idx_mapping.as_deref().map(a),
        stats: gstats.as_deref_mut().map(am),
    };
    let planned = plan::resolve_gather(
        tgt,
        d,
        &addrs,
        &layers,
        a(&host_pool),
        am(&mut gdev),
        mode.global,
    )
    .map_err(|e| e.to_string())?;
    if planned.launches.first().map(|l| l.kernel) != Some(Kernel::ResolveGather) {
        return Err("the fused plan does not start with hs_resolve_gather".into());
    }
    let ws_entries = planned.workspace_bytes / 16;
    let counter = emu.execute(planned);
    check_counter(
        counter,
        ws_entries,
        &format!("resolve_gather ({mode:?}, {d:?})"),
    )?;
    for (name, w, g) in [
        ("indices", ind, &gind),
        ("miss_src", src, &gsrc),
        ("miss_dst", dst, &gdst),
        ("valid_counts", vc, &gvc),
        ("hit_counts", hc, &ghc),
        ("miss_counts", mc, &gmc),
        ("slot_host_rows", want_state.0, &gpu_slot_host_rows),
    ] {
        if w != g {
            return Err(format!(
                "resolve_gather {name} differs ({mode:?}) for {d:?}"
            ));
        }
    }
    if *want_state.1 != glru {
        return Err(format!("resolve_gather lru differs ({mode:?}) for {d:?}"));
    }
    if *want_state.2 != gstats {
        return Err(format!("resolve_gather stats differ ({mode:?}) for {d:?}"));
    }
    // Plan destinations of different requests may coincide here (random hot tables share
    // blocks; real ones never do): which source lands there is unspecified, so those rows are
    // not compared.
    let mut seen = std::collections::HashMap::new();
    for (ti, &m) in mc.iter().enumerate() {
        for &row in &dst[ti * k as usize..ti * k as usize + m.max(0) as usize] {
            *seen.entry(row).or_insert(0u32) += 1;
        }
    }
    for (&row, _) in seen.iter().filter(|&(_, &n)| n > 1) {
        for l in &layers {
            if let Some((b, o)) = l.device.locate(i64::from(row)) {
                for (at, len) in l.device.row_parts(b, o) {
                    let r = at as usize..(at + len) as usize;
                    gdev[r.clone()].copy_from_slice(&want_dev[r]);
                }
            }
        }
    }
    if gdev != want_dev {
        return Err(format!(
            "resolve_gather's device pool differs from the reference gather ({nl} layers, {row} B rows, split {split}, {mode:?}) for {d:?}"
        ));
    }
    Ok(())
}
