// Miss-plan gather (hisparse_core::ops::copy::gather_rows). One workgroup of 128 invocations per
// (layer, token row, chunk of 16 plan entries): invocation i < 16 locates entry i's source and
// destination once, then the 16-byte words of all the chunk's rows are spread over the workgroup,
// every invocation issuing up to eight independent loads before its stores (the host pool is read
// across the bus, so many loads must be in flight: the same scheme as the CUDA kernel
// hs_gather_rows). Addresses are in 16-byte words.
//
// Pool A (the pinned host pool) and pool B (the device pool) are each bound as windows of
// 2^chunk_shift words (see build.rs); a dispatch covers windows [a_base, a_base + WINDOWS) of A
// and [b_base, b_base + WINDOWS) of B and writes only the destination words whose source word
// lies in its A windows (zero-filled rows: the dispatches with a_base = 0) and whose destination
// lies in its B windows. The host issues one dispatch per pair of window groups.
struct Params {
    num_tokens: u32,
    top_k: u32,
    // ceil(top_k / 16)
    row_chunks: u32,
    // workgroups: layers * num_tokens * row_chunks
    groups: u32,
    chunk_shift: u32,
    chunk_mask: u32,
    a_base: u32,
    b_base: u32,
}

// Per layer, 16 words: host layout then device layout, each
// [base16, stride16, num_blocks, block_size, row16, value16, index_stride, 0].
//@read plan_src: array<i32>
//@read plan_dst: array<i32>
//@read plan_counts: array<i32>
//@read layers: array<u32>
//@POOL_BINDINGS

//@POOL_ACCESS

const ROWS: u32 = 16u;
const THREADS: u32 = 128u;

// `locate` and `Row`: shaders/row_layout.wgsl (appended by build.rs).

// Per row of the chunk: 0 = skip (destination outside the pool), 1 = copy, 2 = zero-fill.
var<workgroup> s_mode: array<u32, 16>;
var<workgroup> s_src_v: array<u32, 16>;
var<workgroup> s_src_s: array<u32, 16>;
var<workgroup> s_dst_v: array<u32, 16>;
var<workgroup> s_dst_s: array<u32, 16>;

// Word `c` of a row whose value part starts at `v` and scale part at `s` (`vc` value words).
fn word(v: u32, s: u32, vc: u32, c: u32) -> u32 {
    return select(s + (c - vc), v + c, c < vc);
}

// Job `q` of the chunk: (mode, source word, destination word); mode 0 when this dispatch does
// not write the word.
fn job(q: u32, total: u32, cpr: u32, vc: u32) -> vec3<u32> {
    if (q >= total) {
        return vec3<u32>(0u);
    }
    let i = q / cpr;
    let c = q % cpr;
    let mode = s_mode[i];
    if (mode == 0u) {
        return vec3<u32>(0u);
    }
    let dw = word(s_dst_v[i], s_dst_s[i], vc, c);
    if (!in_b(dw)) {
        return vec3<u32>(0u);
    }
    if (mode == 2u) {
        return vec3<u32>(select(0u, 2u, pc.a_base == 0u), 0u, dw);
    }
    let sw = word(s_src_v[i], s_src_s[i], vc, c);
    if (!in_a(sw)) {
        return vec3<u32>(0u);
    }
    return vec3<u32>(1u, sw, dw);
}

@compute @workgroup_size(128)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = group_index(wid, nwg);
    if (g >= pc.groups) {
        return;
    }
    // Uniform per workgroup: which layer, token row and chunk it copies.
    let chunk = g % pc.row_chunks;
    let lt = g / pc.row_chunks;
    let t = lt % pc.num_tokens;
    let layer = lt / pc.num_tokens;
    let j0 = chunk * ROWS;
    let n = u32(clamp(plan_counts[t], 0, i32(pc.top_k)));
    if (j0 >= n) {
        return;
    }
    let rows = min(ROWS, n - j0);
    let hl = layer * 16u;
    let dl = hl + 8u;
    if (lid < rows) {
        let e = t * pc.top_k + j0 + lid;
        var mode = 0u;
        let dst = locate(dl, plan_dst[e]);
        if (dst.ok) {
            s_dst_v[lid] = dst.value;
            s_dst_s[lid] = dst.scale;
            let src = locate(hl, plan_src[e]);
            mode = 2u;
            if (src.ok) {
                mode = 1u;
                s_src_v[lid] = src.value;
                s_src_s[lid] = src.scale;
            }
        }
        s_mode[lid] = mode;
    }
    workgroupBarrier();
    let cpr = layers[dl + 4u];
    let vc = layers[dl + 5u];
    let total = rows * cpr;
    for (var base = 0u; base < total; base = base + 8u * THREADS) {
        let q = base + lid;
        let w0 = job(q, total, cpr, vc);
        let w1 = job(q + THREADS, total, cpr, vc);
        let w2 = job(q + 2u * THREADS, total, cpr, vc);
        let w3 = job(q + 3u * THREADS, total, cpr, vc);
        let w4 = job(q + 4u * THREADS, total, cpr, vc);
        let w5 = job(q + 5u * THREADS, total, cpr, vc);
        let w6 = job(q + 6u * THREADS, total, cpr, vc);
        let w7 = job(q + 7u * THREADS, total, cpr, vc);
        var v0 = vec4<u32>(0u);
        var v1 = vec4<u32>(0u);
        var v2 = vec4<u32>(0u);
        var v3 = vec4<u32>(0u);
        var v4 = vec4<u32>(0u);
        var v5 = vec4<u32>(0u);
        var v6 = vec4<u32>(0u);
        var v7 = vec4<u32>(0u);
        if (w0.x == 1u) { v0 = load_a(w0.y); }
        if (w1.x == 1u) { v1 = load_a(w1.y); }
        if (w2.x == 1u) { v2 = load_a(w2.y); }
        if (w3.x == 1u) { v3 = load_a(w3.y); }
        if (w4.x == 1u) { v4 = load_a(w4.y); }
        if (w5.x == 1u) { v5 = load_a(w5.y); }
        if (w6.x == 1u) { v6 = load_a(w6.y); }
        if (w7.x == 1u) { v7 = load_a(w7.y); }
        if (w0.x != 0u) { store_b(w0.z, v0); }
        if (w1.x != 0u) { store_b(w1.z, v1); }
        if (w2.x != 0u) { store_b(w2.z, v2); }
        if (w3.x != 0u) { store_b(w3.z, v3); }
        if (w4.x != 0u) { store_b(w4.z, v4); }
        if (w5.x != 0u) { store_b(w5.z, v5); }
        if (w6.x != 0u) { store_b(w6.z, v6); }
        if (w7.x != 0u) { store_b(w7.z, v7); }
    }
}
