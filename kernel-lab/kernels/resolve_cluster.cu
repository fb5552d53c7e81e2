// An experiment of the kernel lab (never part of a published crate): the resolver's decode path
// spread over a thread-block cluster, to measure against the production kernel (hs_resolve) on
// the same inputs. Compiled after a vendor prelude and the production source
// (hisparse_gpu_kernels::COMMON_SOURCE), whose helpers it uses: on CUDA by NVRTC for sm_90 (the
// lab's cuda_bench), on the CPU by the emulation (`tests/cluster_emulation.rs`).
//
// Why: one request's decode resolve is one 1024-thread block on one multiprocessor, about
// 11,300 warp instructions per scheduler through eight barriers (docs/PERF.md, "The
// resolver"): the multiprocessor's issue rate and the barriers' chain set its time (12 us at one
// request), while the other multiprocessors idle. A cluster of C blocks of 1024 / C threads
// (C = 2, 4, 8) keeps each thread's work exactly as in hs_resolve_decode (two top-k entries,
// four LRU positions and four slots in registers from first load to last store) but gives each
// multiprocessor 1 / C of it; what the blocks share lives in their shared memory, reached
// through the cluster's distributed shared memory. The same body with C = 1 and twice the work
// per thread (four entries, eight positions and slots: lab_resolve_w512, 512 threads, at most 64
// registers) lets two requests share a multiprocessor, which hs_resolve's 64 registers for 1024
// threads forbid: the case of more requests than multiprocessors.
//   * the wanted-row table (key, first entry, first LRU position, slot), one table of `cap`
//     entries interleaved over the blocks (entry h in block h % C, at h / C), probed linearly as
//     one table, so it never fills however the keys hash;
//   * the LRU inverse (slot -> position), the partition and the bitmap, each of N entries cut
//     into C ranges of 4 * (1024 / C): block c holds the positions and slots its threads own;
//   * the flags and the row's valid count in block 0, each block's scan totals in every block.
// Every block barrier of hs_resolve_decode becomes a cluster barrier (release / acquire); a
// block's pair scan is followed by an exchange of the blocks' totals.
//
// It computes exactly what hs_resolve computes: a decode request (one token row, top_k <= the
// cluster's entries and even, hot_slots <= its slots and a multiple of 4, state-row order,
// aligned rows) takes the cluster path; a padding row is written as hs_resolve writes it; any
// other row (a request with several rows in the launch, rows an engine lent at odd offsets) is
// resolved by block 0 of its cluster running the production general body (hs_resolve_body) in
// global-state mode, on the launch's workspace, the other blocks leaving: what the production
// decode path hands to the body, it hands over too. `*fallbacks` counts the rows it handed over
// (the benches expect none on decode walks). Every block of the grid releases the workspace
// counters (hs_workspace_release_after), as hs_resolve's do.
//
// Dynamic shared memory of each block: lab_cluster_shared_bytes(threads, table entries / C).

// The cluster's spelling on each vendor the lab builds for.
#if defined(HS_VENDOR_CUDA)
HS_DEVICE u32 lc_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
HS_DEVICE u32 lc_size() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}
// Every thread of every block of the cluster arrives (its earlier writes, shared and
// distributed, released) before any proceeds (acquiring them).
HS_DEVICE void lc_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// The generic address of `p` (this block's shared memory) in block `rank`'s shared memory.
template <class T>
HS_DEVICE T* lc_cluster_map(T* p, u32 rank) {
    u64 out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"((u64)p), "r"(rank));
    return (T*)out;
}
#elif defined(HS_VENDOR_CPU)
HS_DEVICE u32 lc_rank() { return hs_cpu_cluster_rank(); }
HS_DEVICE u32 lc_size() { return hs_cpu_cluster_size(); }
HS_DEVICE void lc_cluster_sync() { hs_cpu_cluster_sync(); }
template <class T>
HS_DEVICE T* lc_cluster_map(T* p, u32 rank) {
    return (T*)hs_cpu_cluster_map((void*)p, rank);
}
#else
#error "the cluster resolver is built for CUDA or the CPU emulation only"
#endif

// A barrier of the cluster of C blocks (C = 1: the block's own barrier), and the address of `p`
// in block `rank` (C = 1: `p` itself, so shared accesses stay shared-memory instructions).
template <u32 C>
HS_DEVICE void lc_sync() {
    if constexpr (C == 1) HS_SYNC();
    else lc_cluster_sync();
}
template <u32 C, class T>
HS_DEVICE T* lc_map(T* p, u32 rank) {
    if constexpr (C == 1) return p;
    else return lc_cluster_map(p, rank);
}

