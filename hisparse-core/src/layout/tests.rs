use super::*;
use crate::model::{LayerSpec, RegularKind, RegularLayer, SparseLayer};
use crate::presets::{DEEPSEEK_V4, DEEPSEEK_V32, GLM5};

const GIB: u64 = 1 << 30;

fn plan(
    model: &ModelSpec<'_>,
    host: u64,
    gpu: u64,
    len: u32,
) -> Result<KvCacheConfig, LayoutError> {
    let cfg = HiSparseConfig::new(model.top_k, host);
    plan_layout(&LayoutInput::new(model, &cfg, gpu, len))
}

#[test]
fn deepseek_v32_vectors() {
    let kv = plan(&DEEPSEEK_V32, 64 * GIB, 40 * GIB, 131072).unwrap();
    assert_eq!(kv.num_buckets, 6);
    let kinds: Vec<GroupKind> = kv.groups.iter().map(|g| g.kind).collect();
    let mut expect = alloc::vec![GroupKind::Source, GroupKind::Indexer];
    expect.extend([GroupKind::Resident; 6]);
    expect.extend([GroupKind::Hot; 6]);
    assert_eq!(kinds, expect);
    for b in 0..6 {
        let n = if b == 5 { 1 } else { 12 };
        assert_eq!(kv.groups[kv.resident_group(b)].layers.len(), n);
        assert_eq!(kv.groups[kv.hot_group(b)].layers.len(), n);
        assert_eq!(
            kv.groups[kv.hot_group(b)].layers,
            kv.groups[kv.resident_group(b)].layers
        );
    }
    assert_eq!(kv.groups[0].layers.len(), 61);
    assert_eq!(kv.groups[1].layers.len(), 61);
    assert_eq!(kv.groups[1].page_bytes, 61 * 64 * 132);
    assert_eq!(kv.bytes_per_block, 545792);
    assert_eq!(kv.attention_block_stride, 832);
    assert_eq!(kv.host_block_stride, 2561024);
    assert_eq!(kv.hot_blocks_per_request, 64);
    assert_eq!(kv.device_buffer_size, 4096);
    assert_eq!(kv.num_gpu_blocks as u64, 40 * GIB / 545792);
    // The host budget holds the pool (2,561,024 B per block) and the indexer host cache
    // (61 x 64 x 132 B per block).
    assert_eq!(
        kv.host_num_blocks as u64,
        64 * GIB / (2561024 + 61 * 64 * 132)
    );
    assert_eq!(kv.max_pages_per_request, 2048);
    assert_eq!(kv.index_groups.len(), 61);
    assert_eq!(kv.index_groups[13].bucket, 1);
    assert_eq!(kv.index_groups[60].bucket, 5);
    // Layer 13 is the second layer of bucket 1: offset = one page.
    let (b, l) = kv.bucket_of(13).unwrap();
    assert_eq!((b, l.index_in_group, l.offset), (1, 1, 41984));
    let pair = kv.layer_pair(13).unwrap();
    assert_eq!(pair.device.base, 41984);
    assert_eq!(pair.device.block_stride, 545792);
    assert_eq!(pair.device.index_stride_rows, 832);
    assert_eq!(pair.host.base, 13 * u64::from(kv.host_num_blocks) * 41984);
    assert_eq!(
        kv.groups[0].layers[13].offset, pair.host.base,
        "source offset = host base"
    );
    assert_eq!(pair.host.block_stride, 41984);
    assert_eq!(pair.host.index_stride_rows, 64);
    pair.host
        .check(
            crate::error::OpName::CopyPages,
            "host",
            kv.host_pool_bytes(),
        )
        .unwrap();
    pair.device
        .check(
            crate::error::OpName::CopyPages,
            "device",
            kv.gpu_pool_bytes(),
        )
        .unwrap();
    // Every layer of the last pool fits exactly.
    let last = kv.layer_pair(60).unwrap();
    assert_eq!(
        last.host.end(crate::error::OpName::CopyPages).unwrap(),
        kv.host_pool_bytes()
    );
    // Indexer offsets include the index within the group.
    assert_eq!(kv.groups[1].layers[5].offset, 5 * 8448);
    assert_eq!(kv.device_offset(3, 1, 5), Some(3 * 545792 + 5 * 8448));
    assert_eq!(kv.layer_pair(61), Err(LayoutError::NotSparse { layer: 61 }));
    assert_eq!(kv.bucket_layer_pairs(5).unwrap().len(), 1);
    assert_eq!(
        kv.bucket_layer_pairs(0).unwrap()[1],
        kv.layer_pair(1).unwrap()
    );
    assert!(kv.bucket_layer_pairs(6).is_err());
    let d = kv.resolve_desc(3, 8);
    assert_eq!(
        (d.hot_slots, d.attention_block_stride, d.max_pages),
        (4096, 832, 2048)
    );
    d.validate().unwrap();
}

