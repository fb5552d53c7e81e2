// Compressed slot mapping (hisparse_core::ops::slot_mapping): one invocation per token.
struct Params {
    num_tokens: u32,
    ratio: u32,
    block_size: u32,
    table_rows: u32,
    max_blocks: u32,
}

//@read positions: array<i32>
//@read slot_mapping: array<i32>
//@read table_row: array<i32>
//@read block_table: array<i32>
//@read_write out_slots: array<i32>

fn map_slot(position: i32, slot: i32, row: i32) -> i32 {
    if (slot < 0 || position < 0 || ((u32(position) + 1u) % pc.ratio) != 0u) {
        return -1;
    }
    if (row < 0 || u32(row) >= pc.table_rows) {
        return -1;
    }
    let bc = pc.block_size / pc.ratio;
    let c = u32(position) / pc.ratio;
    let col = c / bc;
    if (col >= pc.max_blocks) {
        return -1;
    }
    let block = block_table[u32(row) * pc.max_blocks + col];
    return phys_row(block, bc, c % bc);
}

// Items: one per token row (the entry point: per_item.wgsl).
fn items() -> u32 {
    return pc.num_tokens;
}

fn item(t: u32) {
    out_slots[t] = map_slot(positions[t], slot_mapping[t], table_row[t]);
}
