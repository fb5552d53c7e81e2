// HiSparse data-plane kernels: ONE source for CUDA and HIP.
//
// A vendor prelude (vendor_cuda.h or vendor_hip.h) is prepended; it defines the HS_* macros used
// here (kernel qualifiers, thread/block indices, barrier, warp shuffle, shared memory). This file
// uses no vendor spelling directly except the atomics (atomicCAS/atomicMin/atomicAdd/atomicOr/atomicAnd),
// the builtin `uint4` vector and `__restrict__`, which CUDA and HIP spell alike.
//
// Every kernel reproduces the reference implementation in hisparse-core `ops` bit for bit; each
// kernel's comment names the reference function and the launch shape the host must use. The
// parameter lists are mirrored by the ABI table in gpu-kernels/src/lib.rs: change both together.
//
// Conventions: indices and block ids are i32, LRU orders u16, -1 means "no row". Byte offsets are
// u64. A decode-path kernel's `stats` (hisparse_core::ops::stats), when not null, points at the
// four u32 words of the call's slot: [0] hits, [1] misses, [2] valid entries, [3] calls; the kernel
// adds to them with native 32-bit atomics (wrapping), one atomic per token row per word where the
// row's counts are final, and one block adds the call. Page bases and strides and every row's value part are multiples of 16 bytes, and a split
// row's scale part a multiple of 4 (checked by the host's planner, gpu-kernels/src/plan.rs):
// copies move 16-byte chunks, except a scale part that is not a multiple of 16 (DeepSeek V4's
// 8-byte and 4-byte scales), which moves in the 8- or 4-byte words the planner chose for the
// layout (hs_layout::scale_word), and a page tail past its last 16-byte chunk, in 4-byte words.

typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned short u16;
typedef unsigned char u8;

#define HS_I32_MAX 2147483647LL
#define HS_NONE 0xffffffffu
#define HS_EMPTY_KEY (-1)
// Most warps a block of 1024 threads can have (CUDA warps of 32).
#define HS_MAX_WARPS 32u

// ---------------------------------------------------------------------------------------------
// Shared structures (layouts mirrored in gpu-kernels/src/lib.rs; sizes asserted there).
// ---------------------------------------------------------------------------------------------

// One layer's pages in one pool (hisparse_core::ops::PageLayout). 40 bytes.
struct hs_layout {
    u64 base;              // byte offset of block 0's page of this layer
    u64 block_stride;      // bytes between pages of consecutive blocks
    u32 num_blocks;        // blocks in the pool
    u32 block_size;        // rows per page
    u32 row_bytes;         // bytes per row (value part + scale part)
    u32 value_bytes;       // value bytes per row (== row_bytes unless split; multiple of 16)
    u32 index_stride_rows; // flat row -> (row / stride, row % stride)
    u32 scale_word;        // bytes per access of the scale part: 16, 8 or 4 (plan::scale_word;
                           // any other value reads as 16)
};

// A layer in the host pool and the device pool (hisparse_core::ops::LayerPair). 80 bytes.
struct hs_layer_pair {
    hs_layout host;
    hs_layout device;
};

// Most layers one gather launch carries by value (more are split over several launches).
#define HS_GATHER_MAX_LAYERS 16
// Layers of a gather, passed BY VALUE so a captured graph keeps them. 16 + 16 * 80 = 1296 bytes.
struct hs_gather_layers {
    u32 count;
    u32 pad[3];
    hs_layer_pair layer[HS_GATHER_MAX_LAYERS];
};

// One layer of a whole-page copy: where pages sit in the source and destination. 40 bytes.
struct hs_page_job {
    u64 src_base;
    u64 src_stride;
    u64 dst_base;
    u64 dst_stride;
    u64 page_bytes;
};

// A (source block, destination block) pair. 8 bytes.
struct hs_pair {
    u32 src;
    u32 dst;
};

// A row span (hisparse_core::ops::RowSpan). 16 bytes.
struct hs_span {
    u32 device_block;
    u32 host_block;
    u32 first_row;
    u32 num_rows;
};

// One sparse table write (hisparse_core::ops::TableWrite): table[index] = value. 8 bytes.
struct hs_table_write {
    u32 index;
    i32 value;
};

