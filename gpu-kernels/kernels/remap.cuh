// ---------------------------------------------------------------------------------------------
// Remap (hisparse_core::ops::remap::remap)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid.x (any size; the host uses min(num_tokens, what the device holds at once), and one
// block for an empty batch with stats), grid.y (column tiles of each row; more than one only
// without counts and compaction: the host spreads a few plain rows over the multiprocessors this
// way), block (a multiple of 64 up to HS_REMAP_MAX_THREADS; the host uses top_k / 4 threads per
// tile, one 16-byte vector each, when top_k is a multiple of 4; top_k / 8, two vectors each, with
// HS_REMAP_PAIR), dynamic shared memory 4 * top_k bytes with HS_REMAP_STAGED, else none.
// Blocks take token rows grid-stride. `idx_mapping` and `counts` may be null when the matching
// flag is clear; `stats` (null: none) receives each row's valid entries in word 2 (counted
// whether or not `counts` is written) and block (0, 0) adds the call to word 3.
//
// Per row the request id and the thread's top-k vector are loaded together (independent), one
// row ahead: while a block looks up row t, the inputs of its next row are already in flight, so a
// block with several rows pays the first round trip once. Each entry's block-table entry is read
// directly through the read-only path, a thread's four loads issued together (one dependent round
// trip for all of them; no staging, no barrier), and the outputs are stored as 16-byte vectors.
// Valid counts are a block sum and compaction a block scan, each with a single barrier
// (hs_block_scan1). With HS_REMAP_STAGED the compacted row is built in shared memory and leaves it
// as whole 16-byte vectors with its -1 tail (one more barrier, no scattered 4-byte stores);
// without it, valid entries are stored where they land and the -1 tail is written by the threads
// whose own entries lie beyond the valid ones. Rows longer than one pass of the block loop over
// passes.

#define HS_REMAP_MAX_THREADS 512
#define HS_REMAP_HAS_MAP 1u
#define HS_REMAP_COUNTS 2u
#define HS_REMAP_COMPACT 4u
#define HS_REMAP_STAGED 16u
#define HS_REMAP_PAIR 32u

#if defined(HS_VENDOR_CUDA)
// Four blocks of 512 threads per multiprocessor (at most 32 registers each): a launch of up to
// four rows per multiprocessor runs as one wave.
#define HS_REMAP_BOUNDS __launch_bounds__(HS_REMAP_MAX_THREADS, 4)
#else
#define HS_REMAP_BOUNDS HS_BOUNDS(HS_REMAP_MAX_THREADS)
#endif

// How a top-k token number splits into (block-table column, offset in the block).
struct hs_remap_geo {
    u32 block_size, max_blocks, stride;
    u32 shift; // log2(block_size) when it is a power of two, else 32
};

// The geometry of a remap's block table (one rule for every remap path).
HS_DEVICE hs_remap_geo hs_remap_geo_make(u32 block_size, u32 max_blocks, u32 block_stride_rows) {
    hs_remap_geo g;
    g.block_size = block_size;
    g.max_blocks = max_blocks;
    g.stride = block_stride_rows;
    g.shift = hs_pow2_shift(block_size);
    return g;
}

// The block-table row of request `req` (through idx_mapping when MAP), or -1 for a padding row.
// Selects, not branches: at decode sizes the remap's time is its dependent chain.
template <bool MAP>
HS_DEVICE i32 hs_remap_row_of(i32 req, const i32* idx_mapping, u32 table_rows,
                              u32 idx_mapping_len) {
    if (MAP) {
        const bool mapped = req >= 0 && (u32)req < idx_mapping_len;
        const i32 m = mapped ? HS_LDG(idx_mapping + req) : -1;
        return m >= 0 && (u32)m < table_rows ? m : -1;
    }
    return req >= 0 && (u32)req < table_rows ? req : -1;
}

// Row `row` of the block table as a pointer, or null for a padding row (`row` < 0).
HS_DEVICE const i32* hs_remap_row_ptr(const i32* block_table, i32 row, u32 max_blocks) {
    return row >= 0 ? block_table + (u64)row * max_blocks : 0;
}

