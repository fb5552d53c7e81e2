//! Layout planning (contract §3): from a model, a [`HiSparseConfig`] and memory budgets to a
//! [`KvCacheConfig`] — the KV-cache groups, the GPU and host pools and where every layer's pages
//! sit in them. Pure: no I/O, deterministic.
//!
//! # Groups
//!
//! Order: `[source, indexer, resident.., hot.., regular..]`.
//! * **source** (host): every sparse layer. Owns prefix caching.
//! * **indexer** (GPU): every leader's indexer cache.
//! * **hot units** = runs of sparse layers starting at each leader (the leader and its followers).
//!   Units are packed greedily into *buckets* while the bucket's summed page bytes stay ≤ the
//!   indexer group's summed page bytes (a unit is never split; a bucket always takes at least one
//!   unit). Each bucket gives one **resident** group and a twin **hot** group with the same layers.
//!   Mixed page sizes inside a bucket cannot happen: [`ModelSpec::validate`] already refuses
//!   sparse layers whose row geometry differs ([`ModelError::MixedSparseGeometry`]), because one
//!   flat row view and one host row view serve every sparse layer.
//! * **regular** (GPU): non-sparse caches, grouped by geometry (kind, row bytes, rows and tokens
//!   per block, sliding window, page alignment) in model order; a group takes layers while its
//!   summed page bytes stay ≤ the largest of the indexer and resident groups (the block those
//!   set), so one geometry with many layers (DeepSeek V4's 43 sliding-window caches) becomes
//!   several groups instead of one that would make every GPU block — resident pages included —
//!   as large as all of them. Each regular group has its own block size in tokens
//!   ([`KvCacheGroup::block_tokens`], dividing the sparse layers' `block_tokens`): DeepSeek V4's
//!   sliding-window caches use 64-token blocks and its compressor states 4- and 8-token blocks,
//!   beside the 256-token pages of the sparse layers, in one block-id space.
//!
//! # Pages
//!
//! A page holds `rows_per_block` rows and is padded up to the layer's `page_alignment`
//! ([`crate::model::padded_page_bytes`]): DeepSeek V4's C4A page is 64 × 584 B = 37,376 B,
//! padded to 37,440 B; its indexer page 64 × 132 B → 8,640 B. Pages the data plane copies —
//! sparse and indexer pages — are padded to a multiple of 16 B as well
//! ([`crate::model::copied_page_bytes`], [`crate::ops::COPY_ALIGNMENT`]), so every page the
//! planner places side by side starts where the copies can address it (one row of 584 B per
//! block: a 592-B page); [`KvCacheConfig::validate`] checks every layer's pages with the copies'
//! own rule ([`crate::ops::PageLayout::check_shape`]).
//!
//! # GPU pool
//!
//! All GPU groups share one block-id space; a block id belongs to one group at a time, so groups
//! alias the same bytes. `bytes_per_block` is the largest GPU group's summed page bytes, rounded
//! up to a multiple of the sparse page size so one flat row view addresses hot and resident rows
//! alike (`attention_block_stride = bytes_per_block / row_bytes`). Inside a block a group's layers
//! sit side by side from byte 0: layer `i` of a group at the sum of the pages before it. Device
//! byte address of (block `b`, layer) = `b * bytes_per_block + layer offset`.
//!
//! # Host pool
//!
//! Layer-major: source layer `i` (its index in the source group) is one contiguous
//! `[host_num_blocks, page]` array at `i * host_array_bytes` ([`KvCacheConfig::host_array_bytes`]:
//! `host_num_blocks * page_bytes`). The flat host row of (host block `h`, offset `o`) is
//! `h * block_size + o`. `host_block_stride` is the summed source page bytes (the host memory
//! one block id costs across all layers), and the pool is `host_pool_bytes() = layers *
//! host_array_bytes`.
//!
//! **Shared host pool** ([`LayoutInput::shared_host_pool`], for the tensor-parallel ranks of a
//! node mapping one pool): `host_block_stride` is rounded up to a multiple of
//! [`SHARED_HOST_ALIGNMENT`] (4,096 B) and every layer's array starts on a 4,096-B boundary
//! (`host_array_bytes` is rounded up to it); the host block count is the largest whose arrays fit
//! the budget.
//!
//! # Layouts from elsewhere
//!
//! A [`KvCacheConfig`] is plain data (serialisable). One that did not come from [`plan_layout`]
//! — edited by hand, or deserialised — is checked by [`KvCacheConfig::validate`] (the
//! coordinator does so on construction): every rule the planner keeps, with the field named.
//! The helpers never panic on an unvalidated layout either: they return an error, `None`, or a
//! saturated count.
//!
//! # Example: DeepSeek V3.2
//!
//! ```
//! use hisparse_core::{config::HiSparseConfig, layout::{plan_layout, LayoutInput}, presets};
//! let model = presets::DEEPSEEK_V32;
//! let cfg = HiSparseConfig::new(model.top_k, 64 << 30);
//! let kv = plan_layout(&LayoutInput::new(&model, &cfg, 40 << 30, 131072)).unwrap();
//! assert_eq!(kv.num_buckets, 6);
//! assert_eq!(kv.bytes_per_block, 545792);
//! assert_eq!(kv.host_block_stride, 2561024);
//! assert_eq!(kv.hot_blocks_per_request, 64);
//! assert_eq!(kv.attention_block_stride, 832);
//! ```

