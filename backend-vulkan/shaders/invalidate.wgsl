// Hot-entry invalidation (hisparse_core::ops::invalidate): one invocation per slot_host_rows entry.
struct Params {
    entries: u32,
    num_ranges: u32,
}

//@read ranges: array<i32>
//@read_write slot_host_rows: array<i32>

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = group_index(wid, nwg) * 256u + lid;
    if (i >= pc.entries) {
        return;
    }
    let d = slot_host_rows[i];
    for (var r = 0u; r < pc.num_ranges; r = r + 1u) {
        if (ranges[2u * r] <= d && d < ranges[2u * r + 1u]) {
            slot_host_rows[i] = -1;
            return;
        }
    }
}
