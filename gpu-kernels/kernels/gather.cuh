// ---------------------------------------------------------------------------------------------
// Gather of a miss plan (hisparse_core::ops::copy::gather_rows)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (G, 1, layers.count) with any G (the host fills the device, or gives every work
// item its own block), block (HS_GATHER_THREADS), and `walk`, how the blocks take the work items.
// Work item (t, x) of layer z is chunk x of token row t: plan entries [x * HS_GATHER_ROWS, ...)
// of row t.
//   * walk 0, every row at once: item w is chunk x = w / num_tokens of row t = w % num_tokens and
//     blocks take items grid-stride, so the first chunk of every row comes before any second
//     chunk: the work (a row's valid count of entries, typically a tenth of top_k) sits in the
//     first items and the blocks that start first do it. An item beyond its row's count costs
//     one cached load of the count.
//   * walk k > 0, rows in order: the blocks form G / k groups of k; group g takes rows g,
//     g + G / k, ... one after another, its k blocks sharing each row's live chunks (block j of
//     the group takes chunks j, j + k, ...). Only G / k rows are read at once: a request's missed
//     rows lie in its own host pages, and a host reading random rows from a few such windows keeps
//     its address translations cached where rows from every request at once do not (H200 host:
//     0.76x of bulk H2D against 0.42x in a microbenchmark; plan::gather_in_order says when).
// Otherwise the item's first threads locate its rows into a shared row table,
// and after a barrier the item's units (hs_row_units) are spread over the whole block, consecutive
// threads on consecutive units, up to HS_GATHER_UNROLL loads in flight per thread before its
// stores (the host pool is mapped pinned memory read across the bus, so many loads must be in
// flight; a warp's loads cover whole runs of a row's 128-byte lines). This is the design measured
// fastest on the H200 (a group of eight threads per row with no barrier measured 10-13% slower and
// was retired).

#define HS_GATHER_THREADS 128
#define HS_GATHER_ROWS 16
#define HS_GATHER_UNROLL 8

#if defined(HS_VENDOR_CUDA)
// Eight blocks per multiprocessor (at most 64 registers: the eight 16-byte values in flight per
// thread take 32), the residency the host's grid assumes (GATHER_BLOCKS_PER_MULTIPROCESSOR).
#define HS_GATHER_BOUNDS __launch_bounds__(HS_GATHER_THREADS, 8)
#else
#define HS_GATHER_BOUNDS HS_BOUNDS(HS_GATHER_THREADS)
#endif

