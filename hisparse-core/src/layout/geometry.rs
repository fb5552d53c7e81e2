//! Where things sit: group indices, pool sizes, pages per request, and the byte layout of every
//! layer in the device and host pools.

use alloc::vec::Vec;

use super::*;

impl KvCacheConfig {
    /// The layout's scalar sizes (what [`plan_layout`] computed beside the groups).
    pub fn sizes(&self) -> LayoutSizes {
        LayoutSizes {
            config: self.config,
            block_tokens: self.block_tokens,
            block_size: self.block_size,
            sparse_compress_ratio: self.sparse_compress_ratio,
            row_bytes: self.row_bytes,
            value_bytes: self.value_bytes,
            page_alignment: self.page_alignment,
            shared_host_pool: self.shared_host_pool,
            num_buckets: self.num_buckets,
            bytes_per_block: self.bytes_per_block,
            attention_block_stride: self.attention_block_stride,
            num_gpu_blocks: self.num_gpu_blocks,
            host_block_stride: self.host_block_stride,
            host_num_blocks: self.host_num_blocks,
            device_buffer_size: self.device_buffer_size,
            hot_blocks_per_request: self.hot_blocks_per_request,
            max_model_len: self.max_model_len,
            max_pages_per_request: self.max_pages_per_request,
        }
    }

    /// Index of the source group (always 0).
    pub const SOURCE_GROUP: usize = 0;
    /// Index of the indexer group (always 1).
    pub const INDEXER_GROUP: usize = 1;

    /// Index of resident group `bucket`.
    pub fn resident_group(&self, bucket: u32) -> usize {
        2 + bucket as usize
    }

    /// Index of hot group `bucket`.
    pub fn hot_group(&self, bucket: u32) -> usize {
        2 + self.num_buckets as usize + bucket as usize
    }

    /// Indices of the regular groups (empty when `groups` is shorter than its buckets need).
    pub fn regular_groups(&self) -> core::ops::Range<usize> {
        let len = self.groups.len();
        (2 + 2 * self.num_buckets as usize).min(len)..len
    }

    /// Bytes of the GPU pool (saturating).
    pub fn gpu_pool_bytes(&self) -> u64 {
        u64::from(self.num_gpu_blocks).saturating_mul(self.bytes_per_block)
    }

    /// Bytes of one layer's host array, `host_num_blocks * page_bytes` (rounded up to
    /// [`SHARED_HOST_ALIGNMENT`] in a shared host pool, so the next array starts aligned;
    /// saturating).
    pub fn host_array_bytes(&self) -> u64 {
        let page = self
            .groups
            .get(Self::SOURCE_GROUP)
            .and_then(|g| g.layers.first())
            .map_or(0, |l| l.page_bytes);
        rules::host_array_bytes(self.host_num_blocks, page, self.shared_host_pool)
    }

    /// Bytes of the host pool: every source layer's array (saturating). Without a shared host
    /// pool this is `host_num_blocks * host_block_stride`.
    pub fn host_pool_bytes(&self) -> u64 {
        let layers = self
            .groups
            .get(Self::SOURCE_GROUP)
            .map_or(0, |g| g.layers.len() as u64);
        layers.saturating_mul(self.host_array_bytes())
    }

    /// Bytes of host memory the layout takes: the host pool ([`KvCacheConfig::host_pool_bytes`])
    /// and the indexer host cache the runtime pins beside it
    /// ([`KvCacheConfig::indexer_host_pool_bytes`]); what `host_budget_bytes` holds
    /// (saturating).
    pub fn host_bytes(&self) -> u64 {
        self.host_pool_bytes()
            .saturating_add(self.indexer_host_pool_bytes())
    }

    /// Host bytes one host block takes: its pool stride and its pages in the indexer host
    /// cache. A budget of `n` times this (and, in a shared pool, room for each array's
    /// alignment) holds `n` blocks.
    pub fn host_bytes_per_block(&self) -> u64 {
        self.host_block_stride
            .saturating_add(self.indexer_page_bytes())
    }

