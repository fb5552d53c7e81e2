// The body of hs_resolve (the design measured fastest on the H200):
// every entry classified in one pass of batched loads (a one-row request's class, value and hash
// slot kept in registers), hits found in LRU order, the table cleared at its full shared capacity,
// one barrier per block scan. hs_resolve_gather runs it too. `t` is the token row the block
// resolves (its block index). Returns the rows of the request this
// block resolved (0 when it resolved none: a padding row, or a later row of a request), after a
// barrier that follows every write of the miss plan and its counts, so that the block may read
// them back (the fused gather).
//
// Global round trips: the block's time is its chain of dependent steps, so every load that does
// not depend on the top-k is issued beside it. Round trip 1: req_id[t] and the first pass of row
// t's top-k (row t is the first row of the request whenever this block resolves one). Round trip
// 2, issued before the request's rows are counted: the page-table entries of those top-k entries,
// the request's LRU row (when the hot buffer fits one pass) and its hot-table row (staged in the
// first 4 * HS_RESOLVE_HOT_STAGE bytes of the dynamic shared memory when it has at most
// HS_RESOLVE_HOT_STAGE entries; otherwise read from global memory where needed); the shared
// table is cleared meanwhile. Round trip 3: the slot_host_rows entry of each LRU position's slot (a load that
// waits on the LRU load only), issued before the classification. Steps 4-8 then read global
// memory only in the general case (several rows, or a top-k or hot buffer beyond one pass).
//
// Batch-row order (hisparse_core's resolve module, "Table row order"): with `idx_mapping`
// non-null, `req_id` holds batch rows (< num_requests) of host_table and hot_table, and the state
// row of resident_table, slot_host_rows and lru is idx_mapping[batch row] when it lies below num_state_rows
// and no smaller batch row maps to it (a block-wide scan of idx_mapping[0..b)); otherwise the
// row is padding. A null idx_mapping is state-row order: one branch, nothing else changes.
//
// Stats (`stats` non-null, the slot's four words): hs_resolve_rows adds the call (block 0,
// before anything else, so an empty batch, launched as one block, counts too); thread 0 of a
// resolving block adds each of its rows' hit and miss counts where it writes them (nothing when
// no entry reads host: the counts are 0) and each row's valid count after the row's last scan.
HS_DEVICE u32 hs_resolve_body(
    const i32* __restrict__ req_id, const i32* __restrict__ topk,
    const i32* __restrict__ resident_table, const i32* __restrict__ host_table,
    const i32* __restrict__ hot_table, i32* __restrict__ slot_host_rows, u16* __restrict__ lru,
    i32* __restrict__ indices, i32* __restrict__ valid_counts, i32* __restrict__ hit_counts,
    i32* __restrict__ miss_counts, i32* __restrict__ miss_src, i32* __restrict__ miss_dst,
    hs_wanted* __restrict__ workspace, u32* __restrict__ workspace_counter, u32 workspace_entries,
    u32 smem_table_entries, u32 num_tokens, u32 top_k, u32 num_requests, u32 max_pages,
    u32 block_size, u32 hot_slots, u32 attention_block_stride, u32 host_num_blocks,
    const i32* __restrict__ idx_mapping, u32 num_state_rows, u32* __restrict__ stats, u32 t,
    u32* s_scan, u32* s_words, bool& allocated) {
    HS_DYN_SHARED(hs_smem);
    // The caller's static shared scratch (hs_resolve_rows): the scans' 4 * HS_MAX_WARPS words
    // and four flag words.
    u32& s_flag = s_words[0];
    u32& s_any_host = s_words[1];
    u32& s_corrupt = s_words[2];
    u32& s_table_off = s_words[3];
    // The caller has waited for its grid dependency (HS_GRID_DEP_WAIT) before calling this.
    allocated = false; // thread 0: whether this block took workspace (hs_workspace_release_after)

    const hs_resolve_desc d =
        hs_resolve_desc_make(num_tokens, top_k, num_requests, max_pages, block_size, hot_slots,
                             attention_block_stride, host_num_blocks);

    if (t >= num_tokens) return 0;
    const u32 K = top_k, N = hot_slots;
    const u32 span_k = HS_NTHREADS * HS_RESOLVE_IK, span_n = HS_NTHREADS * HS_RESOLVE_IN;
    // Row t's entries in one pass (the decode case): its first pass is loaded up front.
    const bool pre_k = K <= span_k;
    // The hot buffer in one pass: its LRU row and slot_host_rows entries are loaded up front, and each LRU
    // position's hash slot kept in registers.
    const bool cached_n = N <= span_n;

    const i32 req = HS_LDG(req_id + t);

    // Step 1: padding rows (in batch-row order also a batch row that owns no state row).
    bool padding = req < 0 || (u32)req >= num_requests;
    u32 sr = (u32)req;
    if (!padding && idx_mapping != 0) {
        const i32 s = HS_LDG(idx_mapping + req);
        padding = s < 0 || (u32)s >= num_state_rows;
        if (!padding) { // uniform over the block
            if (HS_TID == 0) s_flag = 0;
            HS_SYNC();
            for (u32 b = HS_TID; b < (u32)req; b += HS_NTHREADS)
                if (HS_LDG(idx_mapping + b) == s) atomicOr(&s_flag, 1u);
            HS_SYNC();
            padding = s_flag != 0;
            sr = (u32)s;
            HS_SYNC(); // every thread has read s_flag before it is reused below
        }
    }
    if (padding) {
        const u64 base = (u64)t * K;
        for (u32 j = HS_TID; j < K; j += HS_NTHREADS) {
            indices[base + j] = -1;
            miss_src[base + j] = -1;
            miss_dst[base + j] = -1;
        }
        if (HS_TID == 0) {
            valid_counts[t] = 0;
            hit_counts[t] = 0;
            miss_counts[t] = 0;
        }
        return 0;
    }
    const u32 r = (u32)req;
    const u64 sbase = (u64)sr * N;

    // Round trip 2 (nothing here waits for the rows' count): row t's top-k (row t is the first
    // row of the request whenever this block resolves one), the LRU row (two positions per
    // register) and (below) the hot-table row.
    i32 p_tok[HS_RESOLVE_IK];
#pragma unroll
    for (u32 q = 0; q < HS_RESOLVE_IK; ++q) {
        const u32 j = HS_TID * HS_RESOLVE_IK + q;
        p_tok[q] = pre_k && j < K ? HS_LDG(topk + (u64)t * K + j) : -1;
    }
    u32 p_lru[HS_RESOLVE_IN / 2];
#pragma unroll
    for (u32 q = 0; q < HS_RESOLVE_IN; q += 2) {
        const u32 p = HS_TID * HS_RESOLVE_IN + q;
        const u32 lo = cached_n && p < N ? (u32)lru[sbase + p] : 0u;
        const u32 hi = cached_n && p + 1 < N ? (u32)lru[sbase + p + 1] : 0u;
        p_lru[q / 2] = lo | (hi << 16);
    }

    // Only the first row of a request resolves it; count the request's rows (one block sum of
    // the earlier rows naming the request and of the rows from t on).
    u32 n_before = 0, n_rows = 0;
    for (u32 t2 = HS_TID; t2 < t; t2 += HS_NTHREADS)
        if (HS_LDG(req_id + t2) == req) ++n_before;
    for (u32 t2 = t + HS_TID; t2 < num_tokens; t2 += HS_NTHREADS)
        if (HS_LDG(req_id + t2) == req) ++n_rows;

    // Shared memory: the hot stage, then (in shared-state mode) the per-request state: lru copy
    // (u16[N]), partition (u16[N]), bitmap (u32[N/32]), each part 16-byte aligned, then the
    // shared table; in global-state mode the state lives in the workspace and the shared table
    // follows the hot stage.
    const bool global_state = (smem_table_entries & HS_RESOLVE_GLOBAL_STATE) != 0u;
    const u32 smem_cap = smem_table_entries & ~HS_RESOLVE_GLOBAL_STATE;
    const u32 state_bytes = hs_resolve_state_bytes(N);
    unsigned char* smem = hs_smem + 4u * HS_RESOLVE_HOT_STAGE;
    hs_wanted* s_table = (hs_wanted*)(global_state ? smem : smem + state_bytes);
    i32* s_hot = d.hot_cols <= HS_RESOLVE_HOT_STAGE ? (i32*)hs_smem : (i32*)0;
    if (s_hot != 0)
        for (u32 i = HS_TID; i < d.hot_cols; i += HS_NTHREADS)
            s_hot[i] = HS_LDG(hot_table + (u64)r * d.hot_cols + i);
    // The shared table at its full capacity (the capacity a request takes when its table fits
    // shared memory), and the bitmap of shared-state mode, cleared while the loads are in flight.
    hs_clear_table(s_table, smem_cap);
    if (!global_state) {
        u32* bits = hs_resolve_state_at(smem, N).bits;
        for (u32 i = HS_TID; i < (N + 31) / 32; i += HS_NTHREADS) bits[i] = 0;
    }
    if (HS_TID == 0) {
        s_any_host = 0;
        s_corrupt = 0;
    }
    u32 phase = 0; // hs_block_scan1 / hs_block_scan_pair calls so far (uniform)
    u32 before_total, rows;
    {
        u32 ea, eb;
        hs_block_scan_pair(n_before, n_rows, s_scan, phase++, ea, eb, before_total, rows);
    }
    if (before_total != 0) return 0;
    const u32 entries = rows * K;
    // One row in one pass: keep each entry's class, value and hash slot in registers.
    const bool cached = rows == 1 && pre_k;

    // Round trip 3: the slot_host_rows entry of each LRU position's slot (a slot beyond the buffer, in a
    // corrupt LRU, reads nothing: the reset below replaces the row).
    i32 p_slot_host_rows[HS_RESOLVE_IN];
#pragma unroll
    for (u32 q = 0; q < HS_RESOLVE_IN; ++q) {
        const u32 p = HS_TID * HS_RESOLVE_IN + q;
        const u32 s = (p_lru[q / 2] >> (16u * (q & 1u))) & 0xffffu;
        p_slot_host_rows[q] = cached_n && p < N && s < N ? slot_host_rows[sbase + s] : -1;
    }

    // The smallest power of two >= 2 * entries, at least 16.
    u32 cap = 2 * entries <= 16 ? 16u : 1u << (32u - (u32)HS_CLZ(2 * entries - 1));
    const bool table_shared = cap <= smem_cap;
    if (table_shared) cap = smem_cap;
    unsigned char* state;
    hs_wanted* table;
    if (global_state) {
        if (HS_TID == 0) {
            s_table_off = atomicAdd(workspace_counter, state_bytes / 16u + (table_shared ? 0u : cap));
            allocated = true;
        }
        HS_SYNC();
        state = (unsigned char*)(workspace + s_table_off);
        table = table_shared ? s_table : workspace + s_table_off + state_bytes / 16u;
    } else {
        state = smem;
        if (table_shared) {
            table = s_table;
        } else {
            if (HS_TID == 0) {
                s_table_off = atomicAdd(workspace_counter, cap);
                allocated = true;
            }
            HS_SYNC();
            table = workspace + s_table_off;
        }
    }
    const hs_resolve_state st = hs_resolve_state_at(state, N);
    u16* s_lru = st.order;
    u16* s_part = st.part;
    u32* s_bits = st.bits;
    const u32 mask = cap - 1;
    if (!table_shared || global_state) { // uniform: a table or bitmap outside shared memory
        if (!table_shared) hs_clear_table(table, cap);
        if (global_state)
            for (u32 i = HS_TID; i < (N + 31) / 32; i += HS_NTHREADS) s_bits[i] = 0;
        HS_SYNC();
    }

    // The registers of the cached case: value and hash slot of this thread's entries (the class
    // follows: a hash slot for a host row, else resident when the value is a row, else invalid).
    i32 c_val[HS_RESOLVE_IK];
    u32 c_h[HS_RESOLVE_IK];
#pragma unroll
    for (u32 q = 0; q < HS_RESOLVE_IK; ++q) {
        c_val[q] = -1;
        c_h[q] = HS_NONE;
    }

    // Steps 2-3: classify every entry, insert host rows with their first appearance; reset the
    // plan and counts of every row. Row t's first pass uses the entries loaded up front.
    {
        bool any = false;
        u32 ord = 0;
        for (u32 t2 = t, seen = 0; t2 < num_tokens && seen < rows; ++t2) {
            if (t2 != t && HS_LDG(req_id + t2) != req) continue;
            ++seen;
            const u64 base = (u64)t2 * K;
            for (u32 jb = 0; jb < K; jb += span_k) {
                const u32 j0 = jb + HS_TID * HS_RESOLVE_IK;
                const bool pre = pre_k && t2 == t; // then jb == 0
                i32 tok[HS_RESOLVE_IK];
#pragma unroll
                for (u32 q = 0; q < HS_RESOLVE_IK; ++q)
                    tok[q] = pre ? p_tok[q] : (j0 + q < K ? HS_LDG(topk + base + j0 + q) : -1);
#pragma unroll
                for (u32 q = 0; q < HS_RESOLVE_IK; ++q) {
                    i32 v = -1;
                    const u32 kind =
                        j0 + q < K ? hs_classify(d, resident_table, host_table, r, sr, tok[q], v) : 0u;
                    u32 h = HS_NONE;
                    if (kind == 2) {
                        bool existed;
                        h = hs_insert(table, mask, v, ord * K + j0 + q, existed);
                        any = true;
                    }
                    c_val[q] = v;
                    c_h[q] = h;
                    if (j0 + q < K) {
                        miss_src[base + j0 + q] = -1;
                        miss_dst[base + j0 + q] = -1;
                    }
                }
            }
            if (HS_TID == 0) {
                hit_counts[t2] = 0;
                miss_counts[t2] = 0;
            }
            ++ord;
        }
        if (any) atomicOr(&s_any_host, 1u);
    }
    HS_SYNC();

    // An entry's class, value and hash slot: from the registers in the cached case, else read
    // and classified again (`tok` is the entry's top-k value, loaded by the caller).
#define HS_RESOLVE_ENTRY(q, tokv, kind, v, h)                                                    \
    do {                                                                                         \
        if (cached) {                                                                            \
            v = c_val[q];                                                                        \
            h = c_h[q];                                                                          \
            kind = h != HS_NONE ? 2u : (v != -1 ? 1u : 0u);                                      \
        } else {                                                                                 \
            v = -1;                                                                              \
            kind = j0 + (q) < K ? hs_classify(d, resident_table, host_table, r, sr, tokv, v) : 0u; \
            h = kind == 2 ? hs_lookup(table, mask, v) : HS_NONE;                                 \
        }                                                                                        \
    } while (0)

    if (s_any_host) {
        // Step 4: the LRU must be a permutation of 0..N; otherwise reset it and the slot_host_rows row.
        for (u32 pb = 0; pb < N; pb += span_n) {
            const u32 p0 = pb + HS_TID * HS_RESOLVE_IN;
            u32 sv[HS_RESOLVE_IN];
#pragma unroll
            for (u32 q = 0; q < HS_RESOLVE_IN; ++q)
                sv[q] = cached_n ? (p_lru[q / 2] >> (16u * (q & 1u))) & 0xffffu
                                 : (p0 + q < N ? (u32)lru[sbase + p0 + q] : 0u);
#pragma unroll
            for (u32 q = 0; q < HS_RESOLVE_IN; ++q) {
                if (p0 + q >= N) continue;
                const u32 s = sv[q];
                s_lru[p0 + q] = (u16)s;
                if (s >= N) {
                    atomicOr(&s_corrupt, 1u);
                } else {
                    const u32 bit = 1u << (s & 31u);
                    if (atomicOr(&s_bits[s >> 5], bit) & bit) atomicOr(&s_corrupt, 1u);
                }
            }
        }
        HS_SYNC();
        const bool corrupt = s_corrupt != 0;
        if (corrupt) { // uniform
            for (u32 p = HS_TID; p < N; p += HS_NTHREADS) {
                s_lru[p] = (u16)p;
                slot_host_rows[sbase + p] = -1;
            }
            HS_SYNC();
        }

        const i64 host_rows = (i64)host_num_blocks * (i64)block_size;
        // Step 5a: for each wanted g, the first LRU position caching it (only rows in the pool).
        u32 c_hq[HS_RESOLVE_IN];
#pragma unroll
        for (u32 q = 0; q < HS_RESOLVE_IN; ++q) c_hq[q] = HS_NONE;
        if (!corrupt) {
            for (u32 pb = 0; pb < N; pb += span_n) {
                const u32 p0 = pb + HS_TID * HS_RESOLVE_IN;
                i32 c[HS_RESOLVE_IN];
#pragma unroll
                for (u32 q = 0; q < HS_RESOLVE_IN; ++q)
                    c[q] = cached_n ? p_slot_host_rows[q] : (p0 + q < N ? slot_host_rows[sbase + s_lru[p0 + q]] : -1);
#pragma unroll
                for (u32 q = 0; q < HS_RESOLVE_IN; ++q) {
                    u32 h = HS_NONE;
                    if (c[q] >= 0 && (i64)c[q] < host_rows) {
                        h = hs_lookup(table, mask, c[q]);
                        if (h != HS_NONE) atomicMin(&table[h].first_lru, p0 + q);
                    }
                    c_hq[q] = h;
                }
            }
        }
        HS_SYNC();

        // Step 5b: split LRU positions into hits (old order, stored from the end of s_part) and
        // evictables (old order, stored from the front): evictable rank e at s_part[e], hit rank
        // h at s_part[N - 1 - h].
        u32 hits_before = 0;
        for (u32 pb = 0; pb < N; pb += span_n) {
            const u32 p0 = pb + HS_TID * HS_RESOLVE_IN;
            u32 hq[HS_RESOLVE_IN];
            if (cached_n || corrupt) {
#pragma unroll
                for (u32 q = 0; q < HS_RESOLVE_IN; ++q) hq[q] = c_hq[q];
            } else {
                i32 c[HS_RESOLVE_IN];
#pragma unroll
                for (u32 q = 0; q < HS_RESOLVE_IN; ++q) c[q] = p0 + q < N ? slot_host_rows[sbase + s_lru[p0 + q]] : -1;
#pragma unroll
                for (u32 q = 0; q < HS_RESOLVE_IN; ++q)
                    hq[q] = c[q] >= 0 && (i64)c[q] < host_rows ? hs_lookup(table, mask, c[q]) : HS_NONE;
            }
            u32 hit_slot[HS_RESOLVE_IN];
            u32 nh = 0;
#pragma unroll
            for (u32 q = 0; q < HS_RESOLVE_IN; ++q) {
                hit_slot[q] = HS_NONE;
                if (p0 + q < N && hq[q] != HS_NONE && table[hq[q]].first_lru == p0 + q) {
                    hit_slot[q] = hq[q];
                    ++nh;
                }
            }
            u32 total;
            u32 hr = hits_before + hs_block_scan1(nh, s_scan, phase++, total);
#pragma unroll
            for (u32 q = 0; q < HS_RESOLVE_IN; ++q) {
                const u32 p = p0 + q;
                if (p >= N) continue;
                const u32 s = s_lru[p];
                if (hit_slot[q] != HS_NONE) {
                    s_part[N - 1 - hr] = (u16)s;
                    table[hit_slot[q]].slot = s;
                    ++hr;
                } else {
                    s_part[p - hr] = (u16)s;
                }
            }
            hits_before += total;
        }
        HS_SYNC();
        const u32 V = N - hits_before; // evictable slots

        // Steps 6 and 8 (plan): number misses in order of first appearance, give the m-th miss
        // the m-th evictable slot, count hits and misses by the row of first appearance (the
        // row's hits summed in the scan of its last pass).
        u32 misses = 0;
        {
            u32 ord = 0;
            for (u32 t2 = t, seen = 0; t2 < num_tokens && seen < rows; ++t2) {
                if (t2 != t && HS_LDG(req_id + t2) != req) continue;
                ++seen;
                const u64 base = (u64)t2 * K;
                const u32 row_base = misses;
                u32 row_hits = 0, hits_total = 0;
                for (u32 jb = 0; jb < K; jb += span_k) {
                    const u32 j0 = jb + HS_TID * HS_RESOLVE_IK;
                    i32 tok[HS_RESOLVE_IK];
#pragma unroll
                    for (u32 q = 0; q < HS_RESOLVE_IK; ++q)
                        tok[q] = !cached && j0 + q < K ? HS_LDG(topk + base + j0 + q) : -1;
                    u32 miss_h[HS_RESOLVE_IK];
                    i32 miss_g[HS_RESOLVE_IK];
                    u32 nm = 0;
#pragma unroll
                    for (u32 q = 0; q < HS_RESOLVE_IK; ++q) {
                        u32 kind, h;
                        i32 g;
                        HS_RESOLVE_ENTRY(q, tok[q], kind, g, h);
                        miss_h[q] = HS_NONE;
                        miss_g[q] = -1;
                        if (kind == 2 && table[h].first_entry == ord * K + j0 + q) {
                            if (table[h].slot != HS_NONE) {
                                ++row_hits;
                            } else {
                                miss_h[q] = h;
                                miss_g[q] = g;
                                ++nm;
                            }
                        }
                    }
                    u32 total, m;
                    if (jb + span_k >= K) { // the row's last pass (uniform)
                        u32 ignore;
                        hs_block_scan_pair(nm, row_hits, s_scan, phase++, m, ignore, total,
                                           hits_total);
                    } else {
                        m = hs_block_scan1(nm, s_scan, phase++, total);
                    }
                    m += misses;
#pragma unroll
                    for (u32 q = 0; q < HS_RESOLVE_IK; ++q) {
                        if (miss_h[q] == HS_NONE) continue;
                        if (m < V) {
                            const u32 s = s_part[m];
                            const i32 g = miss_g[q];
                            const i32 src = (i64)g < host_rows ? g : -1;
                            table[miss_h[q]].slot = s;
                            slot_host_rows[sbase + s] = src;
                            miss_src[base + (m - row_base)] = src;
                            miss_dst[base + (m - row_base)] = hs_hot_row_staged(d, s_hot, hot_table, r, s);
                        }
                        ++m;
                    }
                    misses += total;
                }
                if (HS_TID == 0) {
                    hit_counts[t2] = (i32)hits_total;
                    u32 lo = row_base < V ? row_base : V, hi = misses < V ? misses : V;
                    miss_counts[t2] = (i32)(hi - lo);
                    if (stats != 0) {
                        if (hits_total != 0) atomicAdd(stats + 0, hits_total);
                        if (hi != lo) atomicAdd(stats + 1, hi - lo);
                    }
                }
                ++ord;
            }
        }
        HS_SYNC();

        // Step 7: new LRU order = unused evictables, miss slots (miss order), hits (old order).
        // Step 8 reads nothing this writes: no barrier after it.
        const u32 used = misses < V ? misses : V;
        for (u32 i = HS_TID; i < N; i += HS_NTHREADS) {
            u32 s;
            if (i < V - used) s = s_part[used + i];
            else if (i < V) s = s_part[i - (V - used)];
            else s = s_part[N - 1 - (i - V)];
            lru[sbase + i] = (u16)s;
        }
    }

    // Step 8: output indices and valid counts.
    for (u32 t2 = t, seen = 0; t2 < num_tokens && seen < rows; ++t2) {
        if (t2 != t && HS_LDG(req_id + t2) != req) continue;
        ++seen;
        const u64 base = (u64)t2 * K;
        u32 valid = 0;
        for (u32 jb = 0; jb < K; jb += span_k) {
            const u32 j0 = jb + HS_TID * HS_RESOLVE_IK;
            i32 tok[HS_RESOLVE_IK];
#pragma unroll
            for (u32 q = 0; q < HS_RESOLVE_IK; ++q)
                tok[q] = !cached && j0 + q < K ? HS_LDG(topk + base + j0 + q) : -1;
#pragma unroll
            for (u32 q = 0; q < HS_RESOLVE_IK; ++q) {
                if (j0 + q >= K) continue;
                u32 kind, h;
                i32 v;
                HS_RESOLVE_ENTRY(q, tok[q], kind, v, h);
                i32 out = -1;
                if (kind == 1) {
                    out = v;
                } else if (kind == 2) {
                    const u32 s = table[h].slot;
                    if (s != HS_NONE) out = hs_hot_row_staged(d, s_hot, hot_table, r, s);
                }
                indices[base + j0 + q] = out;
                valid += out != -1 ? 1u : 0u;
            }
        }
        u32 total;
        hs_block_scan1(valid, s_scan, phase++, total);
        if (HS_TID == 0) {
            valid_counts[t2] = (i32)total;
            if (stats != 0 && total != 0) atomicAdd(stats + 2, total);
        }
    }
#undef HS_RESOLVE_ENTRY
    return rows;
}

