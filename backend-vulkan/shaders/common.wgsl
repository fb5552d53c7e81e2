// Helpers shared by the index shaders (prepended to each source by build.rs). A shader declares
// its storage buffers as `//@read name: type` / `//@read_write name: type` lines, in binding order;
// build.rs writes the declarations (group 0, numbered from 0) and the push constants `pc: Params`.

// `block * stride + off` as an i32 physical row, or -1 when `block` is negative or the row does not
// fit an i32: exactly `hisparse_core::ops::physical_row`. `stride` is at least 1.
fn phys_row(block: i32, stride: u32, off: u32) -> i32 {
    if (block < 0 || off > 0x7fffffffu) {
        return -1;
    }
    let lim = (0x7fffffffu - off) / stride;
    if (u32(block) > lim) {
        return -1;
    }
    return i32(u32(block) * stride + off);
}

// Linear workgroup index of a 2-D dispatch (the host splits large counts over y).
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}
