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

// Exclusive prefix sum of `v` over the block, in thread order; `total` receives the block's sum.
// Every thread of the block must call it (it holds barriers). blockDim.x must be a multiple of
// HS_WARP. `s` is scratch of HS_MAX_WARPS + 1 words, free again when the function returns.
HS_DEVICE u32 hs_block_scan(u32 v, u32* s, u32& total) {
    const u32 lane = HS_TID % HS_WARP, warp = HS_TID / HS_WARP;
    u32 x = v;
    for (u32 d = 1; d < HS_WARP; d <<= 1) {
        u32 y = HS_SHFL_UP_U32(x, d);
        if (lane >= d) x += y;
    }
    if (lane == HS_WARP - 1) s[warp] = x;
    HS_SYNC();
    if (HS_TID == 0) {
        u32 acc = 0, nw = HS_NTHREADS / HS_WARP;
        for (u32 w = 0; w < nw; ++w) {
            u32 t = s[w];
            s[w] = acc;
            acc += t;
        }
        s[HS_MAX_WARPS] = acc;
    }
    HS_SYNC();
    u32 r = s[warp] + x - v;
    total = s[HS_MAX_WARPS];
    HS_SYNC();
    return r;
}

// ---------------------------------------------------------------------------------------------
// Remap (hisparse_core::ops::remap::remap)
// ---------------------------------------------------------------------------------------------

#define HS_REMAP_THREADS 256
// Block-table rows of at most this many blocks are staged in shared memory (16 KB).
#define HS_REMAP_SMEM_BLOCKS 4096
#define HS_REMAP_HAS_MAP 1u
#define HS_REMAP_COUNTS 2u
#define HS_REMAP_COMPACT 4u
// Look block-table entries up in global memory even where the row would be staged in shared
// memory. The results are identical; the CUDA backend sets it only to compare the two paths.
#define HS_REMAP_DIRECT 8u
// 16-byte top-k vectors a thread of hs_remap loads before it uses any (per pass over a row).
#define HS_REMAP_VECS 2u

#if defined(HS_VENDOR_CUDA)
// Read-only data path (data no thread writes during the launch).
#define HS_LDG(p) __ldg(p)
// Streaming load of data read once (first to leave the caches).
#define HS_LDCS(p) __ldcs(p)
// Launch bounds of hs_remap: 8 blocks of 256 threads per multiprocessor (at most 32 registers),
// so that a launch of up to 8 rows per multiprocessor runs as one wave.
#define HS_REMAP_BOUNDS __launch_bounds__(HS_REMAP_THREADS, 8)
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
#define HS_REMAP_BOUNDS HS_BOUNDS(HS_REMAP_THREADS)
#endif
#ifndef HS_GRID_DEP_WAIT
#define HS_GRID_DEP_WAIT() ((void)0)
#endif

struct hs_remap_ctx {
    const i32* bt; // block-table row, or 0 for padding
    u32 block_size, max_blocks, stride;
    u32 shift; // log2(block_size) when it is a power of two, else 32
};

HS_DEVICE i32 hs_remap_one(const hs_remap_ctx& c, i32 tok) {
    if (c.bt == 0 || tok < 0) return -1;
    u32 col, off;
    if (c.shift < 32) {
        col = (u32)tok >> c.shift;
        off = (u32)tok & (c.block_size - 1);
    } else {
        col = (u32)tok / c.block_size;
        off = (u32)tok % c.block_size;
    }
    if (col >= c.max_blocks) return -1;
    return hs_physical_row(c.bt[col], c.stride, off);
}