#[cfg(feature = "alloc")]
use alloc::string::String;
#[cfg(feature = "alloc")]
use alloc::vec::Vec;
use core::fmt;

use crate::config::{ConfigError, HiSparseConfig};
use crate::model::{ModelError, ModelSpec, RegularKind};
// For the heap layout's submodules (`use super::*`).
#[cfg(feature = "alloc")]
use crate::{
    model::copied_page_bytes,
    ops::{LayerPair, PageLayout},
};

/// Resident pages at the tail of a running request that are never reclaimed: the page its next
/// token writes and the one before it. (When the last allocated page is full, the next token's
/// page is not allocated yet, so only one allocated page is protected.)
pub const ACTIVE_TAIL_PAGES: u32 = 2;

#[cfg(feature = "serde")]
const fn one() -> u32 {
    1
}

/// What a KV-cache group holds and where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum GroupKind {
    /// Host pool: the durable copy of every sparse layer.
    Source,
    /// GPU: the indexer caches of all leaders.
    Indexer,
    /// GPU: resident pages of one bucket of sparse layers.
    Resident,
    /// GPU: per-request hot buffers of one bucket of sparse layers.
    Hot,
    /// GPU: a non-sparse layer group with ordinary paging.
    Regular,
}

impl GroupKind {
    /// Lowercase name for logs and tables.
    pub const fn as_str(self) -> &'static str {
        match self {
            GroupKind::Source => "source",
            GroupKind::Indexer => "indexer",
            GroupKind::Resident => "resident",
            GroupKind::Hot => "hot",
            GroupKind::Regular => "regular",
        }
    }
}

/// One layer's place inside its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GroupLayer {
    /// Model layer index.
    pub layer: u32,
    /// Position of the layer inside its group.
    pub index_in_group: u32,
    /// GPU groups: byte offset of this layer's page inside a GPU block (the sum of the pages of
    /// the group's earlier layers — the index-within-group offset). Source group: byte offset of
    /// this layer's contiguous array in the host pool (`index_in_group * host_num_blocks *
    /// page_bytes`).
    pub offset: u64,
    /// Bytes of one page of this layer, padding included.
    pub page_bytes: u64,
    /// Rows per page.
    pub rows_per_block: u32,
    /// Bytes per row (indexer groups: the indexer row).
    pub row_bytes: u32,
    /// Value bytes per row (`row_bytes` for contiguous rows).
    pub value_bytes: u32,
}

