//! [`KvCacheConfig::validate`]: every rule of the planner, checked on a layout from elsewhere.

use super::*;

impl KvCacheConfig {
    /// Checks every rule of [`plan_layout`] that the coordinator, the helpers and the data plane
    /// rely on, so that a hand-edited or deserialised layout gives a typed error naming the
    /// field ([`LayoutError::InvalidField`], or the planner's own error for pools that cannot
    /// hold one `max_model_len` request) instead of a panic, an overflow or a coordinator that
    /// never makes progress. A layout from [`plan_layout`] always passes. O(groups + layers).
    pub fn validate(&self) -> Result<(), LayoutError> {
        fn bad(
            field: &'static str,
            index: Option<usize>,
            value: Option<u64>,
            rule: &'static str,
        ) -> Result<(), LayoutError> {
            Err(LayoutError::InvalidField {
                field,
                index: index.map(|i| i.min(u32::MAX as usize) as u32),
                value,
                rule,
            })
        }
        let dbs = self.config.resolved_device_buffer_size()?;
        if self.device_buffer_size != dbs {
            bad(
                "device_buffer_size",
                None,
                Some(self.device_buffer_size.into()),
                "must equal the configuration's device_buffer_size",
            )?;
        }
        for (field, v) in [
            ("block_tokens", self.block_tokens),
            ("block_size", self.block_size),
            ("sparse_compress_ratio", self.sparse_compress_ratio),
            ("max_model_len", self.max_model_len),
            ("num_buckets", self.num_buckets),
            ("num_gpu_blocks", self.num_gpu_blocks),
            ("host_num_blocks", self.host_num_blocks),
        ] {
            if v == 0 {
                bad(field, None, Some(0), "must be greater than 0")?;
            }
        }
        if u64::from(self.block_size) * u64::from(self.sparse_compress_ratio)
            != u64::from(self.block_tokens)
        {
            bad(
                "block_tokens",
                None,
                Some(self.block_tokens.into()),
                "must equal block_size * sparse_compress_ratio",
            )?;
        }
        // The row geometry's units are the copies' rule, checked with every layer's pages below.
        if self.row_bytes == 0 {
            bad("row_bytes", None, Some(0), "must be greater than 0")?;
        }
        if self.value_bytes == 0 || self.value_bytes > self.row_bytes {
            bad(
                "value_bytes",
                None,
                Some(self.value_bytes.into()),
                "must be positive and no larger than row_bytes",
            )?;
        }
        if self.page_alignment == 0 {
            bad("page_alignment", None, Some(0), "must be greater than 0")?;
        }
        if self.max_pages_per_request != self.max_model_len.div_ceil(self.block_tokens) {
            bad(
                "max_pages_per_request",
                None,
                Some(self.max_pages_per_request.into()),
                "must equal ceil(max_model_len / block_tokens)",
            )?;
        }
        if self.hot_blocks_per_request != dbs.div_ceil(self.block_size) {
            bad(
                "hot_blocks_per_request",
                None,
                Some(self.hot_blocks_per_request.into()),
                "must equal ceil(device_buffer_size / block_size)",
            )?;
        }
        if self
            .num_buckets
            .checked_mul(self.hot_blocks_per_request)
            .is_none()
        {
            bad(
                "num_buckets",
                None,
                Some(self.num_buckets.into()),
                "times hot_blocks_per_request overflows a u32 block count",
            )?;
        }
        let Some(page) = copied_page_bytes(self.block_size, self.row_bytes, self.page_alignment)
        else {
            return bad(
                "row_bytes",
                None,
                Some(self.row_bytes.into()),
                "times block_size overflows a page",
            );
        };
        if self.bytes_per_block == 0 || !self.bytes_per_block.is_multiple_of(page) {
            bad(
                "bytes_per_block",
                None,
                Some(self.bytes_per_block),
                "must be a positive multiple of the sparse page (block_size rows of row_bytes, padded to page_alignment and 16 bytes)",
            )?;
        }
        if (self.bytes_per_block / page).checked_mul(u64::from(self.block_size))
            != Some(u64::from(self.attention_block_stride))
        {
            bad(
                "attention_block_stride",
                None,
                Some(self.attention_block_stride.into()),
                "must equal (bytes_per_block / sparse page) * block_size",
            )?;
        }
        self.validate_groups(page)?;
        self.validate_pages()?;
        let host_max = i32::MAX as u64 / u64::from(self.block_size);
        if u64::from(self.host_num_blocks) > host_max {
            return Err(LayoutError::PoolTooLarge {
                pool: "host",
                blocks: self.host_num_blocks.into(),
                max: host_max,
            });
        }
        let gpu_max = i32::MAX as u64 / u64::from(self.attention_block_stride);
        if u64::from(self.num_gpu_blocks) > gpu_max {
            return Err(LayoutError::PoolTooLarge {
                pool: "gpu",
                blocks: self.num_gpu_blocks.into(),
                max: gpu_max,
            });
        }
        if self.host_bytes() > self.config.host_budget_bytes {
            bad(
                "host_num_blocks",
                None,
                Some(self.host_num_blocks.into()),
                "gives a host pool (every source layer's array) and indexer host cache beyond host_budget_bytes",
            )?;
        }
        if u64::from(self.host_num_blocks) < u64::from(self.max_pages_per_request) + 2 {
            bad(
                "host_num_blocks",
                None,
                Some(self.host_num_blocks.into()),
                "must be at least max_pages_per_request + 2 (one max_model_len request, the null block and a copy-on-write tail)",
            )?;
        }
        let needed = self
            .gpu_blocks_per_request(self.max_model_len)
            .min_needed()
            .saturating_add(1);
        if u64::from(self.num_gpu_blocks) < needed {
            return Err(LayoutError::GpuPoolTooSmall {
                blocks: self.num_gpu_blocks.into(),
                needed,
                bytes_per_block: self.bytes_per_block,
            });
        }
        Ok(())
    }