// The block-table row of request `req` as a pointer (null: padding), through idx_mapping when
// MAP.
template <bool MAP>
HS_DEVICE const i32* hs_remap_table_row_at(i32 req, const i32* block_table,
                                           const i32* idx_mapping, u32 table_rows, u32 max_blocks,
                                           u32 idx_mapping_len) {
    return hs_remap_row_ptr(block_table,
                            hs_remap_row_of<MAP>(req, idx_mapping, table_rows, idx_mapping_len),
                            max_blocks);
}

// hs_remap_table_row_at with HS_REMAP_HAS_MAP read from `flags`.
HS_DEVICE const i32* hs_remap_table_row(i32 req, const i32* block_table, const i32* idx_mapping,
                                        u32 table_rows, u32 max_blocks, u32 idx_mapping_len,
                                        u32 flags) {
    const i32 row = (flags & HS_REMAP_HAS_MAP)
                        ? hs_remap_row_of<true>(req, idx_mapping, table_rows, idx_mapping_len)
                        : hs_remap_row_of<false>(req, idx_mapping, table_rows, idx_mapping_len);
    return hs_remap_row_ptr(block_table, row, max_blocks);
}

// Where top-k entry `tok` is found against the table row `bt` (null: padding): its block-table
// column and offset in the block, or false when the output is -1 without a table load. POW2: the
// block size is a power of two (g.shift < 32), so a shift and a mask split the entry. No branch:
// at decode sizes the kernels' time is their dependent chain, and a branch costs a convergence
// barrier on it. The load itself is the caller's, so that a thread's four entries issue their
// loads back to back (one round trip, not four).
template <bool POW2>
HS_DEVICE bool hs_remap_where(const hs_remap_geo& g, const i32* bt, i32 tok, u32& col, u32& off) {
    const u32 u = (u32)tok;
    if (POW2) {
        col = u >> g.shift;
        off = u & (g.block_size - 1);
    } else {
        col = u / g.block_size;
        off = u % g.block_size;
    }
    return bt != 0 && tok >= 0 && col < g.max_blocks;
}

// Entries `v[q]` with `take[q]` set are looked up against the table row `bt` (the four table
// loads in flight at once); the others keep their value. Returns how many of the four are not -1.
template <bool POW2>
HS_DEVICE u32 hs_remap_lookup4(const hs_remap_geo& g, const i32* bt, i32 (&v)[4],
                               const bool (&take)[4]) {
    u32 col[4], off[4];
    bool look[4];
#pragma unroll
    for (u32 q = 0; q < 4; ++q) {
        look[q] = take[q] && hs_remap_where<POW2>(g, bt, v[q], col[q], off[q]);
        if (take[q] && !look[q]) v[q] = -1;
    }
    i32 blk[4];
#pragma unroll
    for (u32 q = 0; q < 4; ++q) blk[q] = look[q] ? HS_LDG(bt + col[q]) : -1;
    u32 n = 0;
#pragma unroll
    for (u32 q = 0; q < 4; ++q) {
        const i32 row = hs_physical_row(blk[q], g.stride, off[q]);
        v[q] = look[q] ? row : v[q];
        n += v[q] != -1 ? 1u : 0u;
    }
    return n;
}

// This thread's entries of a row `in` from entry j0: a 16-byte vector (`vec`) or one entry, -1
// for the rest and past the row's end.
HS_DEVICE void hs_remap_entries(const i32* in, u32 top_k, u32 j0, bool vec, i32 (&v)[4]) {
    v[0] = v[1] = v[2] = v[3] = -1;
    if (j0 < top_k) {
        if (vec) {
            const uint4 a = HS_LDG((const uint4*)(in + j0));
            v[0] = (i32)a.x;
            v[1] = (i32)a.y;
            v[2] = (i32)a.z;
            v[3] = (i32)a.w;
        } else {
            v[0] = HS_LDG(in + j0);
        }
    }
}

