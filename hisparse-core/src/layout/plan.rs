//! The planner: model + configuration + budgets → a layout (rules in the module docs of
//! [`crate::layout`]).
//!
//! One algorithm, [`plan_into`], places every group and layer through a [`PlanSink`] and returns
//! the layout's [`LayoutSizes`]: the heap sink builds a [`KvCacheConfig`] ([`plan_layout`], with
//! `alloc`), the fixed one a [`FixedLayout`](super::FixedLayout)
//! ([`plan_layout_fixed`](super::plan_layout_fixed), no allocator). Both give the same groups,
//! layers and sizes for the same input.

use super::rules::{self, GpuBlocksPerRequest};
use super::{
    GroupKind, GroupLayer, GroupShape, LayoutError, LayoutInput, LayoutSizes,
    SHARED_HOST_ALIGNMENT, ovf,
};
use crate::model::{
    LayerSpec, ModelError, ModelSpec, SparseLayer, copied_page_bytes, padded_page_bytes,
};

/// Where the planner places groups, layers and index groups. Groups are appended in order
/// `[source, indexer, resident.., hot.., regular..]`; a layer is appended to any group placed so
/// far (regular layers go to the open group of their geometry).
pub(super) trait PlanSink {
    /// Appends a group without layers; returns its index. A full sink refuses it.
    fn push_group(&mut self, group: GroupShape) -> Result<usize, LayoutError>;
    /// Groups placed so far.
    fn num_groups(&self) -> usize;
    /// Group `g` (placed) and its first layer, if it has one.
    fn group(&self, g: usize) -> (GroupShape, Option<GroupLayer>);
    /// Appends `layer` to group `g` (counting it in the group's `num_layers`; its page bytes
    /// are the planner's to set). A full sink refuses it.
    fn push_layer(&mut self, g: usize, layer: GroupLayer) -> Result<(), LayoutError>;
    /// Sets group `g`'s summed page bytes.
    fn set_page_bytes(&mut self, g: usize, bytes: u64);
    /// Appends an index group: `leader` and the `len` sparse layers from the `first`-th (the
    /// source group's layers `first..first + len`), in bucket `bucket`. A full sink refuses it.
    fn push_index_group(
        &mut self,
        leader: u32,
        bucket: u32,
        first: u32,
        len: u32,
    ) -> Result<(), LayoutError>;
    /// The bucket of index group `i` (placed).
    fn index_bucket(&self, i: usize) -> u32;
    /// Gives every source layer its host array: layer `i` of the source group at `i *
    /// array_bytes`.
    fn place_source_arrays(&mut self, array_bytes: u64);
}

/// One hot unit: a leader and the followers up to the next leader.
#[derive(Clone, Copy, Debug)]
struct Unit {
    /// Model layer of the leader.
    leader: u32,
    /// Index of the leader among the model's sparse layers.
    first: u32,
    /// Sparse layers in the unit.
    len: u32,
}

/// The model's sparse layers with their model layer index.
fn sparse_layers<'m>(model: &'m ModelSpec<'m>) -> impl Iterator<Item = (u32, &'m SparseLayer)> {
    model
        .layers
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.as_sparse().map(|s| (i as u32, s)))
}

/// The model's hot units in order (validation guarantees the first sparse layer leads one).
fn units<'m>(model: &'m ModelSpec<'m>) -> impl Iterator<Item = Unit> + 'm {
    let mut sparse = sparse_layers(model).enumerate().peekable();
    core::iter::from_fn(move || {
        let (k, (leader, _)) = sparse.next()?;
        let mut len = 1;
        while sparse
            .next_if(|(_, (_, s))| s.indexer_row_bytes.is_none())
            .is_some()
        {
            len += 1;
        }
        Some(Unit {
            leader,
            first: k as u32,
            len,
        })
    })
}

/// A group of `kind` without layers.
fn shape(kind: GroupKind, bucket: Option<u32>, block_tokens: u32) -> GroupShape {
    GroupShape {
        kind,
        bucket,
        sliding_window: None,
        block_tokens,
        cache: None,
        page_bytes: 0,
        num_layers: 0,
    }
}