// Bytes of one block's dynamic shared memory: the hot stage, the block's range of the LRU
// inverse, partition and bitmap (`per_thread` entries a thread), its share of the table's four
// columns, the scan scratch, the blocks' totals (two words for each of up to 8 blocks) and five
// words (four flags, the valid count).
HS_DEVICE u32 lab_cluster_shared_bytes(u32 threads, u32 per_thread, u32 table_per_block) {
    const u32 np = per_thread * threads;
    return 4u * HS_RESOLVE_HOT_STAGE + 2u * hs_align16(2u * np) + hs_align16(4u * (np / 32u)) +
           4u * hs_align16(4u * table_per_block) + 16u * HS_MAX_WARPS + 64u + 32u;
}

// The wanted-row table spread over the cluster: entry h lives in block h % C at h / C.
struct lc_table {
    i32* key;
    u32* first_entry;
    u32* first_lru;
    u32* slot;
    u32 mask;   // cap - 1
    u32 cshift; // log2(C)
};

template <u32 C, class T>
HS_DEVICE T* lc_at(const lc_table& tb, T* column, u32 h) {
    return lc_map<C>(column + (h >> tb.cshift), h & ((1u << tb.cshift) - 1u));
}

template <u32 C>
HS_DEVICE u32 lc_lookup(const lc_table& tb, i32 g) {
    u32 h = hs_hash(g, tb.mask);
    for (;;) {
        const i32 k = *lc_at<C>(tb, tb.key, h);
        if (k == g) return h;
        if (k == HS_EMPTY_KEY) return HS_NONE;
        h = (h + 1u) & tb.mask;
    }
}

// hs_insert on the cluster's table.
template <u32 C>
HS_DEVICE u32 lc_insert(const lc_table& tb, i32 g, u32 entry, bool& existed) {
    u32 h = hs_hash(g, tb.mask);
    for (;;) {
        const i32 prev = atomicCAS(lc_at<C>(tb, tb.key, h), HS_EMPTY_KEY, g);
        if (prev == HS_EMPTY_KEY || prev == g) {
            atomicMin(lc_at<C>(tb, tb.first_entry, h), entry);
            existed = prev == g;
            return h;
        }
        h = (h + 1u) & tb.mask;
    }
}

// Flags block 0 gathers (plain stores of 1: any number of threads may set one).
#define LC_OTHER_ROW 0u
#define LC_ANY_HOST 1u
#define LC_CORRUPT 2u
#define LC_SHARED_ROW 3u
#define LC_VALID 4u

// The general body for a row the cluster path does not take, kept out of line: inlined, its
// registers would be the cluster path's too (64 a thread and spills, against 48-58 without).
#if defined(HS_VENDOR_CUDA)
#define LC_OUT_OF_LINE static __device__ __noinline__
#else
#define LC_OUT_OF_LINE static
#endif
LC_OUT_OF_LINE void lc_general_body(
    const i32* __restrict__ req_id, const i32* __restrict__ topk,
    const i32* __restrict__ resident_table, const i32* __restrict__ host_table,
    const i32* __restrict__ hot_table, i32* __restrict__ slot_host_rows, u16* __restrict__ lru,
    i32* __restrict__ indices, i32* __restrict__ valid_counts, i32* __restrict__ hit_counts,
    i32* __restrict__ miss_counts, i32* __restrict__ miss_src, i32* __restrict__ miss_dst,
    hs_wanted* __restrict__ workspace, u32* __restrict__ workspace_counter, u32 workspace_entries,
    u32 smem_table_entries, u32 num_tokens, u32 top_k, u32 num_requests, u32 max_pages,
    u32 block_size, u32 hot_slots, u32 attention_block_stride, u32 host_num_blocks,
    u32* __restrict__ stats, u32 t, u32* s_scan, u32* s_words, bool* allocated) {
    bool a = false;
    hs_resolve_body(req_id, topk, resident_table, host_table, hot_table, slot_host_rows, lru,
                    indices, valid_counts, hit_counts, miss_counts, miss_src, miss_dst, workspace,
                    workspace_counter, workspace_entries, smem_table_entries, num_tokens, top_k,
                    num_requests, max_pages, block_size, hot_slots, attention_block_stride,
                    host_num_blocks, 0, 0, stats, t, s_scan, s_words, a);
    *allocated = a;
}

