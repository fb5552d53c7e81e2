// The decode path of the resolver (hs_resolve_rows): a request of exactly one token row whose
// top-k fits one pass (top_k <= 2 * HS_RESOLVE_THREADS) and whose hot buffer fits one pass
// (hot_slots <= 4 * HS_RESOLVE_THREADS), in state-row order (idx_mapping null), with its
// per-request state and wanted-row table in shared memory. It computes exactly what
// hs_resolve_body computes for such a request, with the work laid out for it: thread i owns
// top-k entries 2i and 2i + 1 and LRU positions and hot slots 4i .. 4i + 3, and keeps them in
// registers from first load to last store; the slot_host_rows row is read in slot order
// (coalesced, beside the LRU row, not behind it), each slot's LRU position coming from the
// inverse of the LRU built in shared memory while the LRU is checked; hits are marked in the
// position bitmap the check leaves full; positions and misses are numbered in one paired block
// scan. Returns HS_NONE, having written nothing to global memory, when the block's row is not
// such a request (hs_resolve_body resolves it then), else 1 after a barrier that follows every
// write of the row's miss plan and counts (as hs_resolve_body).
//
// Barriers: (1) the shared table, bitmap and flags are clear; (2) every wanted row is inserted,
// the LRU checked and inverted, the row's other rows looked for; (3) every cached row is looked
// up; (4) the hits are marked; (5) the paired scan; (6) the partition is complete; (7) every
// miss has its slot (only when some host row is wanted by two entries); (8) the valid count.
HS_DEVICE u32 hs_resolve_decode(
    const i32* __restrict__ req_id, const i32* __restrict__ topk,
    const i32* __restrict__ resident_table, const i32* __restrict__ host_table,
    const i32* __restrict__ hot_table, i32* __restrict__ slot_host_rows, u16* __restrict__ lru,
    i32* __restrict__ indices, i32* __restrict__ valid_counts, i32* __restrict__ hit_counts,
    i32* __restrict__ miss_counts, i32* __restrict__ miss_src, i32* __restrict__ miss_dst,
    u32 smem_table_entries, u32 num_tokens, u32 top_k, u32 num_requests, u32 max_pages,
    u32 block_size, u32 hot_slots, u32 attention_block_stride, u32 host_num_blocks,
    const i32* __restrict__ idx_mapping, u32* __restrict__ stats, u32 t, u32* s_scan,
    u32* s_words) {
    HS_DYN_SHARED(hs_smem);
    // The caller's static shared scratch, as hs_resolve_body's.
    u32& s_other_row = s_words[0];
    u32& s_any_host = s_words[1];
    u32& s_corrupt = s_words[2];
    u32& s_shared_row = s_words[3];
    const u32 K = top_k, N = hot_slots;
    // Static eligibility (uniform): one pass of entries (an even count: a thread's two entries
    // are one 8-byte load) and of slots (a multiple of 4: a thread's four LRU positions and
    // cached rows are one 8- and one 16-byte load), shared state and a shared table of at least
    // twice the entries, state-row order.
    const u32 smem_cap = smem_table_entries & ~HS_RESOLVE_GLOBAL_STATE;
    if (t >= num_tokens || idx_mapping != 0 || HS_NTHREADS != HS_RESOLVE_THREADS ||
        (smem_table_entries & HS_RESOLVE_GLOBAL_STATE) != 0u || K == 0 || (K & 1u) != 0 ||
        K > HS_RESOLVE_THREADS * 2u || N == 0 || (N & 3u) != 0 || N > HS_RESOLVE_THREADS * 4u ||
        smem_cap < 2u * K || (smem_cap & (smem_cap - 1u)) != 0u)
        return HS_NONE;
    // The vector loads need aligned rows: buffers an engine lent at an odd offset take the body.
    if (((u64)topk & 7u) != 0 || ((u64)lru & 7u) != 0 || ((u64)slot_host_rows & 15u) != 0)
        return HS_NONE;
    const i32 req = HS_LDG(req_id + t);
    if (req < 0 || (u32)req >= num_requests) return HS_NONE; // padding: the body writes it

    const hs_resolve_desc d =
        hs_resolve_desc_make(num_tokens, top_k, num_requests, max_pages, block_size, hot_slots,
                             attention_block_stride, host_num_blocks);
    const u32 r = (u32)req;
    const u64 sbase = (u64)r * N;
    const u64 base = (u64)t * K;

    // Loads, all issued before anything waits on them: this thread's two entries, its four LRU
    // positions and its four slots' cached rows, the request's hot-table row (staged), and
    // the other token rows' requests.
    const u32 j0 = HS_TID * 2u, p0 = HS_TID * 4u;
    const bool my_entries = j0 < K, my_slots = p0 < N; // both entries, all four slots, or none
    i32 tok[2] = {-1, -1};
    if (my_entries) {
        const u64 pair = HS_LDG((const u64*)(topk + base + j0));
        tok[0] = (i32)(u32)pair;
        tok[1] = (i32)(u32)(pair >> 32);
    }
    u32 pos_slot[4] = {0, 0, 0, 0};
    i32 cached_row[4] = {-1, -1, -1, -1};
    if (my_slots) {
        const u64 four = *(const u64*)(lru + sbase + p0);
        const uint4 rows = *(const uint4*)(slot_host_rows + sbase + p0);
#pragma unroll
        for (u32 q = 0; q < 4; ++q) pos_slot[q] = (u32)(four >> (16u * q)) & 0xffffu;
        cached_row[0] = (i32)rows.x;
        cached_row[1] = (i32)rows.y;
        cached_row[2] = (i32)rows.z;
        cached_row[3] = (i32)rows.w;
    }
    bool other_row = false;
    for (u32 t2 = HS_TID; t2 < num_tokens; t2 += HS_NTHREADS)
        if (t2 != t && HS_LDG(req_id + t2) == req) other_row = true;
    unsigned char* smem = hs_smem + 4u * HS_RESOLVE_HOT_STAGE;
    const hs_resolve_state st = hs_resolve_state_at(smem, N);
    u16* s_inv = st.order; // slot -> its LRU position
    u16* s_part = st.part; // evictables, then hits from the end
    u32* s_bits = st.bits; // slots claimed, then positions not hit
    const hs_wanted_cols table = hs_wanted_cols_at(smem + hs_resolve_state_bytes(N), smem_cap);
    // The table at all the shared capacity the launch reserved: the fewer entries per bucket,
    // the shorter the probes (on the H200 a table of 4096 entries for 2048 keys took 34% longer
    // than one of 8192; the planner reserves a quarter-full table where it fits).
    const u32 cap = smem_cap;
    const u32 mask = cap - 1u;
    i32* s_hot = d.hot_cols <= HS_RESOLVE_HOT_STAGE ? (i32*)hs_smem : (i32*)0;
    if (s_hot != 0)
        for (u32 i = HS_TID; i < d.hot_cols; i += HS_NTHREADS)
            s_hot[i] = HS_LDG(hot_table + (u64)r * d.hot_cols + i);
    hs_clear_table(table.key, cap);
    for (u32 i = HS_TID; i < (N + 31) / 32; i += HS_NTHREADS) s_bits[i] = 0;
    if (HS_TID == 0) {
        s_other_row = 0;
        s_any_host = 0;
        s_corrupt = 0;
        s_shared_row = 0;
    }
    // Classify the entries (page-table loads behind the top-k) while the clears drain.
    i32 val[2];
    u32 kind[2];
#pragma unroll
    for (u32 q = 0; q < 2; ++q) {
        val[q] = -1;
        kind[q] = my_entries ? hs_classify(d, resident_table, host_table, r, r, tok[q], val[q]) : 0u;
    }
    HS_SYNC(); // (1)

    // Insert the wanted host rows (first appearance wins), check the LRU is a permutation and
    // invert it; a slot claimed twice or beyond the buffer makes it corrupt.
    u32 h_entry[2];
    bool any = false, shared_row = false;
#pragma unroll
    for (u32 q = 0; q < 2; ++q) {
        h_entry[q] = HS_NONE;
        if (kind[q] == 2) {
            bool existed;
            h_entry[q] = hs_insert(table, mask, val[q], j0 + q, existed);
            shared_row |= existed;
            any = true;
        }
    }
#pragma unroll
    for (u32 q = 0; q < 4; ++q) {
        if (!my_slots) continue;
        const u32 sl = pos_slot[q];
        if (sl >= N) {
            atomicOr(&s_corrupt, 1u);
        } else {
            const u32 bit = 1u << (sl & 31u);
            if (atomicOr(&s_bits[sl >> 5], bit) & bit) atomicOr(&s_corrupt, 1u);
            else s_inv[sl] = (u16)(p0 + q); // only the claiming thread writes the inverse
        }
    }
    if (other_row) atomicOr(&s_other_row, 1u);
    if (any) atomicOr(&s_any_host, 1u);
    if (shared_row) atomicOr(&s_shared_row, 1u);
    HS_SYNC(); // (2)
    if (s_other_row != 0) { // uniform: several rows, which the body resolves together
        HS_SYNC(); // every thread has read the flags before the body clears them
        return HS_NONE;
    }
    const bool any_host = s_any_host != 0;
    const bool corrupt = s_corrupt != 0;
    const bool dups = s_shared_row != 0;

    u32 used = 0, hits = 0;
    if (any_host) {
        const i64 host_rows = (i64)host_num_blocks * (i64)block_size;
        if (corrupt) { // uniform: the LRU and slot_host_rows rows start over, nothing hits
#pragma unroll
            for (u32 q = 0; q < 4; ++q) {
                if (!my_slots) continue;
                pos_slot[q] = p0 + q;
                cached_row[q] = -1;
                slot_host_rows[sbase + p0 + q] = -1;
            }
        }
        // Each cached row in the table: the first LRU position caching it wins the hit.
        u32 h_slot[4];
#pragma unroll
        for (u32 q = 0; q < 4; ++q) {
            h_slot[q] = HS_NONE;
            const i32 c = cached_row[q];
            if (!corrupt && my_slots && c >= 0 && (i64)c < host_rows) {
                h_slot[q] = hs_lookup(table, mask, c);
                if (h_slot[q] != HS_NONE) atomicMin(&table.first_lru[h_slot[q]], (u32)s_inv[p0 + q]);
            }
        }
        HS_SYNC(); // (3)
        // Mark the hits: the winning slot takes the row; its position's bit is cleared (the
        // check left every position's bit set).
#pragma unroll
        for (u32 q = 0; q < 4; ++q) {
            const u32 h = h_slot[q];
            if (h == HS_NONE) continue;
            const u32 at = s_inv[p0 + q];
            if (table.first_lru[h] == at) {
                table.slot[h] = p0 + q;
                atomicAnd(&s_bits[at >> 5], ~(1u << (at & 31u)));
            }
        }
        HS_SYNC(); // (4)
        // Number this thread's hit positions and its missed first appearances, in one scan.
        u32 nh = 0, nm = 0;
        bool pos_hit[4];
#pragma unroll
        for (u32 q = 0; q < 4; ++q) {
            const u32 p = p0 + q;
            pos_hit[q] = !corrupt && my_slots && ((s_bits[p >> 5] >> (p & 31u)) & 1u) == 0;
            nh += pos_hit[q] ? 1u : 0u;
        }
        bool first_miss[2];
#pragma unroll
        for (u32 q = 0; q < 2; ++q) {
            const u32 h = h_entry[q];
            first_miss[q] = h != HS_NONE && table.first_entry[h] == j0 + q && table.slot[h] == HS_NONE;
            nm += first_miss[q] ? 1u : 0u;
        }
        u32 hr, m, misses;
        hs_block_scan_pair(nh, nm, s_scan, 0, hr, m, hits, misses); // (5)
        const u32 V = N - hits; // evictable slots
#pragma unroll
        for (u32 q = 0; q < 4; ++q) {
            const u32 p = p0 + q;
            if (!my_slots) continue;
            if (pos_hit[q]) s_part[N - 1 - hr++] = (u16)pos_slot[q];
            else s_part[p - hr] = (u16)pos_slot[q];
        }
        HS_SYNC(); // (6)
        used = misses < V ? misses : V;
        // The m-th miss takes the m-th evictable slot; entries past the plan read -1.
#pragma unroll
        for (u32 q = 0; q < 2; ++q) {
            if (first_miss[q]) {
                if (m < V) {
                    const u32 sl = s_part[m];
                    const i32 g = val[q];
                    const i32 src = (i64)g < host_rows ? g : -1;
                    table.slot[h_entry[q]] = sl;
                    slot_host_rows[sbase + sl] = src;
                    miss_src[base + m] = src;
                    miss_dst[base + m] = hs_hot_row_staged(d, s_hot, hot_table, r, sl);
                }
                ++m;
            }
            if (my_entries && j0 + q >= used) {
                miss_src[base + j0 + q] = -1;
                miss_dst[base + j0 + q] = -1;
            }
        }
        // The new LRU: unused evictables, the miss slots in miss order, the hits in old order.
#pragma unroll
        for (u32 q = 0; q < 4; ++q) {
            const u32 i = p0 + q;
            if (!my_slots) continue;
            u32 sl;
            if (i < V - used) sl = s_part[used + i];
            else if (i < V) sl = s_part[i - (V - used)];
            else sl = s_part[N - 1 - (i - V)];
            lru[sbase + i] = (u16)sl;
        }
        if (dups) HS_SYNC(); // (7) uniform: a later entry of a missed row reads its slot
    } else {
#pragma unroll
        for (u32 q = 0; q < 2; ++q) {
            if (my_entries) {
                miss_src[base + j0 + q] = -1;
                miss_dst[base + j0 + q] = -1;
            }
        }
    }
    if (HS_TID == 0) {
        hit_counts[t] = (i32)hits;
        miss_counts[t] = (i32)used;
        if (stats != 0) {
            if (hits != 0) atomicAdd(stats + 0, hits);
            if (used != 0) atomicAdd(stats + 1, used);
        }
    }
    // The row's indices and valid count.
    u32 valid = 0;
#pragma unroll
    for (u32 q = 0; q < 2; ++q) {
        if (!my_entries) continue;
        i32 out = -1;
        if (kind[q] == 1) {
            out = val[q];
        } else if (kind[q] == 2) {
            const u32 sl = table.slot[h_entry[q]];
            if (sl != HS_NONE) out = hs_hot_row_staged(d, s_hot, hot_table, r, sl);
        }
        indices[base + j0 + q] = out;
        valid += out != -1 ? 1u : 0u;
    }
    // (8): a thread's valid entries are 0 to 2, so two counting barriers sum them on CUDA.
    const u32 total = hs_block_sum_small(valid, 2u, s_scan, 1);
    if (HS_TID == 0) {
        valid_counts[t] = (i32)total;
        if (stats != 0 && total != 0) atomicAdd(stats + 2, total);
    }
    return 1;
}

