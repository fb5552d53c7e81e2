// Where a layer's rows lie in a pool, for the pooled row shaders (gather, gather_per_entry,
// indexer_backup): build.rs appends this to each of them. Each declares `layers: array<u32>`,
// 16 words per layer — host layout then device layout, each [base, stride, num_blocks,
// block_size, row, value, index_stride, 0], byte sizes in pool words.

struct Row {
    ok: bool,
    value: u32,
    scale: u32,
}

// Where flat row `row` of the layout at word `l` lies: value and scale parts in pool words (a
// row outside the pool, or in another layer's part of a block, is not `ok`).
fn locate(l: u32, row: i32) -> Row {
    var r = Row(false, 0u, 0u);
    if (row < 0) {
        return r;
    }
    let istride = layers[l + 6u];
    let block = u32(row) / istride;
    let off = u32(row) % istride;
    let bsize = layers[l + 3u];
    if (block >= layers[l + 2u] || off >= bsize) {
        return r;
    }
    let page = layers[l] + block * layers[l + 1u];
    let v = layers[l + 5u];
    r.ok = true;
    r.value = page + off * v;
    r.scale = page + bsize * v + off * (layers[l + 4u] - v);
    return r;
}
