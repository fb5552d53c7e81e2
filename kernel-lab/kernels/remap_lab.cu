// Remap experiments of the CUDA kernel lab (never part of a published crate): decode-size remaps
// stripped to what one geometry needs (block size a power of two, state-row order, no
// idx_mapping), each measured beside the production hs_remap / hs_remap_wide on the same inputs
// to see what the production kernels' dependent chain pays for. Same outputs as the production
// plain remap (and, for the counting kernels, its valid counts). Plain CUDA; NVRTC at run time.
//
// Every kernel: req_id[rows], table[table_rows][max_blocks], topk[rows][top_k] in, out[rows][top_k]
// (and counts[rows]) out; `stats` (null: none) word 0 gets the valid entries, word 1 the call.

typedef unsigned int u32;
typedef unsigned long long u64;

// NC: loads through the read-only path (ld.global.nc, as the production kernels); else plain
// ld.global.
template <bool NC>
__device__ __forceinline__ int lab_load(const int* p) {
    if (NC) return __ldg(p);
    return *p;
}

template <bool NC>
__device__ __forceinline__ uint4 lab_load4(const int* p) {
    if (NC) return __ldg((const uint4*)p);
    return *(const uint4*)p;
}

// One entry: the physical row of `tok` through table row `bt` (null: padding), or -1.
template <bool NC>
__device__ __forceinline__ int lab_row(const int* bt, int tok, u32 shift, u32 max_blocks,
                                       u32 stride) {
    const u32 col = (u32)tok >> shift, off = (u32)tok & ((1u << shift) - 1u);
    const bool look = bt != 0 && tok >= 0 && col < max_blocks;
    const int blk = look ? lab_load<NC>(bt + col) : -1;
    const u64 row = (u64)(u32)blk * stride + off;
    return blk >= 0 && row <= 0x7fffffffull ? (int)row : -1;
}

__device__ __forceinline__ const int* lab_table_row(const int* table, int req, u32 table_rows,
                                                    u32 max_blocks) {
    return req >= 0 && (u32)req < table_rows ? table + (u64)(u32)req * max_blocks : 0;
}

// Plain, one entry a thread, grid (top_k / blockDim.x, rows). STATS 0: none; 1: a counting
// barrier and one atomic a block (the production scheme); 2: one atomic a warp after a warp sum.
template <bool NC, int STATS>
__device__ __forceinline__ void lab_wide(const int* __restrict__ req_id,
                                         const int* __restrict__ table,
                                         const int* __restrict__ topk, int* __restrict__ out,
                                         u32* __restrict__ stats, u32 top_k, u32 table_rows,
                                         u32 max_blocks, u32 shift, u32 stride) {
    const u32 t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    u32 valid = 0;
    if (j < top_k) {
        const int req = lab_load<NC>(req_id + t);
        const int tok = lab_load<NC>(topk + (u64)t * top_k + j);
        const int row = lab_row<NC>(lab_table_row(table, req, table_rows, max_blocks), tok, shift,
                                    max_blocks, stride);
        out[(u64)t * top_k + j] = row;
        valid = row != -1 ? 1u : 0u;
    }
    if (STATS == 1 && stats != 0) {
        const u32 n = (u32)__syncthreads_count(valid != 0);
        if (threadIdx.x == 0) {
            if (n != 0) atomicAdd(stats, n);
            if (blockIdx.x == 0 && blockIdx.y == 0) atomicAdd(stats + 1, 1u);
        }
    }
    if (STATS == 2 && stats != 0) {
        const u32 n = __reduce_add_sync(0xffffffffu, valid);
        if ((threadIdx.x & 31u) == 0) {
            if (n != 0) atomicAdd(stats, n);
            if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) atomicAdd(stats + 1, 1u);
        }
    }
}

#define LAB_WIDE(name, NC, STATS)                                                                  \
    extern "C" __global__ void __launch_bounds__(256) name(                                       \
        const int* req_id, const int* table, const int* topk, int* out, u32* stats, u32 top_k,   \
        u32 table_rows, u32 max_blocks, u32 shift, u32 stride) {                                   \
        lab_wide<NC, STATS>(req_id, table, topk, out, stats, top_k, table_rows, max_blocks, shift, \
                            stride);                                                               \
    }
