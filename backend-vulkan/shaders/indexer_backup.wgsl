// Indexer backup (hisparse_core::ops::indexer_backup): the indexer rows at the device slots,
// copied into the indexer host cache at the host slots, for every layer, in 4-byte pool words
// (indexer rows have no 16-byte rule: DeepSeek V3.2's contiguous 132-byte rows are 33 words).
// Pool A is the device pool (read), pool B the host cache (written), each bound as windows
// (`WINDOWS` per pool; a word is copied by the dispatch that binds both its windows). 32 lanes per
// (layer, token) item, four items per workgroup of 128, layer-major like the reference; a slot
// that is -1, beyond its pool or in another layer's part of a block skips the item.
struct Params {
    num_tokens: u32,
    // total work items: num_layers * num_tokens
    items: u32,
    chunk_shift: u32,
    chunk_mask: u32,
    a_base: u32,
    b_base: u32,
}

// Per layer, 16 words: host layout then device layout, each
// [base, stride, num_blocks, block_size, row, value, index_stride, 0], byte sizes in pool words.
//@read device_slots: array<i32>
//@read host_slots: array<i32>
//@read layers: array<u32>
//@POOL_BINDINGS

//@POOL_ACCESS

// `locate` and `Row`: shaders/row_layout.wgsl (appended by build.rs).

@compute @workgroup_size(128)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let item = group_index(wid, nwg) * 4u + (lid >> 5u);
    if (item >= pc.items) {
        return;
    }
    let lane = lid & 31u;
    let layer = item / pc.num_tokens;
    let t = item % pc.num_tokens;
    let hl = layer * 16u;
    let dl = hl + 8u;
    let src = locate(dl, device_slots[t]);
    let dst = locate(hl, host_slots[t]);
    if (!src.ok || !dst.ok) {
        return;
    }
    let words = layers[dl + 4u];
    let value = layers[dl + 5u];
    for (var w = lane; w < words; w = w + 32u) {
        var sw = src.value + w;
        var dw = dst.value + w;
        if (w >= value) {
            sw = src.scale + (w - value);
            dw = dst.scale + (w - value);
        }
        if (in_a(sw) && in_b(dw)) {
            store_b(dw, load_a(sw));
        }
    }
}
