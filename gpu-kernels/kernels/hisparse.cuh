// HiSparse data-plane kernels: ONE source for CUDA and HIP.
//
// A vendor prelude (vendor_cuda.h or vendor_hip.h) is prepended; it defines the HS_* macros used
// here (kernel qualifiers, thread/block indices, barrier, warp shuffle, shared memory). This file
// uses no vendor spelling directly except the atomics (atomicCAS/atomicMin/atomicAdd/atomicOr),
// the builtin `uint4` vector and `__restrict__`, which CUDA and HIP spell alike.
//
// Every kernel reproduces the reference implementation in hisparse-core `ops` bit for bit; each
// kernel's comment names the reference function and the launch shape the host must use. The
// parameter lists are mirrored by the ABI table in gpu-kernels/src/lib.rs: change both together.
//
// Conventions: indices and block ids are i32, LRU orders u16, -1 means "no row". Byte offsets are
// u64. All pool rows, page bases and strides are multiples of 16 bytes (checked on the host), so
// every copy moves 16-byte chunks.

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
    u32 row_bytes;         // bytes per row (multiple of 16)
    u32 value_bytes;       // value bytes per row (== row_bytes unless split)
    u32 index_stride_rows; // flat row -> (row / stride, row % stride)
    u32 pad;
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
    if (block < 0) return -1;
    i64 row = (i64)block * (i64)stride_rows + (i64)offset;
    return row > HS_I32_MAX ? -1 : (i32)row;
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

// Exclusive prefix sum of `v` over the block in thread order, and the block's total, with ONE
// barrier: each warp publishes its total, then every thread adds up the totals of the warps
// before its own. `s` holds 2 * HS_MAX_WARPS words; `phase` must differ by one between
// consecutive calls (callers pass a counter), so a call never overwrites the half that readers of
// the previous call may still read (they all passed this call's barrier before anyone writes the
// same half again). Every thread of the block calls it; blockDim.x is a multiple of HS_WARP.
HS_DEVICE u32 hs_block_scan1(u32 v, u32* s, u32 phase, u32& total) {
    const u32 lane = HS_TID % HS_WARP, warp = HS_TID / HS_WARP, nw = HS_NTHREADS / HS_WARP;
    u32* t = s + (phase & 1u) * HS_MAX_WARPS;
    const u32 inc = hs_warp_inclusive(v);
    if (lane == HS_WARP - 1) t[warp] = inc;
    HS_SYNC();
    u32 before = 0, sum = 0;
    for (u32 w = 0; w < nw; ++w) {
        const u32 x = t[w];
        before += w < warp ? x : 0u;
        sum += x;
    }
    total = sum;
    return before + inc - v;
}

// ---------------------------------------------------------------------------------------------
// Remap (hisparse_core::ops::remap::remap)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (any size; the host uses num_tokens), block (a multiple of 64 up to
// HS_REMAP_MAX_THREADS; the host uses top_k / 4 threads, one 16-byte vector each, when top_k is
// a multiple of 4). Blocks take token rows grid-stride. `idx_mapping` and `counts` may be null
// when the matching flag is clear.
//
// Per row the request id and the thread's top-k vector are loaded together (independent), then
// each entry's block-table entry is read directly through the read-only path (one dependent round
// trip; no staging, no barrier), and the outputs are stored as 16-byte vectors. Valid counts are
// a block sum and compaction a block scan, each with a single barrier (hs_block_scan1); the -1
// tail of a compacted row is written by the threads whose own entries lie beyond the valid ones.
// Rows longer than one pass of the block loop over passes.

#define HS_REMAP_MAX_THREADS 512
#define HS_REMAP_HAS_MAP 1u
#define HS_REMAP_COUNTS 2u
#define HS_REMAP_COMPACT 4u

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