// hs_remap_v1: the first remap kernel, kept (not in the ABI table) so the CUDA backend can still
// measure it against hs_remap. Same parameters, flags (HS_REMAP_DIRECT is ignored) and launch
// shape as hs_remap, but the grid must be exactly (num_tokens).
HS_KERNEL HS_BOUNDS(HS_REMAP_THREADS) void hs_remap_v1(
    const i32* __restrict__ req_id, const i32* __restrict__ block_table,
    const i32* __restrict__ topk, const i32* __restrict__ idx_mapping, i32* __restrict__ out,
    i32* __restrict__ counts, u32 num_tokens, u32 top_k, u32 table_rows, u32 max_blocks,
    u32 block_size, u32 block_stride_rows, u32 idx_mapping_len, u32 flags) {
    HS_SHARED u32 s_scan[HS_MAX_WARPS + 1];
    HS_SHARED i32 s_bt[HS_REMAP_SMEM_BLOCKS];
    const u32 t = HS_BID_X;
    if (t >= num_tokens) return;
    const i32 req = req_id[t];
    i64 row = -1;
    if (req >= 0) {
        if (flags & HS_REMAP_HAS_MAP) {
            if ((u32)req < idx_mapping_len) {
                i32 m = idx_mapping[req];
                if (m >= 0 && (u32)m < table_rows) row = m;
            }
        } else if ((u32)req < table_rows) {
            row = req;
        }
    }
    hs_remap_ctx c;
    c.bt = row >= 0 ? block_table + (u64)row * max_blocks : 0;
    c.block_size = block_size;
    c.max_blocks = max_blocks;
    c.stride = block_stride_rows;
    c.shift = 32;
    if ((block_size & (block_size - 1)) == 0) {
        c.shift = 0;
        while ((1u << c.shift) < block_size) ++c.shift;
    }
    const i32* in = topk + (u64)t * top_k;
    i32* o = out + (u64)t * top_k;
    const uint4 none4 = make_uint4(HS_NONE, HS_NONE, HS_NONE, HS_NONE);

    // Fast path (no compaction, top_k a multiple of 4, at most two vectors per thread): the
    // thread's top-k vectors are loaded first, so they are in flight while the block-table row
    // is staged in shared memory (one coalesced read instead of top_k scattered ones).
    const bool fast = !(flags & HS_REMAP_COMPACT) && (top_k & 3u) == 0 && (top_k >> 2) <= 2 * HS_NTHREADS;
    uint4 fa = none4, fb = none4;
    if (fast) {
        const uint4* in4 = (const uint4*)in;
        if (HS_TID < (top_k >> 2)) fa = in4[HS_TID];
        if (HS_TID + HS_NTHREADS < (top_k >> 2)) fb = in4[HS_TID + HS_NTHREADS];
    }
    if (c.bt != 0 && max_blocks <= HS_REMAP_SMEM_BLOCKS) {
        for (u32 i0 = 0; i0 < max_blocks; i0 += 8 * HS_NTHREADS) {
            i32 v[8];
#pragma unroll
            for (u32 q = 0; q < 8; ++q) {
                const u32 i = i0 + q * HS_NTHREADS + HS_TID;
                v[q] = i < max_blocks ? c.bt[i] : 0;
            }
#pragma unroll
            for (u32 q = 0; q < 8; ++q) {
                const u32 i = i0 + q * HS_NTHREADS + HS_TID;
                if (i < max_blocks) s_bt[i] = v[q];
            }
        }
        HS_SYNC();
        c.bt = s_bt;
    }

    if (flags & HS_REMAP_COMPACT) {
        // Chunks of 4 consecutive entries per thread, block-wide ordered compaction.
        u32 written = 0;
        for (u32 base = 0; base < top_k; base += HS_NTHREADS * 4) {
            const u32 j0 = base + HS_TID * 4;
            i32 v[4];
            u32 n = 0;
#pragma unroll
            for (u32 q = 0; q < 4; ++q) {
                v[q] = j0 + q < top_k ? hs_remap_one(c, in[j0 + q]) : -1;
                n += v[q] != -1 ? 1u : 0u;
            }
            u32 total;
            u32 at = written + hs_block_scan(n, s_scan, total);
#pragma unroll
            for (u32 q = 0; q < 4; ++q) {
                if (v[q] != -1) o[at++] = v[q];
            }
            written += total;
        }
        for (u32 j = written + HS_TID; j < top_k; j += HS_NTHREADS) o[j] = -1;
        if ((flags & HS_REMAP_COUNTS) && HS_TID == 0) counts[t] = (i32)written;
        return;
    }

    u32 valid = 0;
    if (fast) {
        uint4* o4 = (uint4*)o;
        uint4 ra, rb;
        ra.x = (u32)hs_remap_one(c, (i32)fa.x);
        ra.y = (u32)hs_remap_one(c, (i32)fa.y);
        ra.z = (u32)hs_remap_one(c, (i32)fa.z);
        ra.w = (u32)hs_remap_one(c, (i32)fa.w);
        rb.x = (u32)hs_remap_one(c, (i32)fb.x);
        rb.y = (u32)hs_remap_one(c, (i32)fb.y);
        rb.z = (u32)hs_remap_one(c, (i32)fb.z);
        rb.w = (u32)hs_remap_one(c, (i32)fb.w);
        if (HS_TID < (top_k >> 2)) {
            valid += (ra.x != HS_NONE) + (ra.y != HS_NONE) + (ra.z != HS_NONE) + (ra.w != HS_NONE);
            o4[HS_TID] = ra;
        }
        if (HS_TID + HS_NTHREADS < (top_k >> 2)) {
            valid += (rb.x != HS_NONE) + (rb.y != HS_NONE) + (rb.z != HS_NONE) + (rb.w != HS_NONE);
            o4[HS_TID + HS_NTHREADS] = rb;
        }
    } else if ((top_k & 3u) == 0) {
        // 16-byte loads and stores; two independent vectors in flight per thread.
        const uint4* in4 = (const uint4*)in;
        uint4* o4 = (uint4*)o;
        const u32 n4 = top_k >> 2;
        for (u32 i = HS_TID; i < n4; i += 2 * HS_NTHREADS) {
            const u32 i2 = i + HS_NTHREADS;
            const bool two = i2 < n4;
            const uint4 a = in4[i];
            const uint4 b = two ? in4[i2] : none4;
            uint4 ra, rb;
            ra.x = (u32)hs_remap_one(c, (i32)a.x);
            ra.y = (u32)hs_remap_one(c, (i32)a.y);
            ra.z = (u32)hs_remap_one(c, (i32)a.z);
            ra.w = (u32)hs_remap_one(c, (i32)a.w);
            rb.x = (u32)hs_remap_one(c, (i32)b.x);
            rb.y = (u32)hs_remap_one(c, (i32)b.y);
            rb.z = (u32)hs_remap_one(c, (i32)b.z);
            rb.w = (u32)hs_remap_one(c, (i32)b.w);
            valid += (ra.x != HS_NONE) + (ra.y != HS_NONE) + (ra.z != HS_NONE) + (ra.w != HS_NONE);
            o4[i] = ra;
            if (two) {
                valid += (rb.x != HS_NONE) + (rb.y != HS_NONE) + (rb.z != HS_NONE) + (rb.w != HS_NONE);
                o4[i2] = rb;
            }
        }
    } else {
        for (u32 j = HS_TID; j < top_k; j += HS_NTHREADS) {
            i32 v = hs_remap_one(c, in[j]);
            o[j] = v;
            valid += v != -1 ? 1u : 0u;
        }
    }
    if (flags & HS_REMAP_COUNTS) {
        u32 total;
        hs_block_scan(valid, s_scan, total);
        if (HS_TID == 0) counts[t] = (i32)total;
    }
}

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

