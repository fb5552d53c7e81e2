// Resolve, pass 2 (hisparse_core::ops::resolve): one workgroup per token row; the workgroup of a
// request's first row resolves all rows of that request against its state, padding rows write
// their own empty outputs, every other workgroup exits.
//
// A request's entries are numbered q = rank * top_k + j (rank = row position within the request)
// so that q order is the reference's "row by row, column by column" order. Scratch regions are
// private to the request: entries at [start * top_k, (start + count) * top_k), a hash table of
// 2 * entries slots at twice that offset, per-row counters at [start, start + count), per-slot
// arrays at group * hot_slots.
// Parameters and bindings 0-12: resolve_common.wgsl.
//@read info: array<u32>
//@read perm: array<u32>
// host row wanted by entry q, or -1
//@read_write gval: array<i32>
// miss number of entry q (first appearance, not a hit), or NONE
//@read_write xmiss: array<u32>
// 4 words per slot: key (host row), first entry q, first LRU position, hot slot
//@read_write hash: array<atomic<u32>>
// 4 words per row position: hits, valid entries, misses before the row, unused
//@read_write rowc: array<atomic<u32>>
// per LRU position p: slot | hit << 15 | evictable rank << 16
//@read_write old: array<u32>
// evictable slots in LRU order
//@read_write evl: array<u32>
// Batch-row order (flags bit 2): batch row → state row of resident_table, slot_host_rows and lru. Binding
// 0 (and the grouping pass's) then holds the rows' batch rows with the unowned ones already -1
// (resolve_order.wgsl).
//@read idx_mapping: array<i32>

const W: u32 = 256u;

var<workgroup> sc: array<u32, 256>;
var<workgroup> seen: array<atomic<u32>, 1024>;
var<workgroup> any_host: atomic<u32>;
var<workgroup> bad_lru: atomic<u32>;

// Inclusive workgroup scan of f with workgroup memory only (Hillis-Steele, 16 barriers); the
// caller reads sc[W - 1] (the total) and then must barrier before the next scan.
fn scan_barriers(lid: u32, f: u32) -> u32 {
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
    return sc[lid];
}

// `scan(lid, f)`: the workgroup scan the phases call, with the same contract as scan_barriers
// (build.rs fills in scan_barriers itself, or a subgroup scan with two barriers where the device
// has subgroup arithmetic).
//@SCAN

fn lru_get(i: u32) -> u32 {
    let w = atomicLoad(&lru[i >> 1u]);
    return (w >> ((i & 1u) * 16u)) & 0xffffu;
}

fn lru_set(i: u32, v: u32) {
    let sh = (i & 1u) * 16u;
    atomicAnd(&lru[i >> 1u], ~(0xffffu << sh));
    atomicOr(&lru[i >> 1u], v << sh);
}

fn hash_of(g: u32, size: u32) -> u32 {
    return (g * 2654435761u) % size;
}

// Inserts host row g into the table at slot base hb of `size` slots; returns its slot.
fn insert(hb: u32, size: u32, g: u32) -> u32 {
    var h = hash_of(g, size);
    loop {
        let r = atomicCompareExchangeWeak(&hash[(hb + h) * 4u], NONE, g);
        if (r.exchanged || r.old_value == g) {
            return h;
        }
        if (r.old_value != NONE) {
            h = (h + 1u) % size;
        }
    }
    return h;
}

// The slot of host row g, or NONE.
fn find(hb: u32, size: u32, g: u32) -> u32 {
    var h = hash_of(g, size);
    loop {
        let k = atomicLoad(&hash[(hb + h) * 4u]);
        if (k == g) {
            return h;
        }
        if (k == NONE) {
            return NONE;
        }
        h = (h + 1u) % size;
    }
    return NONE;
}