    /// Pages (blocks) a request of `tokens` tokens occupies in every group.
    pub fn pages_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_tokens.max(1))
    }

    /// Tokens one block of group `group` covers (the layout's `block_tokens` for a group that
    /// does not exist or gives 0).
    pub fn group_block_tokens(&self, group: usize) -> u32 {
        match self.groups.get(group).map(|g| g.block_tokens) {
            Some(b) if b > 0 => b,
            _ => self.block_tokens.max(1),
        }
    }

    /// Columns of group `group`'s per-request block table: `ceil(max_model_len / block tokens)`
    /// (`max_pages_per_request` for every group with the layout's block size).
    pub fn table_width(&self, group: usize) -> u32 {
        self.max_model_len.div_ceil(self.group_block_tokens(group))
    }

    /// Tokens a sliding-window group of window `window` keeps per request: the window, the
    /// `max_query_len` tokens of a step, and the `max_query_len - 1` tokens a rollback of
    /// rejected speculative tokens may give back (their window must still be there).
    pub fn window_tokens(&self, window: u32) -> u64 {
        rules::window_tokens(self.config.max_query_len, window)
    }

    /// Blocks a regular group keeps for a request of `tokens` tokens: a full group every block
    /// of them; a sliding-window group at most the blocks spanned by its window tokens
    /// ([`KvCacheConfig::window_tokens`]) plus one.
    pub fn regular_blocks_for(&self, group: &KvCacheGroup, tokens: u32) -> u64 {
        rules::regular_blocks(
            group.block_tokens,
            self.block_tokens,
            group.sliding_window,
            self.config.max_query_len,
            tokens,
        )
    }

    fn source_layer(&self, layer: u32) -> Result<&GroupLayer, LayoutError> {
        self.groups
            .get(Self::SOURCE_GROUP)
            .and_then(|g| g.layers.iter().find(|l| l.layer == layer))
            .ok_or(LayoutError::NotSparse { layer })
    }

    /// Host-pool layout of sparse model layer `layer`: `[host_num_blocks, page]` at `index *
    /// host_array_bytes`, `index_stride_rows = block_size`.
    pub fn host_layout(&self, layer: u32) -> Result<PageLayout, LayoutError> {
        self.sizes().host_layout(self.source_layer(layer)?)
    }

    /// Bucket of sparse model layer `layer` and its place in the bucket's resident/hot groups.
    pub fn bucket_of(&self, layer: u32) -> Result<(u32, &GroupLayer), LayoutError> {
        for b in 0..self.num_buckets {
            let Some(g) = self.groups.get(self.resident_group(b)) else {
                break;
            };
            if let Some(l) = g.layers.iter().find(|l| l.layer == layer) {
                return Ok((b, l));
            }
        }
        Err(LayoutError::NotSparse { layer })
    }

    /// Device-pool layout of sparse model layer `layer` (the same for its resident and hot
    /// group): block `b`'s page at `b * bytes_per_block + offset`, `index_stride_rows =
    /// attention_block_stride`.
    pub fn device_layout(&self, layer: u32) -> Result<PageLayout, LayoutError> {
        let (_, l) = self.bucket_of(layer)?;
        Ok(self.sizes().device_layout(l))
    }

    /// Host and device layouts of sparse model layer `layer`.
    pub fn layer_pair(&self, layer: u32) -> Result<LayerPair, LayoutError> {
        Ok(LayerPair {
            host: self.host_layout(layer)?,
            device: self.device_layout(layer)?,
        })
    }

    /// The indexer row of leader `layer` in the GPU pool (block `b`'s page at `b *
    /// bytes_per_block + offset`) and in an indexer host cache of `host_num_blocks` pages per
    /// leader, layer-major like the host pool (leader `i` of the indexer group at `i *
    /// host_num_blocks * page`): what [`crate::ops::indexer_backup`] copies. `Err` for a layer
    /// that leads no index group.
    pub fn indexer_layer_pair(&self, layer: u32) -> Result<LayerPair, LayoutError> {
        let l = self
            .groups
            .get(Self::INDEXER_GROUP)
            .and_then(|g| g.layers.iter().find(|l| l.layer == layer))
            .ok_or(LayoutError::NotSparse { layer })?;
        let base = u64::from(l.index_in_group)
            .checked_mul(u64::from(self.host_num_blocks))
            .and_then(|v| v.checked_mul(l.page_bytes))
            .ok_or(ovf("indexer host layout base"))?;
        let rows = |base, block_stride, num_blocks| PageLayout {
            base,
            block_stride,
            num_blocks,
            block_size: l.rows_per_block,
            row_bytes: l.row_bytes,
            value_bytes: l.value_bytes,
            index_stride_rows: l.rows_per_block,
        };
        Ok(LayerPair {
            host: rows(base, l.page_bytes, self.host_num_blocks),
            device: rows(l.offset, self.bytes_per_block, self.num_gpu_blocks),
        })
    }

    /// Bytes of an indexer host cache holding `host_num_blocks` pages of every leader's indexer
    /// (the host side of [`KvCacheConfig::indexer_layer_pair`]; saturating).
    pub fn indexer_host_pool_bytes(&self) -> u64 {
        self.indexer_page_bytes()
            .saturating_mul(u64::from(self.host_num_blocks))
    }

    /// Bytes one host block takes in the indexer host cache: a page of every leader's indexer
    /// (0 without an indexer).
    pub fn indexer_page_bytes(&self) -> u64 {
        self.groups
            .get(Self::INDEXER_GROUP)
            .map_or(0, |g| g.page_bytes)
    }

    /// `(model layer, indexer layer pair)` of every indexer layer, in group order: what one
    /// [`crate::ops::indexer_backup`] call copies (empty without an indexer).
    pub fn indexer_layer_pairs(&self) -> Vec<(u32, LayerPair)> {
        self.groups
            .get(Self::INDEXER_GROUP)
            .map_or(&[][..], |g| &g.layers[..])
            .iter()
            .filter_map(|l| self.indexer_layer_pair(l.layer).ok().map(|p| (l.layer, p)))
            .collect()
    }

    /// Layer pairs of every sparse layer, in model order (backups and restores of all layers in
    /// one call).
    pub fn all_layer_pairs(&self) -> Vec<LayerPair> {
        self.groups
            .get(Self::SOURCE_GROUP)
            .map_or(&[][..], |g| &g.layers[..])
            .iter()
            .filter_map(|l| self.layer_pair(l.layer).ok())
            .collect()
    }

    /// Layer pairs of one index group (leader first): what a gather of that group's plan copies.
    pub fn index_group_pairs(&self, index_group: usize) -> Result<Vec<LayerPair>, LayoutError> {
        let g = self
            .index_groups
            .get(index_group)
            .ok_or(LayoutError::NoSuchGroup {
                group: index_group as u32,
            })?;
        g.layers.iter().map(|&l| self.layer_pair(l)).collect()
    }

    /// Layer pairs of one bucket (its resident/hot group's layers, in group order): what a page
    /// transfer, row mirror or restore of that bucket copies.
    pub fn bucket_layer_pairs(&self, bucket: u32) -> Result<Vec<LayerPair>, LayoutError> {
        let group = self
            .groups
            .get(self.resident_group(bucket))
            .filter(|_| bucket < self.num_buckets)
            .ok_or(LayoutError::NoSuchGroup {
                group: bucket.saturating_add(2),
            })?;
        group
            .layers
            .iter()
            .map(|l| self.layer_pair(l.layer))
            .collect()
    }

    /// The resolver descriptor for one index group's call over `num_tokens` token rows and
    /// `num_requests` state rows (`max_running`), from this layout.
    pub fn resolve_desc(&self, num_tokens: u32, num_requests: u32) -> crate::ops::ResolveDesc {
        crate::ops::ResolveDesc {
            num_tokens,
            top_k: self.config.top_k,
            num_requests,
            max_pages: self.max_pages_per_request,
            block_size: self.block_size,
            hot_slots: self.device_buffer_size,
            attention_block_stride: self.attention_block_stride,
            host_num_blocks: self.host_num_blocks,
            num_state_rows: None,
            stats_slot: 0,
        }
    }

    /// Byte offset of (GPU block, layer of group) in the device pool; `None` when the block is
    /// outside the pool, the group or layer does not exist, or the offset overflows.
    pub fn device_offset(&self, block: u32, group: usize, index_in_group: usize) -> Option<u64> {
        if block >= self.num_gpu_blocks {
            return None;
        }
        let l = self.groups.get(group)?.layers.get(index_in_group)?;
        u64::from(block)
            .checked_mul(self.bytes_per_block)?
            .checked_add(l.offset)
    }
}