// The block-table row of request `req` (through idx_mapping when HS_REMAP_HAS_MAP), or null for
// a padding row.
HS_DEVICE const i32* hs_remap_table_row(i32 req, const i32* block_table, const i32* idx_mapping,
                                        u32 table_rows, u32 max_blocks, u32 idx_mapping_len,
                                        u32 flags) {
    i64 row = -1;
    if (req >= 0) {
        if (flags & HS_REMAP_HAS_MAP) {
            if ((u32)req < idx_mapping_len) {
                const i32 m = HS_LDG(idx_mapping + req);
                if (m >= 0 && (u32)m < table_rows) row = m;
            }
        } else if ((u32)req < table_rows) {
            row = req;
        }
    }
    return row >= 0 ? block_table + (u64)row * max_blocks : 0;
}

// Output of top-k entry `tok` against the table row `bt` (null: padding), read from global memory
// through the read-only path.
HS_DEVICE i32 hs_remap_lookup(const hs_remap_geo& g, const i32* bt, i32 tok) {
    if (bt == 0 || tok < 0) return -1;
    u32 col, off;
    if (g.shift < 32) {
        col = (u32)tok >> g.shift;
        off = (u32)tok & (g.block_size - 1);
    } else {
        col = (u32)tok / g.block_size;
        off = (u32)tok % g.block_size;
    }
    if (col >= g.max_blocks) return -1;
    return hs_physical_row(HS_LDG(bt + col), g.stride, off);
}