LAB_WIDE(lab_wide_nc, true, 0)
LAB_WIDE(lab_wide_ld, false, 0)
LAB_WIDE(lab_wide_nc_stats_block, true, 1)
LAB_WIDE(lab_wide_ld_stats_block, false, 1)
LAB_WIDE(lab_wide_ld_stats_warp, false, 2)

// With counts: one block a row of blockDim.x threads, V 16-byte vectors a thread (the vectors
// at j, j + span, ..., span = 4 * blockDim.x), their loads in flight together; the row's count
// a warp sum, one shared word a warp, one barrier, warp 0's sum; stats as STATS 1 above (one
// atomic a block).
template <bool NC, int V>
__device__ __forceinline__ void lab_counts(const int* __restrict__ req_id,
                                           const int* __restrict__ table,
                                           const int* __restrict__ topk, int* __restrict__ out,
                                           int* __restrict__ counts, u32* __restrict__ stats,
                                           u32 top_k, u32 table_rows, u32 max_blocks, u32 shift,
                                           u32 stride) {
    __shared__ u32 s_warp[32];
    const u32 t = blockIdx.x, span = 4u * blockDim.x;
    const int req = lab_load<NC>(req_id + t);
    const int* in = topk + (u64)t * top_k;
    uint4 v[V];
#pragma unroll
    for (int q = 0; q < V; ++q) {
        const u32 j = 4u * threadIdx.x + (u32)q * span;
        v[q] = j < top_k ? lab_load4<NC>(in + j) : make_uint4(~0u, ~0u, ~0u, ~0u);
    }
    const int* bt = lab_table_row(table, req, table_rows, max_blocks);
    u32 valid = 0;
    int r[V][4];
#pragma unroll
    for (int q = 0; q < V; ++q) {
        r[q][0] = lab_row<NC>(bt, (int)v[q].x, shift, max_blocks, stride);
        r[q][1] = lab_row<NC>(bt, (int)v[q].y, shift, max_blocks, stride);
        r[q][2] = lab_row<NC>(bt, (int)v[q].z, shift, max_blocks, stride);
        r[q][3] = lab_row<NC>(bt, (int)v[q].w, shift, max_blocks, stride);
    }
#pragma unroll
    for (int q = 0; q < V; ++q) {
        const u32 j = 4u * threadIdx.x + (u32)q * span;
        if (j < top_k)
            *(uint4*)(out + (u64)t * top_k + j) =
                make_uint4((u32)r[q][0], (u32)r[q][1], (u32)r[q][2], (u32)r[q][3]);
#pragma unroll
        for (int e = 0; e < 4; ++e) valid += (j < top_k && r[q][e] != -1) ? 1u : 0u;
    }
    const u32 w = __reduce_add_sync(0xffffffffu, valid);
    if ((threadIdx.x & 31u) == 0) s_warp[threadIdx.x >> 5] = w;
    __syncthreads();
    if (threadIdx.x < 32) {
        const u32 warps = blockDim.x >> 5;
        const u32 total = __reduce_add_sync(0xffffffffu, threadIdx.x < warps ? s_warp[threadIdx.x] : 0u);
        if (threadIdx.x == 0) {
            counts[t] = (int)total;
            if (stats != 0) {
                if (total != 0) atomicAdd(stats, total);
                if (t == 0) atomicAdd(stats + 1, 1u);
            }
        }
    }
}

#define LAB_COUNTS(name, NC, V)                                                                    \
    extern "C" __global__ void __launch_bounds__(1024) name(                                      \
        const int* req_id, const int* table, const int* topk, int* out, int* counts, u32* stats,  \
        u32 top_k, u32 table_rows, u32 max_blocks, u32 shift, u32 stride) {                        \
        lab_counts<NC, V>(req_id, table, topk, out, counts, stats, top_k, table_rows, max_blocks,  \
                          shift, stride);                                                          \
    }
LAB_COUNTS(lab_counts_nc_v1, true, 1)
LAB_COUNTS(lab_counts_ld_v1, false, 1)
LAB_COUNTS(lab_counts_ld_v2, false, 2)