// Work item (t, lo) of hs_gather_rows for one layer, scale words of W bytes: plan entries
// [lo, min(lo + HS_GATHER_ROWS, n)) of token row t, whose count is n (lo < n; uniform over the
// block). `first` is false after the block's first item: the previous item's copies must have
// read the row table before it is rewritten. For W == 16 (every contiguous row and every scale
// part of 16-byte multiples, the 656-byte decode row among them) hs_row_units and
// hs_load_unit/hs_store_unit reduce to row_bytes / 16 chunks addressed by hs_chunk: NVRTC gives
// that instantiation the instruction sequence of the kernel before scale words existed.
template <u32 W>
HS_DEVICE void hs_gather_item(const i32* __restrict__ plan_src, const i32* __restrict__ plan_dst,
                              const u8* __restrict__ host, u8* __restrict__ device, u32 top_k,
                              const hs_layer_pair& L, u32 t, u32 lo, u32 n, bool first,
                              u64* s_src_v, u64* s_src_s, u64* s_dst_v, u64* s_dst_s,
                              u32* s_flags) {
    const u32 cpr = hs_row_units<W>(L.host);
    const u32 vc = L.host.value_bytes >> 4;
    const u64 prow = (u64)t * top_k;
    const u32 rows = n - lo < HS_GATHER_ROWS ? n - lo : HS_GATHER_ROWS;
    i32 ps = -1, pd = -1;
    if (HS_TID < rows) {
        ps = HS_LDG(plan_src + prow + lo + HS_TID);
        pd = HS_LDG(plan_dst + prow + lo + HS_TID);
    }
    if (!first) HS_SYNC(); // the previous item's copies have read the row table
    if (HS_TID < rows) {
        u32 db, doff, sb, soff;
        u32 f = 0;
        if (!hs_locate(L.device, pd, db, doff)) {
            f = 2;
        } else {
            hs_row_parts(L.device, db, doff, s_dst_v[HS_TID], s_dst_s[HS_TID]);
            if (hs_locate(L.host, ps, sb, soff)) {
                hs_row_parts(L.host, sb, soff, s_src_v[HS_TID], s_src_s[HS_TID]);
                f = 1;
            }
        }
        s_flags[HS_TID] = f;
    }
    HS_SYNC();

    // The item's units spread over the whole block: consecutive threads take consecutive
    // units of a row, so a warp's loads cover whole runs of 128-byte lines.
    const u32 total = rows * cpr;
    for (u32 base = 0; base < total; base += HS_GATHER_THREADS * HS_GATHER_UNROLL) {
        uint4 v[HS_GATHER_UNROLL];
#pragma unroll
        for (u32 u = 0; u < HS_GATHER_UNROLL; ++u) {
            const u32 q = base + u * HS_GATHER_THREADS + HS_TID;
            v[u] = make_uint4(0u, 0u, 0u, 0u);
            if (q < total) {
                const u32 i = q / cpr, c = q % cpr;
                if (s_flags[i] == 1) v[u] = hs_load_unit<W>(host, s_src_v[i], s_src_s[i], vc, c);
            }
        }
#pragma unroll
        for (u32 u = 0; u < HS_GATHER_UNROLL; ++u) {
            const u32 q = base + u * HS_GATHER_THREADS + HS_TID;
            if (q < total) {
                const u32 i = q / cpr, c = q % cpr;
                if (s_flags[i] != 2) hs_store_unit<W>(device, s_dst_v[i], s_dst_s[i], vc, c, v[u]);
            }
        }
    }
}

// Entries of token row t the gather copies: its plan count clamped to [0, top_k] (one cached
// load).
HS_DEVICE u32 hs_gather_count(const i32* __restrict__ plan_counts, u32 t, u32 top_k) {
    const i32 cnt = HS_LDG(plan_counts + t);
    return cnt < 0 ? 0u : ((u32)cnt > top_k ? top_k : (u32)cnt);
}

// The work items of hs_gather_rows for one layer, taken as `walk` says (the launch comment).
template <u32 W>
HS_DEVICE void hs_gather_items(const i32* __restrict__ plan_src, const i32* __restrict__ plan_dst,
                               const i32* __restrict__ plan_counts, const u8* __restrict__ host,
                               u8* __restrict__ device, u32 num_tokens, u32 top_k, u32 walk,
                               const hs_layer_pair& L, u64* s_src_v, u64* s_src_s,
                               u64* s_dst_v, u64* s_dst_s, u32* s_flags) {
    bool first = true;
    if (walk == 0) {
        const u32 chunks = top_k / HS_GATHER_ROWS + (top_k % HS_GATHER_ROWS != 0 ? 1u : 0u);
        const u64 items = (u64)chunks * num_tokens;
        for (u64 w = HS_BID_X; w < items; w += HS_NBLOCKS_X) {
            const u32 t = (u32)(w % num_tokens);
            const u32 lo = (u32)(w / num_tokens) * HS_GATHER_ROWS;
            // Items beyond their row's count (most of them: a row misses a tenth of top_k)
            // cost one cached load of the count, nothing more.
            const u32 n = hs_gather_count(plan_counts, t, top_k);
            if (lo >= n) continue; // uniform over the block
            hs_gather_item<W>(plan_src, plan_dst, host, device, top_k, L, t, lo, n, first, s_src_v,
                              s_src_s, s_dst_v, s_dst_s, s_flags);
            first = false;
        }
        return;
    }
    // Rows in order: a group of k blocks per row, G / k rows at once (a grid smaller than k is
    // one group of all its blocks).
    const u32 k = walk < HS_NBLOCKS_X ? walk : HS_NBLOCKS_X;
    const u32 groups = HS_NBLOCKS_X / k;
    const u32 group = HS_BID_X / k, j = HS_BID_X % k;
    if (group >= groups) return; // the grid's remainder past whole groups
    for (u32 t = group; t < num_tokens; t += groups) {
        const u32 n = hs_gather_count(plan_counts, t, top_k);
        for (u64 lo = (u64)j * HS_GATHER_ROWS; lo < n; lo += (u64)k * HS_GATHER_ROWS) {
            hs_gather_item<W>(plan_src, plan_dst, host, device, top_k, L, t, (u32)lo, n, first,
                              s_src_v, s_src_s, s_dst_v, s_dst_s, s_flags);
            first = false;
        }
    }
}