// The first pass of token row t: its request id and this thread's top-k vector (or entry), both
// loads issued at once.
HS_DEVICE void hs_remap_load(const i32* req_id, const i32* topk, u32 t, u32 top_k, u32 j0,
                             bool vec, i32& req, i32 (&v)[4]) {
    req = HS_LDG(req_id + t);
    hs_remap_entries(topk + (u64)t * top_k, top_k, j0, vec, v);
}

// The remap modes of hs_remap_modes (hisparse_core::ops::remap::remap_modes): a decode-context
// parallel split (dcp_size 0: none) and a prefill workspace (prefill_req_id null: none).
struct hs_remap_mode_set {
    const i32* prefill_req_id;   // i32[num_tokens]: prefill request of each row, -1 = decode row
    const i32* workspace_starts; // i32[prefill_requests]: first workspace row of each
    u32 prefill_requests;
    u32 dcp_size, dcp_rank, dcp_interleave;
};

// How the entries of one token row map with modes: through its block-table row (`bt`, null for
// padding), decode entries de-interleaved first when a split is set; or, for a prefill row, to
// `workspace_start + entry` (workspace_start -1: the row is padding).
struct hs_remap_rule {
    bool workspace;
    i32 workspace_start;
};

// Top-k entry `tok` of a row with rule `r` (remap_modes' map_decode_token and workspace_row):
// either its output, found without a table load (`done`, the return value), or the entry the
// table lookup takes (decode entries de-interleaved first when a split is set).
HS_DEVICE i32 hs_remap_rule_apply(const hs_remap_mode_set& m, const hs_remap_rule& r, i32 tok,
                                  bool& done) {
    done = true;
    if (tok < 0) return -1;
    if (r.workspace) {
        if (r.workspace_start < 0) return -1;
        const i64 row = (i64)r.workspace_start + (i64)tok;
        return row > HS_I32_MAX ? -1 : (i32)row;
    }
    done = false;
    if (m.dcp_size != 0) {
        // Token tok belongs to rank (tok / interleave) % size, at local index
        // (tok / (size * interleave)) * interleave + tok % interleave (never above tok).
        const u32 run = (u32)tok / m.dcp_interleave;
        if (run % m.dcp_size != m.dcp_rank) {
            done = true;
            return -1;
        }
        tok = (i32)((run / m.dcp_size) * m.dcp_interleave + (u32)tok % m.dcp_interleave);
    }
    return tok;
}

