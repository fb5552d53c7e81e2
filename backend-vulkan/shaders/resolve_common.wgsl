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

var<immediate> pc: Params;
@group(0) @binding(0) var<storage, read> req_id: array<i32>;
@group(0) @binding(1) var<storage, read> topk: array<i32>;
@group(0) @binding(2) var<storage, read> resident_table: array<i32>;
@group(0) @binding(3) var<storage, read> host_table: array<i32>;
@group(0) @binding(4) var<storage, read> hot_table: array<i32>;
@group(0) @binding(5) var<storage, read_write> slot_host_rows: array<i32>;
// u16 LRU entries, two per word (little-endian: even index in the low half).
@group(0) @binding(6) var<storage, read_write> lru: array<atomic<u32>>;
@group(0) @binding(7) var<storage, read_write> indices: array<i32>;
@group(0) @binding(8) var<storage, read_write> valid_counts: array<i32>;
@group(0) @binding(9) var<storage, read_write> hit_counts: array<i32>;
@group(0) @binding(10) var<storage, read_write> miss_counts: array<i32>;
@group(0) @binding(11) var<storage, read_write> miss_src: array<i32>;
@group(0) @binding(12) var<storage, read_write> miss_dst: array<i32>;

const NONE: u32 = 0xffffffffu;