// One entry of the resolver's wanted-row hash table. 16 bytes.
struct hs_wanted {
    i32 key;         // flat host row g, or HS_EMPTY_KEY
    u32 first_entry; // smallest entry ordinal naming g (first appearance)
    u32 first_lru;   // smallest LRU position whose slot caches g (the hit), or HS_NONE
    u32 slot;        // hot slot given to g, or HS_NONE
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

// hisparse_core::ops::physical_row.
HS_DEVICE i32 hs_physical_row(i32 block, u32 stride_rows, u32 offset) {
    // A select, not a branch: the remap's lookups run this on their dependent chain.
    const i64 row = (i64)block * (i64)stride_rows + (i64)offset;
    return block >= 0 && row <= HS_I32_MAX ? (i32)row : -1;
}

// PageLayout::locate: flat row -> (block, offset); false outside the pool or another layer's part.
HS_DEVICE bool hs_locate(const hs_layout& l, i32 row, u32& block, u32& offset) {
    if (row < 0) return false;
    u32 b = (u32)row / l.index_stride_rows;
    u32 o = (u32)row % l.index_stride_rows;
    if (b >= l.num_blocks || o >= l.block_size) return false;
    block = b;
    offset = o;
    return true;
}

// Byte offsets of the value part and the scale part of row (block, offset) (PageLayout::row_parts).
HS_DEVICE void hs_row_parts(const hs_layout& l, u32 block, u32 offset, u64& values, u64& scales) {
    u64 page = l.base + (u64)block * l.block_stride;
    values = page + (u64)offset * l.value_bytes;
    scales = page + (u64)l.block_size * l.value_bytes + (u64)offset * (u64)(l.row_bytes - l.value_bytes);
}

// Byte offset of 16-byte chunk `c` of a row whose parts start at (values, scales).
HS_DEVICE u64 hs_chunk(u64 values, u64 scales, u32 value_chunks, u32 c) {
    return c < value_chunks ? values + ((u64)c << 4) : scales + ((u64)(c - value_chunks) << 4);
}

// A row moves in units: its value part in 16-byte chunks, then its scale part in W-byte words
// (W = hs_layout::scale_word: 16 for every contiguous row and every scale part that is a multiple
// of 16, 8 or 4 for the others). The copy kernels pick W once per layer (a uniform branch to one
// of three instantiations), so rows of 16-byte scale parts run exactly the 16-byte code.

// Units of one row of layout `l` with scale words of W bytes.
template <u32 W>
HS_DEVICE u32 hs_row_units(const hs_layout& l) {
    return W == 16 ? l.row_bytes >> 4 : (l.value_bytes >> 4) + (l.row_bytes - l.value_bytes) / W;
}

// Unit `c` of the row whose parts start at (values, scales) in `p` (a word sits in the low
// lanes, the rest zero).
template <u32 W>
HS_DEVICE uint4 hs_load_unit(const u8* p, u64 values, u64 scales, u32 value_chunks, u32 c) {
    if (W == 16 || c < value_chunks) return *(const uint4*)(p + hs_chunk(values, scales, value_chunks, c));
    const u64 at = scales + (u64)(c - value_chunks) * W;
    if (W == 8) {
        const u64 x = *(const u64*)(p + at);
        return make_uint4((u32)x, (u32)(x >> 32), 0u, 0u);
    }
    return make_uint4(*(const u32*)(p + at), 0u, 0u, 0u);
}

// Stores unit `c` (as hs_load_unit loaded it) of the row whose parts start at (values, scales).
template <u32 W>
HS_DEVICE void hs_store_unit(u8* p, u64 values, u64 scales, u32 value_chunks, u32 c, uint4 v) {
    if (W == 16 || c < value_chunks) {
        *(uint4*)(p + hs_chunk(values, scales, value_chunks, c)) = v;
        return;
    }
    const u64 at = scales + (u64)(c - value_chunks) * W;
    if (W == 8)
        *(u64*)(p + at) = (u64)v.x | ((u64)v.y << 32);
    else
        *(u32*)(p + at) = v.x;
}


// ---------------------------------------------------------------------------------------------
// Vendor-specific memory hints shared by the kernels
// ---------------------------------------------------------------------------------------------

#if defined(HS_VENDOR_CUDA)
// Read-only data path (data no thread writes during the launch).
#define HS_LDG(p) __ldg(p)
// Streaming load of data read once (first to leave the caches).
#define HS_LDCS(p) __ldcs(p)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Programmatic dependent launch (sm_90+): let the next kernel of the stream launch now (its own
// HS_GRID_DEP_WAIT still waits for this whole grid), then wait until the previous kernel of the
// stream has completed and its writes are visible. Both are no-ops unless the host launched the
// kernels with programmatic stream serialisation.
#define HS_GRID_DEP_WAIT() asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;\n" ::: "memory")
#endif
#else
#define HS_LDG(p) (*(p))
#define HS_LDCS(p) (*(p))
#endif
#ifndef HS_GRID_DEP_WAIT
#define HS_GRID_DEP_WAIT() ((void)0)
#endif

// Inclusive prefix sum of `v` over the lanes of the calling warp (every lane participates).
HS_DEVICE u32 hs_warp_inclusive(u32 v) {
    const u32 lane = HS_TID % HS_WARP;
    for (u32 d = 1; d < HS_WARP; d <<= 1) {
        const u32 y = HS_SHFL_UP_U32(v, d);
        if (lane >= d) v += y;
    }
    return v;
}

// The sum of the warp totals `t[0..warp)` (the warps before the calling thread's) and of all
// `nw` of them: lane l reads t[l], one warp scan, two shuffles, so every thread's cost is the
// same however many warps the block has (nw <= HS_WARP: a block of at most 1024 threads).
HS_DEVICE void hs_warp_totals(const u32* t, u32 nw, u32 warp, u32& before, u32& sum) {
    const u32 lane = HS_TID % HS_WARP;
    const u32 inc = hs_warp_inclusive(lane < nw ? t[lane] : 0u);
    sum = HS_SHFL_U32(inc, HS_WARP - 1u);
    const u32 b = HS_SHFL_U32(inc, warp == 0 ? 0u : warp - 1u);
    before = warp == 0 ? 0u : b;
}

// Exclusive prefix sum of `v` over the block in thread order, and the block's total, with ONE
// barrier: each warp publishes its total, then every warp scans the totals (hs_warp_totals).
// `s` holds 2 * HS_MAX_WARPS words; `phase` must differ by one between consecutive calls
// (callers pass a counter), so a call never overwrites the half that readers of the previous
// call may still read (they all passed this call's barrier before anyone writes the same half
// again). Every thread of the block calls it; blockDim.x is a multiple of HS_WARP.
HS_DEVICE u32 hs_block_scan1(u32 v, u32* s, u32 phase, u32& total) {
    const u32 lane = HS_TID % HS_WARP, warp = HS_TID / HS_WARP, nw = HS_NTHREADS / HS_WARP;
    u32* t = s + (phase & 1u) * HS_MAX_WARPS;
    const u32 inc = hs_warp_inclusive(v);
    if (lane == HS_WARP - 1) t[warp] = inc;
    HS_SYNC();
    u32 before;
    hs_warp_totals(t, nw, warp, before, total);
    return before + inc - v;
}

// log2(x) when x is a power of two, else 32 (the "no shift" marker of the kernels' geometry:
// a shift and a mask instead of a division).
HS_DEVICE u32 hs_pow2_shift(u32 x) {
    return x != 0 && (x & (x - 1)) == 0 ? 31u - (u32)HS_CLZ(x) : 32u;
}

// ---------------------------------------------------------------------------------------------
// Remap (hisparse_core::ops::remap::remap)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid.x (any size; the host uses min(num_tokens, what the device holds at once), and one
// block for an empty batch with stats), grid.y (column tiles of each row; more than one only
// without counts and compaction: the host spreads a few plain rows over the multiprocessors this
// way), block (a multiple of 64 up to HS_REMAP_MAX_THREADS; the host uses top_k / 4 threads per
// tile, one 16-byte vector each, when top_k is a multiple of 4), dynamic shared memory 4 * top_k
// bytes with HS_REMAP_STAGED, else none. Blocks take token rows grid-stride. `idx_mapping` and
// `counts` may be null when the matching flag is clear; `stats` (null: none) receives each row's
// valid entries in word 2 (counted whether or not `counts` is written) and block (0, 0) adds the
// call to word 3.
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

// The block-table row of request `req` as a pointer (null: padding), HS_REMAP_HAS_MAP read from
// `flags`.
HS_DEVICE const i32* hs_remap_table_row(i32 req, const i32* block_table, const i32* idx_mapping,
                                        u32 table_rows, u32 max_blocks, u32 idx_mapping_len,
                                        u32 flags) {
    const i32 row = (flags & HS_REMAP_HAS_MAP)
                        ? hs_remap_row_of<true>(req, idx_mapping, table_rows, idx_mapping_len)
                        : hs_remap_row_of<false>(req, idx_mapping, table_rows, idx_mapping_len);
    return row >= 0 ? block_table + (u64)row * max_blocks : 0;
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

// The first pass of token row t: its request id and this thread's top-k vector (or entry), both
// loads issued at once.
HS_DEVICE void hs_remap_load(const i32* req_id, const i32* topk, u32 t, u32 top_k, u32 j0,
                             bool vec, i32& req, i32 (&v)[4]) {
    const i32* in = topk + (u64)t * top_k;
    req = HS_LDG(req_id + t);
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
                v[0] = v[1] = v[2] = v[3] = -1;
                if (mine) {
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
// that one pass of the launch's tiles covers, and counts only with one tile per row (a row's
// count is a block sum). Uniform over the launch.
HS_DEVICE bool hs_remap_lean_fits(u32 flags, u32 top_k) {
    if ((flags & HS_REMAP_COMPACT) != 0 || (top_k & 3u) != 0) return false;
    if ((u64)HS_NTHREADS * 4u * HS_NBLOCKS_Y < (u64)top_k) return false;
    return (flags & HS_REMAP_COUNTS) == 0 || HS_NBLOCKS_Y == 1;
}

// The decode-size remap (hs_remap_lean_fits): each thread one 16-byte vector of one row, its
// request id and vector loaded together, its four table loads together, one vector store; the
// row's count a block sum, the stats one block sum and one atomic per block. The same outputs as
// hs_remap_rows<false>, in a fraction of its instructions: at decode sizes the kernel's time is
// its dependent chain, so every instruction before the store counts.
template <bool POW2, bool MAP>
HS_DEVICE void hs_remap_lean(const i32* __restrict__ req_id, const i32* __restrict__ block_table,
                             const i32* __restrict__ topk, const i32* __restrict__ idx_mapping,
                             i32* __restrict__ out, i32* __restrict__ counts,
                             u32* __restrict__ stats, u32 num_tokens, u32 top_k, u32 table_rows,
                             u32 max_blocks, u32 block_size, u32 block_stride_rows,
                             u32 idx_mapping_len, u32 flags, u32* s_scan) {
    const hs_remap_geo g = hs_remap_geo_make(block_size, max_blocks, block_stride_rows);
    const bool want_counts = (flags & HS_REMAP_COUNTS) != 0;
    const u32 j = (HS_BID_Y * HS_NTHREADS + HS_TID) * 4u;
    const bool mine = j < top_k;
    const bool take[4] = {mine, mine, mine, mine};
    u32 phase = 0;
    u32 counted = 0; // this thread's valid entries, for the stats without counts
    for (u32 t = HS_BID_X; t < num_tokens; t += HS_NBLOCKS_X) {
        const i32 req = HS_LDG(req_id + t);
        i32 v[4] = {-1, -1, -1, -1};
        if (mine) {
            const uint4 a = HS_LDG((const uint4*)(topk + (u64)t * top_k + j));
            v[0] = (i32)a.x;
            v[1] = (i32)a.y;
            v[2] = (i32)a.z;
            v[3] = (i32)a.w;
        }
        const i32 row = hs_remap_row_of<MAP>(req, idx_mapping, table_rows, idx_mapping_len);
        const i32* bt = row >= 0 ? block_table + (u64)row * max_blocks : 0;
        const u32 n = hs_remap_lookup4<POW2>(g, bt, v, take);
        if (mine)
            *(uint4*)(out + (u64)t * top_k + j) =
                make_uint4((u32)v[0], (u32)v[1], (u32)v[2], (u32)v[3]);
        if (want_counts) { // uniform; one tile per row
            u32 total;
            hs_block_scan1(n, s_scan, phase++, total);
            if (HS_TID == 0) {
                counts[t] = (i32)total;
                if (stats != 0 && total != 0) atomicAdd(stats + 2, total);
            }
        } else {
            counted += n;
        }
    }
    // The stats last, off the rows' dependent chain: the block's valid entries in one atomic
    // (one per warp would queue thousands of atomics on one word at large batches), then the call.
    if (stats != 0) { // uniform
        if (!want_counts) {
            u32 total;
            hs_block_scan1(counted, s_scan, phase, total);
            if (HS_TID == 0 && total != 0) atomicAdd(stats + 2, total);
        }
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
        // Four instantiations, one taken per launch (uniform): a power-of-two block size splits
        // entries with a shift, and a row without idx_mapping takes no mapping load.
        const bool pow2 = hs_pow2_shift(block_size) < 32, map = (flags & HS_REMAP_HAS_MAP) != 0;
#define HS_REMAP_LEAN(P, M)                                                                    \
    hs_remap_lean<P, M>(req_id, block_table, topk, idx_mapping, out, counts, stats, num_tokens, \
                        top_k, table_rows, max_blocks, block_size, block_stride_rows,          \
                        idx_mapping_len, flags, s_scan)
        if (pow2 && !map) HS_REMAP_LEAN(true, false);
        else if (pow2) HS_REMAP_LEAN(true, true);
        else if (!map) HS_REMAP_LEAN(false, false);
        else HS_REMAP_LEAN(false, true);
#undef HS_REMAP_LEAN
        return;
    }
    const hs_remap_mode_set none = {0, 0, 0, 0, 0, 0};
    hs_remap_rows<false>(req_id, block_table, topk, idx_mapping, out, counts, stats, num_tokens,
                         top_k, table_rows, max_blocks, block_size, block_stride_rows,
                         idx_mapping_len, flags, none, (i32*)hs_remap_smem, s_scan);
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

// ---------------------------------------------------------------------------------------------
// Resolve (hisparse_core::ops::resolve::resolve)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (num_tokens; one block for an empty batch with stats), block (HS_RESOLVE_THREADS),
// dynamic shared memory resolve_shared_bytes(hot_slots, smem_table_entries) of the Rust ABI table:
// the staged hot-table row (4 * HS_RESOLVE_HOT_STAGE bytes), the per-request state
// (hs_resolve_state_bytes) and the shared wanted-row table (16 bytes per entry). `stats` (null:
// none) receives each row's hits, misses and valid entries where the block writes that row's
// counts (a padding row adds nothing), and block 0 adds the call.
// Block t handles token row t: a padding row writes its outputs; a row whose request appeared in
// an earlier row exits (that earlier row's block resolves all rows of the request); otherwise the
// block resolves every row of the request, in row order, against the request's single state.
//
// The wanted-row hash table lives in shared memory when it needs at most `smem_table_entries`
// entries (a power of two, or 0), else in `workspace`: `workspace_counter` bump-allocates
// per-block tables of `workspace_entries` entries in total (the host sizes it at
// 4 * num_tokens * top_k entries, which bounds the sum of every block's need). The counter area is
// zero before the first launch and every launch leaves it zero (hs_workspace_release_after).
//
// Global-state mode: when bit 31 of `smem_table_entries` (HS_RESOLVE_GLOBAL_STATE) is set, the
// per-request state (LRU copy, inverse, partition, bitmaps) does not live in shared memory but in
// `workspace`:
// each resolving block bump-allocates them (resolve_state_entries(hot_slots) 16-byte entries,
// followed by its wanted-row table when that does not fit shared memory) in one atomicAdd on
// `workspace_counter`. The low 31 bits are then the shared table capacity as above, and the
// dynamic shared memory holds only the hot stage and that table. For hot_slots too large for the
// device's shared memory (64 KiB on AMD GPUs).
//
// Work per thread: every pass over a row takes HS_RESOLVE_IK consecutive top-k entries per
// thread, every pass over the hot buffer HS_RESOLVE_IN consecutive LRU positions and slots. The
// hits are found in slot order (each slot's cached row slot_host_rows[s] and, through the inverse of the
// LRU built in shared memory, its LRU position), so the LRU and the slot_host_rows row are read once,
// coalesced and without a dependent load. A request of one row whose entries fit one pass
// (top_k <= HS_RESOLVE_THREADS * HS_RESOLVE_IK: the decode case) classifies each entry once and
// keeps the result and its hash slot in registers for the later phases; likewise the slots when
// the hot buffer fits one pass. The loops over a request's rows stop at its last row (one
// iteration for a one-row request, however many rows the launch has). hs_resolve and the fused
// hs_resolve_gather run this design, hs_resolve_body (below); a later design that scanned two
// sums per barrier measured slower on the H200 (33.9 us against 21.3 us for 64 requests x 2048,
// 4096 slots) and was retired.

#define HS_RESOLVE_THREADS 1024
#define HS_RESOLVE_IK 2
#define HS_RESOLVE_IN 4
#define HS_RESOLVE_GLOBAL_STATE 0x80000000u

#ifndef HS_FENCE
// Orders this thread's global memory accesses before its later ones, device-wide.
#define HS_FENCE() __threadfence()
#endif

struct hs_resolve_desc {
    u32 num_tokens, top_k, num_requests, max_pages, block_size, hot_slots,
        attention_block_stride, host_num_blocks;
    u32 shift;    // log2(block_size) when it is a power of two, else 32
    u32 hot_cols; // columns of the hot table: ceil(hot_slots / block_size)
};

HS_DEVICE u32 hs_hash(i32 g, u32 mask) { return ((u32)g * 2654435761u) & mask; }

HS_DEVICE u32 hs_lookup(const hs_wanted* table, u32 mask, i32 g) {
    u32 h = hs_hash(g, mask);
    for (;;) {
        i32 k = table[h].key;
        if (k == g) return h;
        if (k == HS_EMPTY_KEY) return HS_NONE;
        h = (h + 1) & mask;
    }
}

// Empties entries [0, n) of a wanted-row table, the block's threads striding over them (no
// barrier: the caller syncs before the table is used).
HS_DEVICE void hs_clear_table(hs_wanted* table, u32 n) {
    // One 16-byte store per entry (the table is 16-byte aligned in shared and global memory).
    const uint4 empty = make_uint4((u32)HS_EMPTY_KEY, HS_NONE, HS_NONE, HS_NONE);
    for (u32 i = HS_TID; i < n; i += HS_NTHREADS) ((uint4*)table)[i] = empty;
}

// Inserts g with entry ordinal `entry` (the smallest ordinal wins); returns g's slot in the table
// and whether g was there already (`existed`: another entry names it too).
HS_DEVICE u32 hs_insert(hs_wanted* table, u32 mask, i32 g, u32 entry, bool& existed) {
    u32 h = hs_hash(g, mask);
    for (;;) {
        i32 prev = atomicCAS(&table[h].key, HS_EMPTY_KEY, g);
        if (prev == HS_EMPTY_KEY || prev == g) {
            atomicMin(&table[h].first_entry, entry);
            existed = prev == g;
            return h;
        }
        h = (h + 1) & mask;
    }
}

// Step 2 for one entry: 0 = invalid, 1 = resident (value = physical row), 2 = host (value = flat
// host row g). Both page-table entries are read, neither waiting for the other: the resident
// table at state row `sr`, the host table at row `r` (the same row in state-row order; in
// batch-row order `r` is the batch row and `sr` its state row).
HS_DEVICE u32 hs_classify(const hs_resolve_desc& d, const i32* resident_table, const i32* host_table,
                          u32 r, u32 sr, i32 tok, i32& value) {
    if (tok < 0) return 0;
    u32 page, off;
    if (d.shift < 32) {
        page = (u32)tok >> d.shift;
        off = (u32)tok & (d.block_size - 1);
    } else {
        page = (u32)tok / d.block_size;
        off = (u32)tok % d.block_size;
    }
    if (page >= d.max_pages) return 0;
    const i32 res = HS_LDG(resident_table + ((u64)sr * d.max_pages + page));
    const i32 hb = HS_LDG(host_table + ((u64)r * d.max_pages + page));
    if (res > 0) {
        value = hs_physical_row(res, d.attention_block_stride, off);
        return value == -1 ? 0u : 1u;
    }
    value = hs_physical_row(hb, d.block_size, off);
    return value == -1 ? 0u : 2u;
}

// Hot slot `slot` as (hot-table column, row in that block): a shift and a mask when the block
// size is a power of two (d.shift < 32), else a division.
HS_DEVICE void hs_hot_slot(const hs_resolve_desc& d, u32 slot, u32& col, u32& off) {
    if (d.shift < 32) {
        col = slot >> d.shift;
        off = slot & (d.block_size - 1);
    } else {
        col = slot / d.block_size;
        off = slot % d.block_size;
    }
}

HS_DEVICE i32 hs_hot_row(const hs_resolve_desc& d, const i32* hot_table, u32 r, u32 slot) {
    u32 col, off;
    hs_hot_slot(d, slot, col, off);
    const i32 block = HS_LDG(hot_table + (u64)r * d.hot_cols + col);
    return hs_physical_row(block, d.attention_block_stride, off);
}

// Dynamic shared memory layout of hs_resolve (byte offsets; every part 16-byte aligned).
HS_DEVICE u32 hs_align16(u32 x) { return (x + 15u) & ~15u; }

// The per-request state of a resolving block, for a hot buffer of N slots, at `at` (shared
// memory, or the workspace in global-state mode): two u16[N] arrays (the body's LRU copy, the
// decode path's LRU inverse; the partition) and a bitmap u32[ceil(N / 32)], each part 16-byte
// aligned; hs_resolve_state_bytes(N) bytes in all.
struct hs_resolve_state {
    u16* order;
    u16* part;
    u32* bits;
};

HS_DEVICE u32 hs_resolve_state_bytes(u32 N) {
    return 2 * hs_align16(2 * N) + hs_align16(4 * ((N + 31) / 32));
}

HS_DEVICE hs_resolve_state hs_resolve_state_at(unsigned char* at, u32 N) {
    hs_resolve_state st;
    st.order = (u16*)at;
    st.part = (u16*)(at + hs_align16(2 * N));
    st.bits = (u32*)(at + 2 * hs_align16(2 * N));
    return st;
}

// The resolver's geometry (both paths): the launch's sizes, the block size's shift (32: none)
// and the hot table's columns.
HS_DEVICE hs_resolve_desc hs_resolve_desc_make(u32 num_tokens, u32 top_k, u32 num_requests,
                                               u32 max_pages, u32 block_size, u32 hot_slots,
                                               u32 attention_block_stride, u32 host_num_blocks) {
    hs_resolve_desc d;
    d.num_tokens = num_tokens;
    d.top_k = top_k;
    d.num_requests = num_requests;
    d.max_pages = max_pages;
    d.block_size = block_size;
    d.hot_slots = hot_slots;
    d.attention_block_stride = attention_block_stride;
    d.host_num_blocks = host_num_blocks;
    d.shift = hs_pow2_shift(block_size);
    d.hot_cols = d.shift < 32 ? (hot_slots + block_size - 1) >> d.shift
                              : hot_slots / block_size + (hot_slots % block_size != 0 ? 1u : 0u);
    return d;
}

// Hot-table entries of the resolving request staged in shared memory by hs_resolve_body: the
// first part of the dynamic shared memory, 4 *
// HS_RESOLVE_HOT_STAGE bytes, which the planner reserves for every resolver launch; a request
// with more hot blocks reads them from global memory.
#define HS_RESOLVE_HOT_STAGE 1024

// The workspace counter area of hs_resolve (u32[4], zero before the first launch that uses it):
// [0] the launch's bump allocator, [1] blocks finished, [2] the most entries one launch took
// (a diagnostic), [3] unused. The last block of a launch to finish puts [0] and [1] back to zero,
// so the next launch on the stream finds them zero without a memset before every launch. Every
// block of the grid calls this once, after its last allocation (the allocations are made by
// thread 0, which is the thread that counts the block as finished).
HS_DEVICE void hs_workspace_release_after(u32* counter, bool allocated) {
    if (counter == 0 || HS_TID != 0) return;
    if (allocated) HS_FENCE(); // a block that took nothing has no allocation to order

    if (atomicAdd(counter + 1, 1u) == HS_NBLOCKS_X - 1) {
        HS_FENCE();
        const u32 used = atomicExch(counter, 0u);
        atomicMax(counter + 2, used);
        atomicExch(counter + 1, 0u);
        HS_FENCE();
    }
}


// hs_hot_row with the request's hot-table row staged in shared memory (`s_hot`), or read from
// global memory when `s_hot` is null.
HS_DEVICE i32 hs_hot_row_staged(const hs_resolve_desc& d, const i32* s_hot, const i32* hot_table,
                                u32 r, u32 slot) {
    if (s_hot == 0) return hs_hot_row(d, hot_table, r, slot);
    u32 col, off;
    hs_hot_slot(d, slot, col, off);
    return hs_physical_row(s_hot[col], d.attention_block_stride, off);
}

// Two exclusive prefix sums over the block in thread order, with their totals, in ONE barrier.
// `s` holds 4 * HS_MAX_WARPS words; the first sum uses the half hs_block_scan1 of the same
// `phase` uses, the second the matching half of
// s[2 * HS_MAX_WARPS..], so calls of either kind may alternate (phase differing by one between
// consecutive calls of both).
HS_DEVICE void hs_block_scan_pair(u32 a, u32 b, u32* s, u32 phase, u32& ea, u32& eb, u32& ta,
                                  u32& tb) {
    const u32 lane = HS_TID % HS_WARP, warp = HS_TID / HS_WARP, nw = HS_NTHREADS / HS_WARP;
    u32* ha = s + (phase & 1u) * HS_MAX_WARPS;
    u32* hb = s + 2u * HS_MAX_WARPS + (phase & 1u) * HS_MAX_WARPS;
    const u32 ia = hs_warp_inclusive(a), ib = hs_warp_inclusive(b);
    if (lane == HS_WARP - 1) {
        ha[warp] = ia;
        hb[warp] = ib;
    }
    HS_SYNC();
    u32 ba, bb;
    hs_warp_totals(ha, nw, warp, ba, ta);
    hs_warp_totals(hb, nw, warp, bb, tb);
    ea = ba + ia - a;
    eb = bb + ib - b;
}

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
    hs_wanted* table = (hs_wanted*)(smem + hs_resolve_state_bytes(N));
    // The table at all the shared capacity the launch reserved: the fewer entries per bucket,
    // the shorter the probes (on the H200 a table of 4096 entries for 2048 keys took 34% longer
    // than one of 8192; the planner reserves a quarter-full table where it fits).
    const u32 cap = smem_cap;
    const u32 mask = cap - 1u;
    i32* s_hot = d.hot_cols <= HS_RESOLVE_HOT_STAGE ? (i32*)hs_smem : (i32*)0;
    if (s_hot != 0)
        for (u32 i = HS_TID; i < d.hot_cols; i += HS_NTHREADS)
            s_hot[i] = HS_LDG(hot_table + (u64)r * d.hot_cols + i);
    hs_clear_table(table, cap);
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
                if (h_slot[q] != HS_NONE) atomicMin(&table[h_slot[q]].first_lru, (u32)s_inv[p0 + q]);
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
            if (table[h].first_lru == at) {
                table[h].slot = p0 + q;
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
            first_miss[q] = h != HS_NONE && table[h].first_entry == j0 + q && table[h].slot == HS_NONE;
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
                    table[h_entry[q]].slot = sl;
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
            const u32 sl = table[h_entry[q]].slot;
            if (sl != HS_NONE) out = hs_hot_row_staged(d, s_hot, hot_table, r, sl);
        }
        indices[base + j0 + q] = out;
        valid += out != -1 ? 1u : 0u;
    }
    u32 total;
    hs_block_scan1(valid, s_scan, 1, total); // (8)
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
// ---------------------------------------------------------------------------------------------
// Gather of a miss plan (hisparse_core::ops::copy::gather_rows)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (G, 1, layers.count) with any G (the host fills the device, or gives every work
// item its own block), block (HS_GATHER_THREADS). Work item w of layer z is chunk
// x = w / num_tokens of token row t = w % num_tokens: plan entries [x * HS_GATHER_ROWS, ...) of
// row t. Blocks take items grid-stride, so the first chunk of every row comes before any second
// chunk: the work (a row's valid count of entries, typically a tenth of top_k) sits in the first
// items and the blocks that start first do it. An item beyond its row's count costs one cached
// load of the count. Otherwise the item's first threads locate its rows into a shared row table,
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

// The work items of hs_gather_rows for one layer, scale words of W bytes. For W == 16 (every
// contiguous row and every scale part of 16-byte multiples, the 656-byte decode row among them)
// hs_row_units and hs_load_unit/hs_store_unit reduce to row_bytes / 16 chunks addressed by
// hs_chunk: NVRTC gives that instantiation the instruction sequence of the kernel before scale
// words existed.
template <u32 W>
HS_DEVICE void hs_gather_items(const i32* __restrict__ plan_src, const i32* __restrict__ plan_dst,
                               const i32* __restrict__ plan_counts, const u8* __restrict__ host,
                               u8* __restrict__ device, u32 num_tokens, u32 top_k,
                               const hs_layer_pair& L, u64* s_src_v, u64* s_src_s,
                               u64* s_dst_v, u64* s_dst_s, u32* s_flags) {
    const u32 cpr = hs_row_units<W>(L.host);
    const u32 vc = L.host.value_bytes >> 4;
    const u32 chunks = top_k / HS_GATHER_ROWS + (top_k % HS_GATHER_ROWS != 0 ? 1u : 0u);
    const u64 items = (u64)chunks * num_tokens;
    bool first = true;
    for (u64 w = HS_BID_X; w < items; w += HS_NBLOCKS_X) {
        const u32 t = (u32)(w % num_tokens);
        const u32 lo = (u32)(w / num_tokens) * HS_GATHER_ROWS;
        const u64 prow = (u64)t * top_k;
        // Items beyond their row's count (most of them: a row misses a tenth of top_k) cost one
        // cached load of the count, nothing more.
        const i32 cnt = HS_LDG(plan_counts + t);
        const u32 n = cnt < 0 ? 0u : ((u32)cnt > top_k ? top_k : (u32)cnt);
        if (lo >= n) continue; // uniform over the block
        const u32 rows = n - lo < HS_GATHER_ROWS ? n - lo : HS_GATHER_ROWS;
        i32 ps = -1, pd = -1;
        if (HS_TID < rows) {
            ps = HS_LDG(plan_src + prow + lo + HS_TID);
            pd = HS_LDG(plan_dst + prow + lo + HS_TID);
        }
        if (!first) HS_SYNC(); // the previous item's copies have read the row table
        first = false;
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
}

// The shared row table: where the rows of the current work item sit (written by its first
// HS_GATHER_ROWS threads before a barrier), host and device row parts (hs_row_parts), and a flag
// per row: 1 copy, 0 zero-fill, 2 skip.
HS_KERNEL HS_GATHER_BOUNDS void hs_gather_rows(
    const i32* __restrict__ plan_src, const i32* __restrict__ plan_dst,
    const i32* __restrict__ plan_counts, const u8* __restrict__ host, u8* __restrict__ device,
    u32 num_tokens, u32 top_k, hs_gather_layers layers) {
    HS_SHARED u64 s_src_v[HS_GATHER_ROWS], s_src_s[HS_GATHER_ROWS];
    HS_SHARED u64 s_dst_v[HS_GATHER_ROWS], s_dst_s[HS_GATHER_ROWS];
    HS_SHARED u32 s_flags[HS_GATHER_ROWS];
    HS_GRID_DEP_WAIT(); // before any global memory access
    if (HS_BID_Z >= layers.count || num_tokens == 0) return;
    const hs_layer_pair L = layers.layer[HS_BID_Z];
    // One branch per block: the layer's scale words.
    if (L.host.scale_word == 8)
        hs_gather_items<8>(plan_src, plan_dst, plan_counts, host, device, num_tokens, top_k, L,
                           s_src_v, s_src_s, s_dst_v, s_dst_s, s_flags);
    else if (L.host.scale_word == 4)
        hs_gather_items<4>(plan_src, plan_dst, plan_counts, host, device, num_tokens, top_k, L,
                           s_src_v, s_src_s, s_dst_v, s_dst_s, s_flags);
    else
        hs_gather_items<16>(plan_src, plan_dst, plan_counts, host, device, num_tokens, top_k, L,
                            s_src_v, s_src_s, s_dst_v, s_dst_s, s_flags);
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

// ---------------------------------------------------------------------------------------------
// Whole-page copies (hisparse_core::ops::copy::copy_pages and copy_host_pages)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (min(num_layers * num_pairs, a few blocks per multiprocessor)), block
// (HS_COPY_THREADS). Tiles (layer, pair), layer fastest, are spread over blocks grid-stride; a
// block copies one page with 16-byte chunks, HS_COPY_UNROLL loads in flight per thread, and the
// page's last page_bytes % 16 bytes (pages of rows whose scale parts are not multiples of 16: 4, 8
// or 12 bytes) as 4-byte words, one per thread (page bases and strides are multiples of 16 and
// page_bytes a multiple of 4, checked by the planner). `jobs` and
// `pairs` live in device memory. The host guarantees destination ranges do not overlap each other
// or any source range of the same launch (it splits the call otherwise), so order does not matter.

#define HS_COPY_THREADS 256
#define HS_COPY_UNROLL 4

HS_KERNEL HS_BOUNDS(HS_COPY_THREADS) void hs_copy_pages(
    const hs_page_job* __restrict__ jobs, u32 num_layers, const hs_pair* __restrict__ pairs,
    u32 num_pairs, const u8* src, u8* dst) {
    const u64 tiles = (u64)num_layers * num_pairs;
    for (u64 tile = HS_BID_X; tile < tiles; tile += HS_NBLOCKS_X) {
        const hs_page_job j = jobs[tile % num_layers];
        const hs_pair p = pairs[tile / num_layers];
        const uint4* s = (const uint4*)(src + j.src_base + (u64)p.src * j.src_stride);
        uint4* o = (uint4*)(dst + j.dst_base + (u64)p.dst * j.dst_stride);
        const u32 n = (u32)(j.page_bytes >> 4);
        for (u32 base = 0; base < n; base += HS_COPY_THREADS * HS_COPY_UNROLL) {
            uint4 v[HS_COPY_UNROLL];
#pragma unroll
            for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
                const u32 c = base + u * HS_COPY_THREADS + HS_TID;
                if (c < n) v[u] = s[c];
            }
#pragma unroll
            for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
                const u32 c = base + u * HS_COPY_THREADS + HS_TID;
                if (c < n) o[c] = v[u];
            }
        }
        // The tail past the last 16-byte chunk (no thread for 16-byte multiples).
        const u32 tail_words = (u32)(j.page_bytes & 15u) >> 2;
        if (HS_TID < tail_words) {
            const u64 at = ((u64)n << 4) + ((u64)HS_TID << 2);
            *(u32*)((u8*)o + at) = *(const u32*)((const u8*)s + at);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Row-span copies (hisparse_core::ops::copy::copy_rows)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (min(num_layers * num_spans, a few blocks per multiprocessor)), block
// (HS_COPY_THREADS). direction 0 = device -> host, 1 = host -> device. Same overlap guarantee
// as hs_copy_pages. Rows move in units of 16-byte value chunks and scale words of the source
// layout's scale_word bytes (one branch per tile).

// One tile: the span's rows of one layer, scale words of W bytes.
template <u32 W>
HS_DEVICE void hs_copy_span(const hs_layout& sl, const hs_layout& dl, u32 sblock, u32 dblock,
                            const hs_span& sp, const u8* s, u8* o) {
    const u32 cpr = hs_row_units<W>(sl), vc = sl.value_bytes >> 4;
    const u32 n = sp.num_rows * cpr;
    for (u32 base = 0; base < n; base += HS_COPY_THREADS * HS_COPY_UNROLL) {
        uint4 v[HS_COPY_UNROLL];
#pragma unroll
        for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
            const u32 q = base + u * HS_COPY_THREADS + HS_TID;
            if (q < n) {
                u64 pv, ps;
                hs_row_parts(sl, sblock, sp.first_row + q / cpr, pv, ps);
                v[u] = hs_load_unit<W>(s, pv, ps, vc, q % cpr);
            }
        }
#pragma unroll
        for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
            const u32 q = base + u * HS_COPY_THREADS + HS_TID;
            if (q < n) {
                u64 pv, ps;
                hs_row_parts(dl, dblock, sp.first_row + q / cpr, pv, ps);
                hs_store_unit<W>(o, pv, ps, vc, q % cpr, v[u]);
            }
        }
    }
}

HS_KERNEL HS_BOUNDS(HS_COPY_THREADS) void hs_copy_rows(
    const hs_layer_pair* __restrict__ layers, u32 num_layers, const hs_span* __restrict__ spans,
    u32 num_spans, u32 direction, u8* host, u8* device) {
    const u64 tiles = (u64)num_layers * num_spans;
    for (u64 tile = HS_BID_X; tile < tiles; tile += HS_NBLOCKS_X) {
        const hs_layer_pair* L = layers + tile % num_layers;
        const hs_span sp = spans[tile / num_layers];
        const hs_layout sl = direction == 0 ? L->device : L->host;
        const hs_layout dl = direction == 0 ? L->host : L->device;
        const u32 sblock = direction == 0 ? sp.device_block : sp.host_block;
        const u32 dblock = direction == 0 ? sp.host_block : sp.device_block;
        const u8* s = direction == 0 ? device : host;
        u8* o = direction == 0 ? host : device;
        if (sl.scale_word == 8)
            hs_copy_span<8>(sl, dl, sblock, dblock, sp, s, o);
        else if (sl.scale_word == 4)
            hs_copy_span<4>(sl, dl, sblock, dblock, sp, s, o);
        else
            hs_copy_span<16>(sl, dl, sblock, dblock, sp, s, o);
    }
}

// ---------------------------------------------------------------------------------------------
// Indexer backup (hisparse_core::ops::indexer_backup::indexer_backup)
// ---------------------------------------------------------------------------------------------
//
// Launch: 1-D grid (any size), block (HS_INDEXER_THREADS). `layers` (hs_layer_pair[num_layers],
// device memory) are the indexer layers; item (layer, t) copies device row device_slots[t] of the
// layer to host row host_slots[t], skipped when either slot is -1, beyond its pool or in another
// layer's part of a block. Groups of HS_INDEXER_GROUP threads take items grid-stride (layer-major,
// the reference's order; host slots are distinct). Indexer rows have no 16-byte rule: a layer
// whose row parts (and pages) are all multiples of 16 bytes in both pools moves in 16-byte
// chunks, any other (DeepSeek V3.2's contiguous 132-byte rows) in 4-byte words (every part is a
// multiple of 4, pages 16-byte aligned: checked on the host).

#define HS_INDEXER_THREADS 256
#define HS_INDEXER_GROUP 32

// Whether layout `l`'s row parts and page placement are all multiples of 16 bytes.
HS_DEVICE bool hs_rows_in_chunks(const hs_layout& l) {
    return ((l.value_bytes | (l.row_bytes - l.value_bytes)) & 15u) == 0 &&
           ((l.base | l.block_stride) & 15u) == 0;
}

HS_KERNEL HS_BOUNDS(HS_INDEXER_THREADS) void hs_indexer_backup(
    const i32* __restrict__ device_slots, const i32* __restrict__ host_slots, u32 num_tokens,
    const hs_layer_pair* __restrict__ layers, u32 num_layers, const u8* __restrict__ device,
    u8* __restrict__ host) {
    const u32 groups = HS_NTHREADS / HS_INDEXER_GROUP;
    const u32 lane = HS_TID % HS_INDEXER_GROUP;
    const u64 items = (u64)num_layers * num_tokens;
    for (u64 item = (u64)HS_BID_X * groups + HS_TID / HS_INDEXER_GROUP; item < items;
         item += (u64)HS_NBLOCKS_X * groups) {
        const hs_layer_pair L = layers[item / num_tokens];
        const u32 t = (u32)(item % num_tokens);
        u32 db, doff, hb, hoff;
        if (!hs_locate(L.device, device_slots[t], db, doff) ||
            !hs_locate(L.host, host_slots[t], hb, hoff))
            continue;
        u64 sv, ss, dv, ds;
        hs_row_parts(L.device, db, doff, sv, ss);
        hs_row_parts(L.host, hb, hoff, dv, ds);
        const u32 vb = L.device.value_bytes, rb = L.device.row_bytes;
        if (hs_rows_in_chunks(L.device) && hs_rows_in_chunks(L.host)) {
            const u32 vc = vb >> 4;
            for (u32 c = lane; c < rb >> 4; c += HS_INDEXER_GROUP)
                *(uint4*)(host + hs_chunk(dv, ds, vc, c)) =
                    *(const uint4*)(device + hs_chunk(sv, ss, vc, c));
        } else {
            const u32 vw = vb >> 2;
            for (u32 w = lane; w < rb >> 2; w += HS_INDEXER_GROUP) {
                const u64 from = w < vw ? sv + ((u64)w << 2) : ss + ((u64)(w - vw) << 2);
                const u64 to = w < vw ? dv + ((u64)w << 2) : ds + ((u64)(w - vw) << 2);
                *(u32*)(host + to) = *(const u32*)(device + from);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Invalidate (hisparse_core::ops::invalidate::invalidate)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (min(ceil(total / HS_INVALIDATE_THREADS), a few blocks per multiprocessor)),
// block (HS_INVALIDATE_THREADS). The first HS_INVALIDATE_SHARED ranges are staged in shared
// memory; further ranges are read from device memory.

#define HS_INVALIDATE_THREADS 256
#define HS_INVALIDATE_SHARED 512

HS_KERNEL HS_BOUNDS(HS_INVALIDATE_THREADS) void hs_invalidate(
    const i32* __restrict__ ranges, u32 num_ranges, i32* __restrict__ slot_host_rows, u64 total) {
    HS_SHARED i32 s_ranges[2 * HS_INVALIDATE_SHARED];
    const u32 staged = num_ranges < HS_INVALIDATE_SHARED ? num_ranges : HS_INVALIDATE_SHARED;
    for (u32 i = HS_TID; i < 2 * staged; i += HS_NTHREADS) s_ranges[i] = ranges[i];
    HS_SYNC();
    for (u64 i = (u64)HS_BID_X * HS_NTHREADS + HS_TID; i < total; i += (u64)HS_NBLOCKS_X * HS_NTHREADS) {
        const i32 v = slot_host_rows[i];
        bool hit = false;
        for (u32 k = 0; k < staged && !hit; ++k) hit = s_ranges[2 * k] <= v && v < s_ranges[2 * k + 1];
        for (u32 k = staged; k < num_ranges && !hit; ++k) hit = ranges[2 * k] <= v && v < ranges[2 * k + 1];
        if (hit) slot_host_rows[i] = -1;
    }
}

// ---------------------------------------------------------------------------------------------
// Compressed slot mapping (hisparse_core::ops::slot_mapping::compressed_slot_mapping)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (ceil(num_tokens / HS_SLOT_THREADS)), block (HS_SLOT_THREADS).

#define HS_SLOT_THREADS 256

HS_KERNEL HS_BOUNDS(HS_SLOT_THREADS) void hs_compressed_slot_mapping(
    const i32* __restrict__ positions, const i32* __restrict__ slot_mapping,
    const i32* __restrict__ table_row, const i32* __restrict__ block_table, i32* __restrict__ out,
    u32 num_tokens, u32 ratio, u32 block_size, u32 table_rows, u32 max_blocks) {
    const u32 t = HS_BID_X * HS_NTHREADS + HS_TID;
    if (t >= num_tokens) return;
    const i32 p = positions[t], slot = slot_mapping[t], row = table_row[t];
    i32 v = -1;
    if (slot >= 0 && p >= 0 && ((u64)p + 1) % ratio == 0 && row >= 0 && (u32)row < table_rows) {
        const u32 bc = block_size / ratio;
        const u32 c = (u32)p / ratio;
        const u32 col = c / bc;
        if (col < max_blocks) v = hs_physical_row(block_table[(u64)row * max_blocks + col], bc, c % bc);
    }
    out[t] = v;
}

// ---------------------------------------------------------------------------------------------
// Table maintenance (hisparse_core::ops::table::write_table and reset_hot_state)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (min(ceil(work / HS_TABLE_THREADS), a few blocks per multiprocessor)), block
// (HS_TABLE_THREADS); both kernels are grid-stride. The host stages the lists (`writes`, `rows`)
// in device memory. Write indices are unique (checked on the host), so the writes are
// independent; a reset row listed twice is written twice with the same values.

#define HS_TABLE_THREADS 256

// table[w.index] = w.value for every write. Indices at or beyond table_len are skipped (the host
// refuses them before launching; the bound keeps a corrupted list from writing out of range).
HS_KERNEL HS_BOUNDS(HS_TABLE_THREADS) void hs_write_table(
    const hs_table_write* __restrict__ writes, u32 num_writes, i32* __restrict__ table,
    u32 table_len) {
    for (u64 i = (u64)HS_BID_X * HS_NTHREADS + HS_TID; i < num_writes; i += (u64)HS_NBLOCKS_X * HS_NTHREADS) {
        const hs_table_write w = writes[i];
        if (w.index < table_len) table[w.index] = w.value;
    }
}

// For every listed state row r: slot_host_rows[r][s] = -1 and lru[r][s] = s for s in 0..hot_slots. Rows at
// or beyond num_requests are skipped (refused on the host, as above).
HS_KERNEL HS_BOUNDS(HS_TABLE_THREADS) void hs_reset_hot_state(
    const u32* __restrict__ rows, u32 num_rows, i32* __restrict__ slot_host_rows, u16* __restrict__ lru,
    u32 num_requests, u32 hot_slots) {
    const u64 total = (u64)num_rows * hot_slots;
    for (u64 i = (u64)HS_BID_X * HS_NTHREADS + HS_TID; i < total; i += (u64)HS_NBLOCKS_X * HS_NTHREADS) {
        const u32 r = rows[i / hot_slots];
        const u32 s = (u32)(i % hot_slots);
        if (r < num_requests) {
            const u64 at = (u64)r * hot_slots + s;
            slot_host_rows[at] = -1;
            lru[at] = (u16)s;
        }
    }
}
