// HiSparse data-plane kernels: ONE source for CUDA and HIP, in parts (one per operation family)
// concatenated in the order gpu-kernels/src/lib.rs gives; this first part holds what every other
// part uses.
//
// A vendor prelude (vendor_cuda.h or vendor_hip.h) is prepended; it defines the HS_* macros used
// here (kernel qualifiers, thread/block indices, barrier, warp shuffle, shared memory). The source
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
// row's counts are final, and one block adds the call. Page bases and strides and every row's
// value part are multiples of 16 bytes, and a split row's scale part a multiple of 4 (checked by
// the host's planner, gpu-kernels/src/plan/):
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
    // A select, not a branch: the remap's lookups run this on their dependent chain. Unsigned
    // (a block >= 0 is its u32 value; below 2^31 * 2^32 + 2^32 nothing wraps): one wide
    // multiply-add and a test of the high word, no sign extension.
    const u64 row = (u64)(u32)block * stride_rows + offset;
    return block >= 0 && row <= (u64)HS_I32_MAX ? (i32)row : -1;
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

// The sum of `v` over the lanes of the calling warp, known to every lane: one instruction where
// the vendor prelude defines HS_WARP_SUM (CUDA), else a warp scan's last lane.
HS_DEVICE u32 hs_warp_sum(u32 v) {
#if defined(HS_WARP_SUM)
    return HS_WARP_SUM(v);
#else
    return HS_SHFL_U32(hs_warp_inclusive(v), HS_WARP - 1u);
#endif
}

// The block's sum of every thread's `n`, known to every thread, in one barrier: each warp's sum
// into one shared word, then each warp sums the words. `s` and `phase` as hs_block_scan1's (the
// same halves, so calls of the two may alternate). For a sum of several bits a thread this is
// one barrier where hs_block_sum_small's counting barriers are one a bit (the remap's decode
// path sums its rows' counts this way; docs/PERF.md, "The remap").
HS_DEVICE u32 hs_block_sum(u32 n, u32* s, u32 phase) {
    const u32 lane = HS_TID % HS_WARP, warp = HS_TID / HS_WARP, nw = HS_NTHREADS / HS_WARP;
    u32* t = s + (phase & 1u) * HS_MAX_WARPS;
    const u32 w = hs_warp_sum(n);
    if (lane == 0) t[warp] = w;
    HS_SYNC();
    return hs_warp_sum(lane < nw ? t[lane] : 0u);
}

// The block's sum of every thread's `n` (each at most `max_n`, uniform over the block), known to
// every thread. With a counting barrier (HS_SYNC_COUNT: one instruction on CUDA) it is one of
// them per bit of max_n, with no shared memory, shuffle or atomic; elsewhere (HIP)
// hs_block_scan1's total (`s_scan` and `phase` as there).
HS_DEVICE u32 hs_block_sum_small(u32 n, u32 max_n, u32* s_scan, u32 phase) {
#if defined(HS_SYNC_COUNT)
    (void)s_scan;
    (void)phase;
    const u32 bits = 32u - (u32)HS_CLZ(max_n);
    u32 total = 0;
    for (u32 b = 0; b < bits; ++b) total += HS_SYNC_COUNT(((n >> b) & 1u) != 0) << b;
    return total;
#else
    (void)max_n;
    u32 total;
    hs_block_scan1(n, s_scan, phase, total);
    return total;
#endif
}

// log2(x) when x is a power of two, else 32 (the "no shift" marker of the kernels' geometry:
// a shift and a mask instead of a division).
HS_DEVICE u32 hs_pow2_shift(u32 x) {
    return x != 0 && (x & (x - 1)) == 0 ? 31u - (u32)HS_CLZ(x) : 32u;
}

