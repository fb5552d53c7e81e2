//! Layout planning (SPEC §3): from a model, a [`HiSparseConfig`] and memory budgets to a
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
//! padded to 37,440 B; its indexer page 64 × 132 B → 8,640 B.
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

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::config::{ConfigError, HiSparseConfig};
use crate::model::{LayerSpec, ModelError, ModelSpec, RegularKind, padded_page_bytes};
use crate::ops::{LayerPair, PageLayout};

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

/// An index group: a leader and the followers that apply its resolver plan.
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
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KvCacheConfig {
    /// Model name.
    pub model: String,
    /// The configuration with `device_buffer_size` resolved (`Some`).
    pub config: HiSparseConfig,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Rows per page of the source, resident and hot groups (SPEC's block size).
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
        /// Host blocks it gives.
        blocks: u64,
        /// Host blocks needed.
        needed: u64,
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
                blocks,
                needed,
            } => write!(
                f,
                "layout: host budget {budget} B gives {blocks} host blocks of {host_block_stride} B but one max_model_len request needs {needed} (pages + null block + copy-on-write tail); raise host_budget_bytes to at least {} B or lower max_model_len",
                needed.saturating_mul(host_block_stride)
            ),
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
        }
    }
}

impl crate::error::Error for LayoutError {
    fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::InvalidArgument
    }
}

impl core::error::Error for LayoutError {}

fn ovf(field: &'static str) -> LayoutError {
    LayoutError::Overflow { field }
}

/// Plans the layout. See the module docs for the rules.
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
        padded_page_bytes(block_size, first.row_bytes, align).ok_or(ovf("sparse page bytes"))?;
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
            let page = padded_page_bytes(block_size, irb, align).ok_or(ovf("indexer page"))?;
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

    // Host pool: the largest block count whose (aligned) layer arrays fit the budget.
    let budget = config.host_budget_bytes;
    let layers = groups[0].layers.len() as u64;
    let pool_bytes = |n: u64| {
        n.checked_mul(sparse_page)
            .and_then(|a| a.checked_next_multiple_of(host_align))
            .and_then(|a| a.checked_mul(layers))
    };
    let mut host_blocks = budget / host_block_stride;
    while host_blocks > 0 && pool_bytes(host_blocks).is_none_or(|b| b > budget) {
        // Each block less frees `layers * sparse_page` bytes; the alignment slack is at most
        // `layers * host_align`, so this ends within `host_align / sparse_page + 1` rounds.
        host_blocks -= 1;
    }
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
}

/// Which tier limits concurrency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum CapacityLimit {
    /// The GPU pool: indexer, regular, resident tails and hot regions fill it first.
    Gpu,
    /// The host pool: the full KV of every request must fit in pinned host memory.
    Host,
    /// Keeping every page on the GPU already admits at least as many requests; HiSparse's hot
    /// regions would cost more than the pages they free (short contexts).
    AllOnGpu,
}

/// Max concurrent requests at one context length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CapacityReport {
    /// Context length in tokens.
    pub context_len: u32,
    /// Pages (blocks) per request.
    pub pages_per_request: u64,
    /// Usable GPU blocks (null block excluded).
    pub gpu_blocks: u64,
    /// Usable host blocks (null block and one copy-on-write block excluded).
    pub host_blocks: u64,
    /// GPU blocks per request.
    pub gpu_blocks_per_request: GpuBlocksPerRequest,
    /// Max requests with every page on the GPU.
    pub all_on_gpu_max: u64,
    /// Max requests the GPU pool admits under HiSparse.
    pub hisparse_gpu_max: u64,
    /// Max requests the host pool admits.
    pub host_max: u64,
    /// Max concurrent requests with HiSparse: `max(all_on_gpu_max, min(hisparse_gpu_max,
    /// host_max))`.
    pub hisparse_max: u64,
    /// The tier that limits `hisparse_max`.
    pub limit: CapacityLimit,
}

