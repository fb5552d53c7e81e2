// Index remap (hisparse_core::ops::remap): one workgroup per token row. Without compaction every
// invocation maps its entries independently and the valid count is one workgroup atomic; with
// compaction, chunks of 64 entries are placed by a workgroup scan.
struct Params {
    num_tokens: u32,
    top_k: u32,
    table_rows: u32,
    max_blocks: u32,
    block_size: u32,
    block_stride: u32,
    // entries of idx_mapping, 0 = no mapping
    idx_len: u32,
    // bit 0: write counts, bit 1: compact, bit 2: has idx_mapping
    flags: u32,
}

var<immediate> pc: Params;
@group(0) @binding(0) var<storage, read> req_id: array<i32>;
@group(0) @binding(1) var<storage, read> block_table: array<i32>;
@group(0) @binding(2) var<storage, read> topk: array<i32>;
@group(0) @binding(3) var<storage, read> idx_mapping: array<i32>;
@group(0) @binding(4) var<storage, read_write> out_rows: array<i32>;
@group(0) @binding(5) var<storage, read_write> counts: array<i32>;

const W: u32 = 64u;
var<workgroup> sc: array<u32, 64>;
var<workgroup> valid: atomic<u32>;

fn map_token(row: u32, tok: i32) -> i32 {
    if (tok < 0) {
        return -1;
    }
    let col = u32(tok) / pc.block_size;
    if (col >= pc.max_blocks) {
        return -1;
    }
    let block = block_table[row * pc.max_blocks + col];
    return phys_row(block, pc.block_stride, u32(tok) % pc.block_size);
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = group_index(wid, nwg);
    if (t >= pc.num_tokens) {
        return;
    }
    let k = pc.top_k;
    let compact = (pc.flags & 2u) != 0u;
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
    if (!compact) {
        if (lid == 0u) {
            atomicStore(&valid, 0u);
        }
        workgroupBarrier();
        var n = 0u;
        for (var j = lid; j < k; j = j + W) {
            var v = -1;
            if (row >= 0) {
                v = map_token(u32(row), topk[t * k + j]);
            }
            out_rows[t * k + j] = v;
            n = n + select(0u, 1u, v != -1);
        }
        atomicAdd(&valid, n);
        workgroupBarrier();
        if ((pc.flags & 1u) != 0u && lid == 0u) {
            counts[t] = i32(atomicLoad(&valid));
        }
        return;
    }
    var base = 0u;
    for (var j0 = 0u; j0 < k; j0 = j0 + W) {
        let j = j0 + lid;
        var v = -1;
        if (j < k && row >= 0) {
            v = map_token(u32(row), topk[t * k + j]);
        }
        let f = select(0u, 1u, j < k && v != -1);
        sc[lid] = f;
        workgroupBarrier();
        for (var o = 1u; o < W; o = o * 2u) {
            var x = 0u;
            if (lid >= o) {
                x = sc[lid - o];
            }
            workgroupBarrier();
            sc[lid] = sc[lid] + x;
            workgroupBarrier();
        }
        let incl = sc[lid];
        let total = sc[W - 1u];
        workgroupBarrier();
        if (j < k) {
            if (compact) {
                if (v != -1) {
                    out_rows[t * k + base + incl - 1u] = v;
                }
            } else {
                out_rows[t * k + j] = v;
            }
        }
        base = base + total;
    }
    if (compact) {
        for (var j = base + lid; j < k; j = j + W) {
            out_rows[t * k + j] = -1;
        }
    }
    if ((pc.flags & 1u) != 0u && lid == 0u) {
        counts[t] = i32(base);
    }
}
