//! The planner: model + configuration + budgets → [`KvCacheConfig`] (rules in the module docs
//! of [`crate::layout`]).

use alloc::vec::Vec;

use super::*;

/// Plans the layout. See the module docs for the rules.
///
/// A plan whose GPU pool holds a `max_model_len` request under HiSparse but not its prefill
/// (which reads the whole context on the GPU) is still returned — shorter prompts prefill, and
/// the pool's decode capacity is what it is — with
/// [`LayoutWarning::MaxModelLenPrefillNeverFits`] among [`KvCacheConfig::warnings`] (and in the
/// [`LayoutReport`](super::LayoutReport)).
pub fn plan_layout(input: &LayoutInput<'_>) -> Result<KvCacheConfig, LayoutError> {
    let model = input.model;
    model.validate()?;
    input.config.validate()?;
    if input.max_model_len == 0 {
        return Err(LayoutError::ZeroMaxModelLen);
    }
    let first = *model.first_sparse().ok_or(ModelError::NoSparseLayers)?;
    let bt = model.block_tokens;
    let block_size = bt / first.compress_ratio;
    let align = first.page_alignment;
    let sparse_page =
        copied_page_bytes(block_size, first.row_bytes, align).ok_or(ovf("sparse page bytes"))?;
    let device_buffer_size = input.config.resolved_device_buffer_size()?;
    let mut config = *input.config;
    config.device_buffer_size = Some(device_buffer_size);

    // Source group, indexer group and hot units.
    let mut source = Vec::new();
    let mut indexer = Vec::new();
    let mut units: Vec<Vec<u32>> = Vec::new();
    let mut indexer_sum = 0u64;
    for (i, l) in model.layers.iter().enumerate() {
        let LayerSpec::Sparse(s) = l else { continue };
        let layer = i as u32;
        source.push(GroupLayer {
            layer,
            index_in_group: source.len() as u32,
            offset: 0,
            page_bytes: sparse_page,
            rows_per_block: block_size,
            row_bytes: s.row_bytes,
            value_bytes: s.value_bytes,
        });
        if let Some(irb) = s.indexer_row_bytes {
            let page = copied_page_bytes(block_size, irb, align).ok_or(ovf("indexer page"))?;
            indexer.push(GroupLayer {
                layer,
                index_in_group: indexer.len() as u32,
                offset: indexer_sum,
                page_bytes: page,
                rows_per_block: block_size,
                row_bytes: irb,
                value_bytes: s.indexer_value_bytes.unwrap_or(irb),
            });
            indexer_sum = indexer_sum
                .checked_add(page)
                .ok_or(ovf("indexer page bytes"))?;
            units.push(Vec::new());
        }
        // Validation guarantees the first sparse layer is a leader.
        if let Some(u) = units.last_mut() {
            u.push(layer);
        }
    }
    let source_sum = sparse_page
        .checked_mul(source.len() as u64)
        .ok_or(ovf("host_block_stride"))?;
    let host_align = if input.shared_host_pool {
        SHARED_HOST_ALIGNMENT
    } else {
        1
    };
    let host_block_stride = source_sum
        .checked_next_multiple_of(host_align)
        .ok_or(ovf("host_block_stride"))?;

    // Buckets.
    let mut buckets: Vec<Vec<u32>> = Vec::new();
    let mut bucket_sum = 0u64;
    let mut largest_bucket = 0u64;
    let mut index_groups = Vec::with_capacity(units.len());
    for unit in units {
        let unit_bytes = sparse_page * unit.len() as u64;
        let fits = bucket_sum + unit_bytes <= indexer_sum;
        match buckets.last_mut() {
            Some(b) if fits => {
                b.extend_from_slice(&unit);
                bucket_sum += unit_bytes;
            }
            _ => {
                buckets.push(unit.clone());
                bucket_sum = unit_bytes;
            }
        }
        largest_bucket = largest_bucket.max(bucket_sum);
        index_groups.push(IndexGroup {
            leader: unit[0],
            layers: unit,
            bucket: buckets.len() as u32 - 1,
        });
    }

    let mut groups = Vec::new();
    let group = |kind, bucket, page_bytes, layers| KvCacheGroup {
        kind,
        bucket,
        sliding_window: None,
        block_tokens: bt,
        cache: None,
        page_bytes,
        layers,
    };
    groups.push(group(GroupKind::Source, None, source_sum, source));
    groups.push(group(GroupKind::Indexer, None, indexer_sum, indexer));
    for kind in [GroupKind::Resident, GroupKind::Hot] {
        for (b, layers) in buckets.iter().enumerate() {
            let layers: Vec<GroupLayer> = layers
                .iter()
                .enumerate()
                .map(|(i, &layer)| GroupLayer {
                    layer,
                    index_in_group: i as u32,
                    offset: sparse_page * i as u64,
                    page_bytes: sparse_page,
                    rows_per_block: block_size,
                    row_bytes: first.row_bytes,
                    value_bytes: first.value_bytes,
                })
                .collect();
            let page = sparse_page * layers.len() as u64;
            groups.push(group(kind, Some(b as u32), page, layers));
        }
    }
    // Regular groups: by geometry, in order of first appearance; a group takes layers while it
    // stays within the block the sparse groups set (a group of one layer may exceed it).
    let cap = indexer_sum.max(largest_bucket);
    let first_regular = groups.len();
    for (i, l) in model.layers.iter().enumerate() {
        let LayerSpec::Regular(r) = l else { continue };
        let gbt = r.tokens_per_block(bt);
        let rows = gbt / r.compress_ratio;
        let page = padded_page_bytes(rows, r.row_bytes, r.page_alignment)
            .ok_or(ovf("regular page bytes"))?;
        let open = groups[first_regular..].iter().rposition(|g| {
            g.sliding_window == r.sliding_window
                && g.cache == Some(r.kind)
                && g.block_tokens == gbt
                && g.layers[0].row_bytes == r.row_bytes
                && g.layers[0].rows_per_block == rows
                && g.layers[0].page_bytes == page
        });
        let gi = match open {
            Some(j) if groups[first_regular + j].page_bytes.saturating_add(page) <= cap => {
                first_regular + j
            }
            _ => {
                groups.push(KvCacheGroup {
                    sliding_window: r.sliding_window,
                    block_tokens: gbt,
                    cache: Some(r.kind),
                    ..group(GroupKind::Regular, None, 0, Vec::new())
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[gi];
        g.layers.push(GroupLayer {
            layer: i as u32,
            index_in_group: g.layers.len() as u32,
            offset: g.page_bytes,
            page_bytes: page,
            rows_per_block: rows,
            row_bytes: r.row_bytes,
            value_bytes: r.row_bytes,
        });
        g.page_bytes = g
            .page_bytes
            .checked_add(page)
            .ok_or(ovf("regular page bytes"))?;
    }

    // GPU block size: the largest GPU group, rounded up to a multiple of the hot page size (all
    // hot pages have one size, so their lcm is that size).
    let largest = groups[1..].iter().map(|g| g.page_bytes).max().unwrap_or(0);
    let bytes_per_block = largest
        .div_ceil(sparse_page)
        .checked_mul(sparse_page)
        .ok_or(ovf("bytes_per_block"))?;
    let attention_block_stride = u32::try_from(bytes_per_block / sparse_page)
        .ok()
        .and_then(|slots| slots.checked_mul(block_size))
        .ok_or(ovf("attention_block_stride"))?;

    let hot_blocks_per_request = device_buffer_size.div_ceil(block_size);
    let max_pages_per_request = input.max_model_len.div_ceil(bt);

    // Host pool: the largest block count whose layer arrays fit the budget. An array is
    // rounded up to `host_align`, so each layer's share of the budget, rounded down to it, is
    // what its pages may fill: `n` blocks fit exactly when `n * page` is at most that.
    let budget = config.host_budget_bytes;
    let layers = (groups[0].layers.len() as u64).max(1);
    let array_room = budget / layers / host_align * host_align;
    let host_blocks = array_room / sparse_page;
    let host_needed = u64::from(max_pages_per_request) + 2;
    if host_blocks < host_needed {
        return Err(LayoutError::HostBudgetTooSmall {
            budget,
            host_block_stride,
            blocks: host_blocks,
            needed: host_needed,
        });
    }
    let host_max = (i32::MAX as u64 / u64::from(block_size)).min(i32::MAX as u64);
    if host_blocks > host_max {
        return Err(LayoutError::PoolTooLarge {
            pool: "host",
            blocks: host_blocks,
            max: host_max,
        });
    }

    // GPU pool.
    let gpu_blocks = match input.num_gpu_blocks_override {
        Some(n) => u64::from(n),
        None if input.gpu_bytes == 0 => return Err(LayoutError::ZeroGpuMemory),
        None => input.gpu_bytes / bytes_per_block,
    };
    let gpu_max = i32::MAX as u64 / u64::from(attention_block_stride).max(1);
    if gpu_blocks > gpu_max {
        return Err(LayoutError::PoolTooLarge {
            pool: "gpu",
            blocks: gpu_blocks,
            max: gpu_max,
        });
    }

    let mut kv = KvCacheConfig {
        model: model.name.into(),
        config,
        block_tokens: bt,
        block_size,
        sparse_compress_ratio: first.compress_ratio,
        row_bytes: first.row_bytes,
        value_bytes: first.value_bytes,
        page_alignment: align,
        shared_host_pool: input.shared_host_pool,
        groups,
        num_buckets: buckets.len() as u32,
        index_groups,
        bytes_per_block,
        attention_block_stride,
        num_gpu_blocks: gpu_blocks as u32,
        host_block_stride,
        host_num_blocks: host_blocks as u32,
        device_buffer_size,
        hot_blocks_per_request,
        max_model_len: input.max_model_len,
        max_pages_per_request,
    };
    // The source group's layers are host-pool arrays, one after another (layer-major).
    let array = kv.host_array_bytes();
    if let Some(source) = kv.groups.first_mut() {
        for l in &mut source.layers {
            l.offset = u64::from(l.index_in_group) * array;
        }
    }
    let needed = 1 + kv.gpu_blocks_per_request(input.max_model_len).min_needed();
    if gpu_blocks < needed {
        return Err(LayoutError::GpuPoolTooSmall {
            blocks: gpu_blocks,
            needed,
            bytes_per_block,
        });
    }
    Ok(kv)
}