// The rows of hs_remap (MODES false: exactly the plain remap) or hs_remap_modes (MODES true: each
// row's rule first, then every entry through hs_remap_rule_apply). `s_row` is the dynamic
// shared memory, `s_scan` the block-scan scratch.
template <bool MODES>
HS_DEVICE void hs_remap_rows(
    const i32* __restrict__ req_id, const i32* __restrict__ block_table,
    const i32* __restrict__ topk, const i32* __restrict__ idx_mapping, i32* __restrict__ out,
    i32* __restrict__ counts, u32* __restrict__ stats, u32 num_tokens, u32 top_k,
    u32 table_rows, u32 max_blocks, u32 block_size, u32 block_stride_rows, u32 idx_mapping_len,
    u32 flags, const hs_remap_mode_set& modes, i32* s_row, u32* s_scan) {
    if (stats != 0 && HS_BID_X == 0 && HS_BID_Y == 0 && HS_TID == 0)
        atomicAdd(stats + 3, 1u); // the call
    const hs_remap_geo g = hs_remap_geo_make(block_size, max_blocks, block_stride_rows);
    const bool compact = (flags & HS_REMAP_COMPACT) != 0;
    const bool staged = compact && (flags & HS_REMAP_STAGED) != 0;
    const bool want_counts = (flags & HS_REMAP_COUNTS) != 0;
    // Four entries (one 16-byte vector) per thread per pass when rows are 16-byte aligned.
    const bool vec = (top_k & 3u) == 0;
    const u32 per = vec ? 4u : 1u;
    const u32 span = HS_NTHREADS * per;
    // Column tiles (grid.y > 1; plain rows only, as counts and compaction need the whole row in
    // one block): block y takes the columns of every tiles-th span of the row, so a few rows are
    // spread over several multiprocessors. A launch that breaks the rule leaves the other tiles
    // idle rather than writing a row twice.
    if ((compact || want_counts) && HS_BID_Y != 0) return;
    const u32 tiles = (compact || want_counts) ? 1u : HS_NBLOCKS_Y;
    const u32 step = span * tiles;
    const u32 j_first = (HS_BID_Y * HS_NTHREADS + HS_TID) * per;
    // s_row: the compacted row (staged mode), top_k entries.
    u32 phase = 0; // hs_block_scan1 calls so far (uniform over the block)

    // Row t's first-pass inputs are loaded one row ahead: while row t is looked up, the request
    // id and top-k vector of the block's next row are already on their way.
    i32 next_req = -1;
    i32 next_v[4] = {-1, -1, -1, -1};
    if (HS_BID_X < num_tokens)
        hs_remap_load(req_id, topk, HS_BID_X, top_k, j_first, vec, next_req, next_v);
    for (u32 t = HS_BID_X; t < num_tokens; t += HS_NBLOCKS_X) {
        const i32 req = next_req;
        i32 v[4] = {next_v[0], next_v[1], next_v[2], next_v[3]};
        const u32 tn = t + HS_NBLOCKS_X;
        if (tn < num_tokens) hs_remap_load(req_id, topk, tn, top_k, j_first, vec, next_req, next_v);
        const i32* bt = 0;
        hs_remap_rule rule;
        rule.workspace = false;
        rule.workspace_start = -1;
        if (MODES && modes.prefill_req_id != 0) {
            const i32 prefill = HS_LDG(modes.prefill_req_id + t);
            if (prefill >= 0) {
                rule.workspace = true;
                if ((u32)prefill < modes.prefill_requests)
                    rule.workspace_start = HS_LDG(modes.workspace_starts + prefill);
            }
        }
        if (!rule.workspace)
            bt = hs_remap_table_row(req, block_table, idx_mapping, table_rows, max_blocks,
                                    idx_mapping_len, flags);
        const i32* in = topk + (u64)t * top_k;
        i32* o = out + (u64)t * top_k;
        u32 written = 0; // compaction: valid entries written so far (uniform)
        u32 valid = 0;   // this thread's valid entries (counts without compaction)
        for (u32 base = 0; base < top_k; base += step) {
            const u32 j0 = base + j_first;
            const bool mine = j0 < top_k; // in vector mode j0 + 3 < top_k then too
            if (base > 0) {
                // Later passes of a long row (top_k above 4 entries per thread).
                hs_remap_entries(in, top_k, j0, vec, v);
            }
            // Each entry's rule first (with modes), then every table load at once.
            bool take[4];
#pragma unroll
            for (u32 q = 0; q < 4; ++q) {
                take[q] = false;
                if (!(mine && q < per)) {
                    v[q] = -1;
                    continue;
                }
                if (MODES) {
                    bool done;
                    v[q] = hs_remap_rule_apply(modes, rule, v[q], done);
                    if (done) continue;
                }
                take[q] = true;
            }
            const u32 n = g.shift < 32 ? hs_remap_lookup4<true>(g, bt, v, take)
                                       : hs_remap_lookup4<false>(g, bt, v, take);
            if (!compact) {
                if (mine) {
                    if (vec) *(uint4*)(o + j0) = make_uint4((u32)v[0], (u32)v[1], (u32)v[2], (u32)v[3]);
                    else o[j0] = v[0];
                }
                valid += n;
                continue;
            }
            u32 total;
            u32 at = written + hs_block_scan1(n, s_scan, phase++, total);
            if (staged) {
#pragma unroll
                for (u32 q = 0; q < 4; ++q)
                    if (v[q] != -1) s_row[at++] = v[q];
            } else {
#pragma unroll
                for (u32 q = 0; q < 4; ++q)
                    if (v[q] != -1) o[at++] = v[q];
                if (span >= top_k && mine) {
                    // One pass: this thread's own entries at or beyond the valid count become -1.
                    if (vec && j0 >= written + total) {
                        *(uint4*)(o + j0) = make_uint4(HS_NONE, HS_NONE, HS_NONE, HS_NONE);
                    } else {
                        for (u32 q = 0; q < per; ++q)
                            if (j0 + q >= written + total) o[j0 + q] = -1;
                    }
                }
            }
            written += total;
        }
        if (compact) {
            if (staged) {
                // The compacted row leaves shared memory as whole vectors, its -1 tail with it.
                HS_SYNC();
                if (vec) {
                    for (u32 j = j_first; j < top_k; j += span) {
                        const uint4 a = *(const uint4*)(s_row + j);
                        *(uint4*)(o + j) = make_uint4(j < written ? a.x : HS_NONE,
                                                      j + 1 < written ? a.y : HS_NONE,
                                                      j + 2 < written ? a.z : HS_NONE,
                                                      j + 3 < written ? a.w : HS_NONE);
                    }
                } else {
                    for (u32 j = HS_TID; j < top_k; j += HS_NTHREADS) o[j] = j < written ? s_row[j] : -1;
                }
            } else if (span < top_k) {
                for (u32 j = written + HS_TID; j < top_k; j += HS_NTHREADS) o[j] = -1;
            }
            if (want_counts && HS_TID == 0) counts[t] = (i32)written;
            if (stats != 0 && HS_TID == 0 && written != 0) atomicAdd(stats + 2, written);
        } else if (want_counts || stats != 0) { // uniform
            u32 total;
            hs_block_scan1(valid, s_scan, phase++, total);
            if (want_counts && HS_TID == 0) counts[t] = (i32)total;
            if (stats != 0 && HS_TID == 0 && total != 0) atomicAdd(stats + 2, total);
        }
    }
}