// The rows block `t` resolves (0 for none): the call counted first (block 0), then the decode
// path where it applies (hs_resolve_decode), else the general body (hs_resolve_body), which
// sets `allocated` when it took workspace.
HS_DEVICE u32 hs_resolve_rows(
    const i32* __restrict__ req_id, const i32* __restrict__ topk,
    const i32* __restrict__ resident_table, const i32* __restrict__ host_table,
    const i32* __restrict__ hot_table, i32* __restrict__ slot_host_rows, u16* __restrict__ lru,
    i32* __restrict__ indices, i32* __restrict__ valid_counts, i32* __restrict__ hit_counts,
    i32* __restrict__ miss_counts, i32* __restrict__ miss_src, i32* __restrict__ miss_dst,
    hs_wanted* __restrict__ workspace, u32* __restrict__ workspace_counter, u32 workspace_entries,
    u32 smem_table_entries, u32 num_tokens, u32 top_k, u32 num_requests, u32 max_pages,
    u32 block_size, u32 hot_slots, u32 attention_block_stride, u32 host_num_blocks,
    const i32* __restrict__ idx_mapping, u32 num_state_rows, u32* __restrict__ stats, u32 t,
    bool& allocated) {
    // Static shared scratch of both paths (RESOLVE_STATIC_SHARED_BYTES on the host): the scans'
    // words and four flags. The decode path hands the block to the body only after a barrier
    // that every thread passed after its last use of them (racecheck flags the body's first
    // writes otherwise).
    HS_SHARED u32 s_scan[4 * HS_MAX_WARPS];
    HS_SHARED u32 s_words[4];
    allocated = false;
    if (stats != 0 && t == 0 && HS_TID == 0) atomicAdd(stats + 3, 1u); // the call
    const u32 rows = hs_resolve_decode(
        req_id, topk, resident_table, host_table, hot_table, slot_host_rows, lru, indices,
        valid_counts, hit_counts, miss_counts, miss_src, miss_dst, smem_table_entries,
        num_tokens, top_k, num_requests, max_pages, block_size, hot_slots,
        attention_block_stride, host_num_blocks, idx_mapping, stats, t, s_scan, s_words);
    if (rows != HS_NONE) return rows;
    return hs_resolve_body(req_id, topk, resident_table, host_table, hot_table, slot_host_rows, lru,
                           indices, valid_counts, hit_counts, miss_counts, miss_src, miss_dst,
                           workspace, workspace_counter, workspace_entries, smem_table_entries,
                           num_tokens, top_k, num_requests, max_pages, block_size, hot_slots,
                           attention_block_stride, host_num_blocks, idx_mapping, num_state_rows,
                           stats, t, s_scan, s_words, allocated);
}

