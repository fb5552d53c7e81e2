// The parameters and bindings both resolvers take (prepended to `resolve.wgsl` and
// `resolve_wg.wgsl` by build.rs, after common.wgsl): the descriptor of
// hisparse_core::ops::resolve, then the flags, and the op's arguments in `ResolveArgs` order.
struct Params {
    num_tokens: u32,
    top_k: u32,
    num_requests: u32,
    max_pages: u32,
    block_size: u32,
    hot_slots: u32,
    attn_stride: u32,
    host_rows: u32,
    hot_width: u32,
    // bit 0: per-slot scratch indexed by request id (else by the request's first row);
    // bit 1 (the one-dispatch resolver only): workgroup mode allowed;
    // bit 2: batch-row order — req_id holds owning batch rows (resolve_order.wgsl) and the
    // state row of resident_table, slot_host_rows and lru is idx_mapping[req_id]
    flags: u32,
}

//@read req_id: array<i32>
//@read topk: array<i32>
//@read resident_table: array<i32>
//@read host_table: array<i32>
//@read hot_table: array<i32>
//@read_write slot_host_rows: array<i32>
// u16 LRU entries, two per word (little-endian: even index in the low half).
//@read_write lru: array<atomic<u32>>
//@read_write indices: array<i32>
//@read_write valid_counts: array<i32>
//@read_write hit_counts: array<i32>
//@read_write miss_counts: array<i32>
//@read_write miss_src: array<i32>
//@read_write miss_dst: array<i32>

const NONE: u32 = 0xffffffffu;
