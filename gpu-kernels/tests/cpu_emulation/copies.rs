//! The copy kernels (gathers, page and row copies, the indexer backup) against the reference,
//! over row geometries with 16-, 8- and 4-byte scale words.

use super::*;

/// A row geometry of the copy checks: `(row_bytes, value_bytes, page alignment)`.
pub(crate) type RowGeometry = (u32, u32, u64);

/// Rows whose scale parts are not multiples of 16 (scale words of 8 and 4 bytes), as the
/// conformance suite has them: DeepSeek V4's 584-B rows (576 + 8) in pages padded to a multiple
/// of 576 B, its indexer's 132-B rows (128 + 4), and 20-B rows (16 + 4) in pages padded to 16 B.
pub(crate) const WORD_GEOMETRIES: [RowGeometry; 3] =
    [(584, 576, 576), (132, 128, 576), (20, 16, 16)];

/// A random geometry: half the time 16-byte multiples (contiguous, or split with a 16-byte
/// scale part), else one of [`WORD_GEOMETRIES`].
pub(crate) fn row_geometry(rng: &mut SplitMix64) -> RowGeometry {
    if rng.percent(50) {
        let row = 16 * rng.range_inclusive(1, 4) as u32;
        let split = rng.percent(50) && row > 16;
        (row, if split { row - 16 } else { row }, 16)
    } else {
        WORD_GEOMETRIES[rng.below(WORD_GEOMETRIES.len() as u64) as usize]
    }
}

/// `n` layers of geometry `g`: host pages layer-major, each padded to `g.2` bytes; device
/// pages side by side in a block (each padded), blocks 32 bytes apart beyond them, flat device
/// rows sometimes with a row of another layer's part per block. Rows per page are odd more often
/// than not (page tails past the last 16-byte chunk).
pub(crate) fn pair_layers(
    rng: &mut SplitMix64,
    n: u32,
    g: RowGeometry,
) -> (Vec<LayerPair>, usize, usize) {
    let (row, value, align) = g;
    let bs = [1u32, 3, 5, 2, 4, 6][rng.below(6) as usize];
    let (hb, db) = (
        rng.range_inclusive(2, 9) as u32,
        rng.range_inclusive(2, 9) as u32,
    );
    let page = u64::from(bs * row).next_multiple_of(align);
    let mut layers = Vec::new();
    let (mut hoff, mut doff) = (0u64, 0u64);
    let dstride = page * u64::from(n) + 32;
    let index_stride_rows = bs + rng.below(2) as u32;
    for _ in 0..n {
        let host = PageLayout {
            base: hoff,
            block_stride: page,
            num_blocks: hb,
            block_size: bs,
            row_bytes: row,
            value_bytes: value,
            index_stride_rows: bs,
        };
        let device = PageLayout {
            base: doff,
            block_stride: dstride,
            num_blocks: db,
            block_size: bs,
            row_bytes: row,
            value_bytes: value,
            index_stride_rows,
        };
        hoff += u64::from(hb) * page;
        doff += page;
        layers.push(LayerPair { host, device });
    }
    let host_len = hoff as usize;
    let dev_len = (dstride * u64::from(db) + 64) as usize;
    (layers, host_len, dev_len)
}