// Output of top-k entry `tok` against the (non-null) table row `bt`, which lives in shared
// memory, or in global memory (read-only path) when GLOBAL.
template <bool GLOBAL>
HS_DEVICE i32 hs_remap_entry(const hs_remap_geo& g, const i32* bt, i32 tok) {
    if (tok < 0) return -1;
    u32 col, off;
    if (g.shift < 32) {
        col = (u32)tok >> g.shift;
        off = (u32)tok & (g.block_size - 1);
    } else {
        col = (u32)tok / g.block_size;
        off = (u32)tok % g.block_size;
    }
    if (col >= g.max_blocks) return -1;
    return hs_physical_row(GLOBAL ? HS_LDG(bt + col) : bt[col], g.stride, off);
}

template <bool GLOBAL>
HS_DEVICE uint4 hs_remap_vec(const hs_remap_geo& g, const i32* bt, uint4 a, u32& valid) {
    uint4 r;
    r.x = (u32)hs_remap_entry<GLOBAL>(g, bt, (i32)a.x);
    r.y = (u32)hs_remap_entry<GLOBAL>(g, bt, (i32)a.y);
    r.z = (u32)hs_remap_entry<GLOBAL>(g, bt, (i32)a.z);
    r.w = (u32)hs_remap_entry<GLOBAL>(g, bt, (i32)a.w);
    valid += (u32)(r.x != HS_NONE) + (u32)(r.y != HS_NONE) + (u32)(r.z != HS_NONE) + (u32)(r.w != HS_NONE);
    return r;
}

// The vector pass loop of one row: `a` holds the first pass's top-k vectors.
template <bool GLOBAL>
HS_DEVICE u32 hs_remap_row_vec(const hs_remap_geo& g, const i32* bt, uint4* a, const uint4* in4,
                               uint4* o4, u32 n4) {
    u32 valid = 0;
    for (u32 base = 0;;) {
#pragma unroll
        for (u32 q = 0; q < HS_REMAP_VECS; ++q) {
            const u32 i = base + q * HS_NTHREADS + HS_TID;
            if (i < n4) o4[i] = hs_remap_vec<GLOBAL>(g, bt, a[q], valid);
        }
        base += HS_REMAP_VECS * HS_NTHREADS;
        if (base >= n4) return valid;
#pragma unroll
        for (u32 q = 0; q < HS_REMAP_VECS; ++q) {
            const u32 i = base + q * HS_NTHREADS + HS_TID;
            if (i < n4) a[q] = HS_LDCS(in4 + i);
        }
    }
}