/// One KV-cache group.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KvCacheGroup {
    /// What the group holds.
    pub kind: GroupKind,
    /// Resident and hot groups: the bucket index (resident group `b` and hot group `b` are twins).
    pub bucket: Option<u32>,
    /// Regular groups: the sliding window in tokens, if any.
    pub sliding_window: Option<u32>,
    /// Tokens one block of this group covers (the layout's `block_tokens` for every group but
    /// regular ones with their own block size).
    pub block_tokens: u32,
    /// Regular groups: what their caches hold.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub cache: Option<RegularKind>,
    /// Summed page bytes of the group's layers (one block's worth of this group).
    pub page_bytes: u64,
    /// The layers, in model order.
    pub layers: Vec<GroupLayer>,
}

/// A KV-cache group without its layer list: what it holds, where, and one block's worth of its
/// pages. The groups of a [`FixedLayout`]; [`KvCacheGroup::shape`] gives a heap group's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupShape {
    /// What the group holds.
    pub kind: GroupKind,
    /// Resident and hot groups: the bucket index.
    pub bucket: Option<u32>,
    /// Regular groups: the sliding window in tokens, if any.
    pub sliding_window: Option<u32>,
    /// Tokens one block of this group covers.
    pub block_tokens: u32,
    /// Regular groups: what their caches hold.
    pub cache: Option<RegularKind>,
    /// Summed page bytes of the group's layers.
    pub page_bytes: u64,
    /// Layers in the group.
    pub num_layers: u32,
}

#[cfg(feature = "alloc")]
impl KvCacheGroup {
    /// The group without its layer list.
    pub fn shape(&self) -> GroupShape {
        GroupShape {
            kind: self.kind,
            bucket: self.bucket,
            sliding_window: self.sliding_window,
            block_tokens: self.block_tokens,
            cache: self.cache,
            page_bytes: self.page_bytes,
            num_layers: self.layers.len() as u32,
        }
    }
}

/// An index group: a leader and the followers that apply its resolver plan.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct IndexGroup {
    /// Model layer of the leader.
    pub leader: u32,
    /// Model layers of the unit (leader first, then its followers).
    pub layers: Vec<u32>,
    /// Bucket (resident/hot group pair) the unit lives in.
    pub bucket: u32,
}

/// Inputs of [`plan_layout`].
#[derive(Clone, Copy, Debug)]
pub struct LayoutInput<'a> {
    /// The model.
    pub model: &'a ModelSpec<'a>,
    /// HiSparse settings (host budget included).
    pub config: &'a HiSparseConfig,
    /// GPU bytes available for the KV pool.
    pub gpu_bytes: u64,
    /// Longest request in tokens.
    pub max_model_len: u32,
    /// Use exactly this many GPU blocks (null block included) instead of `gpu_bytes /
    /// bytes_per_block`.
    pub num_gpu_blocks_override: Option<u32>,
    /// One host pool for every tensor-parallel rank of a node (in shared memory): the host
    /// stride and every layer's host array are aligned to [`SHARED_HOST_ALIGNMENT`].
    pub shared_host_pool: bool,
}

/// Alignment of the host stride and of every layer's host array in a shared host pool (the
/// page size each rank maps and registers).
pub const SHARED_HOST_ALIGNMENT: u64 = 4096;

impl<'a> LayoutInput<'a> {
    /// Inputs without a block-count override.
    pub const fn new(
        model: &'a ModelSpec<'a>,
        config: &'a HiSparseConfig,
        gpu_bytes: u64,
        max_model_len: u32,
    ) -> Self {
        LayoutInput {
            model,
            config,
            gpu_bytes,
            max_model_len,
            num_gpu_blocks_override: None,
            shared_host_pool: false,
        }
    }
}

