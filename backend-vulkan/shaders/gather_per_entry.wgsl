// Miss-plan gather, first design (hisparse_core::ops::copy::gather_rows): 32 lanes per plan
// entry and layer, a workgroup of 128 lanes handling 4 entries; a 656-byte row (41 words) takes
// two passes of 16-byte words. Fewer loads in flight than `gather.wgsl` (the default on GPUs),
// but no per-word division: faster on CPU implementations (lavapipe), whose SIMD lanes
// scalarise integer division. Same bindings and window scheme as `gather.wgsl`. Addresses and
// layouts are in pool words (`Word`): 16 bytes, or 4 in the 4-byte-word form (`gather_per_entry_words`),
// which split rows whose scale part is not a multiple of 16 bytes take.
struct Params {
    num_tokens: u32,
    top_k: u32,
    // unused (the layout of gather.wgsl's parameters)
    row_chunks: u32,
    // total work items: num_layers * num_tokens * top_k
    items: u32,
    chunk_shift: u32,
    chunk_mask: u32,
    a_base: u32,
    b_base: u32,
}

// Per layer, 16 words: host layout then device layout, each
// [base, stride, num_blocks, block_size, row, value, index_stride, 0], byte sizes in pool words.
//@read plan_src: array<i32>
//@read plan_dst: array<i32>
//@read plan_counts: array<i32>
//@read layers: array<u32>
//@POOL_BINDINGS

//@POOL_ACCESS

// `locate` and `Row`: shaders/row_layout.wgsl (appended by build.rs).

// Per row slot of the workgroup, computed once by the slot's first lane:
// (copy?, dst value, dst scale, src ok?) and (src value, src scale, row words, value words).
var<workgroup> slot_dst: array<vec4<u32>, 4>;
var<workgroup> slot_src: array<vec4<u32>, 4>;

@compute @workgroup_size(128)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let first = group_index(wid, nwg) * 4u;
    if (first >= pc.items) {
        return;
    }
    let slot = lid >> 5u;
    let lane = lid & 31u;
    if (lane == 0u) {
        var d = vec4<u32>(0u);
        var s = vec4<u32>(0u);
        let item = first + slot;
        if (item < pc.items) {
            let tk = pc.num_tokens * pc.top_k;
            let layer = item / tk;
            let e = item % tk;
            let t = e / pc.top_k;
            let j = e % pc.top_k;
            let n = u32(clamp(plan_counts[t], 0, i32(pc.top_k)));
            if (j < n) {
                let hl = layer * 16u;
                let dl = hl + 8u;
                let dst = locate(dl, plan_dst[e]);
                if (dst.ok) {
                    let src = locate(hl, plan_src[e]);
                    d = vec4<u32>(1u, dst.value, dst.scale, select(0u, 1u, src.ok));
                    s = vec4<u32>(src.value, src.scale, layers[dl + 4u], layers[dl + 5u]);
                }
            }
        }
        slot_dst[slot] = d;
        slot_src[slot] = s;
    }
    workgroupBarrier();
    let d = slot_dst[slot];
    if (d.x == 0u) {
        return;
    }
    let s = slot_src[slot];
    let row16 = s.z;
    let v16 = s.w;
    for (var w = lane; w < row16; w = w + 32u) {
        var dw = d.y + w;
        var sw = s.x + w;
        if (w >= v16) {
            dw = d.z + (w - v16);
            sw = s.y + (w - v16);
        }
        if (!in_b(dw)) {
            continue;
        }
        if (d.w == 1u) {
            if (in_a(sw)) {
                store_b(dw, load_a(sw));
            }
        } else if (pc.a_base == 0u) {
            store_b(dw, Word(0u));
        }
    }
}