#[test]
fn v32_capacity() {
    let kv = plan(&DEEPSEEK_V32, 512 * GIB, 40 * GIB, 131072).unwrap();
    let c = kv.capacity(32768);
    // 512 pages; all-on-GPU: 512 indexer + 6*512 resident = 3584 blocks per request.
    assert_eq!(c.pages_per_request, 512);
    assert_eq!(c.gpu_blocks_per_request.all_on_gpu, 3584);
    // HiSparse: 512 indexer + 6*2 tail + 6*64 hot = 908.
    assert_eq!(c.gpu_blocks_per_request.hisparse, 908);
    let gpu = (40 * GIB / 545792) - 1;
    assert_eq!(c.all_on_gpu_max, gpu / 3584);
    assert_eq!(c.hisparse_gpu_max, gpu / 908);
    assert_eq!(c.limit, CapacityLimit::Gpu);
    assert!(c.hisparse_max > 3 * c.all_on_gpu_max);
    // A small host budget makes the host the limit.
    let kv = plan(&DEEPSEEK_V32, 64 * GIB, 40 * GIB, 131072).unwrap();
    let c = kv.capacity(32768);
    assert_eq!(c.limit, CapacityLimit::Host);
    assert_eq!(c.host_max, (64 * GIB / (2561024 + 61 * 64 * 132) - 2) / 512);
    assert_eq!(c.hisparse_max, c.host_max);
    // Short contexts: all-on-GPU is better.
    let c = kv.capacity(128);
    assert_eq!(c.limit, CapacityLimit::AllOnGpu);
    assert!(std::format!("{c}").contains("limited by"));
}

/// A layout whose host pool holds a 128K request and whose GPU pool holds its HiSparse decode
/// but not its prefill (which holds the whole context on the GPU): the capacity table says so
/// per context, the report names the longest prompt that prefills, and the plan warns.
#[test]
fn capacity_says_whether_one_requests_prefill_fits() {
    let kv = plan(&DEEPSEEK_V32, 512 * GIB, 4 * GIB, 131072).unwrap();
    let gpu = 4 * GIB / 545792 - 1;
    let c128 = kv.capacity(131072);
    assert!(c128.host_max >= 1 && c128.hisparse_max >= 1, "{c128}");
    // 2048 pages: 2048 indexer + 6 * 2048 resident blocks at once.
    assert_eq!(c128.prefill_gpu_blocks, 7 * 2048);
    assert!(!c128.prefill_fits);
    assert!(
        std::format!("{c128}").contains("prefill never fits"),
        "{c128}"
    );
    let c8 = kv.capacity(8192);
    assert!(c8.prefill_fits && c8.prefill_gpu_blocks == 7 * 128);
    // The longest prompt that prefills: 7 blocks per 64-token page.
    let longest = kv.max_prefill_context();
    assert_eq!(longest, (gpu / 7) as u32 * 64);
    assert!(kv.prefill_fits(longest) && !kv.prefill_fits(longest + 1));
    let w = kv.warnings();
    assert_eq!(
        w,
        [LayoutWarning::MaxModelLenPrefillNeverFits {
            max_model_len: 131072,
            needed_blocks: 7 * 2048,
            gpu_blocks: gpu,
            max_prefill_context: longest,
            bytes_per_block: 545792,
        }]
    );
    let text = std::format!("{}", w[0]);
    assert!(
        text.contains("raise the GPU budget") && text.contains(&std::format!("{longest}")),
        "{text}"
    );
    // A pool that holds the prefill: no warning, and the longest prompt is max_model_len.
    let kv = plan(&DEEPSEEK_V32, 512 * GIB, 80 * GIB, 131072).unwrap();
    assert!(kv.warnings().is_empty() && kv.capacity(131072).prefill_fits);
    assert_eq!(kv.max_prefill_context(), 131072);
}

/// GLM-5's index schedule (`index_topk_freq` 4, `index_skip_topk_offset` 3): 21 index
/// groups with leaders at 0, 1, 2, 6, 10, …, 74.
#[test]
fn glm5_index_groups() {
    let kv = plan(&GLM5, 64 * GIB, 40 * GIB, 65536).unwrap();
    assert_eq!(kv.groups[1].layers.len(), 21);
    let leaders: Vec<u32> = kv.index_groups.iter().map(|g| g.leader).collect();
    let mut want = alloc::vec![0, 1, 2];
    want.extend((6..=74).step_by(4));
    assert_eq!(leaders, want);
    assert_eq!(kv.index_groups[2].layers, alloc::vec![2, 3, 4, 5]);
    assert_eq!(kv.index_groups[20].layers, alloc::vec![74, 75, 76, 77]);
    // 21 indexers * 8448 = 177408 hold 4 pages of 41984: layers 0 and 1 share a bucket,
    // then one bucket per 4-layer unit.
    assert_eq!(kv.num_buckets, 20);
    assert_eq!(kv.groups[kv.resident_group(0)].layers.len(), 2);
    assert_eq!(kv.groups[kv.resident_group(1)].layers.len(), 4);
    // Largest group: indexer 177408 → rounded up to 5 pages of 41984.
    assert_eq!(kv.bytes_per_block, 5 * 41984);
    assert_eq!(kv.host_block_stride, 78 * 41984);
    assert_eq!(kv.index_group_pairs(2).unwrap().len(), 4);
}