// The shared row table: where the rows of the current work item sit (written by its first
// HS_GATHER_ROWS threads before a barrier), host and device row parts (hs_row_parts), and a flag
// per row: 1 copy, 0 zero-fill, 2 skip.
HS_KERNEL HS_GATHER_BOUNDS void hs_gather_rows(
    const i32* __restrict__ plan_src, const i32* __restrict__ plan_dst,
    const i32* __restrict__ plan_counts, const u8* __restrict__ host, u8* __restrict__ device,
    u32 num_tokens, u32 top_k, hs_gather_layers layers, u32 walk) {
    HS_SHARED u64 s_src_v[HS_GATHER_ROWS], s_src_s[HS_GATHER_ROWS];
    HS_SHARED u64 s_dst_v[HS_GATHER_ROWS], s_dst_s[HS_GATHER_ROWS];
    HS_SHARED u32 s_flags[HS_GATHER_ROWS];
    HS_GRID_DEP_WAIT(); // before any global memory access
    if (HS_BID_Z >= layers.count || num_tokens == 0) return;
    const hs_layer_pair L = layers.layer[HS_BID_Z];
    // One branch per block: the layer's scale words.
    if (L.host.scale_word == 8)
        hs_gather_items<8>(plan_src, plan_dst, plan_counts, host, device, num_tokens, top_k,
                           walk, L, s_src_v, s_src_s, s_dst_v, s_dst_s, s_flags);
    else if (L.host.scale_word == 4)
        hs_gather_items<4>(plan_src, plan_dst, plan_counts, host, device, num_tokens, top_k,
                           walk, L, s_src_v, s_src_s, s_dst_v, s_dst_s, s_flags);
    else
        hs_gather_items<16>(plan_src, plan_dst, plan_counts, host, device, num_tokens, top_k,
                            walk, L, s_src_v, s_src_s, s_dst_v, s_dst_s, s_flags);
}

// ---------------------------------------------------------------------------------------------
// Resolve and gather in one launch (hisparse_core::ops::resolve::resolve, then
// hisparse_core::ops::copy::gather_rows of its miss plan)
// ---------------------------------------------------------------------------------------------
//
// Launch: as hs_resolve (block HS_RESOLVE_THREADS, the same dynamic shared memory and
// workspace), grid (num_tokens), plus the gather's pools and up to HS_GATHER_MAX_LAYERS layers by
// value (the host launches hs_gather_rows for further layers). The resolve is hs_resolve's own
// body (hs_resolve_body, the design measured fastest). The resolving block then copies all of its
// request's missed rows with the row loop of hs_gather_rows (the rows' units spread over the whole
// block, consecutive threads on consecutive units), so the copies of the requests that finish
// first overlap the resolving of the others, and no second launch waits for the slowest block.
// The plan is read back from global memory through L2 (written by this block in this launch,
// behind a barrier).