// Block `c` of the cluster of C blocks resolving token row `t`, each thread owning EK top-k
// entries (even: EK / 2 eight-byte loads) and EN positions and slots (a multiple of 4: EN / 4
// groups of one eight-byte LRU load and one 16-byte row load). `table_entries`: the whole table
// (a power of two of at least 2 * top_k and 4 * C entries). The launch's shape was checked by
// the host (eligible() in src/resolve_cluster.rs): every block of the cluster takes the same
// path.
template <u32 C, u32 EK, u32 EN>
HS_DEVICE void lab_resolve_cluster_body(
    const i32* __restrict__ req_id, const i32* __restrict__ topk,
    const i32* __restrict__ resident_table, const i32* __restrict__ host_table,
    const i32* __restrict__ hot_table, i32* __restrict__ slot_host_rows, u16* __restrict__ lru,
    i32* __restrict__ indices, i32* __restrict__ valid_counts, i32* __restrict__ hit_counts,
    i32* __restrict__ miss_counts, i32* __restrict__ miss_src, i32* __restrict__ miss_dst,
    hs_wanted* __restrict__ workspace, u32* __restrict__ workspace_counter, u32 workspace_entries,
    u32 table_entries, u32 num_tokens, u32 top_k, u32 num_requests, u32 max_pages, u32 block_size,
    u32 hot_slots, u32 attention_block_stride, u32 host_num_blocks, u32* __restrict__ stats,
    u32* __restrict__ fallbacks, bool& allocated) {
    static_assert(EK % 2 == 0 && EN % 4 == 0 && (C & (C - 1)) == 0 && C <= 8, "shape");
    HS_DYN_SHARED(sm);
    const u32 c = C == 1 ? 0u : lc_rank(), T = HS_NTHREADS;
    const u32 t = HS_BID_X / C;
    const u32 K = top_k, N = hot_slots;
    const u32 np = EN * T; // positions and slots per block
    const u32 gi = c * T + HS_TID, gt = C * T;
    allocated = false;
    if (stats != 0 && t == 0 && c == 0 && HS_TID == 0) atomicAdd(stats + 3, 1u); // the call
    if (t >= num_tokens) return;
    const hs_resolve_desc d =
        hs_resolve_desc_make(num_tokens, top_k, num_requests, max_pages, block_size, hot_slots,
                             attention_block_stride, host_num_blocks);
    const u64 base = (u64)t * K;
    const i32 req = HS_LDG(req_id + t);
    if (req < 0 || (u32)req >= num_requests) { // padding, as hs_resolve_body writes it
        for (u32 j = gi; j < K; j += gt) {
            indices[base + j] = -1;
            miss_src[base + j] = -1;
            miss_dst[base + j] = -1;
        }
        if (c == 0 && HS_TID == 0) {
            valid_counts[t] = 0;
            hit_counts[t] = 0;
            miss_counts[t] = 0;
        }
        return;
    }
    const u32 r = (u32)req;
    const u64 sbase = (u64)r * N;
    // The vector loads need aligned rows: buffers an engine lent at odd offsets take the body.
    const bool aligned =
        ((u64)topk & 7u) == 0 && ((u64)lru & 7u) == 0 && ((u64)slot_host_rows & 15u) == 0;

    // This block's shared memory.
    unsigned char* p = sm + 4u * HS_RESOLVE_HOT_STAGE;
    u16* s_inv = (u16*)p; // slot -> its LRU position, slots [c * np, (c + 1) * np)
    p += hs_align16(2u * np);
    u16* s_part = (u16*)p; // partition entries [c * np, (c + 1) * np)
    p += hs_align16(2u * np);
    u32* s_bits = (u32*)p; // slots claimed, then positions not hit, [c * np, (c + 1) * np)
    p += hs_align16(4u * (np / 32u));
    lc_table tb;
    tb.cshift = 31u - (u32)HS_CLZ(C);
    const u32 per_block = table_entries >> tb.cshift;
    tb.key = (i32*)p;
    p += hs_align16(4u * per_block);
    tb.first_entry = (u32*)p;
    p += hs_align16(4u * per_block);
    tb.first_lru = (u32*)p;
    p += hs_align16(4u * per_block);
    tb.slot = (u32*)p;
    p += hs_align16(4u * per_block);
    tb.mask = table_entries - 1u;
    u32* s_scan = (u32*)p;
    p += 16u * HS_MAX_WARPS;
    u32* s_totals = (u32*)p; // [2 * b]: block b's hits, [2 * b + 1]: its misses
    p += 64u;
    u32* s_words = (u32*)p; // [LC_*]: block 0's flags and valid count
    u32* flags0 = lc_map<C>(s_words, 0u);

    // Loads, as hs_resolve_decode issues them: this thread's entries, its LRU positions and its
    // slots' cached rows, the hot-table row (staged by every block), and the other token rows'
    // requests.
    const u32 j0 = EK * gi, p0 = EN * gi, lp0 = EN * HS_TID; // lp0: p0 in the block's range
    i32 tok[EK];
#pragma unroll
    for (u32 q = 0; q < EK; q += 2) {
        tok[q] = tok[q + 1] = -1;
        if (aligned && j0 + q < K) { // K is even: both entries of the pair, or neither
            const u64 pair = HS_LDG((const u64*)(topk + base + j0 + q));
            tok[q] = (i32)(u32)pair;
            tok[q + 1] = (i32)(u32)(pair >> 32);
        }
    }
    u32 pos_slot[EN];
    i32 cached_row[EN];
#pragma unroll
    for (u32 q = 0; q < EN; q += 4) {
        if (aligned && p0 + q < N) { // N is a multiple of 4: all four, or none
            const u64 four = *(const u64*)(lru + sbase + p0 + q);
            const uint4 rows = *(const uint4*)(slot_host_rows + sbase + p0 + q);
#pragma unroll
            for (u32 e = 0; e < 4; ++e) pos_slot[q + e] = (u32)(four >> (16u * e)) & 0xffffu;
            cached_row[q] = (i32)rows.x;
            cached_row[q + 1] = (i32)rows.y;
            cached_row[q + 2] = (i32)rows.z;
            cached_row[q + 3] = (i32)rows.w;
        } else {
#pragma unroll
            for (u32 e = 0; e < 4; ++e) {
                pos_slot[q + e] = 0;
                cached_row[q + e] = -1;
            }
        }
    }
    bool other_row = !aligned; // uniform: the row goes to the body
    for (u32 t2 = gi; t2 < num_tokens; t2 += gt)
        if (t2 != t && HS_LDG(req_id + t2) == req) other_row = true;
    i32* s_hot = d.hot_cols <= HS_RESOLVE_HOT_STAGE ? (i32*)sm : (i32*)0;
    if (s_hot != 0)
        for (u32 i = HS_TID; i < d.hot_cols; i += T) s_hot[i] = HS_LDG(hot_table + (u64)r * d.hot_cols + i);
    for (u32 i = HS_TID; i < per_block; i += T) {
        tb.key[i] = HS_EMPTY_KEY;
        tb.first_entry[i] = HS_NONE;
        tb.first_lru[i] = HS_NONE;
        tb.slot[i] = HS_NONE;
    }
    for (u32 i = HS_TID; i < np / 32u; i += T) s_bits[i] = 0;
    if (HS_TID < 5u) s_words[HS_TID] = 0;
    i32 val[EK];
    u32 kind[EK];
#pragma unroll
    for (u32 q = 0; q < EK; ++q) {
        val[q] = -1;
        kind[q] = j0 + q < K ? hs_classify(d, resident_table, host_table, r, r, tok[q], val[q]) : 0u;
    }
    lc_sync<C>(); // (1) every block's table, bitmap and flags are clear

    // Insert the wanted host rows; check the LRU is a permutation and invert it (slot sl's
    // bit and inverse live in block sl / np).
    u32 h_entry[EK];
    bool any = false, shared_row = false;
#pragma unroll
    for (u32 q = 0; q < EK; ++q) {
        h_entry[q] = HS_NONE;
        if (kind[q] == 2) {
            bool existed;
            h_entry[q] = lc_insert<C>(tb, val[q], j0 + q, existed);
            shared_row |= existed;
            any = true;
        }
    }
    bool corrupt_seen = false;
#pragma unroll
    for (u32 q = 0; q < EN; ++q) {
        if (p0 + q >= N) continue;
        const u32 sl = pos_slot[q];
        if (sl >= N) {
            corrupt_seen = true;
        } else {
            const u32 owner = sl / np, lo = sl % np, bit = 1u << (lo & 31u);
            if (atomicOr(lc_map<C>(&s_bits[lo >> 5], owner), bit) & bit) corrupt_seen = true;
            else *lc_map<C>(&s_inv[lo], owner) = (u16)(p0 + q);
        }
    }
    if (other_row) flags0[LC_OTHER_ROW] = 1u;
    if (any) flags0[LC_ANY_HOST] = 1u;
    if (corrupt_seen) flags0[LC_CORRUPT] = 1u;
    if (shared_row) flags0[LC_SHARED_ROW] = 1u;
    lc_sync<C>(); // (2)
    const uint4 f = *(const uint4*)flags0;
    if (f.x != 0) { // uniform: several rows of one request (or unaligned rows), the body's work
        lc_sync<C>(); // every block has read block 0's flags before block 0 reuses its memory
        if (c != 0) return;
        if (HS_TID == 0) atomicAdd(fallbacks, 1u);
        // Block 0's whole dynamic shared memory past the hot stage is the body's: its shared
        // table (a power of two) first, its scan and flag words at the end.
        const u32 bytes = lab_cluster_shared_bytes(T, EN, per_block);
        const u32 scratch_bytes = 16u * HS_MAX_WARPS + 16u;
        u32* b_scan = (u32*)(sm + bytes - scratch_bytes);
        u32* b_words = b_scan + 4u * HS_MAX_WARPS;
        const u32 room = (bytes - scratch_bytes - 4u * HS_RESOLVE_HOT_STAGE) / 16u;
        const u32 cap = room >= 16u ? 1u << (31u - (u32)HS_CLZ(room)) : 0u;
        lc_general_body(req_id, topk, resident_table, host_table, hot_table, slot_host_rows, lru,
                        indices, valid_counts, hit_counts, miss_counts, miss_src, miss_dst,
                        workspace, workspace_counter, workspace_entries,
                        cap | HS_RESOLVE_GLOBAL_STATE, num_tokens, top_k, num_requests, max_pages,
                        block_size, hot_slots, attention_block_stride, host_num_blocks, stats, t,
                        b_scan, b_words, &allocated);
        return;
    }
    const bool any_host = f.y != 0, corrupt = f.z != 0, dups = f.w != 0;

    u32 used = 0, hits = 0;
    if (any_host) {
        const i64 host_rows = (i64)host_num_blocks * (i64)block_size;
        if (corrupt) { // the LRU and slot_host_rows rows start over, nothing hits
#pragma unroll
            for (u32 q = 0; q < EN; ++q) {
                if (p0 + q >= N) continue;
                pos_slot[q] = p0 + q;
                cached_row[q] = -1;
                slot_host_rows[sbase + p0 + q] = -1;
            }
        }
        // Each cached row in the table: the first LRU position caching it wins the hit. This
        // thread's slots are in this block's range, so their inverse is local.
        u32 h_slot[EN];
#pragma unroll
        for (u32 q = 0; q < EN; ++q) {
            h_slot[q] = HS_NONE;
            const i32 cr = cached_row[q];
            if (!corrupt && p0 + q < N && cr >= 0 && (i64)cr < host_rows) {
                h_slot[q] = lc_lookup<C>(tb, cr);
                if (h_slot[q] != HS_NONE)
                    atomicMin(lc_at<C>(tb, tb.first_lru, h_slot[q]), (u32)s_inv[lp0 + q]);
            }
        }
        lc_sync<C>(); // (3)
        // Mark the hits: the winning slot takes the row; its position's bit is cleared.
#pragma unroll
        for (u32 q = 0; q < EN; ++q) {
            const u32 h = h_slot[q];
            if (h == HS_NONE) continue;
            const u32 at = s_inv[lp0 + q];
            if (*lc_at<C>(tb, tb.first_lru, h) == at) {
                *lc_at<C>(tb, tb.slot, h) = p0 + q;
                const u32 lo = at % np;
                atomicAnd(lc_map<C>(&s_bits[lo >> 5], at / np), ~(1u << (lo & 31u)));
            }
        }
        lc_sync<C>(); // (4)
        // Number this thread's hit positions and missed first appearances: the block's pair
        // scan, then the blocks before this one.
        u32 nh = 0, nm = 0;
        bool pos_hit[EN];
#pragma unroll
        for (u32 q = 0; q < EN; ++q) {
            const u32 lp = lp0 + q;
            pos_hit[q] = !corrupt && p0 + q < N && ((s_bits[lp >> 5] >> (lp & 31u)) & 1u) == 0;
            nh += pos_hit[q] ? 1u : 0u;
        }
        bool first_miss[EK];
#pragma unroll
        for (u32 q = 0; q < EK; ++q) {
            const u32 h = h_entry[q];
            first_miss[q] = h != HS_NONE && *lc_at<C>(tb, tb.first_entry, h) == j0 + q &&
                            *lc_at<C>(tb, tb.slot, h) == HS_NONE;
            nm += first_miss[q] ? 1u : 0u;
        }
        u32 hr, m, block_hits, block_misses;
        hs_block_scan_pair(nh, nm, s_scan, 0, hr, m, block_hits, block_misses);
        u32 misses = block_misses;
        hits = block_hits;
        if constexpr (C > 1) {
            if (HS_TID < C) {
                u32* to = lc_map<C>(s_totals, HS_TID);
                to[2u * c] = block_hits;
                to[2u * c + 1u] = block_misses;
            }
            lc_sync<C>(); // (5)
            hits = misses = 0;
            for (u32 b = 0; b < C; ++b) {
                const u32 bh = s_totals[2u * b], bm = s_totals[2u * b + 1u];
                if (b < c) {
                    hr += bh;
                    m += bm;
                }
                hits += bh;
                misses += bm;
            }
        }
        const u32 V = N - hits; // evictable slots
#pragma unroll
        for (u32 q = 0; q < EN; ++q) {
            const u32 pp = p0 + q;
            if (pp >= N) continue;
            const u32 at = pos_hit[q] ? N - 1u - hr++ : pp - hr;
            *lc_map<C>(&s_part[at % np], at / np) = (u16)pos_slot[q];
        }
        lc_sync<C>(); // (6)
        used = misses < V ? misses : V;
        // The m-th miss takes the m-th evictable slot; entries past the plan read -1.
#pragma unroll
        for (u32 q = 0; q < EK; ++q) {
            if (first_miss[q]) {
                if (m < V) {
                    const u32 sl = *lc_map<C>(&s_part[m % np], m / np);
                    const i32 g = val[q];
                    const i32 src = (i64)g < host_rows ? g : -1;
                    *lc_at<C>(tb, tb.slot, h_entry[q]) = sl;
                    slot_host_rows[sbase + sl] = src;
                    miss_src[base + m] = src;
                    miss_dst[base + m] = hs_hot_row_staged(d, s_hot, hot_table, r, sl);
                }
                ++m;
            }
            if (j0 + q < K && j0 + q >= used) {
                miss_src[base + j0 + q] = -1;
                miss_dst[base + j0 + q] = -1;
            }
        }
        // The new LRU: unused evictables, the miss slots in miss order, the hits in old order.
#pragma unroll
        for (u32 q = 0; q < EN; ++q) {
            const u32 i = p0 + q;
            if (i >= N) continue;
            u32 at;
            if (i < V - used) at = used + i;
            else if (i < V) at = i - (V - used);
            else at = N - 1u - (i - V);
            lru[sbase + i] = *lc_map<C>(&s_part[at % np], at / np);
        }
        if (dups) lc_sync<C>(); // (7) a later entry of a missed row reads its slot
    } else {
#pragma unroll
        for (u32 q = 0; q < EK; ++q) {
            if (j0 + q < K) {
                miss_src[base + j0 + q] = -1;
                miss_dst[base + j0 + q] = -1;
            }
        }
    }
    if (c == 0 && HS_TID == 0) {
        hit_counts[t] = (i32)hits;
        miss_counts[t] = (i32)used;
        if (stats != 0) {
            if (hits != 0) atomicAdd(stats + 0, hits);
            if (used != 0) atomicAdd(stats + 1, used);
        }
    }
    // The row's indices and valid count (each warp's sum added into block 0).
    u32 valid = 0;
#pragma unroll
    for (u32 q = 0; q < EK; ++q) {
        if (j0 + q >= K) continue;
        i32 out = -1;
        if (kind[q] == 1) {
            out = val[q];
        } else if (kind[q] == 2) {
            const u32 sl = *lc_at<C>(tb, tb.slot, h_entry[q]);
            if (sl != HS_NONE) out = hs_hot_row_staged(d, s_hot, hot_table, r, sl);
        }
        indices[base + j0 + q] = out;
        valid += out != -1 ? 1u : 0u;
    }
    const u32 warp_valid = HS_SHFL_U32(hs_warp_inclusive(valid), HS_WARP - 1u);
    if (HS_TID % HS_WARP == 0 && warp_valid != 0) atomicAdd(&flags0[LC_VALID], warp_valid);
    lc_sync<C>(); // (8) every block's count is in; nothing reads another block's memory after it
    if (c == 0 && HS_TID == 0) {
        const u32 total = s_words[LC_VALID];
        valid_counts[t] = (i32)total;
        if (stats != 0 && total != 0) atomicAdd(stats + 2, total);
    }
}

