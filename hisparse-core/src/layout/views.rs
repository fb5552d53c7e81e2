//! How an engine's kernels read and write the device pool: one *view* per layer of every GPU
//! group, and the row a token writes in it.
//!
//! The device pool is `num_gpu_blocks × bytes_per_block` bytes; inside a block each GPU group's
//! layers sit side by side. A layer's view reads the pool as `[num_pages, rows_per_page, row]`
//! pages starting at byte `offset`, page `v` at `offset + v * page_stride`:
//!
//! * **Resident and hot groups** (the sparse KV): the flat attention view. `page_stride` is the
//!   layer's page size and every block holds `pages_per_block = bytes_per_block / page_bytes`
//!   consecutive view pages, so the row of (block `b`, offset `o`) is `b *
//!   attention_block_stride + o` — exactly the rows the remap and the resolver return. Hot and
//!   resident rows of a layer are addressed through one view.
//! * **Indexer and regular groups**: `page_stride = bytes_per_block`, one view page per block,
//!   row `b * rows_per_page + o`.
//!
//! A row's bytes inside its page: contiguous rows at `r * row_bytes`; split rows (DeepSeek V4)
//! with the values of all the page's rows first (`r * value_bytes`) and their scales after
//! (`rows_per_page * value_bytes + r * (row_bytes - value_bytes)`).
//!
//! [`LayerView::token_row`] gives the row a token at a position writes (a slot-mapping
//! entry), or `None` for a token that writes no row of that group (a compressed group writes one
//! row every `block_tokens / rows_per_page` tokens: on the last token of each run).

use alloc::vec::Vec;

use super::{GroupKind, KvCacheConfig, KvCacheGroup};

/// How one layer of a GPU group reads the device pool (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LayerView {
    /// The layout group (`KvCacheConfig::groups` index).
    pub group: u32,
    /// The model layer.
    pub layer: u32,
    /// Byte offset of view page 0 in the device pool (the layer's page in block 0).
    pub offset: u64,
    /// Bytes from one view page to the next.
    pub page_stride: u64,
    /// View pages that lie inside the pool from `offset`.
    pub num_pages: u64,
    /// View pages per GPU block: block `b` holds view page `b * pages_per_block`.
    pub pages_per_block: u32,
    /// Rows per page.
    pub rows_per_page: u32,
    /// Bytes per row.
    pub row_bytes: u32,
    /// Value bytes per row (`row_bytes` for contiguous rows; split rows keep their scales after
    /// the page's values).
    pub value_bytes: u32,
    /// Tokens per row: a token at position `p` writes row `p / tokens_per_row` when `(p + 1)` is
    /// a multiple of it (1 for uncompressed groups).
    pub tokens_per_row: u32,
}

impl LayerView {
    /// The view row of offset `offset` in GPU block `block`.
    pub fn row(&self, block: u32, offset: u32) -> u64 {
        u64::from(block) * u64::from(self.pages_per_block) * u64::from(self.rows_per_page)
            + u64::from(offset)
    }

    /// The row the token at `position` writes in this view (every layer of a group shares its
    /// block table, so one row serves all of them), given the request's block table row of the
    /// group (`table[page]` = GPU block, `≤ 0` = none): `None` when the token writes no row (a
    /// compressed group between its rows), or when the page is beyond the table or has no block.
    pub fn token_row(&self, table: &[i32], position: u32) -> Option<u64> {
        let per_row = self.tokens_per_row.max(1);
        if !(u64::from(position) + 1).is_multiple_of(u64::from(per_row)) {
            return None;
        }
        let row = position / per_row;
        let page = row / self.rows_per_page.max(1);
        let block = *table.get(page as usize)?;
        if block <= 0 {
            return None;
        }
        Some(self.row(block as u32, row % self.rows_per_page))
    }

    /// Byte offset, in the device pool, of the first byte of view row `row` (its value part for
    /// split rows), or `None` beyond the view.
    pub fn row_offset(&self, row: u64) -> Option<u64> {
        let rows = u64::from(self.rows_per_page);
        let page = row / rows.max(1);
        if page >= self.num_pages {
            return None;
        }
        let within = (row % rows.max(1)) * u64::from(self.value_bytes);
        Some(self.offset + page * self.page_stride + within)
    }
}

impl KvCacheConfig {
    /// The view of layer `index_in_group` of GPU group `group` (module docs), or `None` for the
    /// source group, a group or layer outside the layout, or a layout whose block size does not
    /// hold a whole number of the layer's pages.
    pub fn layer_view(&self, group: usize, index_in_group: usize) -> Option<LayerView> {
        let g: &KvCacheGroup = self.groups.get(group)?;
        let l = g.layers.get(index_in_group)?;
        let pool = self.gpu_pool_bytes();
        let bpb = self.bytes_per_block;
        let (page_stride, pages_per_block) = match g.kind {
            GroupKind::Source => return None,
            GroupKind::Resident | GroupKind::Hot => {
                if l.page_bytes == 0 || !bpb.is_multiple_of(l.page_bytes) {
                    return None;
                }
                (l.page_bytes, u32::try_from(bpb / l.page_bytes).ok()?)
            }
            GroupKind::Indexer | GroupKind::Regular => (bpb, 1),
        };
        if page_stride == 0 || l.rows_per_block == 0 || l.offset >= pool {
            return None;
        }
        let tokens_per_row = g.block_tokens / l.rows_per_block;
        Some(LayerView {
            group: group as u32,
            layer: l.layer,
            offset: l.offset,
            page_stride,
            // The last page of the view must end inside the pool: block `N - 1`'s.
            num_pages: (pool - l.offset).checked_sub(l.page_bytes)? / page_stride + 1,
            pages_per_block,
            rows_per_page: l.rows_per_block,
            row_bytes: l.row_bytes,
            value_bytes: l.value_bytes,
            tokens_per_row: tokens_per_row.max(1),
        })
    }

