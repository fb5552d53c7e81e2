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
// hs_resolve_gather run this design, hs_resolve_body (resolve_general.cuh); a later design that
// scanned two sums per barrier measured slower on the H200 (33.9 us against 21.3 us for 64
// requests x 2048, 4096 slots) and was retired.

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

// A wanted-row table is laid out one of two ways: an array of hs_wanted entries (the general
// body's, in shared or global memory), or the same fields as four arrays of `cap` entries in the
// same bytes (the decode path's, in shared memory: a warp's random probes and field reads at a
// 4-byte stride spread over all 32 banks, where a field of every 16-byte entry falls on the same
// 8). The probes below are written once over both, through these accessors.
struct hs_wanted_cols {
    i32* key;
    u32* first_entry;
    u32* first_lru;
    u32* slot;
};

HS_DEVICE hs_wanted_cols hs_wanted_cols_at(unsigned char* base, u32 cap) {
    hs_wanted_cols c;
    c.key = (i32*)base;
    c.first_entry = (u32*)(base + 4u * cap);
    c.first_lru = (u32*)(base + 8u * cap);
    c.slot = (u32*)(base + 12u * cap);
    return c;
}

HS_DEVICE i32* hs_key_at(hs_wanted* t, u32 h) { return &t[h].key; }
HS_DEVICE i32* hs_key_at(const hs_wanted_cols& t, u32 h) { return &t.key[h]; }
HS_DEVICE u32* hs_first_entry_at(hs_wanted* t, u32 h) { return &t[h].first_entry; }
HS_DEVICE u32* hs_first_entry_at(const hs_wanted_cols& t, u32 h) { return &t.first_entry[h]; }

template <class Table>
HS_DEVICE u32 hs_lookup(const Table& table, u32 mask, i32 g) {
    u32 h = hs_hash(g, mask);
    for (;;) {
        const i32 k = *hs_key_at(table, h);
        if (k == g) return h;
        if (k == HS_EMPTY_KEY) return HS_NONE;
        h = (h + 1) & mask;
    }
}

// Empties entries [0, n) of a wanted-row table (either layout: both are n 16-byte units from
// `base`), the block's threads striding over them (no barrier: the caller syncs before the table
// is used).
static_assert((u32)HS_EMPTY_KEY == HS_NONE, "an empty entry is all ones in either layout");
HS_DEVICE void hs_clear_table(void* base, u32 n) {
    // One 16-byte store per entry (the table is 16-byte aligned in shared and global memory).
    const uint4 empty = make_uint4((u32)HS_EMPTY_KEY, HS_NONE, HS_NONE, HS_NONE);
    for (u32 i = HS_TID; i < n; i += HS_NTHREADS) ((uint4*)base)[i] = empty;
}

// Inserts g with entry ordinal `entry` (the smallest ordinal wins); returns g's slot in the table
// and whether g was there already (`existed`: another entry names it too).
template <class Table>
HS_DEVICE u32 hs_insert(const Table& table, u32 mask, i32 g, u32 entry, bool& existed) {
    u32 h = hs_hash(g, mask);
    for (;;) {
        const i32 prev = atomicCAS(hs_key_at(table, h), HS_EMPTY_KEY, g);
        if (prev == HS_EMPTY_KEY || prev == g) {
            atomicMin(hs_first_entry_at(table, h), entry);
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

