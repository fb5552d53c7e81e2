// Hot-entry invalidation (hisparse_core::ops::invalidate): one invocation per slot_host_rows entry.
struct Params {
    entries: u32,
    num_ranges: u32,
}

//@read ranges: array<i32>
//@read_write slot_host_rows: array<i32>

// Items: one per slot_host_rows entry (the entry point: per_item.wgsl).
fn items() -> u32 {
    return pc.entries;
}

fn item(i: u32) {
    let d = slot_host_rows[i];
    for (var r = 0u; r < pc.num_ranges; r = r + 1u) {
        if (ranges[2u * r] <= d && d < ranges[2u * r + 1u]) {
            slot_host_rows[i] = -1;
            return;
        }
    }
}
