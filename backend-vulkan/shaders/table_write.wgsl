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

// Items: one per write (the entry point: per_item.wgsl).
fn items() -> u32 {
    return pc.count;
}

fn item(i: u32) {
    let w = writes[i];
    table[u32(w.x) - pc.base] = w.y;
}