/// DeepSeek V4 as vLLM declares its caches: 584-B split rows in 37,440-B pages, 8,640-B
/// indexer pages, 1,728-B C128A pages, sliding-window and compressor-state groups with
/// their own block sizes, host stride 21 × 37,440 = 786,240.
#[test]
fn deepseek_v4_vectors() {
    let kv = plan(&DEEPSEEK_V4, 512 * GIB, 80 * GIB, 131072).unwrap();
    assert_eq!((kv.block_tokens, kv.block_size), (256, 64));
    assert_eq!(
        (kv.row_bytes, kv.value_bytes, kv.page_alignment),
        (584, 576, 576)
    );
    assert_eq!(kv.host_block_stride, 786240);
    assert!(kv.groups[0].layers.iter().all(|l| l.page_bytes == 37440));
    assert_eq!(kv.groups[1].layers.len(), 21);
    assert!(
        kv.groups[1]
            .layers
            .iter()
            .all(|l| l.page_bytes == 8640 && l.row_bytes == 132 && l.value_bytes == 128)
    );
    // 21 indexers * 8640 = 181440 hold 4 C4A pages (149760): 21 = 5 * 4 + 1.
    assert_eq!(kv.num_buckets, 6);
    assert_eq!(kv.groups[kv.resident_group(0)].page_bytes, 4 * 37440);
    // Block: 181440 rounded up to 5 pages of 37440; 5 * 64 rows in the flat view.
    assert_eq!(kv.bytes_per_block, 5 * 37440);
    assert_eq!(kv.attention_block_stride, 320);
    assert_eq!(kv.hot_blocks_per_request, (2 * 512) / 64);
    let regular: Vec<&KvCacheGroup> = kv.groups[kv.regular_groups()].iter().collect();
    let of = |kind: RegularKind, bt: u32| -> Vec<&&KvCacheGroup> {
        regular
            .iter()
            .filter(|g| g.cache == Some(kind) && g.block_tokens == bt)
            .collect()
    };
    let swa = of(RegularKind::SlidingWindow, 64);
    assert_eq!(swa.iter().map(|g| g.layers.len()).sum::<usize>(), 43);
    assert_eq!(swa.len(), 11);
    assert!(swa.iter().all(|g| {
        g.sliding_window == Some(128)
            && g.layers
                .iter()
                .all(|l| l.page_bytes == 37440 && l.rows_per_block == 64)
    }));
    let c128a = of(RegularKind::Attention, 256);
    assert_eq!(c128a.len(), 1);
    assert_eq!(c128a[0].layers.len(), 20);
    assert!(
        c128a[0]
            .layers
            .iter()
            .all(|l| l.page_bytes == 1728 && l.rows_per_block == 2)
    );
    let c4_state: Vec<_> = of(RegularKind::CompressorState, 4);
    let (kv_state, indexer_state): (Vec<&&&KvCacheGroup>, Vec<&&&KvCacheGroup>) = c4_state
        .iter()
        .partition(|g| g.layers[0].page_bytes == 32832);
    assert_eq!(kv_state.iter().map(|g| g.layers.len()).sum::<usize>(), 21);
    assert_eq!(
        indexer_state.iter().map(|g| g.layers.len()).sum::<usize>(),
        21
    );
    assert!(indexer_state.iter().all(|g| g.layers[0].page_bytes == 8640));
    assert!(c4_state.iter().all(|g| g.sliding_window == Some(8)));
    let c128_state = of(RegularKind::CompressorState, 8);
    assert_eq!(c128_state.iter().map(|g| g.layers.len()).sum::<usize>(), 20);
    assert!(
        c128_state.iter().all(
            |g| g.sliding_window == Some(128) && g.layers.iter().all(|l| l.page_bytes == 32832)
        )
    );
    // Every group fits the block; groups of one geometry split where the block ends.
    assert!(
        kv.groups[1..]
            .iter()
            .all(|g| g.page_bytes <= kv.bytes_per_block)
    );
    assert_eq!(kv.table_width(kv.regular_groups().start), 131072 / 64);
    // The first C4A layer is tensor 3 (after three sliding-window caches).
    assert_eq!(kv.groups[0].layers[0].layer, 3);
    let pair = kv.layer_pair(3).unwrap();
    assert!(pair.host.is_split());
    assert_eq!(
        (pair.host.value_bytes, pair.host.block_stride),
        (576, 37440)
    );
    pair.device
        .check(
            crate::error::OpName::CopyPages,
            "device",
            kv.gpu_pool_bytes(),
        )
        .unwrap();
    pair.host
        .check(
            crate::error::OpName::CopyPages,
            "host",
            kv.host_pool_bytes(),
        )
        .unwrap();
    let ix = kv.indexer_layer_pair(3).unwrap();
    assert_eq!((ix.host.row_bytes, ix.host.value_bytes), (132, 128));
    ix.host
        .check(
            crate::error::OpName::CopyRows,
            "host",
            kv.indexer_host_pool_bytes(),
        )
        .unwrap();
    ix.device
        .check(
            crate::error::OpName::CopyRows,
            "device",
            kv.gpu_pool_bytes(),
        )
        .unwrap();
    assert_eq!(kv.max_pages_per_request, 131072 / 256);
    assert_eq!(kv.validate(), Ok(()));
}

