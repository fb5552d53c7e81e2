// Index remap (hisparse_core::ops::remap): one workgroup of 256 invocations per token row, eight
// entries per invocation per chunk of 2048: an invocation issues its eight top-k loads, then its
// eight (independent) block-table loads, then its stores, so a decode row of 2048 entries costs
// two dependent memory round trips. Without compaction invocation `lid` takes entries
// `lid, lid + 256, ...` of the chunk (every load and store of the workgroup is coalesced) and the
// valid count is one workgroup atomic; with compaction it takes eight consecutive entries and each
// chunk's valid entries are placed by a workgroup scan. A power-of-two block size divides by a
// shift, and a block whose rows all fit an i32 skips the exact overflow check (same results).
// The top-k loads do not wait for the request id: they are issued together with it (a row's top-k
// entries are bound whole; a padding row's are loaded and ignored), so a chunk pays one memory
// round trip before its block-table loads instead of two, and no barrier stands before them (the
// valid counter is cleared by invocation 0, and the barrier that orders the clear before the
// additions comes after the stores). With stats (hisparse_core::ops::stats; flags bit 3) each row's
// valid entries are added to word 2 of the call's slot (whether or not counts are written) and
// workgroup 0 adds the call to word 3 (an empty batch is one workgroup that adds the call only).
struct Params {
    num_tokens: u32,
    top_k: u32,
    table_rows: u32,
    max_blocks: u32,
    block_size: u32,
    block_stride: u32,
    // entries of idx_mapping, 0 = no mapping
    idx_len: u32,
    // bit 0: write counts, bit 1: compact, bit 2: has idx_mapping, bit 3: stats
    flags: u32,
    // index of the stats slot's first word in `stats`
    stats_word: u32,
}

//@read req_id: array<i32>
//@read block_table: array<i32>
//@read topk: array<i32>
//@read idx_mapping: array<i32>
//@read_write out_rows: array<i32>
//@read_write counts: array<i32>
//@read_write stats: array<atomic<u32>>

const W: u32 = 256u;
const IK: u32 = 8u;
const CHUNK: u32 = 2048u; // W * IK
// The compaction scan: values in groups of 32 invocations, then the group totals.
var<workgroup> sc: array<u32, 256>;
var<workgroup> tot: array<u32, 8>;
var<workgroup> valid: atomic<u32>;
var<private> scan_total: u32;
// Uniform per dispatch (set at the start of main): the block size's shift when it is a power of
// two, and the largest block whose every row `block * stride + off` (off < block size) fits.
var<private> bs_pow2: bool;
var<private> bs_shift: u32;
var<private> fast_lim: u32;
var<private> has_fast: bool;

fn map_token(row: u32, tok: i32) -> i32 {
    if (tok < 0) {
        return -1;
    }
    var col = 0u;
    var off = 0u;
    if (bs_pow2) {
        col = u32(tok) >> bs_shift;
        off = u32(tok) & (pc.block_size - 1u);
    } else {
        col = u32(tok) / pc.block_size;
        off = u32(tok) % pc.block_size;
    }
    if (col >= pc.max_blocks) {
        return -1;
    }
    let block = block_table[row * pc.max_blocks + col];
    if (block >= 0 && has_fast && u32(block) <= fast_lim) {
        return i32(u32(block) * pc.block_stride + off);
    }
    return phys_row(block, pc.block_stride, off);
}