impl fmt::Display for CapacityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "context {} tokens ({} pages): all-on-GPU {} requests ({} GPU blocks each of {}); HiSparse {} requests (GPU allows {} at {} blocks each, host allows {} at {} blocks each); limited by ",
            self.context_len,
            self.pages_per_request,
            self.all_on_gpu_max,
            self.gpu_blocks_per_request.all_on_gpu,
            self.gpu_blocks,
            self.hisparse_max,
            self.hisparse_gpu_max,
            self.gpu_blocks_per_request.hisparse,
            self.host_max,
            self.pages_per_request,
        )?;
        match self.limit {
            CapacityLimit::Gpu => f.write_str(
                "the GPU pool (indexer, regular pages, resident tails and hot regions); add GPU memory or shrink device_buffer_size",
            ),
            CapacityLimit::Host => f.write_str(
                "the host pool (every request's full KV lives in pinned host memory); raise host_budget_bytes",
            ),
            CapacityLimit::AllOnGpu => f.write_str(
                "nothing HiSparse can improve: at this context every page fits on the GPU, and hot regions would cost more than they free",
            ),
        }
    }
}

impl KvCacheConfig {
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
        let raw = u64::from(self.host_num_blocks).saturating_mul(page);
        if self.shared_host_pool {
            raw.checked_next_multiple_of(SHARED_HOST_ALIGNMENT)
                .unwrap_or(u64::MAX)
        } else {
            raw
        }
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
        let spec = u64::from(self.config.max_query_len.max(1)) - 1;
        u64::from(window) + 2 * spec
    }

    /// Blocks a regular group keeps for a request of `tokens` tokens: a full group every block
    /// of them; a sliding-window group at most the blocks spanned by its window tokens
    /// ([`KvCacheConfig::window_tokens`]) plus one.
    pub fn regular_blocks_for(&self, group: &KvCacheGroup, tokens: u32) -> u64 {
        let bt = u64::from(if group.block_tokens > 0 {
            group.block_tokens
        } else {
            self.block_tokens.max(1)
        });
        let all = u64::from(tokens).div_ceil(bt);
        match group.sliding_window {
            Some(w) => all.min(self.window_tokens(w).div_ceil(bt) + 1),
            None => all,
        }
    }

    /// GPU blocks one request needs at `context_len` tokens (saturating, so a hand-edited layout
    /// gives huge counts rather than a panic).
    pub fn gpu_blocks_per_request(&self, context_len: u32) -> GpuBlocksPerRequest {
        let pages = u64::from(self.pages_for(context_len));
        let regular = self.groups[self.regular_groups()]
            .iter()
            .fold(0u64, |acc, g| {
                acc.saturating_add(self.regular_blocks_for(g, context_len))
            });
        let b = u64::from(self.num_buckets);
        let base = pages.saturating_add(regular);
        GpuBlocksPerRequest {
            all_on_gpu: base.saturating_add(b.saturating_mul(pages)),
            hisparse: base
                .saturating_add(b.saturating_mul(pages.min(u64::from(ACTIVE_TAIL_PAGES))))
                .saturating_add(b.saturating_mul(u64::from(self.hot_blocks_per_request))),
        }
    }

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
        let split = self.value_bytes != self.row_bytes;
        if self.row_bytes == 0
            || (!split && !self.row_bytes.is_multiple_of(16))
            || (split && !(self.row_bytes.wrapping_sub(self.value_bytes)).is_multiple_of(4))
        {
            bad(
                "row_bytes",
                None,
                Some(self.row_bytes.into()),
                "must be a positive multiple of 16 (contiguous rows) or value_bytes plus a multiple of 4 (split rows)",
            )?;
        }
        if self.value_bytes == 0
            || self.value_bytes > self.row_bytes
            || !self.value_bytes.is_multiple_of(16)
        {
            bad(
                "value_bytes",
                None,
                Some(self.value_bytes.into()),
                "must be a positive multiple of 16 no larger than row_bytes",
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
        let Some(page) = padded_page_bytes(self.block_size, self.row_bytes, self.page_alignment)
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
                "must be a positive multiple of the sparse page (block_size rows of row_bytes, padded to page_alignment)",
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
        if self.host_pool_bytes() > self.config.host_budget_bytes {
            bad(
                "host_num_blocks",
                None,
                Some(self.host_num_blocks.into()),
                "gives a host pool (every source layer's array) beyond host_budget_bytes",
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

    /// Max concurrent requests at `context_len` tokens, all-on-GPU vs HiSparse, and why.
    pub fn capacity(&self, context_len: u32) -> CapacityReport {
        let pages = u64::from(self.pages_for(context_len)).max(1);
        let per = self.gpu_blocks_per_request(context_len.max(1));
        let gpu_blocks = u64::from(self.num_gpu_blocks).saturating_sub(1);
        let host_blocks = u64::from(self.host_num_blocks).saturating_sub(2);
        let all_on_gpu_max = gpu_blocks / per.all_on_gpu.max(1);
        let hisparse_gpu_max = gpu_blocks / per.hisparse.max(1);
        let host_max = host_blocks / pages;
        let offload = hisparse_gpu_max.min(host_max);
        let (hisparse_max, limit) = if all_on_gpu_max >= offload {
            (all_on_gpu_max, CapacityLimit::AllOnGpu)
        } else if hisparse_gpu_max <= host_max {
            (offload, CapacityLimit::Gpu)
        } else {
            (offload, CapacityLimit::Host)
        };
        CapacityReport {
            context_len,
            pages_per_request: pages,
            gpu_blocks,
            host_blocks,
            gpu_blocks_per_request: per,
            all_on_gpu_max,
            hisparse_gpu_max,
            host_max,
            hisparse_max,
            limit,
        }
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
        let l = self.source_layer(layer)?;
        let array = u64::from(self.host_num_blocks)
            .checked_mul(l.page_bytes)
            .and_then(|a| {
                a.checked_next_multiple_of(if self.shared_host_pool {
                    SHARED_HOST_ALIGNMENT
                } else {
                    1
                })
            });
        let base = array
            .and_then(|a| u64::from(l.index_in_group).checked_mul(a))
            .ok_or(ovf("host layout base"))?;
        Ok(PageLayout {
            base,
            block_stride: l.page_bytes,
            num_blocks: self.host_num_blocks,
            block_size: self.block_size,
            row_bytes: self.row_bytes,
            value_bytes: self.value_bytes,
            index_stride_rows: self.block_size,
        })
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
        Ok(PageLayout {
            base: l.offset,
            block_stride: self.bytes_per_block,
            num_blocks: self.num_gpu_blocks,
            block_size: self.block_size,
            row_bytes: self.row_bytes,
            value_bytes: self.value_bytes,
            index_stride_rows: self.attention_block_stride,
        })
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
        self.groups
            .get(Self::INDEXER_GROUP)
            .map_or(0, |g| g.page_bytes)
            .saturating_mul(u64::from(self.host_num_blocks))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{RegularKind, RegularLayer, SparseLayer};
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
        assert_eq!(kv.host_num_blocks as u64, 64 * GIB / 2561024);
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
        assert_eq!(c.host_max, (64 * GIB / 2561024 - 2) / 512);
        assert_eq!(c.hisparse_max, c.host_max);
        // Short contexts: all-on-GPU is better.
        let c = kv.capacity(128);
        assert_eq!(c.limit, CapacityLimit::AllOnGpu);
        assert!(std::format!("{c}").contains("limited by"));
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
        assert!(c128_state.iter().all(
            |g| g.sliding_window == Some(128) && g.layers.iter().all(|l| l.page_bytes == 32832)
        ));
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
                assert!(kv.host_pool_bytes() <= budget);
                assert!(kv.host_num_blocks <= plain.host_num_blocks);
                // The largest block count whose aligned arrays fit.
                let mut more = kv.clone();
                more.host_num_blocks += 1;
                assert!(
                    more.host_pool_bytes() > budget
                        || u64::from(more.host_num_blocks) * kv.host_block_stride > budget
                );
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
                blocks: 100,
                needed: 2050
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
}