/// The hot table has `hot_blocks_per_request` columns in every preset: the resolver's
/// `hot_table_width` (`ceil(device_buffer_size / block_size)`), with the hot groups' own
/// rows per block.
#[test]
fn hot_blocks_follow_the_hot_group_geometry() {
    for model in [DEEPSEEK_V32, GLM5, DEEPSEEK_V4] {
        for mql in [1, 2, 4] {
            let mut cfg = HiSparseConfig::new(model.top_k, 512 * GIB);
            cfg.max_query_len = mql;
            let kv = plan_layout(&LayoutInput::new(&model, &cfg, 80 * GIB, 65536)).unwrap();
            assert_eq!(kv.device_buffer_size, (mql + 1) * model.top_k);
            let d = kv.resolve_desc(1, 1);
            assert_eq!(d.hot_table_width(), kv.hot_blocks_per_request);
            for b in 0..kv.num_buckets {
                let hot = &kv.groups[kv.hot_group(b)];
                assert!(hot.layers.iter().all(|l| l.rows_per_block == kv.block_size));
                assert!(
                    u64::from(kv.hot_blocks_per_request) * u64::from(kv.block_size)
                        >= u64::from(kv.device_buffer_size)
                );
            }
        }
    }
}

/// A shared host pool (one pool for the tensor-parallel ranks of a node): the stride is a
/// multiple of 4096 and every layer's array starts on a 4096-B boundary; the pool is the
/// arrays, within the budget.
#[test]
fn shared_host_pool_aligns_stride_and_arrays() {
    for model in [DEEPSEEK_V32, GLM5, DEEPSEEK_V4] {
        for budget in [64 * GIB, 512 * GIB, 3 * GIB + 12345] {
            let cfg = HiSparseConfig::new(model.top_k, budget);
            let mut input = LayoutInput::new(&model, &cfg, 80 * GIB, 8192);
            let plain = plan_layout(&input).unwrap();
            input.shared_host_pool = true;
            let kv = plan_layout(&input).unwrap();
            assert!(kv.shared_host_pool);
            assert_eq!(kv.host_block_stride % SHARED_HOST_ALIGNMENT, 0);
            assert_eq!(
                kv.host_block_stride,
                plain.host_block_stride.next_multiple_of(4096)
            );
            for l in &kv.groups[0].layers {
                let h = kv.host_layout(l.layer).unwrap();
                assert_eq!(h.base % 4096, 0, "{}", model.name);
                assert_eq!(h.base, l.offset);
                h.check(
                    crate::error::OpName::CopyPages,
                    "host",
                    kv.host_pool_bytes(),
                )
                .unwrap();
            }
            assert_eq!(kv.host_pool_bytes() % 4096, 0);
            assert!(kv.host_bytes() <= budget);
            assert!(kv.host_num_blocks <= plain.host_num_blocks);
            // The largest block count whose aligned arrays fit.
            let mut more = kv.clone();
            more.host_num_blocks += 1;
            assert!(more.host_bytes() > budget);
            assert_eq!(kv.validate(), Ok(()));
            // validate keeps to the shared rules.
            let mut bad = kv.clone();
            bad.host_block_stride = plain.host_block_stride;
            if bad.host_block_stride != kv.host_block_stride {
                assert!(matches!(
                    bad.validate(),
                    Err(LayoutError::InvalidField {
                        field: "host_block_stride",
                        ..
                    })
                ));
            }
            let mut bad = kv.clone();
            bad.shared_host_pool = false;
            assert!(bad.validate().is_err());
        }
    }
}