HS_KERNEL HS_REMAP_BOUNDS void hs_remap(
    const i32* __restrict__ req_id, const i32* __restrict__ block_table,
    const i32* __restrict__ topk, const i32* __restrict__ idx_mapping, i32* __restrict__ out,
    i32* __restrict__ counts, u32 num_tokens, u32 top_k, u32 table_rows, u32 max_blocks,
    u32 block_size, u32 block_stride_rows, u32 idx_mapping_len, u32 flags) {
    HS_SHARED u32 s_scan[2 * HS_MAX_WARPS];
    HS_GRID_DEP_WAIT(); // before any global memory access
    hs_remap_geo g;
    g.block_size = block_size;
    g.max_blocks = max_blocks;
    g.stride = block_stride_rows;
    g.shift = 32;
    if ((block_size & (block_size - 1)) == 0) {
        g.shift = 0;
        while ((1u << g.shift) < block_size) ++g.shift;
    }
    const bool compact = (flags & HS_REMAP_COMPACT) != 0;
    const bool want_counts = (flags & HS_REMAP_COUNTS) != 0;
    // Four entries (one 16-byte vector) per thread per pass when rows are 16-byte aligned.
    const bool vec = (top_k & 3u) == 0;
    const u32 per = vec ? 4u : 1u;
    const u32 span = HS_NTHREADS * per;
    u32 phase = 0; // hs_block_scan1 calls so far (uniform over the block)

    for (u32 t = HS_BID_X; t < num_tokens; t += HS_NBLOCKS_X) {
        const i32* in = topk + (u64)t * top_k;
        i32* o = out + (u64)t * top_k;
        u32 written = 0; // compaction: valid entries written so far (uniform)
        u32 valid = 0;   // this thread's valid entries (counts without compaction)
        const i32* bt = 0;
        for (u32 base = 0; base < top_k; base += span) {
            const u32 j0 = base + HS_TID * per;
            const bool mine = j0 < top_k; // in vector mode j0 + 3 < top_k then too
            i32 v[4] = {-1, -1, -1, -1};
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
            if (base == 0)
                bt = hs_remap_table_row(HS_LDG(req_id + t), block_table, idx_mapping, table_rows,
                                        max_blocks, idx_mapping_len, flags);
            u32 n = 0;
#pragma unroll
            for (u32 q = 0; q < 4; ++q) {
                v[q] = (mine && q < per) ? hs_remap_lookup(g, bt, v[q]) : -1;
                n += v[q] != -1 ? 1u : 0u;
            }
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
#pragma unroll
            for (u32 q = 0; q < 4; ++q)
                if (v[q] != -1) o[at++] = v[q];
            written += total;
            if (span >= top_k && mine) {
                // One pass: this thread's own entries at or beyond the valid count become -1.
                if (vec && j0 >= written) {
                    *(uint4*)(o + j0) = make_uint4(HS_NONE, HS_NONE, HS_NONE, HS_NONE);
                } else {
                    for (u32 q = 0; q < per; ++q)
                        if (j0 + q >= written) o[j0 + q] = -1;
                }
            }
        }
        if (compact) {
            if (span < top_k)
                for (u32 j = written + HS_TID; j < top_k; j += HS_NTHREADS) o[j] = -1;
            if (want_counts && HS_TID == 0) counts[t] = (i32)written;
        } else if (want_counts) {
            u32 total;
            hs_block_scan1(valid, s_scan, phase++, total);
            if (HS_TID == 0) counts[t] = (i32)total;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Resolve (hisparse_core::ops::resolve::resolve)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (num_tokens), block (HS_RESOLVE_THREADS), dynamic shared memory
// hs_resolve_smem_bytes(hot_slots, smem_table_entries) (see the Rust ABI table for the formula).
// Block t handles token row t: a padding row writes its outputs; a row whose request appeared in
// an earlier row exits (that earlier row's block resolves all rows of the request); otherwise the
// block resolves every row of the request, in row order, against the request's single state.
//
// The wanted-row hash table lives in shared memory when it needs at most `smem_table_entries`
// entries (a power of two, or 0), else in `workspace`: `workspace_counter` (zeroed by the host
// before each launch) bump-allocates per-block tables of `workspace_entries` entries in total; the
// host sizes it at 4 * num_tokens * top_k entries, which bounds the sum of every block's need.
//
// Global-state mode: when bit 31 of `smem_table_entries` (HS_RESOLVE_GLOBAL_STATE) is set, the
// per-request LRU copy, partition and bitmap do not live in shared memory but in `workspace`:
// each resolving block bump-allocates them (resolve_state_entries(hot_slots) 16-byte entries,
// followed by its wanted-row table when that does not fit shared memory) in one atomicAdd on
// `workspace_counter`. The low 31 bits are then the shared table capacity as above, and the
// dynamic shared memory holds only that table (16 * capacity bytes). For hot_slots too large for
// the device's shared memory (64 KiB on AMD GPUs).
//
// Work per thread: every pass over a row takes HS_RESOLVE_IK consecutive top-k entries per
// thread, every pass over the LRU HS_RESOLVE_IN consecutive positions, and issues all their loads
// (top-k, both page tables, the LRU, the cached rows) before using any, so each pass costs one
// dependent memory round trip, not one per item. A request of one row whose entries fit one pass
// (top_k <= HS_RESOLVE_THREADS * HS_RESOLVE_IK: the decode case) classifies each entry once and
// keeps the result and its hash slot in registers for the later phases; likewise the LRU scan
// keeps each position's hash slot when the hot buffer fits one pass. Block sums and scans take
// one barrier each (hs_block_scan1). The loops over a request's rows stop at its last row (one
// iteration for a one-row request, however many rows the launch has).

#define HS_RESOLVE_THREADS 1024
#define HS_RESOLVE_IK 2
#define HS_RESOLVE_IN 4
#define HS_RESOLVE_GLOBAL_STATE 0x80000000u

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

// Inserts g with entry ordinal `entry` (the smallest ordinal wins); returns g's slot in the table.
HS_DEVICE u32 hs_insert(hs_wanted* table, u32 mask, i32 g, u32 entry) {
    u32 h = hs_hash(g, mask);
    for (;;) {
        i32 prev = atomicCAS(&table[h].key, HS_EMPTY_KEY, g);
        if (prev == HS_EMPTY_KEY || prev == g) {
            atomicMin(&table[h].first_entry, entry);
            return h;
        }
        h = (h + 1) & mask;
    }
}

// Step 2 for one entry: 0 = invalid, 1 = resident (value = physical row), 2 = host (value = flat
// host row g). Both page-table entries are read, neither waiting for the other.
HS_DEVICE u32 hs_classify(const hs_resolve_desc& d, const i32* resident_table, const i32* host_table,
                          u32 r, i32 tok, i32& value) {
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
    const u64 at = (u64)r * d.max_pages + page;
    const i32 res = HS_LDG(resident_table + at);
    const i32 hb = HS_LDG(host_table + at);
    if (res > 0) {
        value = hs_physical_row(res, d.attention_block_stride, off);
        return value == -1 ? 0u : 1u;
    }
    value = hs_physical_row(hb, d.block_size, off);
    return value == -1 ? 0u : 2u;
}

HS_DEVICE i32 hs_hot_row(const hs_resolve_desc& d, const i32* hot_table, u32 r, u32 slot) {
    u32 col, off;
    if (d.shift < 32) {
        col = slot >> d.shift;
        off = slot & (d.block_size - 1);
    } else {
        col = slot / d.block_size;
        off = slot % d.block_size;
    }
    const i32 block = HS_LDG(hot_table + (u64)r * d.hot_cols + col);
    return hs_physical_row(block, d.attention_block_stride, off);
}

// Dynamic shared memory layout of hs_resolve (byte offsets; every part 16-byte aligned).
HS_DEVICE u32 hs_align16(u32 x) { return (x + 15u) & ~15u; }

HS_KERNEL HS_BOUNDS(HS_RESOLVE_THREADS) void hs_resolve(
    const i32* __restrict__ req_id, const i32* __restrict__ topk,
    const i32* __restrict__ resident_table, const i32* __restrict__ host_table,
    const i32* __restrict__ hot_table, i32* __restrict__ dgi, u16* __restrict__ lru,
    i32* __restrict__ indices, i32* __restrict__ valid_counts, i32* __restrict__ hit_counts,
    i32* __restrict__ miss_counts, i32* __restrict__ miss_src, i32* __restrict__ miss_dst,
    hs_wanted* __restrict__ workspace, u32* __restrict__ workspace_counter, u32 workspace_entries,
    u32 smem_table_entries, u32 num_tokens, u32 top_k, u32 num_requests, u32 max_pages,
    u32 block_size, u32 hot_slots, u32 attention_block_stride, u32 host_num_blocks) {
    HS_DYN_SHARED(hs_smem);
    HS_SHARED u32 s_scan[2 * HS_MAX_WARPS];
    HS_SHARED u32 s_flag, s_rows, s_any_host, s_corrupt, s_table_off;
    HS_GRID_DEP_WAIT(); // before any global memory access

    hs_resolve_desc d;
    d.num_tokens = num_tokens;
    d.top_k = top_k;
    d.num_requests = num_requests;
    d.max_pages = max_pages;
    d.block_size = block_size;
    d.hot_slots = hot_slots;
    d.attention_block_stride = attention_block_stride;
    d.host_num_blocks = host_num_blocks;
    d.shift = 32;
    if ((block_size & (block_size - 1)) == 0) {
        d.shift = 0;
        while ((1u << d.shift) < block_size) ++d.shift;
    }
    d.hot_cols = hot_slots / block_size + (hot_slots % block_size != 0 ? 1u : 0u);

    const u32 t = HS_BID_X;
    if (t >= num_tokens) return;
    const u32 K = top_k, N = hot_slots;
    const u32 span_k = HS_NTHREADS * HS_RESOLVE_IK, span_n = HS_NTHREADS * HS_RESOLVE_IN;
    const i32 req = HS_LDG(req_id + t);

    // Step 1: padding rows.
    if (req < 0 || (u32)req >= num_requests) {
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
        return;
    }
    const u32 r = (u32)req;

    // Only the first row of a request resolves it; count the request's rows.
    if (HS_TID == 0) {
        s_flag = 0;
        s_rows = 0;
        s_any_host = 0;
        s_corrupt = 0;
    }
    HS_SYNC();
    for (u32 t2 = HS_TID; t2 < t; t2 += HS_NTHREADS)
        if (HS_LDG(req_id + t2) == req) atomicOr(&s_flag, 1u);
    for (u32 t2 = t + HS_TID; t2 < num_tokens; t2 += HS_NTHREADS)
        if (HS_LDG(req_id + t2) == req) atomicAdd(&s_rows, 1u);
    HS_SYNC();
    if (s_flag) return;
    const u32 rows = s_rows;
    const u32 entries = rows * K;
    // One row in one pass: keep each entry's class, value and hash slot in registers.
    const bool cached = rows == 1 && K <= span_k;
    // The hot buffer in one pass: keep each LRU position's hash slot in registers.
    const bool cached_n = N <= span_n;

    // Per-request state: lru copy (u16[N]), partition (u16[N]), bitmap (u32[N/32]), each part
    // 16-byte aligned, in shared memory followed by the shared table, or (global-state mode) in
    // the workspace with the table alone in shared memory.
    const bool global_state = (smem_table_entries & HS_RESOLVE_GLOBAL_STATE) != 0u;
    const u32 smem_cap = smem_table_entries & ~HS_RESOLVE_GLOBAL_STATE;
    const u32 state_bytes = 2 * hs_align16(2 * N) + hs_align16(4 * ((N + 31) / 32));

    u32 cap = 16;
    while (cap < 2 * entries) cap <<= 1;
    const bool table_shared = cap <= smem_cap;
    if (table_shared) cap = smem_cap;
    unsigned char* state;
    hs_wanted* table;
    if (global_state) {
        if (HS_TID == 0)
            s_table_off = atomicAdd(workspace_counter, state_bytes / 16u + (table_shared ? 0u : cap));
        HS_SYNC();
        state = (unsigned char*)(workspace + s_table_off);
        table = table_shared ? (hs_wanted*)hs_smem : workspace + s_table_off + state_bytes / 16u;
    } else {
        state = hs_smem;
        if (table_shared) {
            table = (hs_wanted*)(hs_smem + state_bytes);
        } else {
            if (HS_TID == 0) s_table_off = atomicAdd(workspace_counter, cap);
            HS_SYNC();
            table = workspace + s_table_off;
        }
    }
    u16* s_lru = (u16*)state;
    u16* s_part = (u16*)(state + hs_align16(2 * N));
    u32* s_bits = (u32*)(state + 2 * hs_align16(2 * N));
    const u32 mask = cap - 1;
    for (u32 i = HS_TID; i < cap; i += HS_NTHREADS) {
        table[i].key = HS_EMPTY_KEY;
        table[i].first_entry = HS_NONE;
        table[i].first_lru = HS_NONE;
        table[i].slot = HS_NONE;
    }
    for (u32 i = HS_TID; i < (N + 31) / 32; i += HS_NTHREADS) s_bits[i] = 0;
    HS_SYNC();

    u32 phase = 0; // hs_block_scan1 calls so far (uniform)
    // The registers of the cached case: class, value and hash slot of this thread's entries.
    u32 c_kind[HS_RESOLVE_IK];
    i32 c_val[HS_RESOLVE_IK];
    u32 c_h[HS_RESOLVE_IK];
#pragma unroll
    for (u32 q = 0; q < HS_RESOLVE_IK; ++q) {
        c_kind[q] = 0;
        c_val[q] = -1;
        c_h[q] = HS_NONE;
    }

    // Steps 2-3: classify every entry, insert host rows with their first appearance; reset the
    // plan and counts of every row.
    {
        bool any = false;
        u32 ord = 0;
        for (u32 t2 = t, seen = 0; t2 < num_tokens && seen < rows; ++t2) {
            if (HS_LDG(req_id + t2) != req) continue;
            ++seen;
            const u64 base = (u64)t2 * K;
            for (u32 jb = 0; jb < K; jb += span_k) {
                const u32 j0 = jb + HS_TID * HS_RESOLVE_IK;
                i32 tok[HS_RESOLVE_IK];
#pragma unroll
                for (u32 q = 0; q < HS_RESOLVE_IK; ++q)
                    tok[q] = j0 + q < K ? HS_LDG(topk + base + j0 + q) : -1;
#pragma unroll
                for (u32 q = 0; q < HS_RESOLVE_IK; ++q) {
                    i32 v = -1;
                    const u32 kind = j0 + q < K ? hs_classify(d, resident_table, host_table, r, tok[q], v) : 0u;
                    u32 h = HS_NONE;
                    if (kind == 2) {
                        h = hs_insert(table, mask, v, ord * K + j0 + q);
                        any = true;
                    }
                    c_kind[q] = kind;
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
            kind = c_kind[q];                                                                    \
            v = c_val[q];                                                                        \
            h = c_h[q];                                                                          \
        } else {                                                                                 \
            v = -1;                                                                              \
            kind = j0 + (q) < K ? hs_classify(d, resident_table, host_table, r, tokv, v) : 0u;  \
            h = kind == 2 ? hs_lookup(table, mask, v) : HS_NONE;                                 \
        }                                                                                        \
    } while (0)

    const u64 sbase = (u64)r * N;
    if (s_any_host) {
        // Step 4: the LRU must be a permutation of 0..N; otherwise reset it and the dgi row.
        for (u32 pb = 0; pb < N; pb += span_n) {
            const u32 p0 = pb + HS_TID * HS_RESOLVE_IN;
            u32 sv[HS_RESOLVE_IN];
#pragma unroll
            for (u32 q = 0; q < HS_RESOLVE_IN; ++q) sv[q] = p0 + q < N ? (u32)lru[sbase + p0 + q] : 0u;
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
        if (corrupt) {
            for (u32 p = HS_TID; p < N; p += HS_NTHREADS) {
                s_lru[p] = (u16)p;
                dgi[sbase + p] = -1;
            }
        }
        HS_SYNC();

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
                for (u32 q = 0; q < HS_RESOLVE_IN; ++q) c[q] = p0 + q < N ? dgi[sbase + s_lru[p0 + q]] : -1;
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
                for (u32 q = 0; q < HS_RESOLVE_IN; ++q) c[q] = p0 + q < N ? dgi[sbase + s_lru[p0 + q]] : -1;
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
        // the m-th evictable slot, count hits and misses by the row of first appearance.
        u32 misses = 0;
        {
            u32 ord = 0;
            for (u32 t2 = t, seen = 0; t2 < num_tokens && seen < rows; ++t2) {
                if (HS_LDG(req_id + t2) != req) continue;
                ++seen;
                const u64 base = (u64)t2 * K;
                const u32 row_base = misses;
                u32 row_hits = 0;
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
                    u32 total;
                    u32 m = misses + hs_block_scan1(nm, s_scan, phase++, total);
#pragma unroll
                    for (u32 q = 0; q < HS_RESOLVE_IK; ++q) {
                        if (miss_h[q] == HS_NONE) continue;
                        if (m < V) {
                            const u32 s = s_part[m];
                            const i32 g = miss_g[q];
                            const i32 src = (i64)g < host_rows ? g : -1;
                            table[miss_h[q]].slot = s;
                            dgi[sbase + s] = src;
                            miss_src[base + (m - row_base)] = src;
                            miss_dst[base + (m - row_base)] = hs_hot_row(d, hot_table, r, s);
                        }
                        ++m;
                    }
                    misses += total;
                }
                u32 hits_total;
                hs_block_scan1(row_hits, s_scan, phase++, hits_total);
                if (HS_TID == 0) {
                    hit_counts[t2] = (i32)hits_total;
                    u32 lo = row_base < V ? row_base : V, hi = misses < V ? misses : V;
                    miss_counts[t2] = (i32)(hi - lo);
                }
                ++ord;
            }
        }
        HS_SYNC();

        // Step 7: new LRU order = unused evictables, miss slots (miss order), hits (old order).
        const u32 used = misses < V ? misses : V;
        for (u32 i = HS_TID; i < N; i += HS_NTHREADS) {
            u32 s;
            if (i < V - used) s = s_part[used + i];
            else if (i < V) s = s_part[i - (V - used)];
            else s = s_part[N - 1 - (i - V)];
            lru[sbase + i] = (u16)s;
        }
    }
    HS_SYNC();

    // Step 8: output indices and valid counts.
    for (u32 t2 = t, seen = 0; t2 < num_tokens && seen < rows; ++t2) {
        if (HS_LDG(req_id + t2) != req) continue;
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
                    if (s != HS_NONE) out = hs_hot_row(d, hot_table, r, s);
                }
                indices[base + j0 + q] = out;
                valid += out != -1 ? 1u : 0u;
            }
        }
        u32 total;
        hs_block_scan1(valid, s_scan, phase++, total);
        if (HS_TID == 0) valid_counts[t2] = (i32)total;
    }
#undef HS_RESOLVE_ENTRY
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
// items and the blocks that start first do it; an item beyond its row's count is skipped after
// one load of the (cached) count, without a barrier. A block copies its item's rows with every 16-byte chunk of every row spread over its
// threads, each thread issuing up to HS_GATHER_UNROLL independent loads before its stores (the
// host pool is mapped pinned memory read across the bus, so many loads must be in flight).

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

HS_KERNEL HS_GATHER_BOUNDS void hs_gather_rows(
    const i32* __restrict__ plan_src, const i32* __restrict__ plan_dst,
    const i32* __restrict__ plan_counts, const u8* __restrict__ host, u8* __restrict__ device,
    u32 num_tokens, u32 top_k, hs_gather_layers layers) {
    HS_SHARED u64 s_src_v[HS_GATHER_ROWS], s_src_s[HS_GATHER_ROWS];
    HS_SHARED u64 s_dst_v[HS_GATHER_ROWS], s_dst_s[HS_GATHER_ROWS];
    HS_SHARED u32 s_flags[HS_GATHER_ROWS]; // 1: copy, 0: zero-fill, 2: skip
    HS_GRID_DEP_WAIT(); // before any global memory access
    if (HS_BID_Z >= layers.count || num_tokens == 0) return;
    const hs_layer_pair L = layers.layer[HS_BID_Z];
    const u32 cpr = L.host.row_bytes >> 4;
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

        const u32 total = rows * cpr;
        for (u32 base = 0; base < total; base += HS_GATHER_THREADS * HS_GATHER_UNROLL) {
            uint4 v[HS_GATHER_UNROLL];
#pragma unroll
            for (u32 u = 0; u < HS_GATHER_UNROLL; ++u) {
                const u32 q = base + u * HS_GATHER_THREADS + HS_TID;
                v[u] = make_uint4(0u, 0u, 0u, 0u);
                if (q < total) {
                    const u32 i = q / cpr, c = q % cpr;
                    if (s_flags[i] == 1)
                        v[u] = *(const uint4*)(host + hs_chunk(s_src_v[i], s_src_s[i], vc, c));
                }
            }
#pragma unroll
            for (u32 u = 0; u < HS_GATHER_UNROLL; ++u) {
                const u32 q = base + u * HS_GATHER_THREADS + HS_TID;
                if (q < total) {
                    const u32 i = q / cpr, c = q % cpr;
                    if (s_flags[i] != 2)
                        *(uint4*)(device + hs_chunk(s_dst_v[i], s_dst_s[i], vc, c)) = v[u];
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Whole-page copies (hisparse_core::ops::copy::copy_pages and copy_host_pages)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (min(num_layers * num_pairs, a few blocks per multiprocessor)), block
// (HS_COPY_THREADS). Tiles (layer, pair), layer fastest, are spread over blocks grid-stride; a
// block copies one page with 16-byte chunks, HS_COPY_UNROLL loads in flight per thread. `jobs` and
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
    }
}

// ---------------------------------------------------------------------------------------------
// Row-span copies (hisparse_core::ops::copy::copy_rows)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (min(num_layers * num_spans, a few blocks per multiprocessor)), block
// (HS_COPY_THREADS). direction 0 = device -> host, 1 = host -> device. Same overlap guarantee
// as hs_copy_pages.

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
        const u32 cpr = sl.row_bytes >> 4, vc = sl.value_bytes >> 4;
        const u32 n = sp.num_rows * cpr;
        for (u32 base = 0; base < n; base += HS_COPY_THREADS * HS_COPY_UNROLL) {
            uint4 v[HS_COPY_UNROLL];
#pragma unroll
            for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
                const u32 q = base + u * HS_COPY_THREADS + HS_TID;
                if (q < n) {
                    u64 pv, ps;
                    hs_row_parts(sl, sblock, sp.first_row + q / cpr, pv, ps);
                    v[u] = *(const uint4*)(s + hs_chunk(pv, ps, vc, q % cpr));
                }
            }
#pragma unroll
            for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
                const u32 q = base + u * HS_COPY_THREADS + HS_TID;
                if (q < n) {
                    u64 pv, ps;
                    hs_row_parts(dl, dblock, sp.first_row + q / cpr, pv, ps);
                    *(uint4*)(o + hs_chunk(pv, ps, vc, q % cpr)) = v[u];
                }
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
    const i32* __restrict__ ranges, u32 num_ranges, i32* __restrict__ dgi, u64 total) {
    HS_SHARED i32 s_ranges[2 * HS_INVALIDATE_SHARED];
    const u32 staged = num_ranges < HS_INVALIDATE_SHARED ? num_ranges : HS_INVALIDATE_SHARED;
    for (u32 i = HS_TID; i < 2 * staged; i += HS_NTHREADS) s_ranges[i] = ranges[i];
    HS_SYNC();
    for (u64 i = (u64)HS_BID_X * HS_NTHREADS + HS_TID; i < total; i += (u64)HS_NBLOCKS_X * HS_NTHREADS) {
        const i32 v = dgi[i];
        bool hit = false;
        for (u32 k = 0; k < staged && !hit; ++k) hit = s_ranges[2 * k] <= v && v < s_ranges[2 * k + 1];
        for (u32 k = staged; k < num_ranges && !hit; ++k) hit = ranges[2 * k] <= v && v < ranges[2 * k + 1];
        if (hit) dgi[i] = -1;
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

// For every listed state row r: dgi[r][s] = -1 and lru[r][s] = s for s in 0..hot_slots. Rows at
// or beyond num_requests are skipped (refused on the host, as above).
HS_KERNEL HS_BOUNDS(HS_TABLE_THREADS) void hs_reset_hot_state(
    const u32* __restrict__ rows, u32 num_rows, i32* __restrict__ dgi, u16* __restrict__ lru,
    u32 num_requests, u32 hot_slots) {
    const u64 total = (u64)num_rows * hot_slots;
    for (u64 i = (u64)HS_BID_X * HS_NTHREADS + HS_TID; i < total; i += (u64)HS_NBLOCKS_X * HS_NTHREADS) {
        const u32 r = rows[i / hot_slots];
        const u32 s = (u32)(i % hot_slots);
        if (r < num_requests) {
            const u64 at = (u64)r * hot_slots + s;
            dgi[at] = -1;
            lru[at] = (u16)s;
        }
    }
}