/// The planned KV-cache layout.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KvCacheConfig {
    /// Model name.
    pub model: String,
    /// The configuration with `device_buffer_size` resolved (`Some`).
    pub config: HiSparseConfig,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Rows per page of the source, resident and hot groups (the contract's block size).
    pub block_size: u32,
    /// Tokens per sparse row (compress ratio of the sparse layers).
    pub sparse_compress_ratio: u32,
    /// Bytes per sparse row.
    pub row_bytes: u32,
    /// Value bytes per sparse row (`row_bytes` for contiguous rows).
    pub value_bytes: u32,
    /// Pages of the sparse layers (and their indexers) are padded to a multiple of this (1 =
    /// none).
    #[cfg_attr(feature = "serde", serde(default = "one"))]
    pub page_alignment: u32,
    /// The host pool is one pool in shared memory for every rank of a node: its stride and
    /// layer arrays are aligned to [`SHARED_HOST_ALIGNMENT`].
    #[cfg_attr(feature = "serde", serde(default))]
    pub shared_host_pool: bool,
    /// Groups in order `[source, indexer, resident.., hot.., regular..]`.
    pub groups: Vec<KvCacheGroup>,
    /// Number of resident/hot bucket pairs.
    pub num_buckets: u32,
    /// Index groups (leader + followers) in model order.
    pub index_groups: Vec<IndexGroup>,
    /// Bytes of one GPU block.
    pub bytes_per_block: u64,
    /// Rows between consecutive GPU blocks in the flat attention view.
    pub attention_block_stride: u32,
    /// GPU blocks, null block 0 included.
    pub num_gpu_blocks: u32,
    /// Host bytes one host block id costs (summed source page bytes; in a shared host pool
    /// rounded up to a multiple of [`SHARED_HOST_ALIGNMENT`]).
    pub host_block_stride: u64,
    /// Host blocks, null block 0 included.
    pub host_num_blocks: u32,
    /// Hot rows per request per hot group.
    pub device_buffer_size: u32,
    /// Hot blocks per request per hot group: `ceil(device_buffer_size / block_size)`.
    pub hot_blocks_per_request: u32,
    /// Longest request in tokens.
    pub max_model_len: u32,
    /// Pages (blocks) of a `max_model_len` request: `ceil(max_model_len / block_tokens)`.
    pub max_pages_per_request: u32,
}

/// The sizes of a planned layout: every scalar of a [`KvCacheConfig`] (whose fields document
/// them), and of a [`FixedLayout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayoutSizes {
    /// The configuration with `device_buffer_size` resolved (`Some`).
    pub config: HiSparseConfig,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Rows per page of the source, resident and hot groups.
    pub block_size: u32,
    /// Tokens per sparse row.
    pub sparse_compress_ratio: u32,
    /// Bytes per sparse row.
    pub row_bytes: u32,
    /// Value bytes per sparse row.
    pub value_bytes: u32,
    /// Sparse and indexer pages are padded to a multiple of this.
    pub page_alignment: u32,
    /// The host pool is shared by the ranks of a node.
    pub shared_host_pool: bool,
    /// Number of resident/hot bucket pairs.
    pub num_buckets: u32,
    /// Bytes of one GPU block.
    pub bytes_per_block: u64,
    /// Rows between consecutive GPU blocks in the flat attention view.
    pub attention_block_stride: u32,
    /// GPU blocks, null block 0 included.
    pub num_gpu_blocks: u32,
    /// Host bytes one host block id costs.
    pub host_block_stride: u64,
    /// Host blocks, null block 0 included.
    pub host_num_blocks: u32,
    /// Hot rows per request per hot group.
    pub device_buffer_size: u32,
    /// Hot blocks per request per hot group.
    pub hot_blocks_per_request: u32,
    /// Longest request in tokens.
    pub max_model_len: u32,
    /// Pages (blocks) of a `max_model_len` request.
    pub max_pages_per_request: u32,
}

