// ---------------------------------------------------------------------------------------------
// Whole-page copies (hisparse_core::ops::copy::copy_pages and copy_host_pages)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (min(num_layers * num_pairs, a few blocks per multiprocessor)), block
// (HS_COPY_THREADS). Tiles (layer, pair), layer fastest, are spread over blocks grid-stride; a
// block copies one page with 16-byte chunks, HS_COPY_UNROLL loads in flight per thread, and the
// page's last page_bytes % 16 bytes (pages of rows whose scale parts are not multiples of 16: 4, 8
// or 12 bytes) as 4-byte words, one per thread (page bases and strides are multiples of 16 and
// page_bytes a multiple of 4, checked by the planner). `jobs` and
// `pairs` live in device memory. The host guarantees destination ranges do not overlap each other
// or any source range of the same launch (it splits the call otherwise), so order does not matter.

#define HS_COPY_THREADS 256
#define HS_COPY_UNROLL 4

HS_KERNEL HS_BOUNDS(HS_COPY_THREADS) void hs_copy_pages(
    const hs_page_job* __restrict__ jobs, u32 num_layers, const hs_pair* __restrict__ pairs,
    u32 num_pairs, const u8* src, u8* dst) {
    const u64 tiles = (u64)num_layers * num_pairs;
    for (u64 tile = HS_BID_X; tile < tiles; tile += HS_NBLOCKS_X) {
        const hs_page_job j = jobs[tile % num_layers];
        const hs_pair p = pairs[tile / num_layers];
        const uint4* s = (const uint4*)(src + j.src_base + (u64)p.src * j.src_stride);
        uint4* o = (uint4*)(dst + j.dst_base + (u64)p.dst * j.dst_stride);
        const u32 n = (u32)(j.page_bytes >> 4);
        for (u32 base = 0; base < n; base += HS_COPY_THREADS * HS_COPY_UNROLL) {
            uint4 v[HS_COPY_UNROLL];
#pragma unroll
            for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
                const u32 c = base + u * HS_COPY_THREADS + HS_TID;
                if (c < n) v[u] = s[c];
            }
#pragma unroll
            for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
                const u32 c = base + u * HS_COPY_THREADS + HS_TID;
                if (c < n) o[c] = v[u];
            }
        }
        // The tail past the last 16-byte chunk (no thread for 16-byte multiples).
        const u32 tail_words = (u32)(j.page_bytes & 15u) >> 2;
        if (HS_TID < tail_words) {
            const u64 at = ((u64)n << 4) + ((u64)HS_TID << 2);
            *(u32*)((u8*)o + at) = *(const u32*)((const u8*)s + at);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Row-span copies (hisparse_core::ops::copy::copy_rows)
// ---------------------------------------------------------------------------------------------
//
// Launch: grid (min(num_layers * num_spans, a few blocks per multiprocessor)), block
// (HS_COPY_THREADS). direction 0 = device -> host, 1 = host -> device. Same overlap guarantee
// as hs_copy_pages. Rows move in units of 16-byte value chunks and scale words of the source
// layout's scale_word bytes (one branch per tile).

// One tile: the span's rows of one layer, scale words of W bytes.
template <u32 W>
HS_DEVICE void hs_copy_span(const hs_layout& sl, const hs_layout& dl, u32 sblock, u32 dblock,
                            const hs_span& sp, const u8* s, u8* o) {
    const u32 cpr = hs_row_units<W>(sl), vc = sl.value_bytes >> 4;
    const u32 n = sp.num_rows * cpr;
    for (u32 base = 0; base < n; base += HS_COPY_THREADS * HS_COPY_UNROLL) {
        uint4 v[HS_COPY_UNROLL];
#pragma unroll
        for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
            const u32 q = base + u * HS_COPY_THREADS + HS_TID;
            if (q < n) {
                u64 pv, ps;
                hs_row_parts(sl, sblock, sp.first_row + q / cpr, pv, ps);
                v[u] = hs_load_unit<W>(s, pv, ps, vc, q % cpr);
            }
        }
#pragma unroll
        for (u32 u = 0; u < HS_COPY_UNROLL; ++u) {
            const u32 q = base + u * HS_COPY_THREADS + HS_TID;
            if (q < n) {
                u64 pv, ps;
                hs_row_parts(dl, dblock, sp.first_row + q / cpr, pv, ps);
                hs_store_unit<W>(o, pv, ps, vc, q % cpr, v[u]);
            }
        }
    }
}