/// Plans the layout into `sink` and returns its sizes. See the module docs of
/// [`crate::layout`] for the rules.
pub(super) fn plan_into<S: PlanSink>(
    input: &LayoutInput<'_>,
    sink: &mut S,
) -> Result<LayoutSizes, LayoutError> {
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

    // Source group and indexer group.
    let source = sink.push_group(shape(GroupKind::Source, None, bt))?;
    let indexer = sink.push_group(shape(GroupKind::Indexer, None, bt))?;
    let mut num_sparse = 0u32;
    let mut indexer_sum = 0u64;
    for (layer, s) in sparse_layers(model) {
        sink.push_layer(
            source,
            GroupLayer {
                layer,
                index_in_group: num_sparse,
                offset: 0,
                page_bytes: sparse_page,
                rows_per_block: block_size,
                row_bytes: s.row_bytes,
                value_bytes: s.value_bytes,
            },
        )?;
        num_sparse += 1;
        if let Some(irb) = s.indexer_row_bytes {
            let page = copied_page_bytes(block_size, irb, align).ok_or(ovf("indexer page"))?;
            let index_in_group = sink.group(indexer).0.num_layers;
            sink.push_layer(
                indexer,
                GroupLayer {
                    layer,
                    index_in_group,
                    offset: indexer_sum,
                    page_bytes: page,
                    rows_per_block: block_size,
                    row_bytes: irb,
                    value_bytes: s.indexer_value_bytes.unwrap_or(irb),
                },
            )?;
            indexer_sum = indexer_sum
                .checked_add(page)
                .ok_or(ovf("indexer page bytes"))?;
        }
    }
    let source_sum = sparse_page
        .checked_mul(u64::from(num_sparse))
        .ok_or(ovf("host_block_stride"))?;
    sink.set_page_bytes(source, source_sum);
    sink.set_page_bytes(indexer, indexer_sum);
    let host_align = if input.shared_host_pool {
        SHARED_HOST_ALIGNMENT
    } else {
        1
    };
    let host_block_stride = source_sum
        .checked_next_multiple_of(host_align)
        .ok_or(ovf("host_block_stride"))?;

    // Buckets: units packed greedily, each unit an index group.
    let mut num_buckets = 0u32;
    let mut bucket_sum = 0u64;
    let mut largest_bucket = 0u64;
    for unit in units(model) {
        let unit_bytes = sparse_page * u64::from(unit.len);
        let fits = bucket_sum + unit_bytes <= indexer_sum;
        if num_buckets > 0 && fits {
            bucket_sum += unit_bytes;
        } else {
            num_buckets += 1;
            bucket_sum = unit_bytes;
        }
        largest_bucket = largest_bucket.max(bucket_sum);
        sink.push_index_group(unit.leader, num_buckets - 1, unit.first, unit.len)?;
    }

    // Resident and hot groups: bucket `b` holds the layers of its units, side by side.
    for kind in [GroupKind::Resident, GroupKind::Hot] {
        for b in 0..num_buckets {
            let g = sink.push_group(shape(kind, Some(b), bt))?;
            let mut placed = 0u32;
            for (i, unit) in units(model).enumerate() {
                if sink.index_bucket(i) != b {
                    continue;
                }
                let layers = sparse_layers(model).skip(unit.first as usize);
                for (layer, _) in layers.take(unit.len as usize) {
                    sink.push_layer(
                        g,
                        GroupLayer {
                            layer,
                            index_in_group: placed,
                            offset: sparse_page * u64::from(placed),
                            page_bytes: sparse_page,
                            rows_per_block: block_size,
                            row_bytes: first.row_bytes,
                            value_bytes: first.value_bytes,
                        },
                    )?;
                    placed += 1;
                }
            }
            sink.set_page_bytes(g, sparse_page * u64::from(placed));
        }
    }

    // Regular groups: by geometry, in order of first appearance; a group takes layers while it
    // stays within the block the sparse groups set (a group of one layer may exceed it).
    let cap = indexer_sum.max(largest_bucket);
    let first_regular = sink.num_groups();
    for (i, l) in model.layers.iter().enumerate() {
        let LayerSpec::Regular(r) = l else { continue };
        let gbt = r.tokens_per_block(bt);
        let rows = gbt / r.compress_ratio;
        let page = padded_page_bytes(rows, r.row_bytes, r.page_alignment)
            .ok_or(ovf("regular page bytes"))?;
        let open = (first_regular..sink.num_groups()).rev().find(|&g| {
            let (shape, first) = sink.group(g);
            shape.sliding_window == r.sliding_window
                && shape.cache == Some(r.kind)
                && shape.block_tokens == gbt
                && first.is_some_and(|f| {
                    f.row_bytes == r.row_bytes && f.rows_per_block == rows && f.page_bytes == page
                })
        });
        let gi = match open {
            Some(g) if sink.group(g).0.page_bytes.saturating_add(page) <= cap => g,
            _ => sink.push_group(GroupShape {
                sliding_window: r.sliding_window,
                cache: Some(r.kind),
                ..shape(GroupKind::Regular, None, gbt)
            })?,
        };
        let (g, _) = sink.group(gi);
        sink.push_layer(
            gi,
            GroupLayer {
                layer: i as u32,
                index_in_group: g.num_layers,
                offset: g.page_bytes,
                page_bytes: page,
                rows_per_block: rows,
                row_bytes: r.row_bytes,
                value_bytes: r.row_bytes,
            },
        )?;
        let bytes = g
            .page_bytes
            .checked_add(page)
            .ok_or(ovf("regular page bytes"))?;
        sink.set_page_bytes(gi, bytes);
    }

    // GPU block size: the largest GPU group, rounded up to a multiple of the hot page size (all
    // hot pages have one size, so their lcm is that size).
    let largest = (1..sink.num_groups())
        .map(|g| sink.group(g).0.page_bytes)
        .max()
        .unwrap_or(0);
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

    // Host pool: the largest block count whose layer arrays and indexer host cache fit the
    // budget together.
    let budget = config.host_budget_bytes;
    let layers = u64::from(num_sparse).max(1);
    let host_blocks = rules::host_blocks_in_budget(
        budget,
        layers,
        sparse_page,
        indexer_sum,
        input.shared_host_pool,
    );
    let host_needed = u64::from(max_pages_per_request) + 2;
    if host_blocks < host_needed {
        return Err(LayoutError::HostBudgetTooSmall {
            budget,
            host_block_stride,
            indexer_page_bytes: indexer_sum,
            blocks: host_blocks,
            needed: host_needed,
            needed_bytes: rules::host_bytes(
                host_needed,
                layers,
                sparse_page,
                indexer_sum,
                input.shared_host_pool,
            ),
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

    // The source group's layers are host-pool arrays, one after another (layer-major).
    let host_blocks = host_blocks as u32;
    sink.place_source_arrays(rules::host_array_bytes(
        host_blocks,
        sparse_page,
        input.shared_host_pool,
    ));
    let regular = (first_regular..sink.num_groups()).fold(0u64, |acc, g| {
        let (g, _) = sink.group(g);
        acc.saturating_add(rules::regular_blocks(
            g.block_tokens,
            bt,
            g.sliding_window,
            config.max_query_len,
            input.max_model_len,
        ))
    });
    let per_request = GpuBlocksPerRequest::of(
        u64::from(max_pages_per_request),
        regular,
        num_buckets,
        hot_blocks_per_request,
    );
    let needed = 1 + per_request.min_needed();
    if gpu_blocks < needed {
        return Err(LayoutError::GpuPoolTooSmall {
            blocks: gpu_blocks,
            needed,
            bytes_per_block,
        });
    }
    Ok(LayoutSizes {
        config,
        block_tokens: bt,
        block_size,
        sparse_compress_ratio: first.compress_ratio,
        row_bytes: first.row_bytes,
        value_bytes: first.value_bytes,
        page_alignment: align,
        shared_host_pool: input.shared_host_pool,
        num_buckets,
        bytes_per_block,
        attention_block_stride,
        num_gpu_blocks: gpu_blocks as u32,
        host_block_stride,
        host_num_blocks: host_blocks,
        device_buffer_size,
        hot_blocks_per_request,
        max_model_len: input.max_model_len,
        max_pages_per_request,
    })
}

#[cfg(feature = "alloc")]
mod heap {
    use alloc::vec::Vec;

    use super::super::{IndexGroup, KvCacheConfig, KvCacheGroup};
    use super::*;

    /// The heap sink: the groups and index groups of a [`KvCacheConfig`].
    #[derive(Default)]
    struct HeapSink {
        groups: Vec<KvCacheGroup>,
        index_groups: Vec<IndexGroup>,
    }

    impl PlanSink for HeapSink {
        fn push_group(&mut self, g: GroupShape) -> Result<usize, LayoutError> {
            self.groups.push(KvCacheGroup {
                kind: g.kind,
                bucket: g.bucket,
                sliding_window: g.sliding_window,
                block_tokens: g.block_tokens,
                cache: g.cache,
                page_bytes: g.page_bytes,
                layers: Vec::new(),
            });
            Ok(self.groups.len() - 1)
        }

        fn num_groups(&self) -> usize {
            self.groups.len()
        }

        fn group(&self, g: usize) -> (GroupShape, Option<GroupLayer>) {
            let group = &self.groups[g];
            (group.shape(), group.layers.first().copied())
        }

        fn push_layer(&mut self, g: usize, layer: GroupLayer) -> Result<(), LayoutError> {
            self.groups[g].layers.push(layer);
            Ok(())
        }

        fn set_page_bytes(&mut self, g: usize, bytes: u64) {
            self.groups[g].page_bytes = bytes;
        }

        fn push_index_group(
            &mut self,
            leader: u32,
            bucket: u32,
            first: u32,
            len: u32,
        ) -> Result<(), LayoutError> {
            let source = &self.groups[KvCacheConfig::SOURCE_GROUP].layers;
            let layers = source[first as usize..][..len as usize]
                .iter()
                .map(|l| l.layer)
                .collect();
            self.index_groups.push(IndexGroup {
                leader,
                layers,
                bucket,
            });
            Ok(())
        }

        fn index_bucket(&self, i: usize) -> u32 {
            self.index_groups[i].bucket
        }

        fn place_source_arrays(&mut self, array_bytes: u64) {
            for l in &mut self.groups[KvCacheConfig::SOURCE_GROUP].layers {
                l.offset = u64::from(l.index_in_group) * array_bytes;
            }
        }
    }

    /// Plans the layout. See the module docs of [`crate::layout`] for the rules.
    ///
    /// A plan whose GPU pool holds a `max_model_len` request under HiSparse but not its prefill
    /// (which reads the whole context on the GPU) is still returned — shorter prompts prefill,
    /// and the pool's decode capacity is what it is — with
    /// [`LayoutWarning::MaxModelLenPrefillNeverFits`](super::super::LayoutWarning::MaxModelLenPrefillNeverFits)
    /// among [`KvCacheConfig::warnings`] (and in the [`LayoutReport`](super::super::LayoutReport)).
    pub fn plan_layout(input: &LayoutInput<'_>) -> Result<KvCacheConfig, LayoutError> {
        let mut sink = HeapSink::default();
        let s = plan_into(input, &mut sink)?;
        Ok(KvCacheConfig {
            model: input.model.name.into(),
            config: s.config,
            block_tokens: s.block_tokens,
            block_size: s.block_size,
            sparse_compress_ratio: s.sparse_compress_ratio,
            row_bytes: s.row_bytes,
            value_bytes: s.value_bytes,
            page_alignment: s.page_alignment,
            shared_host_pool: s.shared_host_pool,
            groups: sink.groups,
            num_buckets: s.num_buckets,
            index_groups: sink.index_groups,
            bytes_per_block: s.bytes_per_block,
            attention_block_stride: s.attention_block_stride,
            num_gpu_blocks: s.num_gpu_blocks,
            host_block_stride: s.host_block_stride,
            host_num_blocks: s.host_num_blocks,
            device_buffer_size: s.device_buffer_size,
            hot_blocks_per_request: s.hot_blocks_per_request,
            max_model_len: s.max_model_len,
            max_pages_per_request: s.max_pages_per_request,
        })
    }
}

#[cfg(feature = "alloc")]
pub use heap::plan_layout;