// Whether a plain remap launch takes hs_remap_lean: no compaction, rows of whole 16-byte vectors
// (pairs of them with HS_REMAP_PAIR) that one pass of the launch's tiles covers, and counts only
// with one tile per row (a row's count is a block sum). Uniform over the launch.
HS_DEVICE bool hs_remap_lean_fits(u32 flags, u32 top_k) {
    const bool pair = (flags & HS_REMAP_PAIR) != 0;
    if ((flags & HS_REMAP_COMPACT) != 0 || (top_k & (pair ? 7u : 3u)) != 0) return false;
    if ((u64)HS_NTHREADS * (pair ? 8u : 4u) * HS_NBLOCKS_Y < (u64)top_k) return false;
    return (flags & HS_REMAP_COUNTS) == 0 || HS_NBLOCKS_Y == 1;
}

// The decode-size remap (hs_remap_lean_fits): each thread one 16-byte vector of one row (PAIR:
// two, the vectors at j and j + top_k / 2, their loads in flight together: for launches with more
// rows than the device holds at once), its request id and vectors loaded together, its table
// loads together, one store per vector; a row's valid count a block sum in one barrier
// (hs_block_sum: warp sums, one shared word a warp), added to the stats by one atomic per
// block at the end. The same outputs as hs_remap_rows<false>, in a fraction of its
// instructions: at decode sizes the kernel's time is its dependent chain, so every instruction
// before the store counts.
template <bool POW2, bool MAP, bool PAIR>
HS_DEVICE void hs_remap_lean(const i32* __restrict__ req_id, const i32* __restrict__ block_table,
                             const i32* __restrict__ topk, const i32* __restrict__ idx_mapping,
                             i32* __restrict__ out, i32* __restrict__ counts,
                             u32* __restrict__ stats, u32 num_tokens, u32 top_k, u32 table_rows,
                             u32 max_blocks, u32 block_size, u32 block_stride_rows,
                             u32 idx_mapping_len, u32 flags, u32* s_scan) {
    const hs_remap_geo g = hs_remap_geo_make(block_size, max_blocks, block_stride_rows);
    const bool want_counts = (flags & HS_REMAP_COUNTS) != 0;
    const u32 half = PAIR ? top_k / 2u : top_k; // the second vector's offset
    const u32 j = (HS_BID_Y * HS_NTHREADS + HS_TID) * 4u;
    const bool mine = j < half;
    const bool take[4] = {mine, mine, mine, mine};
    u32 phase = 0;
    // The stats: without counts, this thread's valid entries of all its rows, summed once at the
    // end; with counts, thread 0 adds up the rows' sums.
    u32 counted = 0;
    for (u32 t = HS_BID_X; t < num_tokens; t += HS_NBLOCKS_X) {
        const i32 req = HS_LDG(req_id + t);
        const i32* in = topk + (u64)t * top_k;
        i32 v[4], w[4];
        hs_remap_entries(in, half, j, true, v);
        if (PAIR) hs_remap_entries(in + half, half, j, true, w);
        const i32* bt = hs_remap_table_row_at<MAP>(req, block_table, idx_mapping, table_rows,
                                                   max_blocks, idx_mapping_len);
        u32 n = hs_remap_lookup4<POW2>(g, bt, v, take);
        if (PAIR) n += hs_remap_lookup4<POW2>(g, bt, w, take);
        if (mine) {
            i32* o = out + (u64)t * top_k + j;
            *(uint4*)o = make_uint4((u32)v[0], (u32)v[1], (u32)v[2], (u32)v[3]);
            if (PAIR) *(uint4*)(o + half) = make_uint4((u32)w[0], (u32)w[1], (u32)w[2], (u32)w[3]);
        }
        if (want_counts) { // uniform; one tile per row
            const u32 total = hs_block_sum(n, s_scan, phase++);
            if (HS_TID == 0) {
                counts[t] = (i32)total;
                counted += total;
            }
        } else {
            counted += n;
        }
    }
    // The stats last, off the rows' dependent chain: the block's valid entries in one atomic
    // (one per warp would queue thousands of atomics on one word at large batches), then the call.
    if (stats != 0) { // uniform
        if (!want_counts) {
            counted = hs_block_sum(counted, s_scan, phase);
        }
        if (HS_TID == 0 && counted != 0) atomicAdd(stats + 2, counted);
        if (HS_BID_X == 0 && HS_BID_Y == 0 && HS_TID == 0) atomicAdd(stats + 3, 1u);
    }
}

