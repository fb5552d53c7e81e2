//! The sizing rules every form of a layout applies — the heap [`KvCacheConfig`](super::KvCacheConfig)
//! and the fixed-capacity [`FixedLayout`](super::FixedLayout) — and the planner applies while
//! it checks a plan: written once here, over plain numbers.

use super::{ACTIVE_TAIL_PAGES, GroupLayer, LayoutError, LayoutSizes, SHARED_HOST_ALIGNMENT, ovf};
use crate::ops::{LayerPair, PageLayout};

/// GPU blocks one request needs at a context length, per strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GpuBlocksPerRequest {
    /// Everything on the GPU: indexer + resident + regular pages.
    pub all_on_gpu: u64,
    /// HiSparse: indexer + regular pages, the `ACTIVE_TAIL_PAGES` resident tail per bucket, and a
    /// hot region per bucket.
    pub hisparse: u64,
}

impl GpuBlocksPerRequest {
    /// The cheaper of the two (a request whose pages all fit stays fully resident).
    pub fn min_needed(&self) -> u64 {
        self.all_on_gpu.min(self.hisparse)
    }

    /// The blocks of a request of `pages` pages whose regular groups keep `regular` blocks, in a
    /// layout of `num_buckets` buckets and `hot_blocks_per_request` hot blocks per bucket
    /// (saturating).
    pub(super) fn of(
        pages: u64,
        regular: u64,
        num_buckets: u32,
        hot_blocks_per_request: u32,
    ) -> Self {
        let b = u64::from(num_buckets);
        let base = pages.saturating_add(regular);
        GpuBlocksPerRequest {
            all_on_gpu: base.saturating_add(b.saturating_mul(pages)),
            hisparse: base
                .saturating_add(b.saturating_mul(pages.min(u64::from(ACTIVE_TAIL_PAGES))))
                .saturating_add(b.saturating_mul(u64::from(hot_blocks_per_request))),
        }
    }
}

/// Tokens a sliding-window group of window `window` keeps per request: the window, the
/// `max_query_len` tokens of a step, and the `max_query_len - 1` tokens a rollback of rejected
/// speculative tokens may give back (their window must still be there).
pub(super) fn window_tokens(max_query_len: u32, window: u32) -> u64 {
    let spec = u64::from(max_query_len.max(1)) - 1;
    u64::from(window) + 2 * spec
}

/// Blocks a regular group of `group_block_tokens`-token blocks (0: the layout's
/// `layout_block_tokens`) and sliding window `sliding_window` keeps for a request of `tokens`
/// tokens: every block of them; with a window at most the blocks its window tokens span plus one.
pub(super) fn regular_blocks(
    group_block_tokens: u32,
    layout_block_tokens: u32,
    sliding_window: Option<u32>,
    max_query_len: u32,
    tokens: u32,
) -> u64 {
    let bt = u64::from(if group_block_tokens > 0 {
        group_block_tokens
    } else {
        layout_block_tokens.max(1)
    });
    let all = u64::from(tokens).div_ceil(bt);
    match sliding_window {
        Some(w) => all.min(window_tokens(max_query_len, w).div_ceil(bt) + 1),
        None => all,
    }
}

/// Bytes of one layer's host array of `host_num_blocks` pages of `page_bytes`, rounded up to
/// [`SHARED_HOST_ALIGNMENT`] in a shared host pool (saturating).
pub(super) fn host_array_bytes(host_num_blocks: u32, page_bytes: u64, shared: bool) -> u64 {
    array_bytes(u64::from(host_num_blocks), page_bytes, shared)
}

fn array_bytes(blocks: u64, page_bytes: u64, shared: bool) -> u64 {
    let raw = blocks.saturating_mul(page_bytes);
    if shared {
        raw.checked_next_multiple_of(SHARED_HOST_ALIGNMENT)
            .unwrap_or(u64::MAX)
    } else {
        raw
    }
}

/// Host bytes of `blocks` host blocks: `layers` source-layer arrays of `page_bytes` pages
/// ([`host_array_bytes`]) and the indexer host cache the runtime pins beside them,
/// `indexer_page_bytes` per block (saturating). The host budget holds both.
pub(super) fn host_bytes(
    blocks: u64,
    layers: u64,
    page_bytes: u64,
    indexer_page_bytes: u64,
    shared: bool,
) -> u64 {
    layers
        .saturating_mul(array_bytes(blocks, page_bytes, shared))
        .saturating_add(blocks.saturating_mul(indexer_page_bytes))
}

/// The most host blocks whose [`host_bytes`] fit `budget`.
pub(super) fn host_blocks_in_budget(
    budget: u64,
    layers: u64,
    page_bytes: u64,
    indexer_page_bytes: u64,
    shared: bool,
) -> u64 {
    let fits = |n| host_bytes(n, layers, page_bytes, indexer_page_bytes, shared) <= budget;
    // Bytes grow with the block count: the largest count that fits lies in `[lo, hi)`.
    let per_block = layers
        .saturating_mul(page_bytes)
        .saturating_add(indexer_page_bytes)
        .max(1);
    let (mut lo, mut hi) = (0u64, budget / per_block + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

impl LayoutSizes {
    /// Host-pool layout of the sparse layer `source` places (a layer of the source group):
    /// `[host_num_blocks, page]` at `index * host array bytes`, `index_stride_rows = block_size`.
    pub fn host_layout(&self, source: &GroupLayer) -> Result<PageLayout, LayoutError> {
        let array = u64::from(self.host_num_blocks)
            .checked_mul(source.page_bytes)
            .and_then(|a| {
                a.checked_next_multiple_of(if self.shared_host_pool {
                    SHARED_HOST_ALIGNMENT
                } else {
                    1
                })
            });
        let base = array
            .and_then(|a| u64::from(source.index_in_group).checked_mul(a))
            .ok_or(ovf("host layout base"))?;
        Ok(PageLayout {
            base,
            block_stride: source.page_bytes,
            num_blocks: self.host_num_blocks,
            block_size: self.block_size,
            row_bytes: self.row_bytes,
            value_bytes: self.value_bytes,
            index_stride_rows: self.block_size,
        })
    }

    /// Device-pool layout of the sparse layer `resident` places (a layer of a resident group;
    /// its hot twin places it alike): block `b`'s page at `b * bytes_per_block + offset`,
    /// `index_stride_rows = attention_block_stride`.
    pub fn device_layout(&self, resident: &GroupLayer) -> PageLayout {
        PageLayout {
            base: resident.offset,
            block_stride: self.bytes_per_block,
            num_blocks: self.num_gpu_blocks,
            block_size: self.block_size,
            row_bytes: self.row_bytes,
            value_bytes: self.value_bytes,
            index_stride_rows: self.attention_block_stride,
        }
    }

    /// Host and device layouts of a sparse layer from its places in the source and resident
    /// groups.
    pub fn layer_pair(
        &self,
        source: &GroupLayer,
        resident: &GroupLayer,
    ) -> Result<LayerPair, LayoutError> {
        Ok(LayerPair {
            host: self.host_layout(source)?,
            device: self.device_layout(resident),
        })
    }
}