#[test]
fn errors_say_what_to_change() {
    let e = plan(&DEEPSEEK_V32, 2561024 * 100, 40 * GIB, 131072).unwrap_err();
    assert_eq!(
        e,
        LayoutError::HostBudgetTooSmall {
            budget: 2561024 * 100,
            host_block_stride: 2561024,
            indexer_page_bytes: 515328,
            // The budget holds the host pool and the indexer host cache: 100 blocks of pool
            // alone, 83 of both.
            blocks: 83,
            needed: 2050,
            needed_bytes: 2050 * (2561024 + 515328),
        }
    );
    assert!(std::format!("{e}").contains("raise host_budget_bytes"));
    assert_eq!(
        plan(&DEEPSEEK_V32, GIB, 0, 64),
        Err(LayoutError::ZeroGpuMemory)
    );
    assert_eq!(
        plan(&DEEPSEEK_V32, GIB, GIB, 0),
        Err(LayoutError::ZeroMaxModelLen)
    );
    let e = plan(&DEEPSEEK_V32, 64 * GIB, 545792 * 100, 131072).unwrap_err();
    assert!(
        matches!(e, LayoutError::GpuPoolTooSmall { blocks: 100, .. }),
        "{e:?}"
    );
    assert!(std::format!("{e}").contains("raise the GPU budget"));
    assert!(matches!(
        plan(&DEEPSEEK_V32, 0, GIB, 64),
        Err(LayoutError::Config(ConfigError::Zero { .. }))
    ));
    // A custom model: two sparse layers sharing one indexer and a full regular layer.
    let layers = [
        LayerSpec::sparse_leader(64, 16),
        LayerSpec::sparse_follower(64),
        LayerSpec::Regular(RegularLayer {
            row_bytes: 32,
            compress_ratio: 1,
            sliding_window: None,
            block_tokens: None,
            page_alignment: 1,
            kind: crate::model::RegularKind::Attention,
        }),
    ];
    let m = ModelSpec {
        name: "tiny",
        block_tokens: 4,
        top_k: 4,
        layers: &layers,
    };
    let kv = plan(&m, 1 << 20, 1 << 20, 64).unwrap();
    // indexer page 64 B < unit (2 × 256 B): one bucket with both layers.
    assert_eq!(kv.num_buckets, 1);
    assert_eq!(kv.groups.len(), 5);
    assert_eq!(kv.bytes_per_block, 512);
    assert_eq!(kv.hot_blocks_per_request, 2);
    let bad = [LayerSpec::Sparse(SparseLayer {
        row_bytes: 48,
        value_bytes: 40,
        compress_ratio: 1,
        indexer_row_bytes: Some(16),
        indexer_value_bytes: None,
        page_alignment: 1,
    })];
    let m = ModelSpec { layers: &bad, ..m };
    assert!(matches!(
        plan(&m, 1 << 20, 1 << 20, 64),
        Err(LayoutError::Model(_))
    ));
}

#[test]
fn validate_accepts_every_planned_layout() {
    for model in [DEEPSEEK_V32, GLM5, DEEPSEEK_V4] {
        let kv = plan(&model, 512 * GIB, 80 * GIB, 131072).unwrap();
        assert_eq!(kv.validate(), Ok(()), "{}", model.name);
    }
}

/// Every malformed layout a hand edit or a deserialiser can produce is refused with the
/// field named, before a coordinator or a helper can overflow, index out of bounds or wedge.
#[test]
fn validate_names_the_malformed_field() {
    let good = plan(&DEEPSEEK_V32, 64 * GIB, 40 * GIB, 8192).unwrap();
    let field_of = |kv: &KvCacheConfig| match kv.validate() {
        Err(LayoutError::InvalidField { field, .. }) => field,
        other => panic!("expected InvalidField, got {other:?}"),
    };
    let mut kv = good.clone();
    kv.hot_blocks_per_request = 1 << 31;
    assert_eq!(field_of(&kv), "hot_blocks_per_request");
    let e = kv.validate().unwrap_err();
    let text = std::format!("{e}");
    assert!(
        text.contains("`hot_blocks_per_request` = 2147483648"),
        "{text}"
    );
    assert!(text.contains("plan_layout"), "{text}");
    let mut kv = good.clone();
    kv.groups[3].bucket = Some(99);
    assert_eq!(field_of(&kv), "groups[].bucket");
    assert!(std::format!("{}", kv.validate().unwrap_err()).contains("`groups[3].bucket` = 99"));
    let mut kv = good.clone();
    kv.index_groups[7].bucket = 6;
    assert_eq!(field_of(&kv), "index_groups[].bucket");
    let mut kv = good.clone();
    kv.config.max_query_len = 0;
    assert_eq!(
        kv.validate(),
        Err(LayoutError::Config(ConfigError::Zero {
            field: "max_query_len"
        }))
    );
    // max_model_len beyond what the host pool holds.
    let mut kv = good.clone();
    kv.max_model_len = kv.host_num_blocks * 64;
    kv.max_pages_per_request = kv.host_num_blocks;
    assert_eq!(field_of(&kv), "host_num_blocks");
    // ... or the GPU pool.
    let mut kv = good.clone();
    kv.num_gpu_blocks = 10;
    assert!(matches!(
        kv.validate(),
        Err(LayoutError::GpuPoolTooSmall { blocks: 10, .. })
    ));
    let mut kv = good.clone();
    kv.max_pages_per_request += 1;
    assert_eq!(field_of(&kv), "max_pages_per_request");
    let mut kv = good.clone();
    kv.groups.truncate(5);
    assert_eq!(field_of(&kv), "groups");
    let mut kv = good.clone();
    kv.groups.swap(2, 9);
    assert_eq!(field_of(&kv), "groups[].kind");
    let mut kv = good.clone();
    kv.block_tokens = 0;
    assert_eq!(field_of(&kv), "block_tokens");
    let mut kv = good.clone();
    kv.num_buckets = u32::MAX;
    assert_eq!(field_of(&kv), "num_buckets");
    let mut kv = good.clone();
    kv.num_gpu_blocks = u32::MAX;
    assert!(matches!(
        kv.validate(),
        Err(LayoutError::PoolTooLarge { pool: "gpu", .. })
    ));
}