HS_KERNEL HS_REMAP_BOUNDS void hs_remap(
    const i32* __restrict__ req_id, const i32* __restrict__ block_table,
    const i32* __restrict__ topk, const i32* __restrict__ idx_mapping, i32* __restrict__ out,
    i32* __restrict__ counts, u32* __restrict__ stats, u32 num_tokens, u32 top_k,
    u32 table_rows, u32 max_blocks, u32 block_size, u32 block_stride_rows, u32 idx_mapping_len,
    u32 flags) {
    HS_DYN_SHARED(hs_remap_smem);
    HS_SHARED u32 s_scan[2 * HS_MAX_WARPS];
    HS_GRID_DEP_WAIT(); // before any global memory access
    if (hs_remap_lean_fits(flags, top_k)) {
        // Eight instantiations, one taken per launch (uniform): a power-of-two block size splits
        // entries with a shift, a row without idx_mapping takes no mapping load, and the
        // planner's HS_REMAP_PAIR gives each thread two vectors.
        const bool pow2 = hs_pow2_shift(block_size) < 32, map = (flags & HS_REMAP_HAS_MAP) != 0;
        const bool pair = (flags & HS_REMAP_PAIR) != 0;
#define HS_REMAP_LEAN(P, M, W)                                                                     \
    hs_remap_lean<P, M, W>(req_id, block_table, topk, idx_mapping, out, counts, stats, num_tokens, \
                           top_k, table_rows, max_blocks, block_size, block_stride_rows,          \
                           idx_mapping_len, flags, s_scan)
        if (pair) {
            if (pow2 && !map) HS_REMAP_LEAN(true, false, true);
            else if (pow2) HS_REMAP_LEAN(true, true, true);
            else if (!map) HS_REMAP_LEAN(false, false, true);
            else HS_REMAP_LEAN(false, true, true);
        } else if (pow2 && !map) HS_REMAP_LEAN(true, false, false);
        else if (pow2) HS_REMAP_LEAN(true, true, false);
        else if (!map) HS_REMAP_LEAN(false, false, false);
        else HS_REMAP_LEAN(false, true, false);
#undef HS_REMAP_LEAN
        return;
    }
    const hs_remap_mode_set none = {0, 0, 0, 0, 0, 0};
    hs_remap_rows<false>(req_id, block_table, topk, idx_mapping, out, counts, stats, num_tokens,
                         top_k, table_rows, max_blocks, block_size, block_stride_rows,
                         idx_mapping_len, flags, none, (i32*)hs_remap_smem, s_scan);
}