/// Why a layout cannot be planned. Messages say what to change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// The model geometry is invalid.
    Model(ModelError),
    /// The configuration is invalid.
    Config(ConfigError),
    /// `max_model_len` is zero.
    ZeroMaxModelLen,
    /// `gpu_bytes` is zero and no block-count override was given.
    ZeroGpuMemory,
    /// The GPU pool cannot hold one `max_model_len` request even with HiSparse.
    GpuPoolTooSmall {
        /// GPU blocks the budget gives (null block included).
        blocks: u64,
        /// GPU blocks needed (null block included).
        needed: u64,
        /// Bytes per GPU block.
        bytes_per_block: u64,
    },
    /// The host budget cannot hold one `max_model_len` request plus the null block and a
    /// copy-on-write tail.
    HostBudgetTooSmall {
        /// The budget.
        budget: u64,
        /// Bytes per host block.
        host_block_stride: u64,
        /// Bytes per host block of the indexer host cache the runtime pins beside the pool (0
        /// without an indexer); the budget holds both.
        indexer_page_bytes: u64,
        /// Host blocks it gives.
        blocks: u64,
        /// Host blocks needed.
        needed: u64,
        /// The budget those blocks need (pool and indexer host cache).
        needed_bytes: u64,
    },
    /// A pool has more blocks than `i32` block ids (or flat rows) can address.
    PoolTooLarge {
        /// `"gpu"` or `"host"`.
        pool: &'static str,
        /// Blocks requested.
        blocks: u64,
        /// Largest allowed.
        max: u64,
    },
    /// A size computation overflows.
    Overflow {
        /// What was being computed.
        field: &'static str,
    },
    /// A helper was asked about a layer that is not sparse (or not in the model).
    NotSparse {
        /// Model layer index.
        layer: u32,
    },
    /// A helper was asked about a group index that does not exist.
    NoSuchGroup {
        /// Group index.
        group: u32,
    },
    /// A field of a [`KvCacheConfig`] (hand-edited or deserialised) breaks a rule that
    /// [`plan_layout`] keeps; [`KvCacheConfig::validate`] names the first such field.
    InvalidField {
        /// The field (`hot_blocks_per_request`, `groups[].bucket`, …).
        field: &'static str,
        /// For a field inside a list (`groups[]`, `index_groups[]`): the element's index.
        index: Option<u32>,
        /// The field's value, when it is a number.
        value: Option<u64>,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A [`FixedLayout`] has no room for the plan: the model needs more groups, layer entries
    /// or index groups than its const parameters give.
    FixedCapacity {
        /// What ran out: `"groups"`, `"layer entries"` or `"index groups"`.
        what: &'static str,
        /// The const parameter that sets it (`GROUPS` or `LAYERS`).
        parameter: &'static str,
        /// Its value.
        capacity: usize,
    },
    /// The data plane's copies would refuse a layer's pages as a (hand-edited or deserialised)
    /// layout places them: the copies' own rule ([`crate::ops::PageLayout::check_shape`]) names
    /// the field of the page layout, derived from the layout's row geometry, group offsets,
    /// `bytes_per_block` or `host_block_stride`.
    PagesRefused {
        /// The model layer.
        layer: u32,
        /// Which of its pages: `"host"`, `"device"`, `"indexer host"` or `"indexer device"`.
        pages: &'static str,
        /// The copies' refusal.
        error: crate::error::OpError,
    },
}

impl From<ModelError> for LayoutError {
    fn from(e: ModelError) -> Self {
        LayoutError::Model(e)
    }
}