// Loads in flight per thread of the fused gather: each of a block's HS_RESOLVE_THREADS threads
// keeps HS_FUSED_GATHER_UNROLL 16-byte loads in flight (a decode request's ~190 missed 656-byte rows
// are two passes of the block; 64 resolving blocks keep megabytes in flight, far above what the
// bus needs to stay busy), few enough registers for the resolver's bound of 64.
#define HS_FUSED_GATHER_UNROLL 4

// A plan entry the block wrote in this launch, read through L2 (CUDA: not the multiprocessor's
// L1, which global stores do not allocate in).
#if defined(HS_VENDOR_CUDA)
#define HS_LDCG(p) __ldcg(p)
#else
#define HS_LDCG(p) (*(volatile const i32*)(p))
#endif

// The missed rows of one plan row (`n` entries from `base`) of one layer, scale words of W bytes,
// copied by the whole block: unit q of the row set is unit q % units of row q / units, consecutive
// threads on consecutive units (a warp's loads cover whole runs of a row's 128-byte lines, as in
// hs_gather_items), each thread locating its units' rows from the plan itself (no row table, no
// barrier). A device row outside the pool is skipped; a host row outside the pool zero-fills the
// device row (hisparse_core::ops::copy::gather_rows).
template <u32 W>
HS_DEVICE void hs_fused_gather_rows(const hs_layer_pair& L, const i32* miss_src,
                                    const i32* miss_dst, u64 base, u32 n, const u8* host,
                                    u8* device) {
    const u32 cpr = hs_row_units<W>(L.host), vc = L.host.value_bytes >> 4;
    if (cpr == 0) return;
    // Rows in slices of at most 2^31 units, so unit numbers stay far from u32's end (a row has
    // at most 2^28 units).
    const u32 slice = (1u << 31) / cpr;
    // Per unit in flight: its destination offset (HS_NO_UNIT: skipped), whether it is a scale
    // word (W < 16 only) and the loaded value; the source is not kept past its load.
    const u64 HS_NO_UNIT = ~(u64)0;
    for (u32 r0 = 0; r0 < n; r0 += slice) {
        const u64 at = base + r0;
        const u32 total = (n - r0 < slice ? n - r0 : slice) * cpr;
        for (u32 q0 = 0; q0 < total; q0 += HS_NTHREADS * HS_FUSED_GATHER_UNROLL) {
            u64 dat[HS_FUSED_GATHER_UNROLL];
            bool word[HS_FUSED_GATHER_UNROLL];
            uint4 v[HS_FUSED_GATHER_UNROLL];
#pragma unroll
            for (u32 u = 0; u < HS_FUSED_GATHER_UNROLL; ++u) {
                const u32 q = q0 + u * HS_NTHREADS + HS_TID;
                dat[u] = HS_NO_UNIT;
                word[u] = false;
                v[u] = make_uint4(0u, 0u, 0u, 0u);
                if (q >= total) continue;
                const u32 i = q / cpr, c = q % cpr;
                // Through L2: this block wrote the plan in this launch (before a barrier).
                const i32 ps = HS_LDCG(miss_src + at + i), pd = HS_LDCG(miss_dst + at + i);
                u32 db, doff, sb, soff;
                if (!hs_locate(L.device, pd, db, doff)) continue;
                u64 dv, ds;
                hs_row_parts(L.device, db, doff, dv, ds);
                word[u] = W != 16 && c >= vc;
                dat[u] = word[u] ? ds + (u64)(c - vc) * W : hs_chunk(dv, ds, vc, c);
                if (hs_locate(L.host, ps, sb, soff)) {
                    u64 sv, ss;
                    hs_row_parts(L.host, sb, soff, sv, ss);
                    v[u] = hs_load_unit<W>(host, sv, ss, vc, c);
                }
            }
#pragma unroll
            for (u32 u = 0; u < HS_FUSED_GATHER_UNROLL; ++u) {
                if (dat[u] == HS_NO_UNIT) continue;
                if (W == 16 || !word[u])
                    *(uint4*)(device + dat[u]) = v[u];
                else if (W == 8)
                    *(u64*)(device + dat[u]) = (u64)v[u].x | ((u64)v[u].y << 32);
                else
                    *(u32*)(device + dat[u]) = v[u].x;
            }
        }
    }
}

