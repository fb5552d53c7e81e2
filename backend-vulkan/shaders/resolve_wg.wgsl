// Resolve in one dispatch (hisparse_core::ops::resolve), the design of the CUDA kernel
// (gpu-kernels' hs_resolve): one workgroup of 1024 invocations per token row; the workgroup of a
// request's first row groups the request's rows itself (no separate pass) and resolves them all
// against the request's single state; padding rows write their empty outputs; other rows exit.
//
// Two modes, chosen per request (uniformly over the workgroup):
// * workgroup mode (the decode case: at most 2048 entries and 32 rows per request, at most 4096
//   hot slots, at most 256 hot-table columns): the wanted-row hash table, the evictable list,
//   the LRU bitmap, the hot-table row and the per-row counters live in workgroup memory, and each
//   invocation keeps its two entries (class, value, hash slot, miss number) and its four LRU
//   positions (slot, hash slot, rank) in registers, so each phase costs at most one dependent
//   round trip to device memory and one barrier;
// * global mode (anything larger, or when the host forbids workgroup mode): the same phases with
//   those arrays in the `scratch` binding, regions private to the request (placed by `start`, the
//   number of valid rows of requests before it), entries and positions processed in passes.
//
// Entry q = rank * top_k + j (row rank of the request, column j) gives the reference's "row by
// row, column by column" order; invocation `vl` (its place in scan order) takes entries
// [vl * 2, vl * 2 + 2) of each pass of 2048 and LRU positions [vl * 4, vl * 4 + 4) of each pass
// of 4096, so one workgroup scan per pass numbers them in order.
// Parameters and bindings 0-12: resolve_common.wgsl.
// Global-mode regions (words), with TK = num_tokens * top_k, G = groups of per-slot arrays
// (min(num_requests, num_tokens)), NB = ceil(hot_slots / 32):
//   key [0, 2TK), first entry [2TK, 4TK), ref [4TK, 6TK), miss number [6TK, 7TK),
//   perm [7TK, 7TK + T), row counters (3 per row) [.., + 3T), evictables G*N, positions G*N,
//   bitmaps G*NB. `resolve_wg_scratch_words` in src/index.rs computes the same sizes.
//@read_write gs: array<atomic<u32>>
// Batch-row order (flags bit 2): batch row → state row of resident_table, slot_host_rows and lru. Binding
// 0 then holds the rows' batch rows with the unowned ones already -1 (resolve_order.wgsl), so
// every `req_id` read below sees owners only.
//@read idx_mapping: array<i32>

const W: u32 = 1024u;
// Entries per invocation per pass, positions per invocation per pass.
const IK: u32 = 2u;
const IN: u32 = 4u;
const EF: u32 = 2048u; // W * IK
const NF: u32 = 4096u; // W * IN
// Workgroup-mode limits: hash-table capacity (build.rs makes a 2560-entry variant for devices
// with 32 KiB of workgroup memory, load factor up to 0.8, and a 4096-entry one, load factor up to
// 0.5, for devices with 44 KiB), rows, hot-table columns.
const TC: u32 = 2560u;
const MAXR: u32 = 32u;
const HOTC: u32 = 256u;
const HOST: u32 = 2u;
const RESIDENT: u32 = 1u;

// Workgroup mode: key, and meta = first entry << 16 | ref, where ref is first the first LRU
// position caching the key, then the hot slot it gets (0xffff: none).
var<workgroup> w_key: array<atomic<u32>, TC>;
var<workgroup> w_meta: array<atomic<u32>, TC>;
// Evictable slots in LRU order, u16 pairs (only the first EF can take a miss).
var<workgroup> w_evl: array<atomic<u32>, 1024>;
var<workgroup> w_bits: array<atomic<u32>, 128>;
var<workgroup> w_hot: array<i32, HOTC>;
var<workgroup> w_rows: array<u32, MAXR>;
// Per row: hits, valid entries, misses before the row.
var<workgroup> w_rowc: array<atomic<u32>, 96>;
// Flags: 0 a row of the request comes earlier, 1 start, 2 count, 3 any host entry, 4 corrupt.
var<workgroup> w_flags: array<atomic<u32>, 8>;
// The plain scan: values in virtual groups of 32, then the group totals.
var<workgroup> sc: array<u32, W>;
var<workgroup> sc_tot: array<u32, 32>;

