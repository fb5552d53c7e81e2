// Sparse table writes (hisparse_core::ops::table::write_table): one invocation per write. The
// indices of one call are distinct (checked on the host), so the writes are independent. The
// table is bound from element `base` on (the host splits calls whose writes span more than one
// binding).
struct Params {
    count: u32,
    base: u32,
}

// Per write: element index (as i32 bits), value.
//@read writes: array<vec2<i32>>
//@read_write table: array<i32>

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = group_index(wid, nwg) * 256u + lid;
    if (i >= pc.count) {
        return;
    }
    let w = writes[i];
    table[u32(w.x) - pc.base] = w.y;
}
