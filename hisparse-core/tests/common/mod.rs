//! The small world the coordinator's property tests share: a model of two index groups (a
//! leader with a follower, and a second leader), a full-attention regular layer and optionally
//! a sliding-window one with its own block size; 4-token pages, top-k 4; pools from a few
//! dozen blocks; the scheduler settings drawn at random.

#![allow(dead_code)]

use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig};
use hisparse_core::layout::{LayoutInput, plan_layout};
use hisparse_core::model::{LayerSpec, ModelSpec, RegularLayer};
use proptest::prelude::*;

/// Tokens per page.
pub const BT: u32 = 4;
/// `max_model_len` of the layout.
pub const MAX_LEN: u32 = 48;

/// One random world: pool sizes, mirroring, workers, prefix caching, a sliding-window layer,
/// speculative tokens and the scheduler's settings.
#[derive(Clone, Debug)]
pub struct Params {
    pub gpu_blocks: u32,
    pub host_blocks: u32,
    pub eager: bool,
    pub workers: u32,
    pub prefix: bool,
    pub window: bool,
    pub mql: u32,
    pub max_running: u32,
    pub max_batched: u32,
    pub spill: u32,
    pub reclaim_min: u32,
    /// Hot buffer rows, in units of `8 * mql` (the default's): larger ones make a hot region
    /// cost more than the pages it spares.
    pub hot_scale: u32,
}

pub fn params() -> impl Strategy<Value = Params> {
    (
        (48u32..160, 14u32..70, any::<bool>(), 1u32..=3),
        (any::<bool>(), prop::bool::weighted(0.2), 1u32..=2),
        (
            1u32..=6,
            4u32..=40,
            1u32..=4,
            prop_oneof![Just(0u32), 1u32..24],
        ),
    )
        .prop_map(
            |(
                (gpu_blocks, host_blocks, eager, workers),
                (prefix, window, mql),
                (mr, mb, spill, reclaim_min),
            )| {
                Params {
                    gpu_blocks,
                    host_blocks,
                    eager,
                    workers,
                    prefix,
                    window,
                    mql,
                    max_running: mr,
                    max_batched: mb,
                    spill,
                    reclaim_min,
                    hot_scale: 1,
                }
            },
        )
}

/// Prompt tokens of family `family`: the same family shares prefixes.
pub fn tokens_for(family: u8, len: u32) -> Vec<u32> {
    (0..len).map(|i| u32::from(family) * 1000 + i).collect()
}

/// The coordinator of world `p`.
pub fn setup(p: &Params) -> Coordinator {
    let mut layers = vec![
        LayerSpec::sparse_leader(16, 16),
        LayerSpec::sparse_follower(16),
        LayerSpec::sparse_leader(16, 16),
        LayerSpec::Regular(RegularLayer {
            row_bytes: 32,
            compress_ratio: 1,
            sliding_window: None,
            block_tokens: None,
            page_alignment: 1,
            kind: hisparse_core::model::RegularKind::Attention,
        }),
    ];
    if p.window {
        layers.push(LayerSpec::Regular(RegularLayer {
            row_bytes: 16,
            compress_ratio: 1,
            sliding_window: Some(6),
            // Its own block size (2 tokens against the sparse layers' 4).
            block_tokens: Some(2),
            page_alignment: 1,
            kind: hisparse_core::model::RegularKind::SlidingWindow,
        }));
    }
    let layers: &'static [LayerSpec] = Box::leak(layers.into_boxed_slice());
    let model: &'static ModelSpec<'static> = Box::leak(Box::new(ModelSpec {
        name: "model-test",
        block_tokens: BT,
        top_k: 4,
        layers,
    }));
    // Per host block: 3 sparse layers' 64-B pages in the pool and 2 leaders' 64-B indexer pages
    // in the indexer host cache.
    let mut cfg = HiSparseConfig::new(4, u64::from(p.host_blocks) * 5 * 64);
    cfg.device_buffer_size = Some(8 * p.mql * p.hot_scale);
    cfg.max_query_len = p.mql;
    cfg.eager_host_mirror = p.eager;
    let mut input = LayoutInput::new(model, &cfg, 0, MAX_LEN);
    input.num_gpu_blocks_override = Some(4096);
    // A prefill chunk reads its whole context on the GPU: the pool holds one MAX_LEN request's
    // pages at the least (admission refuses longer prompts, see `staging.rs`).
    let floor = plan_layout(&input)
        .expect("layout")
        .gpu_blocks_per_request(MAX_LEN)
        .all_on_gpu as u32
        + 1;
    input.num_gpu_blocks_override = Some(p.gpu_blocks.max(floor));
    let kv = plan_layout(&input).expect("layout");
    assert_eq!(kv.num_buckets, 2);
    // One row per token and per page slot: the byte shadow tags rows by token.
    assert_eq!((kv.sparse_compress_ratio, kv.block_size), (1, BT));
    Coordinator::new(
        kv,
        CoordinatorConfig {
            max_running: p.max_running,
            max_batched_tokens: p.max_batched,
            max_spill_pages_per_step: p.spill,
            num_workers: p.workers,
            enable_prefix_caching: p.prefix,
            reclaim_min_blocks: p.reclaim_min,
        },
    )
    .expect("coordinator")
}