// A kernel's whole work: the body, then every block releases the workspace counters.
template <u32 C, u32 EK, u32 EN>
HS_DEVICE void lab_resolve_cluster(
    const i32* __restrict__ req_id, const i32* __restrict__ topk,
    const i32* __restrict__ resident_table, const i32* __restrict__ host_table,
    const i32* __restrict__ hot_table, i32* __restrict__ slot_host_rows, u16* __restrict__ lru,
    i32* __restrict__ indices, i32* __restrict__ valid_counts, i32* __restrict__ hit_counts,
    i32* __restrict__ miss_counts, i32* __restrict__ miss_src, i32* __restrict__ miss_dst,
    hs_wanted* __restrict__ workspace, u32* __restrict__ workspace_counter, u32 workspace_entries,
    u32 table_entries, u32 num_tokens, u32 top_k, u32 num_requests, u32 max_pages, u32 block_size,
    u32 hot_slots, u32 attention_block_stride, u32 host_num_blocks, u32* __restrict__ stats,
    u32* __restrict__ fallbacks) {
    HS_GRID_DEP_WAIT(); // before any global memory access
    bool allocated;
    lab_resolve_cluster_body<C, EK, EN>(
        req_id, topk, resident_table, host_table, hot_table, slot_host_rows, lru, indices,
        valid_counts, hit_counts, miss_counts, miss_src, miss_dst, workspace, workspace_counter,
        workspace_entries, table_entries, num_tokens, top_k, num_requests, max_pages, block_size,
        hot_slots, attention_block_stride, host_num_blocks, stats, fallbacks, allocated);
    hs_workspace_release_after(workspace_counter, allocated);
}