var<private> vl: u32;
var<private> scan_total: u32;
var<private> gm: bool;
var<private> hb: u32;
var<private> cap: u32;
var<private> g_start: u32;
var<private> g_count: u32;
var<private> g_r: u32;
// The request's row of resident_table, slot_host_rows and lru (g_r itself in state-row order).
var<private> g_s: u32;

// Exclusive workgroup scan of f in `vl` order (workgroup memory only, two barriers); the total
// goes to scan_total.
fn scan_plain(f: u32) -> u32 {
    sc[vl] = f;
    workgroupBarrier();
    if (vl < W / 32u) {
        var acc = 0u;
        for (var i = 0u; i < 32u; i = i + 1u) {
            let x = sc[vl * 32u + i];
            sc[vl * 32u + i] = acc;
            acc = acc + x;
        }
        sc_tot[vl] = acc;
    }
    workgroupBarrier();
    let g = vl / 32u;
    var before = 0u;
    var sum = 0u;
    for (var i = 0u; i < W / 32u; i = i + 1u) {
        let x = sc_tot[i];
        if (i < g) {
            before = before + x;
        }
        sum = sum + x;
    }
    scan_total = sum;
    return before + sc[vl];
}

// `scan(f)`: scan_plain, or a subgroup scan (one barrier) where the device has subgroup
// arithmetic (build.rs fills it in).
//@SCAN

// A barrier for everything the phases share: storage too in global mode.
fn bar() {
    if (gm) {
        storageBarrier();
    }
    workgroupBarrier();
}

fn lru_get(i: u32) -> u32 {
    let w = atomicLoad(&lru[i >> 1u]);
    return (w >> ((i & 1u) * 16u)) & 0xffffu;
}

fn lru_set(i: u32, v: u32) {
    let sh = (i & 1u) * 16u;
    atomicAnd(&lru[i >> 1u], ~(0xffffu << sh));
    atomicOr(&lru[i >> 1u], v << sh);
}

fn tk() -> u32 {
    return pc.num_tokens * pc.top_k;
}

fn hash_of(g: u32) -> u32 {
    var x = g;
    x = x ^ (x >> 16u);
    x = x * 0x7feb352du;
    x = x ^ (x >> 15u);
    x = x * 0x846ca68bu;
    x = x ^ (x >> 16u);
    return x % cap;
}

// Tries to put g into empty slot h: returns g when h holds g afterwards, another key when h
// holds one, NONE after a spurious failure (the caller retries).
fn key_cas(h: u32, g: u32) -> u32 {
    if (gm) {
        let r = atomicCompareExchangeWeak(&gs[hb + h], NONE, g);
        return select(r.old_value, g, r.exchanged);
    }
    let r = atomicCompareExchangeWeak(&w_key[h], NONE, g);
    return select(r.old_value, g, r.exchanged);
}

fn key_get(h: u32) -> u32 {
    if (gm) {
        return atomicLoad(&gs[hb + h]);
    }
    return atomicLoad(&w_key[h]);
}

// Inserts host row g; returns its slot. The table never fills (at least twice the entries).
fn insert(g: u32) -> u32 {
    var h = hash_of(g);
    loop {
        let old = key_cas(h, g);
        if (old == g) {
            return h;
        }
        if (old != NONE) {
            h = h + 1u;
            if (h == cap) {
                h = 0u;
            }
        }
    }
    return h;
}

// The slot of host row g, or NONE.
fn find(g: u32) -> u32 {
    var h = hash_of(g);
    loop {
        let k = key_get(h);
        if (k == g) {
            return h;
        }
        if (k == NONE) {
            return NONE;
        }
        h = h + 1u;
        if (h == cap) {
            h = 0u;
        }
    }
    return NONE;
}

fn fe_min(h: u32, q: u32) {
    if (gm) {
        atomicMin(&gs[hb + 2u * tk() + h], q);
    } else {
        atomicMin(&w_meta[h], (q << 16u) | 0xffffu);
    }
}

fn fe_get(h: u32) -> u32 {
    if (gm) {
        return atomicLoad(&gs[hb + 2u * tk() + h]);
    }
    return atomicLoad(&w_meta[h]) >> 16u;
}

fn ref_min(h: u32, p: u32) {
    if (gm) {
        atomicMin(&gs[hb + 4u * tk() + h], p);
    } else {
        // The first entry (high half) is final here, so the minimum is taken over the low half.
        let m = atomicLoad(&w_meta[h]);
        atomicMin(&w_meta[h], (m & 0xffff0000u) | p);
    }
}

