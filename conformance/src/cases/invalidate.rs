//! Hot-entry invalidation (contract §5.4).

use hisparse_core::Device;
use hisparse_core::ops::invalidate::invalidate as reference;
use hisparse_core::ops::{InvalidateArgs, InvalidateDesc, MAX_HOT_SLOTS};

use crate::util::{Ctx, dev_i32, read_i32, same};
use crate::{Case, CaseResult, SplitMix64};

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    for (name, requests, slots, ranges) in [
        ("small", 1u32, 16u32, 3u32),
        ("several-requests", 5, 300, 6),
        ("many-ranges", 2, 128, 64),
        ("max-hot-slots-32768", 2, MAX_HOT_SLOTS, 8),
    ] {
        v.push(Case::seeded(
            format!("invalidate/{name}"),
            move |d: &D, s| random(d, s, requests, slots, ranges),
        ));
    }
    v.push(Case::fixed("invalidate/fixed/known-values", known::<D>));
    v.push(Case::fixed("invalidate/fixed/no-ranges", no_ranges::<D>));
}

fn check<D: Device>(
    dev: &D,
    desc: &InvalidateDesc,
    ranges: &[i32],
    slot_host_rows: &[i32],
) -> CaseResult {
    let mut want = slot_host_rows.to_vec();
    reference(
        desc,
        InvalidateArgs {
            ranges,
            slot_host_rows: &mut want[..],
        },
    )
    .ctx("reference invalidate")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let d_ranges = dev_i32(dev, ranges)?;
    let mut d_slot_host_rows = dev_i32(dev, slot_host_rows)?;
    dev.invalidate(
        &s,
        desc,
        InvalidateArgs {
            ranges: &d_ranges,
            slot_host_rows: &mut d_slot_host_rows,
        },
    )
    .ctx("invalidate")?;
    dev.synchronize(&s).ctx("synchronize")?;
    same(
        "slot_host_rows",
        &read_i32(dev, &d_slot_host_rows, slot_host_rows.len())?,
        &want,
    )
}

fn random<D: Device>(dev: &D, seed: u64, requests: u32, slots: u32, num_ranges: u32) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let rows = 10_000;
    let desc = InvalidateDesc {
        num_requests: requests,
        hot_slots: slots,
        num_ranges,
    };
    let mut ranges = Vec::new();
    for _ in 0..num_ranges {
        let a = rng.i32_in(-10, rows);
        let (start, end) = match rng.below(10) {
            0 => (a, a),                         // empty
            1 => (a, a - rng.i32_in(1, 50)),     // inverted: matches nothing
            2 => (i32::MIN, rng.i32_in(-5, 20)), // from the bottom
            3 => (a, i32::MAX),                  // to the top (i32::MAX itself excluded)
            _ => (a, a + rng.i32_in(1, 200)),
        };
        ranges.extend_from_slice(&[start, end]);
    }
    // Slack past the declared ranges must be ignored: make it match everything.
    ranges.extend_from_slice(&[i32::MIN, i32::MAX]);
    // A few entries past the declared state must stay untouched too.
    let n = (requests * slots) as usize + 4;
    let slot_host_rows: Vec<i32> = (0..n)
        .map(|_| match rng.below(20) {
            0 => -1,
            1 => i32::MAX,
            2 => i32::MIN,
            _ => rng.i32_in(0, rows),
        })
        .collect();
    check(dev, &desc, &ranges, &slot_host_rows)
}

/// Hand-computed values, independent of the reference.
fn known<D: Device>(dev: &D) -> CaseResult {
    let desc = InvalidateDesc {
        num_requests: 2,
        hot_slots: 3,
        num_ranges: 2,
    };
    let s = dev.create_stream().ctx("create_stream")?;
    let ranges = dev_i32(dev, &[64, 128, 10, 10])?;
    let mut slot_host_rows = dev_i32(dev, &[5, 10, -1, 64, 127, 128])?;
    dev.invalidate(
        &s,
        &desc,
        InvalidateArgs {
            ranges: &ranges,
            slot_host_rows: &mut slot_host_rows,
        },
    )
    .ctx("invalidate")?;
    same(
        "slot_host_rows",
        &read_i32(dev, &slot_host_rows, 6)?,
        &[5, 10, -1, -1, -1, 128],
    )
}

fn no_ranges<D: Device>(dev: &D) -> CaseResult {
    let desc = InvalidateDesc {
        num_requests: 1,
        hot_slots: 4,
        num_ranges: 0,
    };
    check(dev, &desc, &[i32::MIN, i32::MAX], &[1, 2, 3, -1])
}