/// The helpers answer (an error, `None`, or a saturated count) on layouts that `validate`
/// refuses, instead of panicking.
#[test]
fn helpers_do_not_panic_on_unvalidated_layouts() {
    let good = plan(&DEEPSEEK_V32, 64 * GIB, 40 * GIB, 8192).unwrap();
    let mut empty = good.clone();
    empty.groups.clear();
    empty.index_groups.clear();
    let mut huge = good.clone();
    huge.num_buckets = u32::MAX;
    huge.hot_blocks_per_request = u32::MAX;
    huge.bytes_per_block = u64::MAX;
    huge.host_block_stride = u64::MAX;
    huge.block_tokens = 0;
    for kv in [&empty, &huge] {
        let c = kv.capacity(u32::MAX);
        assert!(c.gpu_blocks_per_request.hisparse >= c.pages_per_request.min(1));
        let _ = kv.gpu_blocks_per_request(u32::MAX).min_needed();
        let _ = kv.host_layout(0);
        let _ = kv.device_layout(0);
        let _ = kv.all_layer_pairs();
        let _ = kv.bucket_of(0);
        let _ = kv.bucket_layer_pairs(u32::MAX);
        let _ = kv.index_group_pairs(usize::MAX);
        let _ = (
            kv.gpu_pool_bytes(),
            kv.host_pool_bytes(),
            kv.pages_for(u32::MAX),
        );
        let _ = kv.regular_groups();
        assert_eq!(kv.device_offset(u32::MAX, 1, 0), None);
        assert!(kv.validate().is_err());
    }
    assert_eq!(
        empty.host_layout(0),
        Err(LayoutError::NotSparse { layer: 0 })
    );
    assert!(empty.all_layer_pairs().is_empty());
    // device_offset: range-checked block, checked arithmetic.
    assert_eq!(good.device_offset(good.num_gpu_blocks, 1, 0), None);
    assert_eq!(
        good.device_offset(good.num_gpu_blocks - 1, 1, 0),
        Some(u64::from(good.num_gpu_blocks - 1) * good.bytes_per_block)
    );
    let mut wide = good.clone();
    wide.bytes_per_block = u64::MAX;
    assert_eq!(wide.device_offset(2, 1, 0), None);
    let mut far = good.clone();
    far.groups[0].layers[60].index_in_group = u32::MAX;
    far.host_num_blocks = u32::MAX;
    assert_eq!(
        far.host_layout(60),
        Err(LayoutError::Overflow {
            field: "host layout base"
        })
    );
}

#[test]
fn override_blocks() {
    let model = DEEPSEEK_V32;
    let cfg = HiSparseConfig::new(2048, 64 * GIB);
    let mut input = LayoutInput::new(&model, &cfg, 0, 4096);
    input.num_gpu_blocks_override = Some(1000);
    assert_eq!(plan_layout(&input).unwrap().num_gpu_blocks, 1000);
}

#[test]
fn capacity_contexts_stop_at_max_model_len() {
    assert_eq!(capacity_contexts(131072), [8192, 32768, 131072]);
    assert_eq!(capacity_contexts(40000), [8192, 32768, 40000]);
    assert_eq!(capacity_contexts(4096), [4096]);
}