    /// Every layer's pages as the layout places them, checked with the copies' own rule
    /// ([`PageLayout::check_shape`]): each sparse layer's host and device pages, and where each
    /// leader's indexer pages sit ([`PageLayout::check_placement`]; what an indexer row may be
    /// is [`crate::ops::indexer_backup`]'s to say).
    fn validate_pages(&self) -> Result<(), LayoutError> {
        use crate::error::OpName;
        let refused = |layer, pages| {
            move |error| LayoutError::PagesRefused {
                layer,
                pages,
                error,
            }
        };
        for l in &self.groups[Self::SOURCE_GROUP].layers {
            let pair = self.layer_pair(l.layer)?;
            let op = OpName::CopyPages;
            pair.host
                .check_shape(op)
                .map_err(refused(l.layer, "host"))?;
            pair.device
                .check_shape(op)
                .map_err(refused(l.layer, "device"))?;
        }
        for l in &self.groups[Self::INDEXER_GROUP].layers {
            let pair = self.indexer_layer_pair(l.layer)?;
            let op = OpName::IndexerBackup;
            pair.host
                .check_placement(op)
                .map_err(refused(l.layer, "indexer host"))?;
            pair.device
                .check_placement(op)
                .map_err(refused(l.layer, "indexer device"))?;
        }
        Ok(())
    }