HS_KERNEL HS_BOUNDS(HS_RESOLVE_THREADS) void hs_resolve(
    const i32* __restrict__ req_id, const i32* __restrict__ topk,
    const i32* __restrict__ resident_table, const i32* __restrict__ host_table,
    const i32* __restrict__ hot_table, i32* __restrict__ slot_host_rows, u16* __restrict__ lru,
    i32* __restrict__ indices, i32* __restrict__ valid_counts, i32* __restrict__ hit_counts,
    i32* __restrict__ miss_counts, i32* __restrict__ miss_src, i32* __restrict__ miss_dst,
    hs_wanted* __restrict__ workspace, u32* __restrict__ workspace_counter, u32 workspace_entries,
    u32 smem_table_entries, u32 num_tokens, u32 top_k, u32 num_requests, u32 max_pages,
    u32 block_size, u32 hot_slots, u32 attention_block_stride, u32 host_num_blocks,
    const i32* __restrict__ idx_mapping, u32 num_state_rows, u32* __restrict__ stats) {
    HS_GRID_DEP_WAIT(); // before any global memory access
    bool allocated;
    hs_resolve_rows(req_id, topk, resident_table, host_table, hot_table, slot_host_rows, lru, indices,
                    valid_counts, hit_counts, miss_counts, miss_src, miss_dst, workspace,
                    workspace_counter, workspace_entries, smem_table_entries, num_tokens, top_k,
                    num_requests, max_pages, block_size, hot_slots, attention_block_stride,
                    host_num_blocks, idx_mapping, num_state_rows, stats, HS_BID_X, allocated);
    hs_workspace_release_after(workspace_counter, allocated);
}