// One layer's copy, dispatched on its scale words: rows [r0, r0 + n) of plan row `base`.
HS_DEVICE void hs_fused_copy_layer(const hs_layer_pair& L, const i32* miss_src, const i32* miss_dst,
                                   u64 base, u32 n, const u8* host, u8* device) {
    if (L.host.scale_word == 8)
        hs_fused_gather_rows<8>(L, miss_src, miss_dst, base, n, host, device);
    else if (L.host.scale_word == 4)
        hs_fused_gather_rows<4>(L, miss_src, miss_dst, base, n, host, device);
    else
        hs_fused_gather_rows<16>(L, miss_src, miss_dst, base, n, host, device);
}

// One block per token row: the block that resolves a request copies that request's misses, every
// layer of `layers` in turn.
HS_KERNEL HS_BOUNDS(HS_RESOLVE_THREADS) void hs_resolve_gather(
    const i32* __restrict__ req_id, const i32* __restrict__ topk,
    const i32* __restrict__ resident_table, const i32* __restrict__ host_table,
    const i32* __restrict__ hot_table, i32* __restrict__ slot_host_rows, u16* __restrict__ lru,
    i32* __restrict__ indices, i32* __restrict__ valid_counts, i32* __restrict__ hit_counts,
    i32* __restrict__ miss_counts, i32* __restrict__ miss_src, i32* __restrict__ miss_dst,
    hs_wanted* __restrict__ workspace, u32* __restrict__ workspace_counter, u32 workspace_entries,
    u32 smem_table_entries, u32 num_tokens, u32 top_k, u32 num_requests, u32 max_pages,
    u32 block_size, u32 hot_slots, u32 attention_block_stride, u32 host_num_blocks,
    const i32* __restrict__ idx_mapping, u32 num_state_rows, u32* __restrict__ stats,
    const u8* __restrict__ host, u8* __restrict__ device, hs_gather_layers layers) {
    HS_GRID_DEP_WAIT(); // before any global memory access
    bool allocated;
    const u32 rows = hs_resolve_rows(
        req_id, topk, resident_table, host_table, hot_table, slot_host_rows, lru, indices, valid_counts,
        hit_counts, miss_counts, miss_src, miss_dst, workspace, workspace_counter,
        workspace_entries, smem_table_entries, num_tokens, top_k, num_requests, max_pages,
        block_size, hot_slots, attention_block_stride, host_num_blocks, idx_mapping,
        num_state_rows, stats, HS_BID_X, allocated);
    const u32 k = HS_BID_X;
    const u32 nl = layers.count < HS_GATHER_MAX_LAYERS ? layers.count : HS_GATHER_MAX_LAYERS;
    // The block's last workspace allocation is behind it: release before the copies, so the
    // launch's counters are back to zero as soon as every block has resolved.
    hs_workspace_release_after(workspace_counter, allocated);
    if (rows == 0) return; // uniform over the block
    const i32 req = req_id[k];
    for (u32 t2 = k, seen = 0; t2 < num_tokens && seen < rows; ++t2) {
        if (t2 != k && req_id[t2] != req) continue;
        ++seen;
        const i32 cnt = miss_counts[t2];
        const u32 n = cnt < 0 ? 0u : ((u32)cnt > top_k ? top_k : (u32)cnt);
        const u64 base = (u64)t2 * top_k;
        for (u32 z = 0; z < nl; ++z)
            hs_fused_copy_layer(layers.layer[z], miss_src, miss_dst, base, n, host, device);
    }
}