    /// The group and index-group rules of [`KvCacheConfig::validate`].
    fn validate_groups(&self, sparse_page: u64) -> Result<(), LayoutError> {
        let bad = |field, index: usize, value: Option<u64>, rule| {
            Err(LayoutError::InvalidField {
                field,
                index: Some(index.min(u32::MAX as usize) as u32),
                value,
                rule,
            })
        };
        let nb = self.num_buckets as usize;
        let len = self.groups.len();
        if len < 2 + 2 * nb {
            return Err(LayoutError::InvalidField {
                field: "groups",
                index: None,
                value: Some(len as u64),
                rule: "must hold a source group, an indexer group, and a resident and a hot group per bucket (2 + 2 * num_buckets)",
            });
        }
        for (i, g) in self.groups.iter().enumerate() {
            let (kind, bucket) = match i {
                0 => (GroupKind::Source, None),
                1 => (GroupKind::Indexer, None),
                i if i < 2 + nb => (GroupKind::Resident, Some((i - 2) as u32)),
                i if i < 2 + 2 * nb => (GroupKind::Hot, Some((i - 2 - nb) as u32)),
                _ => (GroupKind::Regular, None),
            };
            if g.kind != kind {
                return bad(
                    "groups[].kind",
                    i,
                    None,
                    "breaks the order [source, indexer, resident.., hot.., regular..]",
                );
            }
            if g.bucket != bucket {
                return bad(
                    "groups[].bucket",
                    i,
                    g.bucket.map(u64::from),
                    "must be the group's bucket (its position among the resident or hot groups), and absent elsewhere",
                );
            }
            if g.layers.is_empty() {
                return bad("groups[].layers", i, Some(0), "must not be empty");
            }
            let own_blocks = kind == GroupKind::Regular;
            if g.block_tokens == 0
                || !self.block_tokens.is_multiple_of(g.block_tokens)
                || (!own_blocks && g.block_tokens != self.block_tokens)
            {
                return bad(
                    "groups[].block_tokens",
                    i,
                    Some(g.block_tokens.into()),
                    "must equal block_tokens (regular groups: divide it)",
                );
            }
            let mut sum = 0u64;
            for (j, l) in g.layers.iter().enumerate() {
                let sparse = matches!(
                    kind,
                    GroupKind::Source | GroupKind::Resident | GroupKind::Hot
                );
                if l.index_in_group as usize != j
                    || (sparse
                        && (l.page_bytes != sparse_page || l.rows_per_block != self.block_size))
                {
                    return bad(
                        "groups[].layers",
                        i,
                        None,
                        "must number their layers in order, and sparse layers must have the sparse page (block_size rows of row_bytes, padded)",
                    );
                }
                sum = sum.saturating_add(l.page_bytes);
            }
            if sum != g.page_bytes {
                return bad(
                    "groups[].page_bytes",
                    i,
                    Some(g.page_bytes),
                    "must equal the sum of its layers' page bytes",
                );
            }
            if kind == GroupKind::Source {
                let align = if self.shared_host_pool {
                    SHARED_HOST_ALIGNMENT
                } else {
                    1
                };
                if g.page_bytes.checked_next_multiple_of(align) != Some(self.host_block_stride) {
                    return Err(LayoutError::InvalidField {
                        field: "host_block_stride",
                        index: None,
                        value: Some(self.host_block_stride),
                        rule: "must equal the source group's page bytes (rounded up to 4096 in a shared host pool)",
                    });
                }
                let array = self.host_array_bytes();
                if let Some(j) = g
                    .layers
                    .iter()
                    .position(|l| Some(l.offset) != u64::from(l.index_in_group).checked_mul(array))
                {
                    return bad(
                        "groups[].layers[].offset",
                        j,
                        Some(g.layers[j].offset),
                        "of a source layer must be its index times host_array_bytes",
                    );
                }
            } else if g.page_bytes > self.bytes_per_block {
                return bad(
                    "groups[].page_bytes",
                    i,
                    Some(g.page_bytes),
                    "must not exceed bytes_per_block",
                );
            }
            if kind == GroupKind::Hot && g.layers != self.groups[i - nb].layers {
                return bad(
                    "groups[].layers",
                    i,
                    None,
                    "of a hot group must equal its twin resident group's",
                );
            }
        }
        if self.host_block_stride == 0 {
            return bad(
                "groups[].page_bytes",
                0,
                Some(0),
                "of the source group must be greater than 0",
            );
        }
        if self.index_groups.is_empty() {
            return Err(LayoutError::InvalidField {
                field: "index_groups",
                index: None,
                value: Some(0),
                rule: "must not be empty",
            });
        }
        for (i, g) in self.index_groups.iter().enumerate() {
            if g.bucket >= self.num_buckets {
                return bad(
                    "index_groups[].bucket",
                    i,
                    Some(g.bucket.into()),
                    "must be below num_buckets",
                );
            }
            if g.layers.first() != Some(&g.leader) {
                return bad(
                    "index_groups[].layers",
                    i,
                    None,
                    "must start with the leader",
                );
            }
        }
        Ok(())
    }
}
