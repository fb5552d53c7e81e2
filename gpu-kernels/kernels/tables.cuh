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
