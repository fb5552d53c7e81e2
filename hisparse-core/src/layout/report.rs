//! The layout report: what `hisparse layout --json` prints and the Python `Layout.to_dict()`
//! returns — every field of the plan, the budgets it came from, the pool sizes, the host memory
//! of the node's ranks and the capacity table. One definition, so the two cannot drift.

use alloc::vec::Vec;

use super::{CapacityReport, KvCacheConfig, LayoutWarning};

/// Host memory the tensor-parallel ranks of a node take: every rank addresses one pool and pins
/// its own indexer host cache beside it; with a shared pool ([`KvCacheConfig::shared_host_pool`])
/// the node pins the pool once, otherwise once per rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct NodeHostMemory {
    /// Ranks of the node.
    pub tp: u32,
    /// Whether one pool serves every rank.
    #[cfg_attr(feature = "serde", serde(rename = "shared_host_pool"))]
    pub shared: bool,
    /// Pools the node pins.
    pub pools: u32,
    /// Bytes one rank addresses: the pool and its indexer host cache
    /// ([`KvCacheConfig::host_bytes`]).
    #[cfg_attr(feature = "serde", serde(rename = "per_rank_bytes"))]
    pub per_rank: u64,
    /// Bytes the node pins.
    #[cfg_attr(feature = "serde", serde(rename = "per_node_bytes"))]
    pub per_node: u64,
}

impl NodeHostMemory {
    /// The host memory of `tp` ranks of `kv` (saturating).
    pub fn of(kv: &KvCacheConfig, tp: u32) -> Self {
        let pools = if kv.shared_host_pool { 1 } else { tp };
        NodeHostMemory {
            tp,
            shared: kv.shared_host_pool,
            pools,
            per_rank: kv.host_bytes(),
            per_node: kv
                .host_pool_bytes()
                .saturating_mul(u64::from(pools))
                .saturating_add(kv.indexer_host_pool_bytes().saturating_mul(u64::from(tp))),
        }
    }
}

/// Context lengths of the default capacity table: 8K, 32K and 128K up to `max_model_len`, then
/// `max_model_len` itself.
pub fn capacity_contexts(max_model_len: u32) -> Vec<u32> {
    let mut v: Vec<u32> = [8192, 32768, 131072]
        .into_iter()
        .filter(|&c| c <= max_model_len)
        .collect();
    if !v.contains(&max_model_len) {
        v.push(max_model_len);
    }
    v
}

/// A planned layout with what a reader of it wants beside the plan. Serialised (feature
/// `serde`), the plan's fields sit at the top level next to the others.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LayoutReport<'a> {
    /// The plan.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub layout: &'a KvCacheConfig,
    /// The GPU budget it was planned from, in bytes.
    pub gpu_mem_bytes: u64,
    /// The host budget it was planned from, in bytes.
    pub host_mem_bytes: u64,
    /// Bytes of the device pool.
    pub gpu_pool_bytes: u64,
    /// Bytes of one rank's pinned host pool.
    pub host_pool_bytes: u64,
    /// Bytes of one rank's indexer host cache, pinned beside the pool; the host budget holds
    /// both.
    pub indexer_host_cache_bytes: u64,
    /// Host memory of the node's ranks.
    pub host_memory: NodeHostMemory,
    /// GPU bytes of one request's hot regions (every bucket).
    pub hot_bytes_per_request: u64,
    /// Requests that fit at each context length (and whether one request's prefill does).
    pub capacity: Vec<CapacityReport>,
    /// The longest prompt, up to `max_model_len`, whose prefill fits the GPU pool
    /// ([`KvCacheConfig::max_prefill_context`]).
    pub max_prefill_context: u32,
    /// What the plan allows but a user should know ([`KvCacheConfig::warnings`]).
    pub warnings: Vec<LayoutWarning>,
}

impl<'a> LayoutReport<'a> {
    /// The report of `kv`, planned from `gpu_mem_bytes` and `host_mem_bytes`, for a node of `tp`
    /// ranks, with the capacity at each of `contexts` ([`capacity_contexts`] for the default
    /// table).
    pub fn new(
        kv: &'a KvCacheConfig,
        gpu_mem_bytes: u64,
        host_mem_bytes: u64,
        tp: u32,
        contexts: &[u32],
    ) -> Self {
        let hot_blocks =
            u64::from(kv.hot_blocks_per_request).saturating_mul(u64::from(kv.num_buckets));
        LayoutReport {
            layout: kv,
            gpu_mem_bytes,
            host_mem_bytes,
            gpu_pool_bytes: kv.gpu_pool_bytes(),
            host_pool_bytes: kv.host_pool_bytes(),
            indexer_host_cache_bytes: kv.indexer_host_pool_bytes(),
            host_memory: NodeHostMemory::of(kv, tp),
            hot_bytes_per_request: hot_blocks.saturating_mul(kv.bytes_per_block),
            capacity: contexts.iter().map(|&c| kv.capacity(c)).collect(),
            max_prefill_context: kv.max_prefill_context(),
            warnings: kv.warnings(),
        }
    }
}