#if defined(HS_VENDOR_CUDA)
#define LAB_RESOLVE_PARAMS                                                                        \
    const i32 *req_id, const i32 *topk, const i32 *resident_table, const i32 *host_table,         \
        const i32 *hot_table, i32 *slot_host_rows, u16 *lru, i32 *indices, i32 *valid_counts,   \
        i32 *hit_counts, i32 *miss_counts, i32 *miss_src, i32 *miss_dst, hs_wanted *workspace,   \
        u32 *workspace_counter, u32 workspace_entries, u32 table_entries, u32 num_tokens,         \
        u32 top_k, u32 num_requests, u32 max_pages, u32 block_size, u32 hot_slots,               \
        u32 attention_block_stride, u32 host_num_blocks, u32 *stats, u32 *fallbacks
#define LAB_RESOLVE_ARGS                                                                          \
    req_id, topk, resident_table, host_table, hot_table, slot_host_rows, lru, indices,            \
        valid_counts, hit_counts, miss_counts, miss_src, miss_dst, workspace, workspace_counter, \
        workspace_entries, table_entries, num_tokens, top_k, num_requests, max_pages,            \
        block_size, hot_slots, attention_block_stride, host_num_blocks, stats, fallbacks
#define LAB_RESOLVE_CLUSTER(C)                                                                    \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(1024 / C)               \
        lab_resolve_c##C(LAB_RESOLVE_PARAMS) {                                                    \
        lab_resolve_cluster<C, 2, 4>(LAB_RESOLVE_ARGS);                                           \
    }
LAB_RESOLVE_CLUSTER(2)
LAB_RESOLVE_CLUSTER(4)
LAB_RESOLVE_CLUSTER(8)
// One block of 512 threads a request, two blocks a multiprocessor.
extern "C" __global__ void __launch_bounds__(512, 2) lab_resolve_w512(LAB_RESOLVE_PARAMS) {
    lab_resolve_cluster<1, 4, 8>(LAB_RESOLVE_ARGS);
}
#endif