fn ref_get(h: u32) -> u32 {
    if (gm) {
        return atomicLoad(&gs[hb + 4u * tk() + h]);
    }
    let lo = atomicLoad(&w_meta[h]) & 0xffffu;
    return select(lo, NONE, lo == 0xffffu);
}

// Only one invocation writes a given slot's ref in a phase.
fn ref_set(h: u32, v: u32) {
    if (gm) {
        atomicStore(&gs[hb + 4u * tk() + h], v);
    } else {
        let m = atomicLoad(&w_meta[h]);
        atomicStore(&w_meta[h], (m & 0xffff0000u) | (v & 0xffffu));
    }
}

fn groups() -> u32 {
    return min(pc.num_requests, pc.num_tokens);
}

fn grp() -> u32 {
    return select(g_start, g_r, (pc.flags & 1u) != 0u);
}

fn nb() -> u32 {
    return (pc.hot_slots + 31u) / 32u;
}

fn perm_at() -> u32 {
    return 7u * tk();
}

fn rowc_at() -> u32 {
    return 7u * tk() + pc.num_tokens;
}

fn evl_at() -> u32 {
    return rowc_at() + 3u * pc.num_tokens + grp() * pc.hot_slots;
}

fn pos_at() -> u32 {
    return rowc_at() + 3u * pc.num_tokens + groups() * pc.hot_slots + grp() * pc.hot_slots;
}

fn bits_at() -> u32 {
    return rowc_at() + 3u * pc.num_tokens + 2u * groups() * pc.hot_slots + grp() * nb();
}

fn set_row(rank: u32, t: u32) {
    if (gm) {
        atomicStore(&gs[perm_at() + g_start + rank], t);
    } else {
        w_rows[rank] = t;
    }
}

fn row_t(rank: u32) -> u32 {
    if (gm) {
        return atomicLoad(&gs[perm_at() + g_start + rank]);
    }
    return w_rows[rank];
}

// Row counter c (0 hits, 1 valid entries, 2 misses before the row) of row `rank`.
fn rowc_add(rank: u32, c: u32, v: u32) {
    if (gm) {
        atomicAdd(&gs[rowc_at() + 3u * (g_start + rank) + c], v);
    } else {
        atomicAdd(&w_rowc[3u * rank + c], v);
    }
}

fn rowc_get(rank: u32, c: u32) -> u32 {
    if (gm) {
        return atomicLoad(&gs[rowc_at() + 3u * (g_start + rank) + c]);
    }
    return atomicLoad(&w_rowc[3u * rank + c]);
}

fn rowc_set(rank: u32, c: u32, v: u32) {
    if (gm) {
        atomicStore(&gs[rowc_at() + 3u * (g_start + rank) + c], v);
    } else {
        atomicStore(&w_rowc[3u * rank + c], v);
    }
}

fn evl_set(e: u32, s: u32) {
    if (gm) {
        atomicStore(&gs[evl_at() + e], s);
    } else if (e < EF) {
        // Cleared before; the two halves of a word belong to different ranks.
        atomicOr(&w_evl[e >> 1u], s << ((e & 1u) * 16u));
    }
}

fn evl_get(e: u32) -> u32 {
    if (gm) {
        return atomicLoad(&gs[evl_at() + e]);
    }
    return (atomicLoad(&w_evl[e >> 1u]) >> ((e & 1u) * 16u)) & 0xffffu;
}

// Sets the bit of slot s; returns whether it was set already.
fn bit_test_set(s: u32) -> bool {
    let bit = 1u << (s & 31u);
    var prev = 0u;
    if (gm) {
        prev = atomicOr(&gs[bits_at() + (s >> 5u)], bit);
    } else {
        prev = atomicOr(&w_bits[s >> 5u], bit);
    }
    return (prev & bit) != 0u;
}

fn hot_row(slot: u32) -> i32 {
    let col = slot / pc.block_size;
    var block = 0;
    if (gm) {
        block = hot_table[g_r * pc.hot_width + col];
    } else {
        block = w_hot[col];
    }
    return phys_row(block, pc.attn_stride, slot % pc.block_size);
}

