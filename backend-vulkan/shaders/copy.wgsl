// Region copies on the device's compute units (page backups and restores, row mirrors, host
// copy-on-write, device-to-device copies): one workgroup per tile of at most 4096 pool words
// (`Word`: 16 bytes, or 4 in the `copyw` variant for regions that are not 16-byte aligned, such as
// the runtime's per-request counters),
// four loads in flight per invocation before their stores. The host cuts every region into tiles
// and guarantees that the tiles of one dispatch never write bytes another tile of the dispatch
// reads or writes (conflicting copies go to successive dispatches), so tiles run in any order.
//
// Pool A (the source) and pool B (the destination) are each bound as windows of
// 2^chunk_shift words (see build.rs); a dispatch covers windows [a_base, a_base + WINDOWS) of A
// and [b_base, b_base + WINDOWS) of B, and copies only the words whose source and destination
// fall inside them (the host issues one dispatch per pair of window groups).
struct Params {
    tiles: u32,
    chunk_shift: u32,
    chunk_mask: u32,
    a_base: u32,
    b_base: u32,
    // unused: keeps the block a multiple of 8 bytes
    pad: u32,
}

// Per tile: first source word, first destination word, words, unused.
//@read tiles: array<vec4<u32>>
//@POOL_BINDINGS

//@POOL_ACCESS

const THREADS: u32 = 256u;

// Whether word `c` of `tile` is copied by this dispatch.
fn take(tile: vec4<u32>, c: u32) -> bool {
    return c < tile.z && in_a(tile.x + c) && in_b(tile.y + c);
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = group_index(wid, nwg);
    if (t >= pc.tiles) {
        return;
    }
    let tile = tiles[t];
    for (var base = 0u; base < tile.z; base = base + 4u * THREADS) {
        let c0 = base + lid;
        let c1 = c0 + THREADS;
        let c2 = c1 + THREADS;
        let c3 = c2 + THREADS;
        let k0 = take(tile, c0);
        let k1 = take(tile, c1);
        let k2 = take(tile, c2);
        let k3 = take(tile, c3);
        var v0 = Word(0u);
        var v1 = Word(0u);
        var v2 = Word(0u);
        var v3 = Word(0u);
        if (k0) { v0 = load_a(tile.x + c0); }
        if (k1) { v1 = load_a(tile.x + c1); }
        if (k2) { v2 = load_a(tile.x + c2); }
        if (k3) { v3 = load_a(tile.x + c3); }
        if (k0) { store_b(tile.y + c0, v0); }
        if (k1) { store_b(tile.y + c1, v1); }
        if (k2) { store_b(tile.y + c2, v2); }
        if (k3) { store_b(tile.y + c3, v3); }
    }
}