// hs_remap_wide: the plain remap (no counts or compaction; idx_mapping and stats as hs_remap)
// with one top-k entry a thread, vLLM's layout: grid (ceil(top_k / blockDim.x), num_tokens),
// block up to 256 threads. A thread loads its row's request id and its entry together, then its
// one block-table entry, then stores; the block's valid entries are summed by one counting
// barrier and added to stats word 2 by one atomic (one a warp would put thousands of atomics on
// one word at 64 rows), and block (0, 0) adds the call, both after the store, off the chain.
// One of four instantiations per launch (a power-of-two block size, an idx_mapping), chosen
// once, so that the thread's chain from its loads to its store has no branch. At decode sizes a
// warp of hs_remap's lean path runs 228 instructions (docs/PERF.md, "The remap"), a warp here a
// fraction of that: the layout the planner takes for few plain rows (plan::remap_layout).
template <bool POW2, bool MAP>
HS_DEVICE void hs_remap_wide_rows(const i32* __restrict__ req_id,
                                  const i32* __restrict__ block_table,
                                  const i32* __restrict__ topk,
                                  const i32* __restrict__ idx_mapping, i32* __restrict__ out,
                                  u32* __restrict__ stats, u32 num_tokens, u32 top_k,
                                  u32 table_rows, u32 max_blocks, u32 block_size,
                                  u32 block_stride_rows, u32 idx_mapping_len, u32* s_scan) {
    const u32 t = HS_BID_Y, j = HS_BID_X * HS_NTHREADS + HS_TID;
    u32 valid = 0;
    if (t < num_tokens && j < top_k) {
        const i32 req = HS_LDG(req_id + t);
        const i32 tok = HS_LDG(topk + (u64)t * top_k + j);
        const hs_remap_geo g = hs_remap_geo_make(block_size, max_blocks, block_stride_rows);
        const i32* bt = hs_remap_table_row_at<MAP>(req, block_table, idx_mapping, table_rows,
                                                   max_blocks, idx_mapping_len);
        u32 col, off;
        const bool look = hs_remap_where<POW2>(g, bt, tok, col, off);
        const i32 blk = look ? HS_LDG(bt + col) : -1;
        const i32 row = look ? hs_physical_row(blk, g.stride, off) : -1;
        out[(u64)t * top_k + j] = row;
        valid = row != -1 ? 1u : 0u;
    }
    if (stats != 0) { // uniform: every thread reaches the barrier
        const u32 block_valid = hs_block_sum_small(valid, 1u, s_scan, 0);
        if (HS_TID == 0) {
            if (block_valid != 0) atomicAdd(stats + 2, block_valid);
            if (HS_BID_X == 0 && HS_BID_Y == 0) atomicAdd(stats + 3, 1u); // the call
        }
    }
}

