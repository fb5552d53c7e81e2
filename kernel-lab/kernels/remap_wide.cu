// An experiment of the kernel lab (never part of a published crate): the plain remap with one
// top-k entry per thread, to measure against the production kernel (hs_remap) on the same
// inputs. Compiled after a vendor prelude and the production source
// (hisparse_gpu_kernels::COMMON_SOURCE), whose hs_physical_row it uses.
//
// Why: at decode sizes the remap's time is each warp's dependent chain. hs_remap's lean path
// gives a thread one 16-byte vector (four entries) and at one token spreads a row over 8 tiles
// of 64 threads: 228 instructions a warp (docs/PERF.md, "The remap"). vLLM's Triton remap, faster
// at 1 and 64 tokens, gives a thread one entry, (tokens x top_k / 128) programs of 4 warps. This
// kernel is that layout with hs_remap's plain semantics (no idx_mapping, counts, compaction or
// stats): grid (ceil(top_k / blockDim.x), num_tokens), one entry a thread, its request id and
// entry loaded together, then the one table load, then the store.
HS_KERNEL HS_BOUNDS(256) void lab_remap_wide(
    const i32* __restrict__ req_id, const i32* __restrict__ block_table,
    const i32* __restrict__ topk, i32* __restrict__ out, u32 num_tokens, u32 top_k,
    u32 table_rows, u32 max_blocks, u32 block_size, u32 block_stride_rows) {
    HS_GRID_DEP_WAIT();
    const u32 t = HS_BID_Y, j = HS_BID_X * HS_NTHREADS + HS_TID;
    if (t >= num_tokens || j >= top_k) return;
    const i32 req = HS_LDG(req_id + t);
    const i32 tok = HS_LDG(topk + (u64)t * top_k + j);
    const u32 shift = hs_pow2_shift(block_size);
    const u32 u = (u32)tok;
    const u32 col = shift < 32 ? u >> shift : u / block_size;
    const u32 off = shift < 32 ? u & (block_size - 1) : u % block_size;
    const bool look = req >= 0 && (u32)req < table_rows && tok >= 0 && col < max_blocks;
    const i32 blk = look ? HS_LDG(block_table + (u64)(u32)req * max_blocks + col) : -1;
    out[(u64)t * top_k + j] = look ? hs_physical_row(blk, block_stride_rows, off) : -1;
}