HS_KERNEL HS_BOUNDS(HS_COPY_THREADS) void hs_copy_rows(
    const hs_layer_pair* __restrict__ layers, u32 num_layers, const hs_span* __restrict__ spans,
    u32 num_spans, u32 direction, u8* host, u8* device) {
    const u64 tiles = (u64)num_layers * num_spans;
    for (u64 tile = HS_BID_X; tile < tiles; tile += HS_NBLOCKS_X) {
        const hs_layer_pair* L = layers + tile % num_layers;
        const hs_span sp = spans[tile / num_layers];
        const hs_layout sl = direction == 0 ? L->device : L->host;
        const hs_layout dl = direction == 0 ? L->host : L->device;
        const u32 sblock = direction == 0 ? sp.device_block : sp.host_block;
        const u32 dblock = direction == 0 ? sp.host_block : sp.device_block;
        const u8* s = direction == 0 ? device : host;
        u8* o = direction == 0 ? host : device;
        if (sl.scale_word == 8)
            hs_copy_span<8>(sl, dl, sblock, dblock, sp, s, o);
        else if (sl.scale_word == 4)
            hs_copy_span<4>(sl, dl, sblock, dblock, sp, s, o);
        else
            hs_copy_span<16>(sl, dl, sblock, dblock, sp, s, o);
    }
}

// ---------------------------------------------------------------------------------------------
// Indexer backup (hisparse_core::ops::indexer_backup::indexer_backup)
// ---------------------------------------------------------------------------------------------
//
// Launch: 1-D grid (any size), block (HS_INDEXER_THREADS). `layers` (hs_layer_pair[num_layers],
// device memory) are the indexer layers; item (layer, t) copies device row device_slots[t] of the
// layer to host row host_slots[t], skipped when either slot is -1, beyond its pool or in another
// layer's part of a block. Groups of HS_INDEXER_GROUP threads take items grid-stride (layer-major,
// the reference's order; host slots are distinct). Indexer rows have no 16-byte rule: a layer
// whose row parts (and pages) are all multiples of 16 bytes in both pools moves in 16-byte
// chunks, any other (DeepSeek V3.2's contiguous 132-byte rows) in 4-byte words (every part is a
// multiple of 4, pages 16-byte aligned: checked on the host).

#define HS_INDEXER_THREADS 256
#define HS_INDEXER_GROUP 32

// Whether layout `l`'s row parts and page placement are all multiples of 16 bytes.
HS_DEVICE bool hs_rows_in_chunks(const hs_layout& l) {
    return ((l.value_bytes | (l.row_bytes - l.value_bytes)) & 15u) == 0 &&
           ((l.base | l.block_stride) & 15u) == 0;
}

HS_KERNEL HS_BOUNDS(HS_INDEXER_THREADS) void hs_indexer_backup(
    const i32* __restrict__ device_slots, const i32* __restrict__ host_slots, u32 num_tokens,
    const hs_layer_pair* __restrict__ layers, u32 num_layers, const u8* __restrict__ device,
    u8* __restrict__ host) {
    const u32 groups = HS_NTHREADS / HS_INDEXER_GROUP;
    const u32 lane = HS_TID % HS_INDEXER_GROUP;
    const u64 items = (u64)num_layers * num_tokens;
    for (u64 item = (u64)HS_BID_X * groups + HS_TID / HS_INDEXER_GROUP; item < items;
         item += (u64)HS_NBLOCKS_X * groups) {
        const hs_layer_pair L = layers[item / num_tokens];
        const u32 t = (u32)(item % num_tokens);
        u32 db, doff, hb, hoff;
        if (!hs_locate(L.device, device_slots[t], db, doff) ||
            !hs_locate(L.host, host_slots[t], hb, hoff))
            continue;
        u64 sv, ss, dv, ds;
        hs_row_parts(L.device, db, doff, sv, ss);
        hs_row_parts(L.host, hb, hoff, dv, ds);
        const u32 vb = L.device.value_bytes, rb = L.device.row_bytes;
        if (hs_rows_in_chunks(L.device) && hs_rows_in_chunks(L.host)) {
            const u32 vc = vb >> 4;
            for (u32 c = lane; c < rb >> 4; c += HS_INDEXER_GROUP)
                *(uint4*)(host + hs_chunk(dv, ds, vc, c)) =
                    *(const uint4*)(device + hs_chunk(sv, ss, vc, c));
        } else {
            const u32 vw = vb >> 2;
            for (u32 w = lane; w < rb >> 2; w += HS_INDEXER_GROUP) {
                const u64 from = w < vw ? sv + ((u64)w << 2) : ss + ((u64)(w - vw) << 2);
                const u64 to = w < vw ? dv + ((u64)w << 2) : ds + ((u64)(w - vw) << 2);
                *(u32*)(host + to) = *(const u32*)(device + from);
            }
        }
    }
}