// Entry q of the request: (class, value) with class 0 invalid, 1 resident (value = physical
// row), 2 host (value = flat host row).
fn classify(q: u32) -> vec2<i32> {
    let rank = q / pc.top_k;
    let j = q - rank * pc.top_k;
    let tok = topk[row_t(rank) * pc.top_k + j];
    if (tok < 0) {
        return vec2<i32>(0, -1);
    }
    let page = u32(tok) / pc.block_size;
    if (page >= pc.max_pages) {
        return vec2<i32>(0, -1);
    }
    let off = u32(tok) % pc.block_size;
    let res = resident_table[g_s * pc.max_pages + page];
    let hst = host_table[g_r * pc.max_pages + page];
    if (res > 0) {
        let v = phys_row(res, pc.attn_stride, off);
        return vec2<i32>(select(1, 0, v == -1), v);
    }
    let g = phys_row(hst, pc.block_size, off);
    return vec2<i32>(select(2, 0, g == -1), g);
}

// Plan entries the row of rank `rank` got (misses with a slot, numbered from the row's base).
fn assigned(rank: u32, misses: u32, ev: u32) -> u32 {
    let base = rowc_get(rank, 2u);
    var next = misses;
    if (rank + 1u < g_count) {
        next = rowc_get(rank + 1u, 2u);
    }
    return min(next, ev) - min(base, ev);
}