HS_KERNEL HS_BOUNDS(256) void hs_remap_wide(
    const i32* __restrict__ req_id, const i32* __restrict__ block_table,
    const i32* __restrict__ topk, const i32* __restrict__ idx_mapping, i32* __restrict__ out,
    i32* __restrict__ counts, u32* __restrict__ stats, u32 num_tokens, u32 top_k,
    u32 table_rows, u32 max_blocks, u32 block_size, u32 block_stride_rows, u32 idx_mapping_len,
    u32 flags) {
    HS_SHARED u32 s_scan[2 * HS_MAX_WARPS]; // the count's scan where no counting barrier exists
    HS_GRID_DEP_WAIT(); // before any global memory access
    (void)counts;
    const bool pow2 = hs_pow2_shift(block_size) < 32, map = (flags & HS_REMAP_HAS_MAP) != 0;
#define HS_REMAP_WIDE(P, M)                                                                      \
    hs_remap_wide_rows<P, M>(req_id, block_table, topk, idx_mapping, out, stats, num_tokens,    \
                             top_k, table_rows, max_blocks, block_size, block_stride_rows,      \
                             idx_mapping_len, s_scan)
    if (pow2 && !map) HS_REMAP_WIDE(true, false);
    else if (pow2) HS_REMAP_WIDE(true, true);
    else if (!map) HS_REMAP_WIDE(false, false);
    else HS_REMAP_WIDE(false, true);
#undef HS_REMAP_WIDE
}

// ---------------------------------------------------------------------------------------------
// Remap with modes (hisparse_core::ops::remap::remap_modes)
// ---------------------------------------------------------------------------------------------
//
// Launch: as hs_remap (the same grid, block, dynamic shared memory and flags), plus the modes:
// `prefill_req_id` and `workspace_starts` (null, with prefill_requests 0, without a prefill
// workspace) and the decode-context-parallel split (dcp_size 0: none; else dcp_rank < dcp_size
// and dcp_interleave > 0, checked on the host). A row whose prefill request is >= 0 maps entry
// tok to workspace_starts[request] + tok (a request >= prefill_requests, or a negative start:
// padding); other rows map through their block-table row, de-interleaved first with a split.
// The plain remap stays hs_remap: this kernel is a separate instantiation of the same rows.

HS_KERNEL HS_REMAP_BOUNDS void hs_remap_modes(
    const i32* __restrict__ req_id, const i32* __restrict__ block_table,
    const i32* __restrict__ topk, const i32* __restrict__ idx_mapping, i32* __restrict__ out,
    i32* __restrict__ counts, u32* __restrict__ stats, const i32* __restrict__ prefill_req_id,
    const i32* __restrict__ workspace_starts, u32 num_tokens, u32 top_k, u32 table_rows,
    u32 max_blocks, u32 block_size, u32 block_stride_rows, u32 idx_mapping_len, u32 flags,
    u32 prefill_requests, u32 dcp_size, u32 dcp_rank, u32 dcp_interleave) {
    HS_DYN_SHARED(hs_remap_smem);
    HS_SHARED u32 s_scan[2 * HS_MAX_WARPS];
    HS_GRID_DEP_WAIT(); // before any global memory access
    hs_remap_mode_set modes;
    modes.prefill_req_id = prefill_requests != 0 ? prefill_req_id : 0;
    modes.workspace_starts = workspace_starts;
    modes.prefill_requests = prefill_requests;
    // A split the host would refuse (no interleave, a rank beyond the size) maps nothing.
    modes.dcp_size = dcp_size;
    modes.dcp_rank = dcp_rank;
    modes.dcp_interleave = dcp_interleave != 0 ? dcp_interleave : 1u;
    if (dcp_size != 0 && (dcp_interleave == 0 || dcp_rank >= dcp_size)) modes.dcp_rank = HS_NONE;
    hs_remap_rows<true>(req_id, block_table, topk, idx_mapping, out, counts, stats, num_tokens,
                        top_k, table_rows, max_blocks, block_size, block_stride_rows,
                        idx_mapping_len, flags, modes, (i32*)hs_remap_smem, s_scan);
}