// A padding row: every output -1.
HS_DEVICE void hs_remap_row_none(uint4* o4, u32 n4) {
    const uint4 none4 = make_uint4(HS_NONE, HS_NONE, HS_NONE, HS_NONE);
    for (u32 i = HS_TID; i < n4; i += HS_NTHREADS) o4[i] = none4;
}

// Copies table row `bt` (m entries) to shared memory `s`: 16-byte loads when rows are 16-byte
// aligned (m % 4 == 0; the table itself starts 16-byte aligned), every load of a step issued
// before the first store.
HS_DEVICE void hs_remap_stage(const i32* bt, u32 m, i32* s) {
    if ((m & 3u) == 0) {
        const uint4* b4 = (const uint4*)bt;
        uint4* s4 = (uint4*)s;
        const u32 m4 = m >> 2;
#if defined(HS_VENDOR_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        // Asynchronous copies global -> shared (L2 only): no registers held while they fly.
        for (u32 i = HS_TID; i < m4; i += HS_NTHREADS) {
            const u32 d = (u32)__cvta_generic_to_shared(s4 + i);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(b4 + i) : "memory");
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
#else
        for (u32 i0 = 0; i0 < m4; i0 += 2 * HS_NTHREADS) {
            const u32 i = i0 + HS_TID, i2 = i + HS_NTHREADS;
            uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0;
            if (i < m4) v0 = HS_LDG(b4 + i);
            if (i2 < m4) v1 = HS_LDG(b4 + i2);
            if (i < m4) s4[i] = v0;
            if (i2 < m4) s4[i2] = v1;
        }
#endif
    } else {
        for (u32 i0 = 0; i0 < m; i0 += 8 * HS_NTHREADS) {
            i32 v[8];
#pragma unroll
            for (u32 q = 0; q < 8; ++q) {
                const u32 i = i0 + q * HS_NTHREADS + HS_TID;
                v[q] = i < m ? HS_LDG(bt + i) : 0;
            }
#pragma unroll
            for (u32 q = 0; q < 8; ++q) {
                const u32 i = i0 + q * HS_NTHREADS + HS_TID;
                if (i < m) s[i] = v[q];
            }
        }
    }
}

