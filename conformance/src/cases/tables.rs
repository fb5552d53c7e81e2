//! Stream-ordered table maintenance (contract §7, item 1): sparse `i32` table writes, hot-state resets,
//! and copies inside one device buffer (GPU copy-on-write of whole blocks).

use hisparse_core::Device;
use hisparse_core::ops::copy::copy_within as ref_copy_within;
use hisparse_core::ops::table::{reset_hot_state as ref_reset, write_table as ref_write};
use hisparse_core::ops::{HotResetDesc, MAX_HOT_SLOTS, TableWrite, TableWriteDesc};

use crate::util::{
    Ctx, SENTINEL, dev_bytes, dev_i32, dev_u16, expect_invalid, read_bytes, read_i32, read_u16,
    same,
};
use crate::{Case, CaseResult, SplitMix64};

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    for (name, len, density) in [
        ("small", 17u32, 50u64),
        ("sparse-large", 200_000, 1),
        ("dense", 4096, 100),
    ] {
        v.push(Case::seeded(
            format!("tables/write/{name}"),
            move |d: &D, s| write_random(d, s, len, density),
        ));
    }
    v.push(Case::fixed("tables/write/empty-list", write_empty::<D>));
    v.push(Case::fixed("tables/write/refused", write_refused::<D>));
    for (name, requests, slots) in [
        ("small", 4u32, 16u32),
        ("v32-4096", 6, 4096),
        ("max-hot-slots-32768", 2, MAX_HOT_SLOTS),
    ] {
        v.push(Case::seeded(
            format!("tables/hot-reset/{name}"),
            move |d: &D, s| reset_random(d, s, requests, slots),
        ));
    }
    v.push(Case::fixed("tables/hot-reset/refused", reset_refused::<D>));
    for (name, len, bytes) in [
        ("block-545792", 4 * 545_792usize, 545_792usize),
        ("unaligned", 10_000, 333),
        ("zero-bytes", 64, 0),
    ] {
        v.push(Case::seeded(
            format!("copies/within/{name}"),
            move |d: &D, s| within_random(d, s, len, bytes),
        ));
    }
    v.push(Case::fixed("copies/within/refused", within_refused::<D>));
}

/// Random sorted unique writes over a table of `len` elements (each element written with
/// probability `density` %), into a buffer with sentinel slack beyond the table.
fn write_random<D: Device>(dev: &D, seed: u64, len: u32, density: u64) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let table: Vec<i32> = (0..len + 8).map(|_| rng.i32_in(-3, 1000)).collect();
    let mut writes = Vec::new();
    for index in 0..len {
        if !rng.percent(density) {
            continue;
        }
        let value = match rng.below(6) {
            0 => -1,
            1 => i32::MIN,
            2 => i32::MAX,
            3 => 0,
            _ => rng.i32_in(-100_000, 100_000),
        };
        writes.push(TableWrite { index, value });
    }
    if writes.is_empty() {
        writes.push(TableWrite {
            index: len - 1,
            value: 42,
        });
    }
    let desc = TableWriteDesc { table_len: len };
    let mut want = table.clone();
    ref_write(&desc, &writes, &mut want[..len as usize]).ctx("reference write_table")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let mut buf = dev_i32(dev, &table)?;
    // The host list may be reused at once (rule 5): scribble over it after the call.
    let mut list = writes.clone();
    dev.write_table(&s, &desc, &list, &mut buf)
        .ctx("write_table")?;
    list.iter_mut().for_each(|w| w.value = SENTINEL);
    dev.synchronize(&s).ctx("synchronize")?;
    same("table", &read_i32(dev, &buf, table.len())?, &want)
}

fn write_empty<D: Device>(dev: &D) -> CaseResult {
    let s = dev.create_stream().ctx("create_stream")?;
    let mut buf = dev_i32(dev, &[5, 6, 7])?;
    dev.write_table(&s, &TableWriteDesc { table_len: 3 }, &[], &mut buf)
        .ctx("write_table")?;
    dev.synchronize(&s).ctx("synchronize")?;
    same("table", &read_i32(dev, &buf, 3)?, &[5, 6, 7])
}

/// Unsorted, duplicate and out-of-range indices and a short table are refused, and the table
/// is left as it was.
fn write_refused<D: Device>(dev: &D) -> CaseResult {
    let s = dev.create_stream().ctx("create_stream")?;
    let mut buf = dev_i32(dev, &[1, 2, 3, 4])?;
    let w = |index, value| TableWrite { index, value };
    let d4 = TableWriteDesc { table_len: 4 };
    expect_invalid(
        "unsorted indices",
        dev.write_table(&s, &d4, &[w(2, 9), w(1, 9)], &mut buf),
    )?;
    expect_invalid(
        "duplicate index",
        dev.write_table(&s, &d4, &[w(1, 9), w(1, 8)], &mut buf),
    )?;
    expect_invalid(
        "index at table_len",
        dev.write_table(&s, &d4, &[w(0, 9), w(4, 9)], &mut buf),
    )?;
    expect_invalid(
        "index u32::MAX",
        dev.write_table(&s, &d4, &[w(u32::MAX, 9)], &mut buf),
    )?;
    expect_invalid(
        "table_len beyond the buffer",
        dev.write_table(&s, &TableWriteDesc { table_len: 5 }, &[w(0, 9)], &mut buf),
    )?;
    dev.synchronize(&s).ctx("synchronize")?;
    same("table", &read_i32(dev, &buf, 4)?, &[1, 2, 3, 4])
}