impl From<ConfigError> for LayoutError {
    fn from(e: ConfigError) -> Self {
        LayoutError::Config(e)
    }
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LayoutError::Model(e) => e.fmt(f),
            LayoutError::Config(e) => e.fmt(f),
            LayoutError::ZeroMaxModelLen => {
                f.write_str("layout: `max_model_len` must be greater than 0")
            }
            LayoutError::ZeroGpuMemory => f.write_str(
                "layout: GPU memory for the KV pool is 0; give a positive GPU budget or a block-count override",
            ),
            LayoutError::GpuPoolTooSmall {
                blocks,
                needed,
                bytes_per_block,
            } => write!(
                f,
                "layout: the GPU pool has {blocks} blocks of {bytes_per_block} B but one max_model_len request needs {needed} (null block included); raise the GPU budget to at least {} B or lower max_model_len",
                needed.saturating_mul(bytes_per_block)
            ),
            LayoutError::HostBudgetTooSmall {
                budget,
                host_block_stride,
                indexer_page_bytes,
                blocks,
                needed,
                needed_bytes,
            } => {
                write!(
                    f,
                    "layout: host budget {budget} B gives {blocks} host blocks of {host_block_stride} B"
                )?;
                if indexer_page_bytes > 0 {
                    write!(f, " (and {indexer_page_bytes} B of indexer keys each)")?;
                }
                write!(
                    f,
                    " but one max_model_len request needs {needed} (pages + null block + copy-on-write tail); raise host_budget_bytes to at least {needed_bytes} B or lower max_model_len"
                )
            }
            LayoutError::PoolTooLarge { pool, blocks, max } => write!(
                f,
                "layout: the {pool} pool would have {blocks} blocks, more than {max} that i32 ids address; lower its budget"
            ),
            LayoutError::Overflow { field } => {
                write!(f, "layout: `{field}` overflows; lower the budgets")
            }
            LayoutError::NotSparse { layer } => {
                write!(f, "layout: layer {layer} is not a sparse layer of this model")
            }
            LayoutError::NoSuchGroup { group } => {
                write!(f, "layout: group {group} does not exist")
            }
            LayoutError::InvalidField {
                field,
                index,
                value,
                rule,
            } => {
                f.write_str("layout: `")?;
                match (index, field.split_once("[]")) {
                    (Some(i), Some((list, rest))) => write!(f, "{list}[{i}]{rest}")?,
                    _ => f.write_str(field)?,
                }
                f.write_str("`")?;
                if let Some(v) = value {
                    write!(f, " = {v}")?;
                }
                write!(
                    f,
                    " {rule}; correct it or plan the layout with `plan_layout`"
                )
            }
            LayoutError::FixedCapacity {
                what,
                parameter,
                capacity,
            } => write!(
                f,
                "layout: the model needs more than {capacity} {what}, all a fixed layout of `{parameter}` = {capacity} holds; raise `{parameter}`"
            ),
            LayoutError::PagesRefused {
                layer,
                pages,
                error,
            } => write!(
                f,
                "layout: the copies refuse layer {layer}'s {pages} pages as placed ({error}); correct the layout's row geometry and offsets or plan it with `plan_layout`"
            ),
        }
    }
}

impl crate::error::Error for LayoutError {
    fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::InvalidArgument
    }
}

impl core::error::Error for LayoutError {}

/// The overflow error of a computed `field`.
fn ovf(field: &'static str) -> LayoutError {
    LayoutError::Overflow { field }
}

#[cfg(feature = "alloc")]
mod capacity;
#[cfg(feature = "alloc")]
mod fingerprint;
mod fixed;
#[cfg(feature = "alloc")]
mod geometry;
mod plan;
#[cfg(feature = "alloc")]
mod report;
mod rules;
#[cfg(feature = "alloc")]
mod validate;
#[cfg(feature = "alloc")]
mod views;

#[cfg(feature = "alloc")]
pub use capacity::{CapacityLimit, CapacityReport, LayoutWarning};
#[cfg(feature = "alloc")]
pub use fingerprint::LayoutFingerprint;
pub use fixed::{FixedIndexGroup, FixedLayout, plan_layout_fixed};
#[cfg(feature = "alloc")]
pub use plan::plan_layout;
#[cfg(feature = "alloc")]
pub use report::{LayoutReport, NodeHostMemory, capacity_contexts};
pub use rules::GpuBlocksPerRequest;
#[cfg(feature = "alloc")]
pub use views::LayerView;

#[cfg(all(test, feature = "alloc"))]
mod tests;
