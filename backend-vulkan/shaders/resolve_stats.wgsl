// A resolve call's stats (hisparse_core::ops::stats), after the resolver on the same stream: the
// sums of its per-row hit, miss and valid counts and the call itself, added into the four words of
// the call's slot with 32-bit atomics (wrapping). One invocation per token row; each workgroup sums
// its rows in workgroup memory and adds them with one atomic per word; workgroup 0 adds the call
// (an empty batch is one workgroup that adds the call only).
struct Params {
    num_tokens: u32,
    // index of the slot's first word in `stats`
    stats_word: u32,
}

//@read hit_counts: array<i32>
//@read miss_counts: array<i32>
//@read valid_counts: array<i32>
//@read_write stats: array<atomic<u32>>

var<workgroup> sums: array<atomic<u32>, 3>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = group_index(wid, nwg);
    if (lid < 3u) {
        atomicStore(&sums[lid], 0u);
    }
    workgroupBarrier();
    let t = g * 256u + lid;
    if (t < pc.num_tokens) {
        atomicAdd(&sums[0], bitcast<u32>(hit_counts[t]));
        atomicAdd(&sums[1], bitcast<u32>(miss_counts[t]));
        atomicAdd(&sums[2], bitcast<u32>(valid_counts[t]));
    }
    workgroupBarrier();
    if (lid < 3u) {
        let v = atomicLoad(&sums[lid]);
        if (v != 0u) {
            atomicAdd(&stats[pc.stats_word + lid], v);
        }
    }
    if (g == 0u && lid == 3u) {
        atomicAdd(&stats[pc.stats_word + 3u], 1u);
    }
}