#[test]
fn node_host_memory_counts_one_pool_per_rank_unless_shared() {
    let model = DEEPSEEK_V32;
    let cfg = HiSparseConfig::new(model.top_k, 64 * GIB);
    let mut input = LayoutInput::new(&model, &cfg, 40 * GIB, 131072);
    let own = plan_layout(&input).unwrap();
    let n = NodeHostMemory::of(&own, 4);
    assert_eq!((n.pools, n.per_rank), (4, own.host_bytes()));
    assert_eq!(n.per_node, 4 * own.host_bytes());
    input.shared_host_pool = true;
    let shared = plan_layout(&input).unwrap();
    let n = NodeHostMemory::of(&shared, 4);
    // One pool for the node; each rank pins its own indexer host cache.
    assert!(shared.indexer_host_pool_bytes() > 0);
    assert_eq!(
        (n.pools, n.per_node),
        (
            1,
            shared.host_pool_bytes() + 4 * shared.indexer_host_pool_bytes()
        )
    );
}

#[cfg(feature = "serde")]
#[test]
fn layout_report_puts_the_plan_beside_budgets_pools_and_capacity() {
    let kv = plan(&DEEPSEEK_V32, 64 * GIB, 40 * GIB, 131072).unwrap();
    let contexts = capacity_contexts(kv.max_model_len);
    let report = LayoutReport::new(&kv, 40 * GIB, 64 * GIB, 2, &contexts);
    let v = serde_json::to_value(&report).unwrap();
    assert_eq!(v["bytes_per_block"], 545792);
    assert_eq!(v["host_block_stride"], 2561024);
    assert_eq!(v["gpu_mem_bytes"], 40 * GIB);
    assert_eq!(v["host_mem_bytes"], 64 * GIB);
    assert_eq!(v["gpu_pool_bytes"], kv.gpu_pool_bytes());
    assert_eq!(v["host_memory"]["tp"], 2);
    assert_eq!(v["host_memory"]["pools"], 2);
    assert_eq!(v["host_memory"]["shared_host_pool"], false);
    assert_eq!(v["indexer_host_cache_bytes"], kv.indexer_host_pool_bytes());
    assert!(kv.host_bytes() <= 64 * GIB);
    assert_eq!(v["host_memory"]["per_node_bytes"], 2 * kv.host_bytes());
    assert_eq!(
        v["hot_bytes_per_request"],
        u64::from(kv.hot_blocks_per_request * kv.num_buckets) * kv.bytes_per_block
    );
    assert_eq!(v["capacity"].as_array().unwrap().len(), contexts.len());
    assert_eq!(v["capacity"][1]["context_len"], 32768);
    assert_eq!(v["capacity"][2]["prefill_fits"], true);
    assert_eq!(v["max_prefill_context"], 131072);
    assert_eq!(v["warnings"].as_array().map(Vec::len), Some(0));
    let small = plan(&DEEPSEEK_V32, 512 * GIB, 4 * GIB, 131072).unwrap();
    let v =
        serde_json::to_value(LayoutReport::new(&small, 4 * GIB, 512 * GIB, 1, &contexts)).unwrap();
    assert_eq!(v["capacity"][2]["prefill_fits"], false);
    assert_eq!(v["capacity"][2]["prefill_gpu_blocks"], 7 * 2048);
    assert_eq!(v["max_prefill_context"], small.max_prefill_context());
    assert_eq!(
        v["warnings"][0]["kind"], "max_model_len_prefill_never_fits",
        "{}",
        v["warnings"]
    );
    assert_eq!(v["warnings"][0]["needed_blocks"], 7 * 2048);
    let v = serde_json::to_value(&report).unwrap();
    // The plan's own fields read back from the report (extra keys ignored).
    let back: KvCacheConfig = serde_json::from_value(v).unwrap();
    assert_eq!(back, kv);
}

