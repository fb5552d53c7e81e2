// Hot-state reset (hisparse_core::ops::table::reset_hot_state): for every listed state row r,
// slot_host_rows[r][..] = -1 and lru[r][s] = s. One invocation per (listed row, slot).
//
// The u16 LRU entries are written as 32-bit words (two entries per word, the even index in the
// low half). With an odd number of slots, neighbouring rows share a word; every word is written by
// exactly one invocation — the listed row that owns its low half, or, when that owner is not
// listed, the listed row that owns its high half — which composes both halves (an unlisted row's
// half keeps its value, as does a half beyond the state). The row list is sorted and free of
// duplicates (the host makes it so), and `listed` is a bitmap of every row listed in the call.
struct Params {
    // listed rows in this dispatch
    rows: u32,
    // hot slots per row (N)
    slots: u32,
    // state rows (R)
    num_requests: u32,
    // first slot_host_rows element and first LRU word of the bindings
    slot_host_rows_base: u32,
    lru_base: u32,
    // unused: keeps the block a multiple of 8 bytes
    pad: u32,
}

// The rows of this dispatch, then (from word `pc.rows`) the bitmap of all listed rows.
//@read list: array<u32>
//@read_write slot_host_rows: array<i32>
//@read_write lru: array<u32>

fn listed(row: u32) -> bool {
    return ((list[pc.rows + (row >> 5u)] >> (row & 31u)) & 1u) == 1u;
}

// The new value of LRU entry `idx`, or `old` when its row keeps its state.
fn entry(idx: u32, old: u32) -> u32 {
    let total = pc.num_requests * pc.slots;
    if (idx >= total) {
        return old;
    }
    let owner = idx / pc.slots;
    if (!listed(owner)) {
        return old;
    }
    return idx - owner * pc.slots;
}

// Items: one per (listed row, slot) (the entry point: per_item.wgsl).
fn items() -> u32 {
    return pc.rows * pc.slots;
}

fn item(i: u32) {
    let r = list[i / pc.slots];
    let e = i % pc.slots;
    let first = r * pc.slots;
    slot_host_rows[first + e - pc.slot_host_rows_base] = -1;
    // Words holding this row's entries: first / 2 ..= (first + N - 1) / 2.
    let w = (first >> 1u) + e;
    if (w > ((first + pc.slots - 1u) >> 1u)) {
        return;
    }
    let lo = 2u * w;
    let lo_owner = lo / pc.slots;
    if (lo_owner != r && listed(lo_owner)) {
        // The previous row is listed too and writes this shared word.
        return;
    }
    let old = lru[w - pc.lru_base];
    let lo_v = entry(lo, old & 0xffffu);
    let hi_v = entry(lo + 1u, old >> 16u);
    lru[w - pc.lru_base] = (hi_v << 16u) | lo_v;
}