@compute @workgroup_size(1024)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    //@SG_PARAMS
) {
    vl = lid;
    //@SG_INIT
    let t0 = group_index(wid, nwg);
    if (t0 >= pc.num_tokens) {
        return;
    }
    let k = pc.top_k;
    let n = pc.hot_slots;
    let req = req_id[t0];
    if (req < 0 || u32(req) >= pc.num_requests) {
        // Padding row: empty outputs, no state touched.
        for (var j = lid; j < k; j = j + W) {
            indices[t0 * k + j] = -1;
            miss_src[t0 * k + j] = -1;
            miss_dst[t0 * k + j] = -1;
        }
        if (lid == 0u) {
            valid_counts[t0] = 0;
            hit_counts[t0] = 0;
            miss_counts[t0] = 0;
        }
        return;
    }
    let r = u32(req);
    g_r = r;
    g_s = r;
    if ((pc.flags & 4u) != 0u) {
        g_s = u32(idx_mapping[r]);
    }

    // Phase 0: the request's rows. start = valid rows of requests before r, count = rows of r;
    // a workgroup whose request has an earlier row exits.
    if (lid < 8u) {
        atomicStore(&w_flags[lid], 0u);
    }
    workgroupBarrier();
    {
        var before = 0u;
        var mine = 0u;
        var earlier = false;
        for (var b = 0u; b < pc.num_tokens; b = b + W) {
            let t2 = b + vl;
            if (t2 < pc.num_tokens) {
                let o = req_id[t2];
                if (o >= 0 && u32(o) < pc.num_requests) {
                    if (u32(o) < r) {
                        before = before + 1u;
                    } else if (u32(o) == r) {
                        if (t2 < t0) {
                            earlier = true;
                        } else {
                            mine = mine + 1u;
                        }
                    }
                }
            }
        }
        if (before > 0u) {
            atomicAdd(&w_flags[1], before);
        }
        if (mine > 0u) {
            atomicAdd(&w_flags[2], mine);
        }
        if (earlier) {
            atomicStore(&w_flags[0], 1u);
        }
    }
    workgroupBarrier();
    if (atomicLoad(&w_flags[0]) != 0u) {
        return;
    }
    let start = atomicLoad(&w_flags[1]);
    let count = atomicLoad(&w_flags[2]);
    g_start = start;
    g_count = count;
    let e_count = count * k;
    let fast = (pc.flags & 2u) != 0u && count <= MAXR && e_count <= EF && n <= NF
        && pc.hot_width <= HOTC;
    gm = !fast;
    if (gm) {
        cap = 2u * e_count;
        hb = 2u * start * k;
    } else {
        cap = TC;
        hb = 0u;
    }
    // Entries (positions) in one pass: kept in registers between phases.
    let single = e_count <= EF;
    let nsingle = n <= NF;
    if (count == 1u) {
        if (lid == 0u) {
            set_row(0u, t0);
        }
    } else {
        var carry = 0u;
        for (var b = t0; b < pc.num_tokens; b = b + W) {
            let t2 = b + vl;
            var f = 0u;
            if (t2 < pc.num_tokens && req_id[t2] == req) {
                f = 1u;
            }
            let ex = scan(f);
            if (f == 1u) {
                set_row(carry + ex, t2);
            }
            carry = carry + scan_total;
        }
    }
    bar();

    // Phase 1: clear the table and the per-request arrays; cache the hot-table row; load and
    // classify this invocation's entries (one pass).
    let lb = g_s * n;
    if (gm) {
        for (var h = lid; h < cap; h = h + W) {
            atomicStore(&gs[hb + h], NONE);
            atomicStore(&gs[hb + 2u * tk() + h], NONE);
            atomicStore(&gs[hb + 4u * tk() + h], NONE);
        }
        for (var i = lid; i < nb(); i = i + W) {
            atomicStore(&gs[bits_at() + i], 0u);
        }
        for (var i = lid; i < 3u * count; i = i + W) {
            atomicStore(&gs[rowc_at() + 3u * start + i], 0u);
        }
    } else {
        for (var h = lid; h < TC; h = h + W) {
            atomicStore(&w_key[h], NONE);
            atomicStore(&w_meta[h], NONE);
        }
        if (lid < 128u) {
            atomicStore(&w_bits[lid], 0u);
        }
        atomicStore(&w_evl[lid], 0u);
        if (lid < 96u) {
            atomicStore(&w_rowc[lid], 0u);
        }
        if (lid < pc.hot_width) {
            w_hot[lid] = hot_table[r * pc.hot_width + lid];
        }
    }
    if (lid == 0u) {
        atomicStore(&w_flags[3], 0u);
        atomicStore(&w_flags[4], 0u);
    }
    var ck = vec2<u32>(0u, 0u);
    var cv = vec2<i32>(-1, -1);
    var ch = vec2<u32>(NONE, NONE);
    var cm = vec2<u32>(NONE, NONE);
    if (single) {
        for (var i = 0u; i < IK; i = i + 1u) {
            let q = vl * IK + i;
            if (q < e_count) {
                let c = classify(q);
                ck[i] = u32(c.x);
                cv[i] = c.y;
            }
        }
    }
    bar();

    // Phase 2: insert the host rows; each keeps its first entry.
    {
        var any = false;
        for (var pb = 0u; pb < e_count; pb = pb + EF) {
            for (var i = 0u; i < IK; i = i + 1u) {
                let q = pb + vl * IK + i;
                if (q < e_count) {
                    var c = vec2<i32>(i32(ck[i]), cv[i]);
                    if (!single) {
                        c = classify(q);
                    }
                    if (u32(c.x) == HOST) {
                        let h = insert(u32(c.y));
                        fe_min(h, q);
                        ch[i] = h;
                        any = true;
                    }
                }
            }
        }
        if (any) {
            atomicStore(&w_flags[3], 1u);
        }
    }
    bar();
    let any_host = atomicLoad(&w_flags[3]) != 0u;

    var misses = 0u;
    var ev = n;
    var row0_hits = 0u;
    if (any_host) {
        // Phase 3: the LRU must be a permutation of 0..n; otherwise it is reset to the identity
        // and every slot_host_rows entry to -1 (no hits; the reset is written in phase 6).
        var sv = vec4<u32>(0u, 0u, 0u, 0u);
        for (var pb = 0u; pb < n; pb = pb + NF) {
            for (var i = 0u; i < IN; i = i + 1u) {
                let p = pb + vl * IN + i;
                if (p < n) {
                    let s = lru_get(lb + p);
                    if (nsingle) {
                        sv[i] = s;
                    }
                    if (s >= n || bit_test_set(s)) {
                        atomicStore(&w_flags[4], 1u);
                    }
                }
            }
        }
        bar();
        let corrupt = atomicLoad(&w_flags[4]) != 0u;

        // Phase 4: the first LRU position caching each wanted row inside the host pool.
        var hq = vec4<u32>(NONE, NONE, NONE, NONE);
        if (!corrupt) {
            for (var pb = 0u; pb < n; pb = pb + NF) {
                for (var i = 0u; i < IN; i = i + 1u) {
                    let p = pb + vl * IN + i;
                    if (p < n) {
                        var s = sv[i];
                        if (!nsingle) {
                            s = lru_get(lb + p);
                        }
                        let c = slot_host_rows[lb + s];
                        var h = NONE;
                        // A row beyond the host pool is never a hit, even if a corrupt slot_host_rows names it.
                        if (c >= 0 && u32(c) < pc.host_rows) {
                            h = find(u32(c));
                            if (h != NONE) {
                                ref_min(h, p);
                            }
                        }
                        hq[i] = h;
                    }
                }
            }
        }
        bar();

        // Phase 5: hits and evictables in LRU order; evictables are listed by rank.
        var prank = vec4<u32>(0u, 0u, 0u, 0u);
        var phit = 0u;
        var hits_total = 0u;
        for (var pb = 0u; pb < n; pb = pb + NF) {
            var nh = 0u;
            var mask = 0u;
            for (var i = 0u; i < IN; i = i + 1u) {
                let p = pb + vl * IN + i;
                if (p < n && !corrupt) {
                    var h = hq[i];
                    if (!nsingle) {
                        h = NONE;
                        let c = slot_host_rows[lb + lru_get(lb + p)];
                        if (c >= 0 && u32(c) < pc.host_rows) {
                            h = find(u32(c));
                        }
                    }
                    if (h != NONE && ref_get(h) == p) {
                        mask = mask | (1u << i);
                        nh = nh + 1u;
                    }
                }
            }
            let ex = scan(nh);
            var hr = hits_total + ex;
            for (var i = 0u; i < IN; i = i + 1u) {
                let p = pb + vl * IN + i;
                if (p < n) {
                    var s = p;
                    if (!corrupt) {
                        if (nsingle) {
                            s = sv[i];
                        } else {
                            s = lru_get(lb + p);
                        }
                    }
                    let hit = ((mask >> i) & 1u) == 1u;
                    var rank = 0u;
                    if (hit) {
                        rank = hr;
                        hr = hr + 1u;
                    } else {
                        rank = p - hr;
                        evl_set(rank, s);
                    }
                    if (nsingle) {
                        sv[i] = s;
                        prank[i] = rank;
                    } else {
                        atomicStore(&gs[pos_at() + p], s | (select(0u, 1u, hit) << 15u) | (rank << 16u));
                    }
                }
            }
            phit = mask;
            hits_total = hits_total + scan_total;
        }
        ev = n - hits_total;
        bar();

        // Phase 5b: each hit's slot (the ref now names slots, no longer positions).
        if (!corrupt) {
            for (var pb = 0u; pb < n; pb = pb + NF) {
                for (var i = 0u; i < IN; i = i + 1u) {
                    let p = pb + vl * IN + i;
                    if (p < n) {
                        if (nsingle) {
                            if (((phit >> i) & 1u) == 1u) {
                                ref_set(hq[i], sv[i]);
                            }
                        } else {
                            let info = atomicLoad(&gs[pos_at() + p]);
                            if (((info >> 15u) & 1u) == 1u) {
                                let s = info & 0x7fffu;
                                ref_set(find(u32(slot_host_rows[lb + s])), s);
                            }
                        }
                    }
                }
            }
        }
        bar();

        // Phase 6a: number the misses (first appearances without a slot) in entry order; count
        // hits by the row of first appearance; each row's base is the misses before it.
        var carry = 0u;
        for (var pb = 0u; pb < e_count; pb = pb + EF) {
            var nm = 0u;
            var nh = 0u;
            var mask = 0u;
            for (var i = 0u; i < IK; i = i + 1u) {
                let q = pb + vl * IK + i;
                if (q < e_count) {
                    var kind = ck[i];
                    var h = ch[i];
                    if (!single) {
                        let c = classify(q);
                        kind = u32(c.x);
                        h = NONE;
                        if (kind == HOST) {
                            h = find(u32(c.y));
                        }
                    }
                    if (kind == HOST && fe_get(h) == q) {
                        if (ref_get(h) != NONE) {
                            nh = nh + 1u;
                            if (count > 1u) {
                                rowc_add(q / k, 0u, 1u);
                            }
                        } else {
                            mask = mask | (1u << i);
                            nm = nm + 1u;
                        }
                    }
                }
            }
            // Misses and hits of a pass are at most 2048 each: one scan of both halves.
            let ex = scan(nm | (nh << 16u));
            var m = carry + (ex & 0xffffu);
            for (var i = 0u; i < IK; i = i + 1u) {
                let q = pb + vl * IK + i;
                if (q < e_count) {
                    if (q % k == 0u) {
                        rowc_set(q / k, 2u, m);
                    }
                    var num = NONE;
                    if (((mask >> i) & 1u) == 1u) {
                        num = m;
                        m = m + 1u;
                    }
                    if (single) {
                        cm[i] = num;
                    } else {
                        atomicStore(&gs[6u * tk() + start * k + q], num);
                    }
                }
            }
            carry = carry + (scan_total & 0xffffu);
            row0_hits = row0_hits + (scan_total >> 16u);
        }
        misses = carry;
        let used = min(misses, ev);
        bar();

        // Phase 6b: misses take the first evictable slots (slot_host_rows, plan); the new LRU order:
        // unused evictables, miss slots, hits (each in old order); a corrupt state's other slots
        // get slot_host_rows -1.
        for (var pb = 0u; pb < e_count; pb = pb + EF) {
            for (var i = 0u; i < IK; i = i + 1u) {
                let q = pb + vl * IK + i;
                if (q < e_count) {
                    var m = cm[i];
                    if (!single) {
                        m = atomicLoad(&gs[6u * tk() + start * k + q]);
                    }
                    if (m != NONE && m < ev) {
                        var g = cv[i];
                        var h = ch[i];
                        if (!single) {
                            g = classify(q).y;
                            h = find(u32(g));
                        }
                        let s = evl_get(m);
                        ref_set(h, s);
                        let src = select(-1, g, u32(g) < pc.host_rows);
                        slot_host_rows[lb + s] = src;
                        let rank = q / k;
                        let at = row_t(rank) * k + (m - rowc_get(rank, 2u));
                        miss_src[at] = src;
                        miss_dst[at] = hot_row(s);
                    }
                }
            }
        }
        for (var pb = 0u; pb < n; pb = pb + NF) {
            for (var i = 0u; i < IN; i = i + 1u) {
                let p = pb + vl * IN + i;
                if (p < n) {
                    var s = sv[i];
                    var rank = prank[i];
                    var hit = ((phit >> i) & 1u) == 1u;
                    if (!nsingle) {
                        let info = atomicLoad(&gs[pos_at() + p]);
                        s = info & 0x7fffu;
                        hit = ((info >> 15u) & 1u) == 1u;
                        rank = info >> 16u;
                    }
                    var at = ev + rank;
                    if (!hit) {
                        if (rank >= used) {
                            at = rank - used;
                            if (corrupt) {
                                slot_host_rows[lb + s] = -1;
                            }
                        } else {
                            at = ev - used + rank;
                        }
                    }
                    lru_set(lb + at, s);
                }
            }
        }
        bar();
    }

    // Phase 7: outputs; the plan's unused tail is -1.
    var valid = 0u;
    for (var pb = 0u; pb < e_count; pb = pb + EF) {
        var nv = 0u;
        for (var i = 0u; i < IK; i = i + 1u) {
            let q = pb + vl * IK + i;
            if (q < e_count) {
                var kind = ck[i];
                var v = cv[i];
                var h = ch[i];
                if (!single) {
                    let c = classify(q);
                    kind = u32(c.x);
                    v = c.y;
                    h = NONE;
                    if (kind == HOST) {
                        h = find(u32(v));
                    }
                }
                var out = -1;
                if (kind == RESIDENT) {
                    out = v;
                } else if (kind == HOST) {
                    let s = ref_get(h);
                    if (s != NONE) {
                        out = hot_row(s);
                    }
                }
                let rank = q / k;
                let j = q - rank * k;
                let at = row_t(rank) * k + j;
                indices[at] = out;
                if (out != -1) {
                    nv = nv + 1u;
                    if (count > 1u) {
                        rowc_add(rank, 1u, 1u);
                    }
                }
                var got = 0u;
                if (any_host) {
                    got = assigned(rank, misses, ev);
                }
                if (j >= got) {
                    miss_src[at] = -1;
                    miss_dst[at] = -1;
                }
            }
        }
        if (count == 1u) {
            _ = scan(nv);
            valid = valid + scan_total;
        }
    }
    bar();
    if (count == 1u) {
        if (lid == 0u) {
            valid_counts[t0] = i32(valid);
            hit_counts[t0] = i32(row0_hits);
            var got = 0u;
            if (any_host) {
                got = assigned(0u, misses, ev);
            }
            miss_counts[t0] = i32(got);
        }
    } else {
        for (var rank = lid; rank < count; rank = rank + W) {
            let t = row_t(rank);
            valid_counts[t] = i32(rowc_get(rank, 1u));
            hit_counts[t] = i32(rowc_get(rank, 0u));
            var got = 0u;
            if (any_host) {
                got = assigned(rank, misses, ev);
            }
            miss_counts[t] = i32(got);
        }
    }
}