// Launch: grid (any size; the host uses num_tokens), block (HS_REMAP_THREADS, or any multiple
// of the warp up to it). Blocks take token rows grid-stride. `idx_mapping` and `counts` may be
// null when the matching flag is clear.
//
// Per row: the first pass's top-k vectors (HS_REMAP_VECS 16-byte loads per thread, when top_k is
// a multiple of 4) are requested first, since they do not depend on the table; then the request's
// table row is resolved and, when it fits and is not much longer than the row's top-k, staged in
// shared memory with 16-byte loads (one coalesced read instead of top_k scattered ones); then the
// outputs are written with 16-byte stores. Compaction keeps a block-wide ordered scan.
HS_KERNEL HS_REMAP_BOUNDS void hs_remap(
    const i32* __restrict__ req_id, const i32* __restrict__ block_table,
    const i32* __restrict__ topk, const i32* __restrict__ idx_mapping, i32* __restrict__ out,
    i32* __restrict__ counts, u32 num_tokens, u32 top_k, u32 table_rows, u32 max_blocks,
    u32 block_size, u32 block_stride_rows, u32 idx_mapping_len, u32 flags) {
    HS_SHARED u32 s_scan[HS_MAX_WARPS + 1];
    HS_SHARED uint4 s_bt4[HS_REMAP_SMEM_BLOCKS / 4];
    i32* const s_bt = (i32*)s_bt4;
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
    const bool vec = !compact && (top_k & 3u) == 0;
    const bool may_stage = !(flags & HS_REMAP_DIRECT) && max_blocks <= HS_REMAP_SMEM_BLOCKS &&
                           (u64)max_blocks <= 8ull * top_k;
    const u32 n4 = top_k >> 2;
    const uint4 none4 = make_uint4(HS_NONE, HS_NONE, HS_NONE, HS_NONE);

    for (u32 t = HS_BID_X; t < num_tokens; t += HS_NBLOCKS_X) {
        const i32* in = topk + (u64)t * top_k;
        i32* o = out + (u64)t * top_k;
        const uint4* in4 = (const uint4*)in;
        uint4* o4 = (uint4*)o;
        uint4 a[HS_REMAP_VECS];
#pragma unroll
        for (u32 q = 0; q < HS_REMAP_VECS; ++q) {
            const u32 i = q * HS_NTHREADS + HS_TID;
            a[q] = none4;
            if (vec && i < n4) a[q] = HS_LDCS(in4 + i);
        }
        const i32* bt = hs_remap_table_row(HS_LDG(req_id + t), block_table, idx_mapping, table_rows,
                                           max_blocks, idx_mapping_len, flags);
        const bool staged = bt != 0 && may_stage; // uniform over the block
        if (staged) {
            if (t != HS_BID_X) HS_SYNC(); // the previous row's lookups are done
            hs_remap_stage(bt, max_blocks, s_bt);
            HS_SYNC();
        }
        u32 valid = 0;
        if (compact) {
            // Chunks of 4 consecutive entries per thread, block-wide ordered compaction.
            u32 written = 0;
            for (u32 base = 0; base < top_k; base += HS_NTHREADS * 4) {
                const u32 j0 = base + HS_TID * 4;
                i32 v[4];
                u32 n = 0;
#pragma unroll
                for (u32 q = 0; q < 4; ++q) {
                    v[q] = -1;
                    if (j0 + q < top_k && bt != 0) {
                        v[q] = staged ? hs_remap_entry<false>(g, s_bt, in[j0 + q])
                                      : hs_remap_entry<true>(g, bt, in[j0 + q]);
                    }
                    n += v[q] != -1 ? 1u : 0u;
                }
                u32 total;
                u32 at = written + hs_block_scan(n, s_scan, total);
#pragma unroll
                for (u32 q = 0; q < 4; ++q) {
                    if (v[q] != -1) o[at++] = v[q];
                }
                written += total;
            }
            for (u32 j = written + HS_TID; j < top_k; j += HS_NTHREADS) o[j] = -1;
            if ((flags & HS_REMAP_COUNTS) && HS_TID == 0) counts[t] = (i32)written;
            continue;
        }
        if (vec) {
            if (staged) valid = hs_remap_row_vec<false>(g, s_bt, a, in4, o4, n4);
            else if (bt != 0) valid = hs_remap_row_vec<true>(g, bt, a, in4, o4, n4);
            else hs_remap_row_none(o4, n4);
        } else {
            for (u32 j = HS_TID; j < top_k; j += HS_NTHREADS) {
                i32 v = -1;
                if (staged) v = hs_remap_entry<false>(g, s_bt, in[j]);
                else if (bt != 0) v = hs_remap_entry<true>(g, bt, in[j]);
                o[j] = v;
                valid += v != -1 ? 1u : 0u;
            }
        }
        if (flags & HS_REMAP_COUNTS) {
            u32 total;
            hs_block_scan(valid, s_scan, total);
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

#define HS_RESOLVE_THREADS 512
#define HS_RESOLVE_ITEMS 4
#define HS_RESOLVE_GLOBAL_STATE 0x80000000u

struct hs_resolve_desc {
    u32 num_tokens, top_k, num_requests, max_pages, block_size, hot_slots,
        attention_block_stride, host_num_blocks;
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

HS_DEVICE void hs_insert(hs_wanted* table, u32 mask, i32 g, u32 entry) {
    u32 h = hs_hash(g, mask);
    for (;;) {
        i32 prev = atomicCAS(&table[h].key, HS_EMPTY_KEY, g);
        if (prev == HS_EMPTY_KEY || prev == g) {
            atomicMin(&table[h].first_entry, entry);
            return;
        }
        h = (h + 1) & mask;
    }
}

// Step 2: 0 = invalid, 1 = resident (value = physical row), 2 = host (value = flat host row g).
HS_DEVICE u32 hs_classify(const hs_resolve_desc& d, const i32* resident_table, const i32* host_table,
                          u32 r, i32 tok, i32& value) {
    if (tok < 0) return 0;
    u32 page = (u32)tok / d.block_size;
    if (page >= d.max_pages) return 0;
    u32 off = (u32)tok % d.block_size;
    u64 at = (u64)r * d.max_pages + page;
    i32 res = resident_table[at];
    if (res > 0) {
        value = hs_physical_row(res, d.attention_block_stride, off);
        return value == -1 ? 0u : 1u;
    }
    value = hs_physical_row(host_table[at], d.block_size, off);
    return value == -1 ? 0u : 2u;
}

HS_DEVICE i32 hs_hot_row(const hs_resolve_desc& d, const i32* hot_table, u32 r, u32 slot) {
    u32 w = (d.hot_slots + d.block_size - 1) / d.block_size;
    i32 block = hot_table[(u64)r * w + slot / d.block_size];
    return hs_physical_row(block, d.attention_block_stride, slot % d.block_size);
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
    HS_SHARED u32 s_scan[HS_MAX_WARPS + 1];
    HS_SHARED u32 s_flag, s_rows, s_any_host, s_corrupt, s_count, s_table_off;

    hs_resolve_desc d;
    d.num_tokens = num_tokens;
    d.top_k = top_k;
    d.num_requests = num_requests;
    d.max_pages = max_pages;
    d.block_size = block_size;
    d.hot_slots = hot_slots;
    d.attention_block_stride = attention_block_stride;
    d.host_num_blocks = host_num_blocks;

    const u32 t = HS_BID_X;
    if (t >= num_tokens) return;
    const u32 K = top_k, N = hot_slots;
    const i32 req = req_id[t];

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
        if (req_id[t2] == req) atomicOr(&s_flag, 1u);
    for (u32 t2 = t + HS_TID; t2 < num_tokens; t2 += HS_NTHREADS)
        if (req_id[t2] == req) atomicAdd(&s_rows, 1u);
    HS_SYNC();
    if (s_flag) return;
    const u32 entries = s_rows * K;

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
    HS_SYNC();

    // Steps 2-3: classify every entry, insert host rows with their first appearance; reset the
    // plan and counts of every row.
    {
        u32 ord = 0;
        for (u32 t2 = t; t2 < num_tokens; ++t2) {
            if (req_id[t2] != req) continue;
            const u64 base = (u64)t2 * K;
            bool any = false;
            for (u32 j = HS_TID; j < K; j += HS_NTHREADS) {
                i32 v;
                if (hs_classify(d, resident_table, host_table, r, topk[base + j], v) == 2) {
                    hs_insert(table, mask, v, ord * K + j);
                    any = true;
                }
                miss_src[base + j] = -1;
                miss_dst[base + j] = -1;
            }
            if (any) atomicOr(&s_any_host, 1u);
            if (HS_TID == 0) {
                hit_counts[t2] = 0;
                miss_counts[t2] = 0;
            }
            ++ord;
        }
    }
    HS_SYNC();

    const u64 sbase = (u64)r * N;
    if (s_any_host) {
        // Step 4: the LRU must be a permutation of 0..N; otherwise reset it and the dgi row.
        for (u32 i = HS_TID; i < (N + 31) / 32; i += HS_NTHREADS) s_bits[i] = 0;
        HS_SYNC();
        for (u32 p = HS_TID; p < N; p += HS_NTHREADS) {
            u32 s = lru[sbase + p];
            s_lru[p] = (u16)s;
            if (s >= N) {
                atomicOr(&s_corrupt, 1u);
            } else {
                u32 bit = 1u << (s & 31u);
                if (atomicOr(&s_bits[s >> 5], bit) & bit) atomicOr(&s_corrupt, 1u);
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
        if (!corrupt) {
            for (u32 p = HS_TID; p < N; p += HS_NTHREADS) {
                i32 c = dgi[sbase + s_lru[p]];
                if (c >= 0 && (i64)c < host_rows) {
                    u32 h = hs_lookup(table, mask, c);
                    if (h != HS_NONE) atomicMin(&table[h].first_lru, p);
                }
            }
        }
        HS_SYNC();

        // Step 5b: split LRU positions into hits (old order, stored from the end of s_part) and
        // evictables (old order, stored from the front): evictable rank e at s_part[e], hit rank
        // h at s_part[N - 1 - h].
        u32 hits_before = 0;
        for (u32 base = 0; base < N; base += HS_NTHREADS * HS_RESOLVE_ITEMS) {
            const u32 p0 = base + HS_TID * HS_RESOLVE_ITEMS;
            u32 hit_slot[HS_RESOLVE_ITEMS];
            u32 nh = 0;
#pragma unroll
            for (u32 q = 0; q < HS_RESOLVE_ITEMS; ++q) {
                hit_slot[q] = HS_NONE;
                const u32 p = p0 + q;
                if (p < N && !corrupt) {
                    i32 c = dgi[sbase + s_lru[p]];
                    if (c >= 0 && (i64)c < host_rows) {
                        u32 h = hs_lookup(table, mask, c);
                        if (h != HS_NONE && table[h].first_lru == p) {
                            hit_slot[q] = h;
                            ++nh;
                        }
                    }
                }
            }
            u32 total;
            u32 hr = hits_before + hs_block_scan(nh, s_scan, total);
#pragma unroll
            for (u32 q = 0; q < HS_RESOLVE_ITEMS; ++q) {
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
            for (u32 t2 = t; t2 < num_tokens; ++t2) {
                if (req_id[t2] != req) continue;
                const u64 base = (u64)t2 * K;
                const u32 row_base = misses;
                if (HS_TID == 0) s_count = 0;
                HS_SYNC();
                u32 row_hits = 0;
                for (u32 jb = 0; jb < K; jb += HS_NTHREADS * HS_RESOLVE_ITEMS) {
                    const u32 j0 = jb + HS_TID * HS_RESOLVE_ITEMS;
                    u32 miss_h[HS_RESOLVE_ITEMS];
                    i32 miss_g[HS_RESOLVE_ITEMS];
                    u32 nm = 0;
#pragma unroll
                    for (u32 q = 0; q < HS_RESOLVE_ITEMS; ++q) {
                        miss_h[q] = HS_NONE;
                        miss_g[q] = -1;
                        const u32 j = j0 + q;
                        i32 g;
                        if (j < K && hs_classify(d, resident_table, host_table, r, topk[base + j], g) == 2) {
                            u32 h = hs_lookup(table, mask, g);
                            if (table[h].first_entry == ord * K + j) {
                                if (table[h].slot != HS_NONE) {
                                    ++row_hits;
                                } else {
                                    miss_h[q] = h;
                                    miss_g[q] = g;
                                    ++nm;
                                }
                            }
                        }
                    }
                    u32 total;
                    u32 m = misses + hs_block_scan(nm, s_scan, total);
#pragma unroll
                    for (u32 q = 0; q < HS_RESOLVE_ITEMS; ++q) {
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
                if (row_hits) atomicAdd(&s_count, row_hits);
                HS_SYNC();
                if (HS_TID == 0) {
                    hit_counts[t2] = (i32)s_count;
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
    for (u32 t2 = t; t2 < num_tokens; ++t2) {
        if (req_id[t2] != req) continue;
        const u64 base = (u64)t2 * K;
        if (HS_TID == 0) s_count = 0;
        HS_SYNC();
        u32 valid = 0;
        for (u32 j = HS_TID; j < K; j += HS_NTHREADS) {
            i32 v;
            u32 kind = hs_classify(d, resident_table, host_table, r, topk[base + j], v);
            i32 out = -1;
            if (kind == 1) {
                out = v;
            } else if (kind == 2) {
                u32 s = table[hs_lookup(table, mask, v)].slot;
                if (s != HS_NONE) out = hs_hot_row(d, hot_table, r, s);
            }
            indices[base + j] = out;
            valid += out != -1 ? 1u : 0u;
        }
        if (valid) atomicAdd(&s_count, valid);
        HS_SYNC();
        if (HS_TID == 0) valid_counts[t2] = (i32)s_count;
        HS_SYNC();
    }
}

// ---------------------------------------------------------------------------------------------
// Gather of a miss plan (hisparse_core::ops::copy::gather_rows)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (ceil(top_k / HS_GATHER_ROWS), num_tokens, layers.count), block
// (HS_GATHER_THREADS). Block (x, t, l) copies plan entries [x * HS_GATHER_ROWS, ...) of token row
// t into layer l: all rows' 16-byte chunks are spread over the block's threads, each thread
// issuing up to HS_GATHER_UNROLL independent loads before its stores (the host pool is mapped
// pinned memory read across the bus, so many loads must be in flight).

#define HS_GATHER_THREADS 128
#define HS_GATHER_ROWS 16
#define HS_GATHER_UNROLL 8

// hs_gather_rows accepts any grid x (the host uses ceil(top_k / HS_GATHER_ROWS)): block x takes
// the ceil(top_k / grid x) entries from x * that, in chunks of HS_GATHER_ROWS. The first chunk's
// plan entries are requested together with the row's count (entries up to top_k are always in
// the plan buffers), so the host loads start one round trip earlier.
HS_KERNEL HS_BOUNDS(HS_GATHER_THREADS) void hs_gather_rows(
    const i32* __restrict__ plan_src, const i32* __restrict__ plan_dst,
    const i32* __restrict__ plan_counts, const u8* __restrict__ host, u8* __restrict__ device,
    u32 num_tokens, u32 top_k, hs_gather_layers layers) {
    HS_SHARED u64 s_src_v[HS_GATHER_ROWS], s_src_s[HS_GATHER_ROWS];
    HS_SHARED u64 s_dst_v[HS_GATHER_ROWS], s_dst_s[HS_GATHER_ROWS];
    HS_SHARED u32 s_flags[HS_GATHER_ROWS]; // bit0: copy (else zero-fill), bit1: skip
    HS_GRID_DEP_WAIT(); // before any global memory access

    const u32 t = HS_BID_Y;
    if (t >= num_tokens || HS_BID_Z >= layers.count) return;
    const u32 per = top_k / HS_NBLOCKS_X + (top_k % HS_NBLOCKS_X != 0 ? 1u : 0u);
    const u64 lo64 = (u64)HS_BID_X * per;
    if (lo64 >= top_k) return;
    const u32 lo = (u32)lo64;
    const u32 end_k = top_k - lo < per ? top_k : lo + per;
    const u64 prow = (u64)t * top_k;
    i32 ps = -1, pd = -1;
    if (HS_TID < HS_GATHER_ROWS && lo + HS_TID < end_k) {
        ps = HS_LDG(plan_src + prow + lo + HS_TID);
        pd = HS_LDG(plan_dst + prow + lo + HS_TID);
    }
    const i32 cnt = HS_LDG(plan_counts + t);
    const u32 n = cnt < 0 ? 0u : ((u32)cnt > top_k ? top_k : (u32)cnt);
    const u32 hi = end_k < n ? end_k : n;
    if (lo >= hi) return;
    const hs_layer_pair L = layers.layer[HS_BID_Z];
    const u32 cpr = L.host.row_bytes >> 4;
    const u32 vc = L.host.value_bytes >> 4;

    for (u32 j0 = lo; j0 < hi; j0 += HS_GATHER_ROWS) {
        const u32 rows = hi - j0 < HS_GATHER_ROWS ? hi - j0 : HS_GATHER_ROWS;
        if (j0 != lo) {
            HS_SYNC(); // the previous chunk's copies have read the row table
            if (HS_TID < rows) {
                ps = HS_LDG(plan_src + prow + j0 + HS_TID);
                pd = HS_LDG(plan_dst + prow + j0 + HS_TID);
            }
        }
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

// hs_gather_rows_v1: the first gather kernel, kept (not in the ABI table) so the CUDA backend can
// still measure it against hs_gather_rows. Same parameters; the grid must be exactly
// (ceil(top_k / HS_GATHER_ROWS), num_tokens, layers.count).
HS_KERNEL HS_BOUNDS(HS_GATHER_THREADS) void hs_gather_rows_v1(
    const i32* __restrict__ plan_src, const i32* __restrict__ plan_dst,
    const i32* __restrict__ plan_counts, const u8* __restrict__ host, u8* __restrict__ device,
    u32 num_tokens, u32 top_k, hs_gather_layers layers) {
    HS_SHARED u64 s_src_v[HS_GATHER_ROWS], s_src_s[HS_GATHER_ROWS];
    HS_SHARED u64 s_dst_v[HS_GATHER_ROWS], s_dst_s[HS_GATHER_ROWS];
    HS_SHARED u32 s_flags[HS_GATHER_ROWS]; // bit0: copy (else zero-fill), bit1: skip

    const u32 t = HS_BID_Y;
    if (t >= num_tokens || HS_BID_Z >= layers.count) return;
    i32 cnt = plan_counts[t];
    const u32 n = cnt < 0 ? 0u : ((u32)cnt > top_k ? top_k : (u32)cnt);
    const u32 j0 = HS_BID_X * HS_GATHER_ROWS;
    if (j0 >= n) return;
    const u32 rows = n - j0 < HS_GATHER_ROWS ? n - j0 : HS_GATHER_ROWS;
    const hs_layer_pair L = layers.layer[HS_BID_Z];

    if (HS_TID < rows) {
        const u64 at = (u64)t * top_k + j0 + HS_TID;
        u32 db, doff, sb, soff;
        u32 f = 0;
        if (!hs_locate(L.device, plan_dst[at], db, doff)) {
            f = 2;
        } else {
            hs_row_parts(L.device, db, doff, s_dst_v[HS_TID], s_dst_s[HS_TID]);
            if (hs_locate(L.host, plan_src[at], sb, soff)) {
                hs_row_parts(L.host, sb, soff, s_src_v[HS_TID], s_src_s[HS_TID]);
                f = 1;
            }
        }
        s_flags[HS_TID] = f;
    }
    HS_SYNC();

    const u32 cpr = L.host.row_bytes >> 4;
    const u32 vc = L.host.value_bytes >> 4;
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