// Exclusive workgroup scan of f in invocation order (two barriers); the total to scan_total.
fn scan(lid: u32, f: u32) -> u32 {
    sc[lid] = f;
    workgroupBarrier();
    if (lid < W / 32u) {
        var acc = 0u;
        for (var i = 0u; i < 32u; i = i + 1u) {
            let x = sc[lid * 32u + i];
            sc[lid * 32u + i] = acc;
            acc = acc + x;
        }
        tot[lid] = acc;
    }
    workgroupBarrier();
    var before = 0u;
    var sum = 0u;
    for (var i = 0u; i < W / 32u; i = i + 1u) {
        let x = tot[i];
        if (i < lid / 32u) {
            before = before + x;
        }
        sum = sum + x;
    }
    scan_total = sum;
    return before + sc[lid];
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = group_index(wid, nwg);
    let with_stats = (pc.flags & 8u) != 0u;
    if (with_stats && t == 0u && lid == 0u) {
        atomicAdd(&stats[pc.stats_word + 3u], 1u);
    }
    if (t >= pc.num_tokens) {
        return;
    }
    let k = pc.top_k;
    let compact = (pc.flags & 2u) != 0u;
    bs_pow2 = (pc.block_size & (pc.block_size - 1u)) == 0u;
    bs_shift = countTrailingZeros(pc.block_size);
    has_fast = pc.block_size - 1u <= 0x7fffffffu;
    fast_lim = 0u;
    if (has_fast) {
        fast_lim = (0x7fffffffu - (pc.block_size - 1u)) / pc.block_stride;
    }
    var row = -1;
    let req = req_id[t];
    if (req >= 0) {
        if ((pc.flags & 4u) != 0u) {
            if (u32(req) < pc.idx_len) {
                let m = idx_mapping[req];
                if (m >= 0 && u32(m) < pc.table_rows) {
                    row = m;
                }
            }
        } else if (u32(req) < pc.table_rows) {
            row = req;
        }
    }
    if (lid == 0u) {
        atomicStore(&valid, 0u);
    }
    var n_all = 0u;
    var base = 0u;
    if (!compact) {
        for (var c0 = 0u; c0 < k; c0 = c0 + CHUNK) {
            var tok: array<i32, 8>;
            for (var i = 0u; i < IK; i = i + 1u) {
                let j = c0 + i * W + lid;
                tok[i] = -1;
                if (j < k) {
                    tok[i] = topk[t * k + j];
                }
            }
            var v: array<i32, 8>;
            for (var i = 0u; i < IK; i = i + 1u) {
                v[i] = -1;
                if (row >= 0) {
                    v[i] = map_token(u32(row), tok[i]);
                }
                n_all = n_all + select(0u, 1u, v[i] != -1);
            }
            for (var i = 0u; i < IK; i = i + 1u) {
                let j = c0 + i * W + lid;
                if (j < k) {
                    out_rows[t * k + j] = v[i];
                }
            }
        }
    } else {
        for (var c0 = 0u; c0 < k; c0 = c0 + CHUNK) {
            let j0 = c0 + lid * IK;
            var tok: array<i32, 8>;
            for (var i = 0u; i < IK; i = i + 1u) {
                tok[i] = -1;
                if (j0 + i < k) {
                    tok[i] = topk[t * k + j0 + i];
                }
            }
            var v: array<i32, 8>;
            var n = 0u;
            for (var i = 0u; i < IK; i = i + 1u) {
                v[i] = -1;
                if (row >= 0) {
                    v[i] = map_token(u32(row), tok[i]);
                }
                n = n + select(0u, 1u, v[i] != -1);
            }
            var at = base + scan(lid, n);
            for (var i = 0u; i < IK; i = i + 1u) {
                if (v[i] != -1) {
                    out_rows[t * k + at] = v[i];
                    at = at + 1u;
                }
            }
            base = base + scan_total;
        }
    }
    if (!compact) {
        // Orders invocation 0's clear of the counter before every addition.
        workgroupBarrier();
        atomicAdd(&valid, n_all);
        workgroupBarrier();
        if (lid == 0u) {
            row_done(t, atomicLoad(&valid), with_stats);
        }
        return;
    }
    for (var j = base + lid; j < k; j = j + W) {
        out_rows[t * k + j] = -1;
    }
    if (lid == 0u) {
        row_done(t, base, with_stats);
    }
}

// Row t's valid count: into counts (flags bit 0) and the stats slot's word 2.
fn row_done(t: u32, valid_entries: u32, with_stats: bool) {
    if ((pc.flags & 1u) != 0u) {
        counts[t] = i32(valid_entries);
    }
    if (with_stats && valid_entries != 0u) {
        atomicAdd(&stats[pc.stats_word + 2u], valid_entries);
    }
}