/// Models `validate` accepts plan only into layouts every copy of the data plane accepts: the
/// pages the planner places side by side are padded to the copies' 16-byte unit beside
/// `page_alignment` — one 584-B split row per block (a 592-B page), `page_alignment` 100 (400),
/// and 132-B split indexer rows one per block, whose page would put the next leader's indexer
/// off the unit (144). A layout edited to place a page where no copy can reach it is refused by
/// `validate`, with the copies' own error naming the field.
#[test]
fn valid_models_plan_only_layouts_the_copies_accept() {
    use crate::error::{OpError, OpName};
    use crate::ops::copy::check_layers;
    let split = |indexer| {
        LayerSpec::Sparse(SparseLayer {
            row_bytes: 584,
            value_bytes: 576,
            compress_ratio: 4,
            indexer_row_bytes: indexer,
            indexer_value_bytes: indexer.map(|_| 128),
            page_alignment: 1,
        })
    };
    let odd = LayerSpec::Sparse(SparseLayer {
        row_bytes: 16,
        value_bytes: 16,
        compress_ratio: 1,
        indexer_row_bytes: Some(16),
        indexer_value_bytes: None,
        page_alignment: 100,
    });
    let leader = LayerSpec::Sparse(SparseLayer {
        row_bytes: 16,
        value_bytes: 16,
        compress_ratio: 1,
        indexer_row_bytes: Some(132),
        indexer_value_bytes: Some(128),
        page_alignment: 1,
    });
    let cases: [(&[LayerSpec], u32, u64); 3] = [
        (&[split(Some(132)), split(None), split(Some(132))], 4, 592),
        (&[odd, odd], 4, 400),
        (&[leader, leader, leader], 1, 16),
    ];
    for (layers, block_tokens, page) in cases {
        let model = ModelSpec {
            name: "odd-pages",
            block_tokens,
            top_k: 4,
            layers,
        };
        assert_eq!(model.validate(), Ok(()));
        let kv = plan(&model, 1 << 20, 1 << 20, 64).unwrap();
        assert_eq!(kv.groups[0].layers[0].page_bytes, page);
        assert_eq!(kv.validate(), Ok(()));
        let (host, device) = (kv.host_pool_bytes(), kv.gpu_pool_bytes());
        check_layers(OpName::CopyPages, &kv.all_layer_pairs(), host, device).unwrap();
        for l in &kv.groups[1].layers {
            let pair = kv.indexer_layer_pair(l.layer).unwrap();
            assert_eq!(
                l.offset % 16,
                0,
                "layer {}'s indexer at {}",
                l.layer,
                l.offset
            );
            check_layers(
                OpName::IndexerBackup,
                &[pair],
                kv.indexer_host_pool_bytes(),
                device,
            )
            .unwrap();
        }
    }
    // A hand edit that moves the second leader's indexer page off the unit.
    let model = ModelSpec {
        name: "odd-pages",
        block_tokens: 1,
        top_k: 4,
        layers: &[leader, leader],
    };
    let mut kv = plan(&model, 1 << 20, 1 << 20, 64).unwrap();
    kv.groups[1].layers[1].offset = 132;
    let e = kv.validate().unwrap_err();
    assert!(
        matches!(
            e,
            LayoutError::PagesRefused {
                layer: 1,
                pages: "indexer device",
                error: OpError::Misaligned {
                    field: "layout.base",
                    value: 132,
                    ..
                },
            }
        ),
        "{e:?}"
    );
    let text = std::format!("{e}");
    assert!(text.contains("layer 1's indexer device pages") && text.contains("plan_layout"));
    // ... and one that breaks the sparse rows' copy unit.
    let mut kv = plan(&model, 1 << 20, 1 << 20, 64).unwrap();
    kv.row_bytes = 24;
    kv.value_bytes = 24;
    assert!(matches!(
        kv.validate(),
        Err(LayoutError::InvalidField { .. } | LayoutError::PagesRefused { .. })
    ));
}

/// A shared host pool holds the largest block count whose (4096-B aligned) layer arrays and
/// indexer host cache fit the budget — not the budget over the aligned stride: 64 KiB for 64-B
/// pages and 64 B of indexer keys per block (one layer of 16-B rows and 16-B keys) is 512
/// blocks with or without the shared pool, where the stride rounded to 4096 B would give 15.
/// Over many budgets, page sizes and layer counts: the count fits and one more does not.
#[test]
fn a_shared_host_pool_holds_the_largest_block_count_that_fits() {
    let sparse = |indexer| {
        LayerSpec::Sparse(SparseLayer {
            row_bytes: 16,
            value_bytes: 16,
            compress_ratio: 1,
            indexer_row_bytes: indexer,
            indexer_value_bytes: None,
            page_alignment: 1,
        })
    };
    let plan_host = |layers: &[LayerSpec], block_tokens, budget, shared| {
        let model = ModelSpec {
            name: "host-pool",
            block_tokens,
            top_k: 4,
            layers,
        };
        let cfg = HiSparseConfig::new(4, budget);
        let mut input = LayoutInput::new(&model, &cfg, 0, 16);
        input.num_gpu_blocks_override = Some(64);
        input.shared_host_pool = shared;
        plan_layout(&input).unwrap()
    };
    let one = [sparse(Some(16))];
    assert_eq!(plan_host(&one, 4, 64 << 10, false).host_num_blocks, 512);
    assert_eq!(plan_host(&one, 4, 64 << 10, true).host_num_blocks, 512);
    let three = [sparse(Some(16)), sparse(None), sparse(Some(16))];
    for layers in [&one[..], &three[..]] {
        for block_tokens in [1, 4, 16, 64] {
            for budget in [40_000u64, 64 << 10, 100_003, 1 << 20, (3 << 20) + 777] {
                let kv = plan_host(layers, block_tokens, budget, true);
                assert!(kv.host_bytes() <= budget);
                let mut more = kv.clone();
                more.host_num_blocks += 1;
                assert!(
                    more.host_bytes() > budget,
                    "{} blocks of {} layers × {block_tokens} rows fit {budget} B, {} planned",
                    more.host_num_blocks,
                    layers.len(),
                    kv.host_num_blocks
                );
                assert_eq!(kv.validate(), Ok(()));
            }
        }
    }
}