/// Indexer rows of every kind `indexer_backup` takes: contiguous 132-byte rows (DeepSeek V3.2,
/// 4-byte words), contiguous 16-byte multiples (16-byte chunks), split 128 + 4 (DeepSeek V4) and
/// contiguous 20-byte rows, pages on 16-byte boundaries; slots that are -1, beyond a pool or in
/// another layer's part of a block.
pub(crate) fn check_indexer_backup(emu: &Emu, rng: &mut SplitMix64) -> Result<(), String> {
    let (row, value) = [(132u32, 132u32), (64, 64), (132, 128), (20, 20)][rng.below(4) as usize];
    let nl = rng.range_inclusive(1, 4) as u32;
    let bs = [1u32, 3, 4, 64][rng.below(4) as usize];
    let (hb, db) = (
        rng.range_inclusive(2, 9) as u32,
        rng.range_inclusive(2, 9) as u32,
    );
    let page = u64::from(bs * row).next_multiple_of(16);
    // Device blocks hold every layer's page side by side and one more page of another group.
    let dstride = page * u64::from(nl + 1);
    let index_stride_rows = bs * (nl + 1);
    let layers: Vec<LayerPair> = (0..u64::from(nl))
        .map(|l| LayerPair {
            host: PageLayout {
                base: l * u64::from(hb) * page,
                block_stride: page,
                num_blocks: hb,
                block_size: bs,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows: bs,
            },
            device: PageLayout {
                base: l * page,
                block_stride: dstride,
                num_blocks: db,
                block_size: bs,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows,
            },
        })
        .collect();
    let (hl, dl) = (
        (u64::from(nl * hb) * page) as usize,
        (dstride * u64::from(db)) as usize,
    );
    let t = rng.range_inclusive(0, 40) as u32;
    let host_rows = i64::from(hb * bs);
    let mut free: Vec<i32> = (0..host_rows as i32).collect();
    rng.shuffle(&mut free);
    let mut free = free.into_iter();
    let device_slots: Vec<i32> = (0..t)
        .map(|_| match rng.below(10) {
            0 => -1,
            1 => rng.range_inclusive(
                i64::from(db * index_stride_rows),
                i64::from(db * index_stride_rows) + 9,
            ) as i32,
            _ => rng.range_inclusive(0, i64::from(db * index_stride_rows) - 1) as i32,
        })
        .collect();
    let host_slots: Vec<i32> = (0..t)
        .map(|_| match rng.below(10) {
            0 => -1,
            1 => rng.range_inclusive(host_rows, host_rows + 9) as i32,
            _ => free.next().unwrap_or(-1),
        })
        .collect();
    let device = fill(rng, dl);
    let host0 = fill(rng, hl);
    let mut want = host0.clone();
    let desc = IndexerBackupDesc {
        num_tokens: t,
        layers: &layers,
    };
    indexer_backup(
        &desc,
        IndexerBackupArgs {
            device_slots: &device_slots,
            host_slots: &host_slots,
            device: &device,
            host: &mut want,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut got = host0;
    let addrs = plan::IndexerBackupAddrs {
        device_slots: a(&device_slots),
        host_slots: a(&host_slots),
        device: a(&device),
        host: am(&mut got),
    };
    let tgt = target(if rng.percent(50) { 1 } else { 132 }, 48 * 1024);
    emu.execute(plan::indexer_backup(&tgt, &desc, &addrs).map_err(|e| e.to_string())?);
    if got != want {
        return Err(format!(
            "indexer_backup differs ({row}-byte rows, {value} value bytes, {nl} layers, {bs} rows per page)"
        ));
    }
    Ok(())
}

pub(crate) fn check_copies(emu: &Emu, rng: &mut SplitMix64, g: RowGeometry) -> Result<(), String> {
    let nl = rng.range_inclusive(1, 3) as u32;
    let (layers, hl, dl) = pair_layers(rng, nl, g);
    let l0 = layers[0];
    // A small device sometimes, so the persistent gather grid is smaller than its work.
    let tgt = target(if rng.percent(50) { 1 } else { 132 }, 48 * 1024);
    // gather (more token rows than an in-order walk reads at once, sometimes)
    let t = rng.range_inclusive(1, 6) as u32;
    let k = rng.range_inclusive(1, 40) as u32;
    let host_rows = i64::from(l0.host.num_blocks * l0.host.block_size);
    let dev_rows = i64::from(l0.device.num_blocks * l0.device.index_stride_rows);
    let mut used = std::collections::HashSet::new();
    let src: Vec<i32> = (0..t * k)
        .map(|_| rng.range_inclusive(-1, host_rows + 2) as i32)
        .collect();
    let dst: Vec<i32> = (0..t * k)
        .map(|_| {
            loop {
                let v = rng.range_inclusive(-1, dev_rows + 2) as i32;
                if v < 0 || used.insert(v) {
                    break v;
                }
                if used.len() as i64 > dev_rows {
                    break -1;
                }
            }
        })
        .collect();
    let counts: Vec<i32> = (0..t)
        .map(|_| rng.range_inclusive(-1, i64::from(k) + 2) as i32)
        .collect();
    let host = fill(rng, hl);
    let dev0 = fill(rng, dl);
    let mut want = dev0.clone();
    let desc = GatherDesc {
        num_tokens: t,
        top_k: k,
        layers: &layers,
    };
    gather_rows(
        &desc,
        GatherArgs {
            plan_src: &src,
            plan_dst: &dst,
            plan_counts: &counts,
            host: &host,
            device: &mut want,
        },
    )
    .map_err(|e| e.to_string())?;
    // Both walks of the plan (every row at once; rows in order, a group of blocks per row).
    for walk in [plan::GatherWalk::AllRows, plan::GatherWalk::InOrder] {
        let mut got = dev0.clone();
        let addrs = plan::GatherAddrs {
            plan_src: a(&src),
            plan_dst: a(&dst),
            plan_counts: a(&counts),
            host: a(&host),
            device: am(&mut got),
        };
        emu.execute(plan::gather(&tgt, &desc, &addrs, walk).map_err(|e| e.to_string())?);
        if got != want {
            return Err(format!(
                "gather ({walk:?}) differs ({g:?} rows, {nl} layers, {t} token rows)"
            ));
        }
    }
    // Page copies both ways, destinations sometimes repeated (the later pair wins: the planner
    // must split the launch).
    for dir in [Direction::DeviceToHost, Direction::HostToDevice] {
        let (sb, db) = match dir {
            Direction::DeviceToHost => (l0.device.num_blocks, l0.host.num_blocks),
            Direction::HostToDevice => (l0.host.num_blocks, l0.device.num_blocks),
        };
        let pairs: Vec<BlockPair> = (0..rng.range_inclusive(1, i64::from(db) + 2))
            .map(|_| BlockPair {
                src: rng.below(u64::from(sb)) as u32,
                dst: rng.below(u64::from(db)) as u32,
            })
            .collect();
        let (mut wh, mut wd) = (fill(rng, hl), fill(rng, dl));
        let (mut gh, mut gd) = (wh.clone(), wd.clone());
        let pdesc = PageCopyDesc {
            direction: dir,
            layers: &layers,
        };
        copy_pages(&pdesc, &pairs, &mut wh, &mut wd).map_err(|e| e.to_string())?;
        let jobs: Vec<(PageLayout, PageLayout)> = layers
            .iter()
            .map(|l| match dir {
                Direction::DeviceToHost => (l.device, l.host),
                Direction::HostToDevice => (l.host, l.device),
            })
            .collect();
        let (sp, dp) = match dir {
            Direction::DeviceToHost => (a(&gd), am(&mut gh)),
            Direction::HostToDevice => (a(&gh), am(&mut gd)),
        };
        emu.execute(
            plan::copy_pages(&tgt, &jobs, &pairs, sp, dp, false).map_err(|e| e.to_string())?,
        );
        if gh != wh || gd != wd {
            return Err(format!(
                "copy_pages {dir:?} differs for {pairs:?} ({g:?} rows, {nl} layers)"
            ));
        }
        // Row spans, destination rows sometimes repeated.
        let spans: Vec<RowSpan> = (0..rng.range_inclusive(1, i64::from(db) + 2))
            .map(|_| {
                let first = rng.below(u64::from(l0.host.block_size)) as u32;
                let num = rng.range_inclusive(0, i64::from(l0.host.block_size - first)) as u32;
                let (d, o) = (
                    rng.below(u64::from(db)) as u32,
                    rng.below(u64::from(sb)) as u32,
                );
                let (device_block, host_block) = match dir {
                    Direction::DeviceToHost => (o, d),
                    Direction::HostToDevice => (d, o),
                };
                RowSpan {
                    device_block,
                    host_block,
                    first_row: first,
                    num_rows: num,
                }
            })
            .collect();
        let (mut wh, mut wd) = (fill(rng, hl), fill(rng, dl));
        let (mut gh, mut gd) = (wh.clone(), wd.clone());
        let rdesc = RowCopyDesc {
            direction: dir,
            layers: &layers,
        };
        copy_rows(&rdesc, &spans, &mut wh, &mut wd).map_err(|e| e.to_string())?;
        let (h, d) = (am(&mut gh), am(&mut gd));
        emu.execute(plan::copy_rows(&tgt, &rdesc, &spans, h, d).map_err(|e| e.to_string())?);
        if gh != wh || gd != wd {
            return Err(format!(
                "copy_rows {dir:?} differs for {spans:?} ({g:?} rows, {nl} layers)"
            ));
        }
    }
    // Host copy-on-write in one buffer: chains (a destination read by a later pair) and repeats.
    let host_layers: Vec<PageLayout> = layers.iter().map(|l| l.host).collect();
    let hb = l0.host.num_blocks;
    let pairs: Vec<BlockPair> = (0..rng.range_inclusive(1, 6))
        .filter_map(|_| {
            let (s, d) = (
                rng.below(u64::from(hb)) as u32,
                rng.below(u64::from(hb)) as u32,
            );
            (s != d).then_some(BlockPair { src: s, dst: d })
        })
        .collect();
    let mut wh = fill(rng, hl);
    let mut gh = wh.clone();
    copy_host_pages(&host_layers, &pairs, &mut wh).map_err(|e| e.to_string())?;
    let jobs: Vec<(PageLayout, PageLayout)> = host_layers.iter().map(|l| (*l, *l)).collect();
    let h = am(&mut gh);
    emu.execute(plan::copy_pages(&tgt, &jobs, &pairs, h, h, true).map_err(|e| e.to_string())?);
    if gh != wh {
        return Err(format!(
            "copy_host_pages differs for {pairs:?} ({g:?} rows, {nl} layers)"
        ));
    }
    Ok(())
}
