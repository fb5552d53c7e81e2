//! The table kernels and the small decode-path operations against the reference.

use super::*;

pub(crate) fn check_small_ops(emu: &Emu, rng: &mut SplitMix64) -> Result<(), String> {
    let tgt = target(if rng.percent(50) { 1 } else { 132 }, 48 * 1024);
    // invalidate
    let (r, n, nr) = (
        rng.range_inclusive(1, 3) as u32,
        rng.range_inclusive(1, 300) as u32,
        rng.range_inclusive(1, 600) as u32,
    );
    let ranges: Vec<i32> = (0..2 * nr)
        .map(|_| rng.range_inclusive(-2, 100) as i32)
        .collect();
    let mut want: Vec<i32> = (0..r * n)
        .map(|_| rng.range_inclusive(-1, 100) as i32)
        .collect();
    let mut got = want.clone();
    let desc = InvalidateDesc {
        num_requests: r,
        hot_slots: n,
        num_ranges: nr,
    };
    invalidate(
        &desc,
        InvalidateArgs {
            ranges: &ranges,
            slot_host_rows: &mut want,
        },
    )
    .map_err(|e| e.to_string())?;
    emu.execute(plan::invalidate(&tgt, &desc, a(&ranges), am(&mut got)));
    if got != want {
        return Err("invalidate differs".into());
    }
    // compressed slot mapping
    let t = rng.range_inclusive(1, 600) as u32;
    let ratio = rng.range_inclusive(1, 4) as u32;
    let bs = ratio * rng.range_inclusive(1, 8) as u32;
    let (rows, m) = (
        rng.range_inclusive(1, 3) as u32,
        rng.range_inclusive(1, 6) as u32,
    );
    let pos: Vec<i32> = (0..t)
        .map(|_| rng.range_inclusive(-2, i64::from(bs * m) + 8) as i32)
        .collect();
    let slots: Vec<i32> = (0..t).map(|_| rng.range_inclusive(-1, 50) as i32).collect();
    let trow: Vec<i32> = (0..t)
        .map(|_| rng.range_inclusive(-1, i64::from(rows)) as i32)
        .collect();
    let table: Vec<i32> = (0..rows * m)
        .map(|_| rng.range_inclusive(-1, 1 << 28) as i32)
        .collect();
    let mut want = vec![5i32; t as usize];
    let mut got = want.clone();
    let d = SlotMappingDesc {
        num_tokens: t,
        ratio,
        block_size: bs,
        table_rows: rows,
        max_blocks: m,
    };
    compressed_slot_mapping(
        &d,
        SlotMappingArgs {
            positions: &pos,
            slot_mapping: &slots,
            table_row: &trow,
            block_table: &table,
            out: &mut want,
        },
    )
    .map_err(|e| e.to_string())?;
    let addrs = plan::SlotMappingAddrs {
        positions: a(&pos),
        slot_mapping: a(&slots),
        table_row: a(&trow),
        block_table: a(&table),
        out: am(&mut got),
    };
    emu.execute(plan::slot_mapping(&d, &addrs));
    if got != want {
        return Err("compressed_slot_mapping differs".into());
    }
    Ok(())
}

/// Sparse table writes (random sorted unique indices, extreme values) and hot-state resets
/// (rows listed more than once), with grids smaller than the work on a small device.
pub(crate) fn check_tables(emu: &Emu, rng: &mut SplitMix64) -> Result<(), String> {
    let tgt = target(1, 48 * 1024);
    let len = rng.range_inclusive(1, 3000) as u32;
    let density = *[1u64, 30, 100].get(rng.below(3) as usize).unwrap_or(&30);
    let mut writes = Vec::new();
    for index in 0..len {
        if rng.percent(density) {
            let value = match rng.below(4) {
                0 => -1,
                1 => i32::MIN,
                2 => i32::MAX,
                _ => rng.range_inclusive(-1000, 1000) as i32,
            };
            writes.push(TableWrite { index, value });
        }
    }
    // Slack beyond the table: the kernel must not touch it.
    let table: Vec<i32> = (0..len + 8)
        .map(|_| rng.range_inclusive(-5, 5) as i32)
        .collect();
    let desc = TableWriteDesc { table_len: len };
    let mut want = table.clone();
    write_table(&desc, &writes, &mut want[..len as usize]).map_err(|e| e.to_string())?;
    let mut got = table.clone();
    let planned =
        plan::write_table(&tgt, &desc, &writes, am(&mut got)).map_err(|e| e.to_string())?;
    if writes.is_empty() != planned.launches.is_empty() {
        return Err("an empty write list must enqueue nothing, any other list one launch".into());
    }
    emu.execute(planned);
    if got != want {
        return Err(format!(
            "write_table differs ({} writes over {len})",
            writes.len()
        ));
    }

    let (r, n) = (
        rng.range_inclusive(1, 5) as u32,
        rng.range_inclusive(1, 700) as u32,
    );
    let rows: Vec<u32> = (0..rng.range_inclusive(1, 8))
        .map(|_| rng.below(u64::from(r)) as u32)
        .collect();
    let desc = HotResetDesc {
        num_requests: r,
        hot_slots: n,
    };
    let slot_host_rows: Vec<i32> = (0..r * n)
        .map(|_| rng.range_inclusive(-1, 99) as i32)
        .collect();
    let lru: Vec<u16> = (0..r * n).map(|_| rng.below(u64::from(n)) as u16).collect();
    let (mut want_slot_host_rows, mut want_lru) = (slot_host_rows.clone(), lru.clone());
    reset_hot_state(&desc, &rows, &mut want_slot_host_rows, &mut want_lru)
        .map_err(|e| e.to_string())?;
    let (mut got_slot_host_rows, mut got_lru) = (slot_host_rows, lru);
    let planned = plan::reset_hot_state(
        &tgt,
        &desc,
        &rows,
        am(&mut got_slot_host_rows),
        am(&mut got_lru),
    )
    .map_err(|e| e.to_string())?;
    emu.execute(planned);
    if got_slot_host_rows != want_slot_host_rows || got_lru != want_lru {
        return Err(format!(
            "reset_hot_state differs (rows {rows:?}, {n} slots)"
        ));
    }
    Ok(())
}