fn hot_row(r: u32, slot: u32) -> i32 {
    let block = hot_table[r * pc.hot_width + slot / pc.block_size];
    return phys_row(block, pc.attn_stride, slot % pc.block_size);
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    //@SG_PARAMS
) {
    //@SG_INIT
    let t0 = group_index(wid, nwg);
    if (t0 >= pc.num_tokens) {
        return;
    }
    let k = pc.top_k;
    let rank0 = info[4u * t0 + 3u];
    if (rank0 == NONE) {
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
    if (rank0 != 0u) {
        return;
    }
    let r = u32(req_id[t0]);
    // `r`: row of host_table and hot_table; `sr`: row of resident_table, slot_host_rows and lru.
    var sr = r;
    if ((pc.flags & 4u) != 0u) {
        sr = u32(idx_mapping[r]);
    }
    let start = info[4u * t0 + 1u];
    let count = info[4u * t0 + 2u];
    let n = pc.hot_slots;
    let e_count = count * k;
    let q0 = start * k;
    let hsize = 2u * e_count;
    let hb = 2u * q0;
    let grp = select(start, r, (pc.flags & 1u) != 0u) * n;

    // Phase 1: classify every entry, clear the outputs, the hash table and the counters.
    if (lid == 0u) {
        atomicStore(&any_host, 0u);
        atomicStore(&bad_lru, 0u);
    }
    workgroupBarrier();
    for (var i = lid; i < 1024u; i = i + W) {
        atomicStore(&seen[i], 0u);
    }
    for (var q = lid; q < e_count; q = q + W) {
        let t = perm[start + q / k];
        let at = t * k + q % k;
        let tok = topk[at];
        var g = -1;
        var v = -1;
        if (tok >= 0) {
            let page = u32(tok) / pc.block_size;
            if (page < pc.max_pages) {
                let off = u32(tok) % pc.block_size;
                let res = resident_table[sr * pc.max_pages + page];
                if (res > 0) {
                    v = phys_row(res, pc.attn_stride, off);
                } else {
                    g = phys_row(host_table[r * pc.max_pages + page], pc.block_size, off);
                }
            }
        }
        if (g >= 0) {
            atomicStore(&any_host, 1u);
        }
        gval[q0 + q] = g;
        indices[at] = v;
        miss_src[at] = -1;
        miss_dst[at] = -1;
    }
    for (var h = lid; h < hsize; h = h + W) {
        atomicStore(&hash[(hb + h) * 4u], NONE);
        atomicStore(&hash[(hb + h) * 4u + 1u], NONE);
        atomicStore(&hash[(hb + h) * 4u + 2u], NONE);
        atomicStore(&hash[(hb + h) * 4u + 3u], NONE);
    }
    for (var i = lid; i < count; i = i + W) {
        atomicStore(&rowc[(start + i) * 4u], 0u);
        atomicStore(&rowc[(start + i) * 4u + 1u], 0u);
        atomicStore(&rowc[(start + i) * 4u + 2u], 0u);
    }
    storageBarrier();
    workgroupBarrier();
    let wanted = atomicLoad(&any_host) != 0u;

    var ev = 0u;
    var used = 0u;
    var misses = 0u;
    if (wanted) {
        // Phase 2: the distinct host rows; each remembers its first entry.
        for (var q = lid; q < e_count; q = q + W) {
            let g = gval[q0 + q];
            if (g >= 0) {
                let h = insert(hb, hsize, u32(g));
                atomicMin(&hash[(hb + h) * 4u + 1u], q);
            }
        }
        // Phase 3: repair an LRU that is not a permutation of 0..n.
        let lb = sr * n;
        for (var p = lid; p < n; p = p + W) {
            let s = lru_get(lb + p);
            if (s >= n) {
                atomicStore(&bad_lru, 1u);
            } else {
                let bit = 1u << (s & 31u);
                let prev = atomicOr(&seen[s >> 5u], bit);
                if ((prev & bit) != 0u) {
                    atomicStore(&bad_lru, 1u);
                }
            }
        }
        storageBarrier();
        workgroupBarrier();
        let bad = atomicLoad(&bad_lru) != 0u;
        if (bad) {
            for (var p = lid; p < n; p = p + W) {
                slot_host_rows[lb + p] = -1;
            }
            storageBarrier();
        }
        // Phase 4: the first LRU position caching each wanted row inside the host pool.
        for (var p = lid; p < n; p = p + W) {
            var s = p;
            if (!bad) {
                s = lru_get(lb + p);
            }
            old[grp + p] = s;
            let c = slot_host_rows[lb + s];
            // A row beyond the host pool is never a hit, even if a corrupt slot_host_rows names it.
            if (c >= 0 && u32(c) < pc.host_rows) {
                let h = find(hb, hsize, u32(c));
                if (h != NONE) {
                    atomicMin(&hash[(hb + h) * 4u + 2u], p);
                }
            }
        }
        storageBarrier();
        // Phase 5: hits and evictables in LRU order.
        var carry = 0u;
        for (var p0 = 0u; p0 < n; p0 = p0 + W) {
            let p = p0 + lid;
            var hit = false;
            var s = 0u;
            if (p < n) {
                s = old[grp + p];
                let c = slot_host_rows[lb + s];
                if (c >= 0 && u32(c) < pc.host_rows) {
                    let h = find(hb, hsize, u32(c));
                    if (h != NONE && atomicLoad(&hash[(hb + h) * 4u + 2u]) == p) {
                        hit = true;
                        atomicStore(&hash[(hb + h) * 4u + 3u], s);
                    }
                }
            }
            let f = select(0u, 1u, p < n && !hit);
            let incl = scan(lid, f);
            let total = sc[W - 1u];
            workgroupBarrier();
            let erank = carry + incl - f;
            if (p < n) {
                old[grp + p] = s | (select(0u, 1u, hit) << 15u) | (erank << 16u);
                if (!hit) {
                    evl[grp + erank] = s;
                }
            }
            carry = carry + total;
        }
        ev = carry;
        storageBarrier();
        // Phase 6: number the misses (first appearances that are not hits) in entry order.
        carry = 0u;
        for (var q1 = 0u; q1 < e_count; q1 = q1 + W) {
            let q = q1 + lid;
            var f = 0u;
            if (q < e_count) {
                let g = gval[q0 + q];
                if (g >= 0) {
                    let h = find(hb, hsize, u32(g));
                    if (atomicLoad(&hash[(hb + h) * 4u + 1u]) == q) {
                        if (atomicLoad(&hash[(hb + h) * 4u + 2u]) == NONE) {
                            f = 1u;
                        } else {
                            atomicAdd(&rowc[(start + q / k) * 4u], 1u);
                        }
                    }
                }
            }
            let incl = scan(lid, f);
            let total = sc[W - 1u];
            workgroupBarrier();
            let m = carry + incl - f;
            if (q < e_count) {
                xmiss[q0 + q] = select(NONE, m, f == 1u);
                if (q % k == 0u) {
                    atomicStore(&rowc[(start + q / k) * 4u + 2u], m);
                }
            }
            carry = carry + total;
        }
        misses = carry;
        used = min(misses, ev);
        storageBarrier();
        // Phase 7: misses take the first evictable slots.
        for (var q = lid; q < e_count; q = q + W) {
            let m = xmiss[q0 + q];
            if (m != NONE && m < ev) {
                let g = gval[q0 + q];
                let h = find(hb, hsize, u32(g));
                let s = evl[grp + m];
                atomicStore(&hash[(hb + h) * 4u + 3u], s);
                let in_pool = u32(g) < pc.host_rows;
                let src = select(-1, g, in_pool);
                slot_host_rows[lb + s] = src;
                let row = q / k;
                let t = perm[start + row];
                let slot_in_row = m - atomicLoad(&rowc[(start + row) * 4u + 2u]);
                miss_src[t * k + slot_in_row] = src;
                miss_dst[t * k + slot_in_row] = hot_row(r, s);
            }
        }
        // Phase 8: the new LRU order: unused evictables, miss slots, hits.
        for (var p = lid; p < n; p = p + W) {
            let v = old[grp + p];
            let s = v & 0x7fffu;
            let er = v >> 16u;
            if (((v >> 15u) & 1u) == 1u) {
                lru_set(lb + ev + (p - er), s);
            } else if (er >= used) {
                lru_set(lb + er - used, s);
            }
        }
        for (var m = lid; m < used; m = m + W) {
            lru_set(lb + ev - used + m, evl[grp + m]);
        }
        storageBarrier();
    }

    // Phase 9: outputs.
    for (var q = lid; q < e_count; q = q + W) {
        let t = perm[start + q / k];
        let at = t * k + q % k;
        let g = gval[q0 + q];
        var v = indices[at];
        if (g >= 0) {
            let h = find(hb, hsize, u32(g));
            let s = atomicLoad(&hash[(hb + h) * 4u + 3u]);
            v = -1;
            if (s != NONE) {
                v = hot_row(r, s);
            }
            indices[at] = v;
        }
        if (v != -1) {
            atomicAdd(&rowc[(start + q / k) * 4u + 1u], 1u);
        }
    }
    storageBarrier();
    for (var i = lid; i < count; i = i + W) {
        let t = perm[start + i];
        valid_counts[t] = i32(atomicLoad(&rowc[(start + i) * 4u + 1u]));
        hit_counts[t] = i32(atomicLoad(&rowc[(start + i) * 4u]));
        var mc = 0u;
        if (wanted) {
            let first = atomicLoad(&rowc[(start + i) * 4u + 2u]);
            var next = misses;
            if (i + 1u < count) {
                next = atomicLoad(&rowc[(start + i + 1u) * 4u + 2u]);
            }
            mc = min(next, ev) - min(first, ev);
        }
        miss_counts[t] = i32(mc);
    }
}