fn reset_random<D: Device>(dev: &D, seed: u64, requests: u32, slots: u32) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let n = (requests * slots) as usize;
    // Slack beyond the declared state must stay untouched.
    let slot_host_rows: Vec<i32> = (0..n + 4).map(|_| rng.i32_in(-1, 1 << 20)).collect();
    let lru: Vec<u16> = (0..n + 4)
        .map(|_| rng.below(u64::from(slots)) as u16)
        .collect();
    let mut rows: Vec<u32> = (0..requests).filter(|_| rng.percent(50)).collect();
    if let Some(&r) = rows.first() {
        rows.push(r); // a repeated row: resetting twice is the same as once
    }
    rng.shuffle(&mut rows);
    let desc = HotResetDesc {
        num_requests: requests,
        hot_slots: slots,
    };
    let (mut want_slot_host_rows, mut want_lru) = (slot_host_rows.clone(), lru.clone());
    ref_reset(&desc, &rows, &mut want_slot_host_rows, &mut want_lru)
        .ctx("reference reset_hot_state")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let mut d_slot_host_rows = dev_i32(dev, &slot_host_rows)?;
    let mut d_lru = dev_u16(dev, &lru)?;
    dev.reset_hot_state(&s, &desc, &rows, &mut d_slot_host_rows, &mut d_lru)
        .ctx("reset_hot_state")?;
    dev.synchronize(&s).ctx("synchronize")?;
    same(
        "slot_host_rows",
        &read_i32(dev, &d_slot_host_rows, slot_host_rows.len())?,
        &want_slot_host_rows,
    )?;
    same("lru", &read_u16(dev, &d_lru, lru.len())?, &want_lru)
}

fn reset_refused<D: Device>(dev: &D) -> CaseResult {
    let s = dev.create_stream().ctx("create_stream")?;
    let mut slot_host_rows = dev_i32(dev, &[7; 8])?;
    let mut lru = dev_u16(dev, &[3; 8])?;
    let desc = HotResetDesc {
        num_requests: 2,
        hot_slots: 4,
    };
    expect_invalid(
        "row beyond num_requests",
        dev.reset_hot_state(&s, &desc, &[0, 2], &mut slot_host_rows, &mut lru),
    )?;
    expect_invalid(
        "hot_slots 0",
        dev.reset_hot_state(
            &s,
            &HotResetDesc {
                hot_slots: 0,
                ..desc
            },
            &[0],
            &mut slot_host_rows,
            &mut lru,
        ),
    )?;
    expect_invalid(
        "state larger than the buffers",
        dev.reset_hot_state(
            &s,
            &HotResetDesc {
                num_requests: 3,
                ..desc
            },
            &[0],
            &mut slot_host_rows,
            &mut lru,
        ),
    )?;
    dev.synchronize(&s).ctx("synchronize")?;
    same(
        "slot_host_rows",
        &read_i32(dev, &slot_host_rows, 8)?,
        &[7; 8],
    )?;
    same("lru", &read_u16(dev, &lru, 8)?, &[3; 8])
}

/// A copy of `bytes` between two random disjoint ranges of a buffer of `len` bytes.
fn within_random<D: Device>(dev: &D, seed: u64, len: usize, bytes: usize) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let mut data = vec![0u8; len];
    rng.fill(&mut data);
    // Source in the first half, destination in the second (or the other way round).
    let half = len / 2;
    let a = rng.below((half - bytes + 1) as u64) as usize;
    let b = half + rng.below((len - half - bytes + 1) as u64) as usize;
    let (src, dst) = if rng.percent(50) { (a, b) } else { (b, a) };
    let mut want = data.clone();
    ref_copy_within(&mut want, src, dst, bytes).ctx("reference copy_within")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let mut buf = dev_bytes(dev, &data)?;
    dev.copy_within_device(&s, &mut buf, src, dst, bytes)
        .ctx("copy_within_device")?;
    dev.synchronize(&s).ctx("synchronize")?;
    same("buffer", &read_bytes(dev, &buf, len)?, &want)
}

fn within_refused<D: Device>(dev: &D) -> CaseResult {
    let s = dev.create_stream().ctx("create_stream")?;
    let data: Vec<u8> = (0..64).collect();
    let mut buf = dev_bytes(dev, &data)?;
    expect_invalid(
        "overlapping ranges",
        dev.copy_within_device(&s, &mut buf, 0, 8, 16),
    )?;
    expect_invalid("same range", dev.copy_within_device(&s, &mut buf, 4, 4, 4))?;
    expect_invalid(
        "destination past the end",
        dev.copy_within_device(&s, &mut buf, 0, 60, 8),
    )?;
    expect_invalid(
        "offset overflow",
        dev.copy_within_device(&s, &mut buf, usize::MAX, 0, 8),
    )?;
    dev.synchronize(&s).ctx("synchronize")?;
    same("buffer", &read_bytes(dev, &buf, 64)?, &data)
}
