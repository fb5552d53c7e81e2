//! The fixed layout: the numbers of the heap planner without an allocator, and a typed error
//! when its arrays are too small.

use super::*;
use crate::config::HiSparseConfig;
use crate::presets::DEEPSEEK_V32;

const GIB: u64 = 1 << 30;

#[test]
fn deepseek_v32_plans_without_an_allocator() {
    let model = DEEPSEEK_V32;
    let cfg = HiSparseConfig::new(model.top_k, 64 * GIB);
    let input = LayoutInput::new(&model, &cfg, 40 * GIB, 131072);
    let kv = plan_layout_fixed::<16, 256>(&input).unwrap();
    assert_eq!(kv.model, "deepseek-v3.2");
    assert_eq!(kv.sizes.num_buckets, 6);
    assert_eq!(kv.sizes.bytes_per_block, 545792);
    assert_eq!(kv.sizes.host_block_stride, 2561024);
    assert_eq!(kv.sizes.hot_blocks_per_request, 64);
    assert_eq!(kv.sizes.attention_block_stride, 832);
    let kinds = kv.groups().iter().map(|g| g.kind);
    assert!(
        kinds
            .clone()
            .take(2)
            .eq([GroupKind::Source, GroupKind::Indexer])
    );
    assert_eq!(kinds.filter(|&k| k == GroupKind::Hot).count(), 6);
    assert_eq!(kv.layers(0).count(), 61);
    // Every source layer's host array follows the one before it.
    let array = kv.sizes.host_num_blocks as u64 * kv.layers(0).next().unwrap().page_bytes;
    for (i, l) in kv.layers(0).enumerate() {
        assert_eq!(l.offset, i as u64 * array);
    }
    assert_eq!(kv.index_groups().len(), 61);
    assert!(kv.index_group_layers(3).eq([3]));
    assert_eq!(kv.index_group_layers(99).count(), 0);
    let pair = kv.layer_pair(60).unwrap();
    assert_eq!(pair.host.base, 60 * array);
    assert_eq!(pair.device.block_stride, 545792);
    assert_eq!(kv.layer_pair(61), Err(LayoutError::NotSparse { layer: 61 }));
}

#[test]
fn a_layout_too_large_for_its_arrays_is_a_typed_error() {
    let model = DEEPSEEK_V32;
    let cfg = HiSparseConfig::new(model.top_k, 64 * GIB);
    let input = LayoutInput::new(&model, &cfg, 40 * GIB, 131072);
    let e = plan_layout_fixed::<16, 100>(&input).unwrap_err();
    assert_eq!(
        e,
        LayoutError::FixedCapacity {
            what: "layer entries",
            parameter: "LAYERS",
            capacity: 100
        }
    );
    let message = std::format!("{e}");
    assert!(message.contains("raise `LAYERS`"), "{message}");
    let e = plan_layout_fixed::<8, 256>(&input).unwrap_err();
    assert!(matches!(
        e,
        LayoutError::FixedCapacity {
            parameter: "GROUPS",
            capacity: 8,
            ..
        }
    ));
    // The planner's own errors come first, as on the heap.
    let short = LayoutInput::new(&model, &cfg, 40 * GIB, 0);
    assert_eq!(
        plan_layout_fixed::<16, 256>(&short).unwrap_err(),
        LayoutError::ZeroMaxModelLen
    );
}

/// One planner writes both forms: for every preset and a spread of budgets (errors included),
/// the fixed layout has the heap layout's sizes, groups, layers and index groups.
#[cfg(feature = "alloc")]
#[test]
fn fixed_and_heap_layouts_agree() {
    use crate::presets::{DEEPSEEK_V4, GLM5};
    let (mut compared, mut refused) = (0, 0);
    for model in [DEEPSEEK_V32, GLM5, DEEPSEEK_V4] {
        for (host, gpu, len, shared, query) in [
            (64 * GIB, 40 * GIB, 131072, false, 1),
            (64 * GIB, 40 * GIB, 131072, true, 4),
            (512 * GIB, 80 * GIB, 8192, false, 1),
            (GIB, 40 * GIB, 131072, false, 1),
            (64 * GIB, GIB / 4, 131072, false, 1),
        ] {
            let mut cfg = HiSparseConfig::new(model.top_k, host);
            cfg.max_query_len = query;
            let mut input = LayoutInput::new(&model, &cfg, gpu, len);
            input.shared_host_pool = shared;
            let heap = super::super::plan_layout(&input);
            let fixed = plan_layout_fixed::<64, 1024>(&input);
            let (heap, fixed) = match (heap, fixed) {
                (Err(h), Err(f)) => {
                    assert_eq!(h, f, "{}", model.name);
                    refused += 1;
                    continue;
                }
                (Ok(h), Ok(f)) => (h, f),
                (h, f) => panic!("{}: heap {h:?} but fixed {f:?}", model.name),
            };
            let s = &fixed.sizes;
            assert_eq!(
                (
                    heap.config,
                    heap.block_tokens,
                    heap.block_size,
                    heap.num_buckets
                ),
                (s.config, s.block_tokens, s.block_size, s.num_buckets)
            );
            assert_eq!(
                (
                    heap.bytes_per_block,
                    heap.attention_block_stride,
                    heap.num_gpu_blocks
                ),
                (
                    s.bytes_per_block,
                    s.attention_block_stride,
                    s.num_gpu_blocks
                )
            );
            assert_eq!(
                (
                    heap.host_block_stride,
                    heap.host_num_blocks,
                    heap.hot_blocks_per_request
                ),
                (
                    s.host_block_stride,
                    s.host_num_blocks,
                    s.hot_blocks_per_request
                )
            );
            assert_eq!(
                (heap.sparse_compress_ratio, heap.row_bytes, heap.value_bytes),
                (s.sparse_compress_ratio, s.row_bytes, s.value_bytes)
            );
            assert_eq!(
                (
                    heap.page_alignment,
                    heap.shared_host_pool,
                    heap.device_buffer_size
                ),
                (s.page_alignment, s.shared_host_pool, s.device_buffer_size)
            );
            assert_eq!(
                (heap.max_model_len, heap.max_pages_per_request),
                (s.max_model_len, s.max_pages_per_request)
            );
            assert_eq!(heap.groups.len(), fixed.groups().len());
            for (g, (h, f)) in heap.groups.iter().zip(fixed.groups()).enumerate() {
                assert_eq!(h.shape(), *f, "{} group {g}", model.name);
                assert!(
                    h.layers.iter().eq(fixed.layers(g)),
                    "{} group {g}",
                    model.name
                );
            }
            assert_eq!(heap.index_groups.len(), fixed.index_groups().len());
            for (i, (h, f)) in heap
                .index_groups
                .iter()
                .zip(fixed.index_groups())
                .enumerate()
            {
                assert_eq!((h.leader, h.bucket), (f.leader, f.bucket));
                assert!(h.layers.iter().copied().eq(fixed.index_group_layers(i)));
            }
            for layer in 0..model.layers.len() as u32 + 1 {
                assert_eq!(
                    heap.layer_pair(layer),
                    fixed.layer_pair(layer),
                    "layer {layer}"
                );
            }
            compared += 1;
        }
    }
    // Both outcomes are covered: plans compared field by field, and refusals.
    assert!(
        compared >= 9 && refused >= 3,
        "{compared} compared, {refused} refused"
    );
}
