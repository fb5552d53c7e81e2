//! The layout's groups and how an engine's kernels read the device pool: one view per layer of
//! every GPU group (`hs_layout_layer_view`), the geometry the slot mapping's rows and the
//! attention rows address.

use hisparse_core::layout::GroupKind;

use crate::error::{HsStatus, invalid};
use crate::layout::{HsLayout, answer, in_layout};

/// What a layout group holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HsGroupKind {
    /// Host pool: the durable copy of every sparse layer (group 0).
    Source = 0,
    /// GPU: the indexer caches of every leader (group 1).
    Indexer = 1,
    /// GPU: the resident pages of one bucket of sparse layers.
    Resident = 2,
    /// GPU: the per-request hot buffers of one bucket of sparse layers.
    Hot = 3,
    /// GPU: a non-sparse layer group with ordinary paging.
    Regular = 4,
}

impl From<GroupKind> for HsGroupKind {
    fn from(k: GroupKind) -> Self {
        match k {
            GroupKind::Source => HsGroupKind::Source,
            GroupKind::Indexer => HsGroupKind::Indexer,
            GroupKind::Resident => HsGroupKind::Resident,
            GroupKind::Hot => HsGroupKind::Hot,
            GroupKind::Regular => HsGroupKind::Regular,
        }
    }
}

/// One layout group.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HsGroupInfo {
    /// What it holds.
    pub kind: HsGroupKind,
    /// Resident and hot groups: their bucket (resident group `b` and hot group `b` are twins);
    /// -1 for the others.
    pub bucket: i32,
    /// Tokens one block of the group covers.
    pub block_tokens: u32,
    /// Regular groups: the sliding window in tokens; 0 for none.
    pub sliding_window: u32,
    /// Layers in the group (`hs_layout_layer_view` of `0 .. num_layers`).
    pub num_layers: u32,
    /// Summed page bytes of the group's layers (one block's worth of the group).
    pub page_bytes: u64,
}

/// How one layer of a GPU group reads the device pool: as `[num_pages][rows_per_page]` rows of
/// `row_bytes` from byte `offset`, page `v` at `offset + v * page_stride`. A slot-mapping value
/// or an attention row `r` is row `r % rows_per_page` of page `r / rows_per_page`; its bytes
/// start at `offset + (r / rows_per_page) * page_stride + (r % rows_per_page) * value_bytes`
/// (split rows keep their scales after the page's values: at `rows_per_page * value_bytes + (r
/// % rows_per_page) * (row_bytes - value_bytes)` inside the page). For resident and hot groups
/// it is the flat attention view (`page_stride` = the layer's page bytes, `pages_per_block *
/// rows_per_page` = the layout's `attention_block_stride`); for indexer and regular groups one
/// view page is one GPU block (`page_stride` = `bytes_per_block`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsLayerView {
    /// The layout group.
    pub group: u32,
    /// The model layer.
    pub layer: u32,
    /// Byte offset of view page 0 in the device pool.
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
    /// Value bytes per row (`row_bytes` for contiguous rows).
    pub value_bytes: u32,
    /// Tokens per row: the token at position `p` writes row `p / tokens_per_row` when `p + 1`
    /// is a multiple of it (1 for uncompressed groups).
    pub tokens_per_row: u32,
}

/// Layout group `group` (`0 .. num_groups` of `hs_layout_info`; the order is source, indexer,
/// resident buckets, hot buckets, regular groups).
///
/// # Safety
///
/// `layout` is a live handle; `out` points to writable memory for an `HsGroupInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_group(
    layout: *const HsLayout,
    group: usize,
    out: *mut HsGroupInfo,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(layout, out, "out", |kv| {
            in_layout(group, kv.groups.len(), "group")?;
            let g = &kv.groups[group];
            Ok(HsGroupInfo {
                kind: g.kind.into(),
                bucket: g.bucket.map_or(-1, |b| b as i32),
                block_tokens: g.block_tokens,
                sliding_window: g.sliding_window.unwrap_or(0),
                num_layers: g.layers.len() as u32,
                page_bytes: g.page_bytes,
            })
        })
    }
}

/// The view of layer `index` (`0 .. num_layers` of `hs_layout_group`) of GPU group `group`.
///
/// # Safety
///
/// `layout` is a live handle; `out` points to writable memory for an `HsLayerView`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_layer_view(
    layout: *const HsLayout,
    group: usize,
    index: usize,
    out: *mut HsLayerView,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(layout, out, "out", |kv| {
            let v = kv.layer_view(group, index).ok_or_else(|| {
                invalid(format!(
                    "group {group} has no device-pool view of its layer {index}: a source group, a group or layer outside the layout ({} groups; see hs_layout_group), or a layout whose blocks do not hold whole pages of the layer",
                    kv.groups.len()
                ))
            })?;
            Ok(HsLayerView {
                group: v.group,
                layer: v.layer,
                offset: v.offset,
                page_stride: v.page_stride,
                num_pages: v.num_pages,
                pages_per_block: v.pages_per_block,
                rows_per_page: v.rows_per_page,
                row_bytes: v.row_bytes,
                value_bytes: v.value_bytes,
                tokens_per_row: v.tokens_per_row,
            })
        })
    }
}