    /// The views of every layer of every GPU group, in group order then layer order.
    pub fn gpu_views(&self) -> Vec<LayerView> {
        (0..self.groups.len())
            .flat_map(|g| {
                (0..self.groups[g].layers.len()).filter_map(move |i| self.layer_view(g, i))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::config::HiSparseConfig;
    use crate::layout::{GroupKind, LayoutInput, plan_layout};
    use crate::presets;

    #[test]
    fn sparse_views_are_the_flat_attention_view() {
        let model = presets::DEEPSEEK_V32;
        let cfg = HiSparseConfig::new(model.top_k, 64 << 30);
        let mut input = LayoutInput::new(&model, &cfg, 0, 131072);
        input.num_gpu_blocks_override = Some(3000);
        let kv = plan_layout(&input).unwrap();
        let g = kv.resident_group(0);
        for i in 0..kv.groups[g].layers.len() {
            let v = kv.layer_view(g, i).unwrap();
            assert_eq!(v.page_stride, 41984);
            assert_eq!(
                v.pages_per_block * v.rows_per_page,
                kv.attention_block_stride
            );
            // Block 7, offset 5 of this layer: the byte the layout says, through the view.
            let row = v.row(7, 5);
            assert_eq!(row, 7 * u64::from(kv.attention_block_stride) + 5);
            let at = kv.device_offset(7, g, i).unwrap() + 5 * 656;
            assert_eq!(v.row_offset(row), Some(at));
            // The last block's page lies inside the view.
            let last = v.row(2999, 63);
            assert!(v.row_offset(last).unwrap() + 656 <= kv.gpu_pool_bytes());
        }
        let hot = kv.layer_view(kv.hot_group(0), 3).unwrap();
        assert_eq!(
            hot,
            kv.layer_view(g, 3)
                .map(|v| crate::layout::LayerView {
                    group: kv.hot_group(0) as u32,
                    ..v
                })
                .unwrap()
        );
    }

    #[test]
    fn indexer_view_pages_are_blocks() {
        let model = presets::DEEPSEEK_V32;
        let cfg = HiSparseConfig::new(model.top_k, 64 << 30);
        let mut input = LayoutInput::new(&model, &cfg, 0, 131072);
        input.num_gpu_blocks_override = Some(3000);
        let kv = plan_layout(&input).unwrap();
        assert_eq!(kv.groups[1].kind, GroupKind::Indexer);
        let v = kv.layer_view(1, 2).unwrap();
        assert_eq!(
            (v.page_stride, v.pages_per_block, v.row_bytes),
            (kv.bytes_per_block, 1, 132)
        );
        assert_eq!(
            v.row_offset(v.row(9, 4)),
            Some(kv.device_offset(9, 1, 2).unwrap() + 4 * 132)
        );
        assert!(
            kv.layer_view(0, 0).is_none(),
            "the source group has no GPU view"
        );
    }

    #[test]
    fn compressed_groups_write_one_row_per_run_of_tokens() {
        let model = presets::DEEPSEEK_V4;
        let cfg = HiSparseConfig::new(model.top_k, 64 << 30);
        let mut input = LayoutInput::new(&model, &cfg, 0, 65536);
        input.num_gpu_blocks_override = Some(3000);
        let kv = plan_layout(&input).unwrap();
        let g = kv.resident_group(0);
        let v = kv.layer_view(g, 0).unwrap();
        assert_eq!(v.tokens_per_row, 4);
        let table = [5, 9];
        assert_eq!(v.token_row(&table, 0), None);
        assert_eq!(v.token_row(&table, 3), Some(v.row(5, 0)));
        assert_eq!(v.token_row(&table, 7), Some(v.row(5, 1)));
        assert_eq!(v.token_row(&table, 255), Some(v.row(5, 63)));
        assert_eq!(v.token_row(&table, 259), Some(v.row(9, 0)));
        assert_eq!(
            v.token_row(&table, 4 * 64 * 2 + 3),
            None,
            "beyond the table"
        );
        assert_eq!(v.token_row(&[0], 3), None, "no block");
        // Split rows: values first, scales after.
        assert_eq!((v.row_bytes, v.value_bytes), (584, 576));
        assert_eq!(
            v.row_offset(v.row(5, 1)).unwrap() - v.row_offset(v.row(5, 0)).unwrap(),
            576
        );
    }
}
