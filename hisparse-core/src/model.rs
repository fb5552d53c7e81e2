//! Model geometry: which KV-cache tensors a model has and how big their rows are (SPEC §2).
//!
//! A model is an ordered list of [`LayerSpec`]s, one per KV-cache tensor:
//! * [`LayerSpec::Sparse`] — a sparse-attention layer whose KV rows go through HiSparse (host
//!   source copy, GPU resident pages, per-request hot buffer). A sparse layer that owns an
//!   indexer (`indexer_row_bytes: Some(_)`) is an **index-group leader**; one without is a
//!   **follower** of the nearest leader before it (GLM-5 shares one indexer across ~4 layers).
//! * [`LayerSpec::Regular`] — a layer that stays fully on the GPU with ordinary paging (sliding
//!   window layers, compressed layers of other ratios).
//!
//! All GPU groups share one *block* of `block_tokens` tokens. A layer with compress ratio `R`
//! stores `block_tokens / R` rows per block. The HiSparse groups (source, resident, hot) all use
//! the sparse layers' rows per block, the *block size* of SPEC §2 (64 for DeepSeek V3.2; for a
//! DeepSeek-V4-style model, 256 tokens / ratio 4 = 64 compressed rows).
//!
//! Models are plain data. [`ModelSpec`] borrows its layer list (works without `alloc`; the
//! presets in [`crate::presets`] are `'static`); with `alloc`, `OwnedModel` owns it and is
//! what a user-described model (for example from JSON under the `serde` feature) deserialises to.

use core::fmt;

use crate::ops::COPY_ALIGNMENT;

#[cfg(feature = "serde")]
const fn one() -> u32 {
    1
}

#[cfg(feature = "serde")]
fn is_one(v: &u32) -> bool {
    *v == 1
}

/// Bytes of a page of `rows` rows of `row_bytes`, padded up to a multiple of `alignment` (`0`
/// or `1` = no padding); `None` on overflow. The one rule every page size of a layout follows
/// (DeepSeek V4's fp8_ds_mla pages: 64 × 584 B = 37,376 B padded to a multiple of 576 B =
/// 37,440 B).
pub const fn padded_page_bytes(rows: u32, row_bytes: u32, alignment: u32) -> Option<u64> {
    pad(rows as u64 * row_bytes as u64, alignment as u64)
}

/// Bytes of a page the data plane copies (a sparse layer's, or its indexer's): padded like
/// [`padded_page_bytes`] and, beyond that, to a multiple of the copies' unit
/// ([`COPY_ALIGNMENT`]), so every page the planner places side by side starts on one — the
/// least multiple of both (`page_alignment` 100 pads to 400; DeepSeek V4's 576 and every
/// preset's pages are multiples of 16 already). `None` on overflow.
pub const fn copied_page_bytes(rows: u32, row_bytes: u32, alignment: u32) -> Option<u64> {
    let unit = COPY_ALIGNMENT as u64;
    let alignment = if alignment <= 1 { 1 } else { alignment as u64 };
    // lcm(alignment, unit): the unit is a power of two.
    let common = alignment
        << (unit
            .trailing_zeros()
            .saturating_sub(alignment.trailing_zeros()));
    pad(rows as u64 * row_bytes as u64, common)
}

/// `raw` rounded up to a multiple of `alignment` (`0` or `1`: as it is); `None` on overflow.
const fn pad(raw: u64, alignment: u64) -> Option<u64> {
    if alignment <= 1 {
        return Some(raw);
    }
    raw.checked_next_multiple_of(alignment)
}

/// A sparse-attention layer served by HiSparse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct SparseLayer {
    /// Bytes of one KV row. Contiguous rows: a multiple of 16 (DeepSeek V3.2 fp8: 656 = 512 fp8,
    /// 16 B scales and 128 B bf16 rope). Split rows: value part plus scale part (DeepSeek V4's
    /// fp8_ds_mla state: 576 + 8 = 584).
    pub row_bytes: u32,
    /// Value bytes of a row when pages are *split* (all value parts of a page first, then all
    /// scale parts); equal to `row_bytes` for contiguous rows. The value part is a multiple of
    /// 16 bytes, the scale part (`row_bytes - value_bytes`) a multiple of 4.
    pub value_bytes: u32,
    /// Tokens per stored row (1 for V3.2; 4 for the C4A layers of DeepSeek V4).
    pub compress_ratio: u32,
    /// Bytes of this layer's own indexer row (`Some` = index-group leader, `None` = follower of the
    /// leader before it). The indexer cache stays on the GPU (and may be backed up to host with
    /// [`crate::ops::indexer_backup`]), so no 16-byte rule applies to a whole row.
    pub indexer_row_bytes: Option<u32>,
    /// Value bytes of an indexer row whose pages are split like the KV pages (DeepSeek V4: 128
    /// fp8 values, then a 4-byte scale per row); `None` = contiguous indexer rows.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub indexer_value_bytes: Option<u32>,
    /// Pages of this layer and of its indexer are padded to a multiple of this many bytes (1 =
    /// none; DeepSeek V4: 576, the FlashMLA packing) — and always to a multiple of 16 bytes, where
    /// the data plane's copies start ([`copied_page_bytes`]).
    #[cfg_attr(
        feature = "serde",
        serde(default = "one", skip_serializing_if = "is_one")
    )]
    pub page_alignment: u32,
}

/// What a regular (GPU-only) cache holds: it decides nothing in the plan beyond the group it
/// joins, and names the group in reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum RegularKind {
    /// Attention KV (full, or compressed at another ratio: DeepSeek V4's C128A).
    #[default]
    Attention,
    /// A sliding-window attention cache (DeepSeek V4: on every layer, 64-token blocks).
    SlidingWindow,
    /// A compressor's running state (DeepSeek V4: the C4/C128 compressors and the indexer's
    /// compressor; a sliding window of `coff × ratio` tokens).
    CompressorState,
}

impl RegularKind {
    /// Lowercase name for logs and tables.
    pub const fn as_str(self) -> &'static str {
        match self {
            RegularKind::Attention => "attention",
            RegularKind::SlidingWindow => "sliding_window",
            RegularKind::CompressorState => "compressor_state",
        }
    }

    #[cfg(feature = "serde")]
    fn is_attention(&self) -> bool {
        *self == RegularKind::Attention
    }
}

/// A cache that stays fully on the GPU with ordinary paging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct RegularLayer {
    /// Bytes of one row (any size: regular caches are never copied by HiSparse).
    pub row_bytes: u32,
    /// Tokens per stored row (1 for uncompressed caches).
    pub compress_ratio: u32,
    /// Sliding-window length in tokens (`None` = full attention). A sliding-window cache only
    /// needs the blocks covering the last `window` tokens (and the tokens of the step).
    pub sliding_window: Option<u32>,
    /// Tokens one block of this cache covers (`None` = the model's `block_tokens`); must divide
    /// the model's `block_tokens` (DeepSeek V4: 64 for its sliding-window caches, 4 and 8 for
    /// its compressor states).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub block_tokens: Option<u32>,
    /// Pages padded to a multiple of this many bytes (1 = none; DeepSeek V4: 576).
    #[cfg_attr(
        feature = "serde",
        serde(default = "one", skip_serializing_if = "is_one")
    )]
    pub page_alignment: u32,
    /// What the cache holds.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "RegularKind::is_attention")
    )]
    pub kind: RegularKind,
}

impl RegularLayer {
    /// A full-attention cache with the model's block size and unpadded pages.
    pub const fn full(row_bytes: u32, compress_ratio: u32) -> Self {
        RegularLayer {
            row_bytes,
            compress_ratio,
            sliding_window: None,
            block_tokens: None,
            page_alignment: 1,
            kind: RegularKind::Attention,
        }
    }

    /// A sliding-window cache of `window` tokens with the model's block size and unpadded
    /// pages.
    pub const fn windowed(row_bytes: u32, window: u32) -> Self {
        RegularLayer {
            row_bytes,
            compress_ratio: 1,
            sliding_window: Some(window),
            block_tokens: None,
            page_alignment: 1,
            kind: RegularKind::SlidingWindow,
        }
    }

    /// Tokens per block of this cache in a model of `model_block_tokens`-token blocks.
    pub const fn tokens_per_block(&self, model_block_tokens: u32) -> u32 {
        match self.block_tokens {
            Some(b) => b,
            None => model_block_tokens,
        }
    }
}

/// One KV-cache tensor of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum LayerSpec {
    /// A sparse layer served by HiSparse.
    Sparse(SparseLayer),
    /// A regular GPU layer.
    Regular(RegularLayer),
}

impl LayerSpec {
    /// A contiguous-row sparse layer that leads its own index group.
    pub const fn sparse_leader(row_bytes: u32, indexer_row_bytes: u32) -> Self {
        LayerSpec::Sparse(SparseLayer {
            row_bytes,
            value_bytes: row_bytes,
            compress_ratio: 1,
            indexer_row_bytes: Some(indexer_row_bytes),
            indexer_value_bytes: None,
            page_alignment: 1,
        })
    }

    /// A contiguous-row sparse layer following the index group leader before it.
    pub const fn sparse_follower(row_bytes: u32) -> Self {
        LayerSpec::Sparse(SparseLayer {
            row_bytes,
            value_bytes: row_bytes,
            compress_ratio: 1,
            indexer_row_bytes: None,
            indexer_value_bytes: None,
            page_alignment: 1,
        })
    }

    /// The sparse description, if this is a sparse layer.
    pub const fn as_sparse(&self) -> Option<&SparseLayer> {
        match self {
            LayerSpec::Sparse(s) => Some(s),
            LayerSpec::Regular(_) => None,
        }
    }
}

/// GLM-5's rule for which sparse layers run their own indexer (the others reuse the top-k of
/// the leader before them): sparse layer `k` (counted among the sparse layers) leads when
/// `max(k + 1 - skip_offset, 0) % freq == 0` — the schedule GLM-5's configs declare as
/// `index_topk_freq` and `index_skip_topk_offset`, and vLLM and SGLang compute. GLM-5 (`freq`
/// 4, `skip_offset` 3, 78 layers) has 21 leaders: 0, 1, 2, 6, 10, …, 74.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct IndexRule {
    /// `index_topk_freq`: one leader every `freq` layers past the offset (≥ 1).
    pub freq: u32,
    /// `index_skip_topk_offset`: the layers before it all lead.
    pub skip_offset: u32,
}

impl IndexRule {
    /// Whether sparse layer `k` leads its index group.
    pub const fn leads(&self, k: u32) -> bool {
        if self.freq == 0 {
            return true;
        }
        let shifted = (k as u64 + 1).saturating_sub(self.skip_offset as u64);
        shifted.is_multiple_of(self.freq as u64)
    }

    /// Gives each sparse layer of `layers` its role under the rule: a leader keeps its
    /// `indexer_row_bytes` (or takes `indexer_row_bytes` when it has none), a follower loses
    /// it.
    pub fn apply(&self, layers: &mut [LayerSpec], indexer_row_bytes: u32) {
        let mut k = 0u32;
        for l in layers.iter_mut() {
            if let LayerSpec::Sparse(s) = l {
                if self.leads(k) {
                    s.indexer_row_bytes.get_or_insert(indexer_row_bytes);
                } else {
                    s.indexer_row_bytes = None;
                    s.indexer_value_bytes = None;
                }
                k += 1;
            }
        }
    }

    /// The rule with the smallest `freq ≥ 2` (then the smallest offset) that gives exactly the
    /// leaders of `layers`, if any (and if some layer follows). What a model description
    /// prints instead of listing every layer's role.
    pub fn detect(layers: &[LayerSpec]) -> Option<IndexRule> {
        let flags = alloc_free::Flags::of(layers);
        if flags.len == 0 || (0..flags.len).all(|k| flags.get(k)) {
            return None;
        }
        let n = flags.len as u32;
        for freq in 2..=n.min(64) {
            for skip_offset in 0..=n {
                let rule = IndexRule { freq, skip_offset };
                if (0..flags.len).all(|k| rule.leads(k as u32) == flags.get(k)) {
                    return Some(rule);
                }
            }
        }
        None
    }
}

/// Leader flags of up to 1024 sparse layers without allocating (rule detection works without
/// `alloc`).
mod alloc_free {
    use super::LayerSpec;

    pub(super) struct Flags {
        bits: [u64; 16],
        pub(super) len: usize,
    }

    impl Flags {
        pub(super) fn of(layers: &[LayerSpec]) -> Self {
            let mut f = Flags {
                bits: [0; 16],
                len: 0,
            };
            for s in layers.iter().filter_map(LayerSpec::as_sparse) {
                if f.len == 16 * 64 {
                    // Too many layers to describe by a rule: report none.
                    f.len = 0;
                    return f;
                }
                if s.indexer_row_bytes.is_some() {
                    f.bits[f.len / 64] |= 1 << (f.len % 64);
                }
                f.len += 1;
            }
            f
        }

        pub(super) fn get(&self, k: usize) -> bool {
            self.bits[k / 64] >> (k % 64) & 1 == 1
        }
    }
}

/// A model's KV-cache geometry, borrowing its layer list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelSpec<'a> {
    /// Name (presets: the lookup key of [`crate::presets::preset`]).
    pub name: &'a str,
    /// Tokens covered by one block (a *page*) of the sparse layers, of their indexer and of the
    /// host pool; regular caches may use smaller blocks ([`RegularLayer::block_tokens`]).
    pub block_tokens: u32,
    /// The model's top-k (tokens each decode token selects per layer); the default for
    /// [`crate::config::HiSparseConfig::top_k`].
    pub top_k: u32,
    /// KV-cache tensors in model order.
    pub layers: &'a [LayerSpec],
}

/// A model whose geometry is invalid. Every variant names the offending layer and field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelError {
    /// `block_tokens` is zero.
    ZeroBlockTokens,
    /// The model has no layers at all.
    NoLayers,
    /// The model has no sparse layer, so HiSparse has nothing to serve.
    NoSparseLayers,
    /// A field of a layer is zero.
    ZeroField {
        /// Layer index.
        layer: usize,
        /// Field name.
        field: &'static str,
    },
    /// A sparse row part is not a multiple of its unit: 16 bytes for a contiguous row and a
    /// split row's value part, 4 bytes for a split row's scale part (the data plane copies
    /// 16-byte chunks of values and 4-byte words of scales).
    RowNotAligned {
        /// Layer index.
        layer: usize,
        /// Field name (`row_bytes`, `value_bytes` or `scale bytes`).
        field: &'static str,
        /// The value given.
        value: u32,
        /// The unit it must be a multiple of.
        multiple: u32,
    },
    /// A regular cache's `block_tokens` is zero or does not divide the model's `block_tokens`.
    RegularBlockTokens {
        /// Layer index.
        layer: usize,
        /// The cache's block tokens.
        block_tokens: u32,
        /// The model's block tokens.
        model_block_tokens: u32,
    },
    /// `indexer_value_bytes` is given without an indexer, is zero, or exceeds
    /// `indexer_row_bytes`.
    IndexerValueBytes {
        /// Layer index.
        layer: usize,
        /// The value given.
        value: u32,
        /// The indexer row size (0 without an indexer).
        indexer_row_bytes: u32,
    },
    /// An index rule ([`IndexRule`]) makes a sparse layer a leader but the description gives
    /// no indexer row for it.
    LeaderWithoutIndexer {
        /// Layer index.
        layer: usize,
    },
    /// `value_bytes` exceeds `row_bytes`.
    ValueBytesTooLarge {
        /// Layer index.
        layer: usize,
        /// The value given.
        value_bytes: u32,
        /// The row size.
        row_bytes: u32,
    },
    /// `block_tokens` is not a multiple of the layer's compress ratio.
    RatioDoesNotDivideBlock {
        /// Layer index.
        layer: usize,
        /// The compress ratio.
        compress_ratio: u32,
        /// Tokens per block.
        block_tokens: u32,
    },
    /// The first sparse layer has no indexer, so there is no leader for it to follow.
    FollowerWithoutLeader {
        /// Layer index.
        layer: usize,
    },
    /// Sparse layers disagree on a field that HiSparse needs uniform (one host row view, one
    /// flat attention row view, one block size).
    MixedSparseGeometry {
        /// Layer index.
        layer: usize,
        /// Field name.
        field: &'static str,
        /// The layer's value.
        value: u32,
        /// The first sparse layer's value.
        expected: u32,
    },
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ModelError::ZeroBlockTokens => f.write_str("model: `block_tokens` must be greater than 0"),
            ModelError::NoLayers => f.write_str("model: the layer list is empty"),
            ModelError::NoSparseLayers => f.write_str(
                "model: no sparse layer; HiSparse serves sparse layers only (mark at least one layer `sparse`)",
            ),
            ModelError::ZeroField { layer, field } => {
                write!(f, "model: layer {layer}: `{field}` must be greater than 0")
            }
            ModelError::RowNotAligned {
                layer,
                field,
                value,
                multiple,
            } => write!(
                f,
                "model: layer {layer}: `{field}` = {value} must be a multiple of {multiple} bytes (pad the row)"
            ),
            ModelError::RegularBlockTokens {
                layer,
                block_tokens,
                model_block_tokens,
            } => write!(
                f,
                "model: layer {layer}: `block_tokens` = {block_tokens} must be positive and divide the model's `block_tokens` = {model_block_tokens}"
            ),
            ModelError::IndexerValueBytes {
                layer,
                value,
                indexer_row_bytes,
            } => write!(
                f,
                "model: layer {layer}: `indexer_value_bytes` = {value} needs an indexer row and must lie in 1..=`indexer_row_bytes` = {indexer_row_bytes}"
            ),
            ModelError::LeaderWithoutIndexer { layer } => write!(
                f,
                "model: layer {layer} leads an index group under `index_topk_freq` / `index_skip_topk_offset` but has no `indexer_row_bytes`; give it one"
            ),
            ModelError::ValueBytesTooLarge {
                layer,
                value_bytes,
                row_bytes,
            } => write!(
                f,
                "model: layer {layer}: `value_bytes` = {value_bytes} exceeds `row_bytes` = {row_bytes}"
            ),
            ModelError::RatioDoesNotDivideBlock {
                layer,
                compress_ratio,
                block_tokens,
            } => write!(
                f,
                "model: layer {layer}: `compress_ratio` = {compress_ratio} does not divide `block_tokens` = {block_tokens}"
            ),
            ModelError::FollowerWithoutLeader { layer } => write!(
                f,
                "model: layer {layer} is the first sparse layer but has no indexer; give it `indexer_row_bytes`"
            ),
            ModelError::MixedSparseGeometry {
                layer,
                field,
                value,
                expected,
            } => write!(
                f,
                "model: layer {layer}: sparse `{field}` = {value} differs from the first sparse layer's {expected}; all sparse layers must share it"
            ),
        }
    }
}

impl crate::error::Error for ModelError {
    fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::InvalidArgument
    }
}

impl core::error::Error for ModelError {}

impl ModelSpec<'_> {
    /// Checks the geometry: sizes non-zero, sparse row parts multiples of their units (16-byte
    /// values, 4-byte scales), ratios dividing the blocks, regular block sizes dividing the
    /// model's, a leader before every follower, one sparse row geometry.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.block_tokens == 0 {
            return Err(ModelError::ZeroBlockTokens);
        }
        if self.layers.is_empty() {
            return Err(ModelError::NoLayers);
        }
        let mut first: Option<SparseLayer> = None;
        for (layer, spec) in self.layers.iter().enumerate() {
            let (row_bytes, ratio, block, alignment) = match spec {
                LayerSpec::Sparse(s) => (
                    s.row_bytes,
                    s.compress_ratio,
                    self.block_tokens,
                    s.page_alignment,
                ),
                LayerSpec::Regular(r) => (
                    r.row_bytes,
                    r.compress_ratio,
                    r.tokens_per_block(self.block_tokens),
                    r.page_alignment,
                ),
            };
            for (field, v) in [
                ("row_bytes", row_bytes),
                ("compress_ratio", ratio),
                ("page_alignment", alignment),
            ] {
                if v == 0 {
                    return Err(ModelError::ZeroField { layer, field });
                }
            }
            if block == 0 || !self.block_tokens.is_multiple_of(block) {
                return Err(ModelError::RegularBlockTokens {
                    layer,
                    block_tokens: block,
                    model_block_tokens: self.block_tokens,
                });
            }
            if !block.is_multiple_of(ratio) {
                return Err(ModelError::RatioDoesNotDivideBlock {
                    layer,
                    compress_ratio: ratio,
                    block_tokens: block,
                });
            }
            match spec {
                LayerSpec::Regular(r) => {
                    if r.sliding_window == Some(0) {
                        return Err(ModelError::ZeroField {
                            layer,
                            field: "sliding_window",
                        });
                    }
                }
                LayerSpec::Sparse(s) => {
                    check_sparse(layer, s)?;
                    match first {
                        None => {
                            if s.indexer_row_bytes.is_none() {
                                return Err(ModelError::FollowerWithoutLeader { layer });
                            }
                            first = Some(*s);
                        }
                        Some(f) => {
                            for (field, value, expected) in [
                                ("row_bytes", s.row_bytes, f.row_bytes),
                                ("value_bytes", s.value_bytes, f.value_bytes),
                                ("compress_ratio", s.compress_ratio, f.compress_ratio),
                                ("page_alignment", s.page_alignment, f.page_alignment),
                            ] {
                                if value != expected {
                                    return Err(ModelError::MixedSparseGeometry {
                                        layer,
                                        field,
                                        value,
                                        expected,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        if first.is_none() {
            return Err(ModelError::NoSparseLayers);
        }
        Ok(())
    }

    /// The first sparse layer (all sparse layers share its row geometry once validated).
    pub fn first_sparse(&self) -> Option<&SparseLayer> {
        self.layers.iter().find_map(LayerSpec::as_sparse)
    }

    /// Number of sparse layers.
    pub fn num_sparse_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.as_sparse().is_some())
            .count()
    }

    /// Number of index-group leaders.
    pub fn num_leaders(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.as_sparse().is_some_and(|s| s.indexer_row_bytes.is_some()))
            .count()
    }

    /// Rows per block of the sparse layers (SPEC's *block size*), once validated.
    pub fn sparse_block_size(&self) -> Option<u32> {
        self.first_sparse()
            .map(|s| self.block_tokens / s.compress_ratio.max(1))
    }
}

fn check_sparse(layer: usize, s: &SparseLayer) -> Result<(), ModelError> {
    if s.value_bytes == 0 {
        return Err(ModelError::ZeroField {
            layer,
            field: "value_bytes",
        });
    }
    if s.indexer_row_bytes == Some(0) {
        return Err(ModelError::ZeroField {
            layer,
            field: "indexer_row_bytes",
        });
    }
    if let Some(v) = s.indexer_value_bytes {
        let irb = s.indexer_row_bytes.unwrap_or(0);
        if v == 0 || v > irb {
            return Err(ModelError::IndexerValueBytes {
                layer,
                value: v,
                indexer_row_bytes: irb,
            });
        }
    }
    if s.value_bytes > s.row_bytes {
        return Err(ModelError::ValueBytesTooLarge {
            layer,
            value_bytes: s.value_bytes,
            row_bytes: s.row_bytes,
        });
    }
    let scale = s.row_bytes - s.value_bytes;
    let parts: [(&'static str, u32, u32); 2] = if scale == 0 {
        [
            ("row_bytes", s.row_bytes, 16),
            ("row_bytes", s.row_bytes, 16),
        ]
    } else {
        [
            ("value_bytes", s.value_bytes, 16),
            ("scale bytes (row_bytes - value_bytes)", scale, 4),
        ]
    };
    for (field, value, multiple) in parts {
        if !value.is_multiple_of(multiple) {
            return Err(ModelError::RowNotAligned {
                layer,
                field,
                value,
                multiple,
            });
        }
    }
    Ok(())
}

/// A model that owns its layer list: what a user-described model deserialises to.
///
/// As JSON (with the `serde` feature) a model is
/// `{"name", "block_tokens", "top_k", "layers": [..], "index_topk_freq"?, "index_skip_topk_offset"?}`
/// where each entry of `layers` is `{"sparse": {..}}` or `{"regular": {..}}`, optionally with
/// `"repeat": n` for `n` identical consecutive layers. With `index_topk_freq` (and
/// `index_skip_topk_offset`, default 0) the sparse layers' roles follow the [`IndexRule`]: a
/// follower's `indexer_row_bytes` is dropped, and a leader without one takes the first one the
/// description gives. Unknown fields are refused with their name (a typo must not silently
/// change the layout). Printing a model writes runs of equal layers as `repeat` entries and the
/// index rule when one describes its leaders.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(try_from = "file::ModelFile", into = "file::ModelFile")
)]
pub struct OwnedModel {
    /// Name.
    pub name: alloc::string::String,
    /// Tokens covered by one block.
    pub block_tokens: u32,
    /// The model's top-k.
    pub top_k: u32,
    /// KV-cache tensors in model order.
    pub layers: alloc::vec::Vec<LayerSpec>,
}

#[cfg(feature = "alloc")]
impl OwnedModel {
    /// Borrows this model as a [`ModelSpec`].
    pub fn as_spec(&self) -> ModelSpec<'_> {
        ModelSpec {
            name: &self.name,
            block_tokens: self.block_tokens,
            top_k: self.top_k,
            layers: &self.layers,
        }
    }
}

#[cfg(feature = "alloc")]
impl From<ModelSpec<'_>> for OwnedModel {
    fn from(m: ModelSpec<'_>) -> Self {
        OwnedModel {
            name: m.name.into(),
            block_tokens: m.block_tokens,
            top_k: m.top_k,
            layers: m.layers.to_vec(),
        }
    }
}

/// The JSON form of [`OwnedModel`].
#[cfg(feature = "serde")]
mod file {
    use alloc::string::String;
    use alloc::vec::Vec;

    use super::{IndexRule, LayerSpec, ModelError, OwnedModel, RegularLayer, SparseLayer};

    /// Largest `repeat` of one entry (a description that expands beyond it is refused).
    const MAX_LAYERS: u32 = 1 << 16;

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct ModelFile {
        name: String,
        block_tokens: u32,
        top_k: u32,
        layers: Vec<LayerEntry>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index_topk_freq: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index_skip_topk_offset: Option<u32>,
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct LayerEntry {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        repeat: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sparse: Option<SparseLayer>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        regular: Option<RegularLayer>,
    }

    /// Why a model description cannot be read.
    #[derive(Debug)]
    pub(super) enum FileError {
        Entry(usize, &'static str),
        TooMany,
        Model(ModelError),
    }

    impl core::fmt::Display for FileError {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            match self {
                FileError::Entry(i, why) => write!(f, "layers[{i}]: {why}"),
                FileError::TooMany => write!(
                    f,
                    "the layers expand to more than {MAX_LAYERS}; lower the `repeat` counts"
                ),
                FileError::Model(e) => e.fmt(f),
            }
        }
    }

    impl TryFrom<ModelFile> for OwnedModel {
        type Error = FileError;

        fn try_from(m: ModelFile) -> Result<Self, FileError> {
            let mut layers = Vec::new();
            for (i, e) in m.layers.iter().enumerate() {
                let spec = match (e.sparse, e.regular) {
                    (Some(s), None) => LayerSpec::Sparse(s),
                    (None, Some(r)) => LayerSpec::Regular(r),
                    _ => {
                        return Err(FileError::Entry(
                            i,
                            "give exactly one of `sparse` and `regular`",
                        ));
                    }
                };
                let n = e.repeat.unwrap_or(1);
                if n == 0 {
                    return Err(FileError::Entry(i, "`repeat` must be at least 1"));
                }
                if layers.len() as u64 + u64::from(n) > u64::from(MAX_LAYERS) {
                    return Err(FileError::TooMany);
                }
                layers.extend(core::iter::repeat_n(spec, n as usize));
            }
            if let Some(freq) = m.index_topk_freq {
                if freq == 0 {
                    return Err(FileError::Model(ModelError::ZeroField {
                        layer: 0,
                        field: "index_topk_freq",
                    }));
                }
                let rule = IndexRule {
                    freq,
                    skip_offset: m.index_skip_topk_offset.unwrap_or(0),
                };
                let first = layers
                    .iter()
                    .filter_map(LayerSpec::as_sparse)
                    .find_map(|s| s.indexer_row_bytes);
                let mut k = 0u32;
                for (i, l) in layers.iter().enumerate() {
                    if let LayerSpec::Sparse(s) = l {
                        if rule.leads(k) && s.indexer_row_bytes.is_none() && first.is_none() {
                            return Err(FileError::Model(ModelError::LeaderWithoutIndexer {
                                layer: i,
                            }));
                        }
                        k += 1;
                    }
                }
                rule.apply(&mut layers, first.unwrap_or(0));
            } else if m.index_skip_topk_offset.is_some() {
                return Err(FileError::Model(ModelError::ZeroField {
                    layer: 0,
                    field: "index_topk_freq (required with index_skip_topk_offset)",
                }));
            }
            Ok(OwnedModel {
                name: m.name,
                block_tokens: m.block_tokens,
                top_k: m.top_k,
                layers,
            })
        }
    }

    impl From<OwnedModel> for ModelFile {
        fn from(m: OwnedModel) -> Self {
            // With a rule, every sparse layer is written as a leader would be (one indexer row
            // size for all), so a run of them is one entry.
            let rule = IndexRule::detect(&m.layers).filter(|_| {
                let mut irb = m
                    .layers
                    .iter()
                    .filter_map(LayerSpec::as_sparse)
                    .filter_map(|s| s.indexer_row_bytes.map(|r| (r, s.indexer_value_bytes)));
                let first = irb.next();
                irb.all(|x| Some(x) == first)
            });
            let (irb, ivb) = m
                .layers
                .iter()
                .filter_map(LayerSpec::as_sparse)
                .find_map(|s| s.indexer_row_bytes.map(|r| (r, s.indexer_value_bytes)))
                .unwrap_or((0, None));
            let mut entries: Vec<(LayerSpec, u32)> = Vec::new();
            for l in &m.layers {
                let mut l = *l;
                if let (Some(_), LayerSpec::Sparse(s)) = (rule, &mut l) {
                    s.indexer_row_bytes = Some(irb);
                    s.indexer_value_bytes = ivb;
                }
                match entries.last_mut() {
                    Some((prev, n)) if *prev == l => *n += 1,
                    _ => entries.push((l, 1)),
                }
            }
            ModelFile {
                name: m.name,
                block_tokens: m.block_tokens,
                top_k: m.top_k,
                layers: entries
                    .into_iter()
                    .map(|(l, n)| LayerEntry {
                        repeat: (n > 1).then_some(n),
                        sparse: l.as_sparse().copied(),
                        regular: match l {
                            LayerSpec::Regular(r) => Some(r),
                            LayerSpec::Sparse(_) => None,
                        },
                    })
                    .collect(),
                index_topk_freq: rule.map(|r| r.freq),
                index_skip_topk_offset: rule.map(|r| r.skip_offset),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(layers: &[LayerSpec]) -> ModelSpec<'_> {
        ModelSpec {
            name: "t",
            block_tokens: 64,
            top_k: 16,
            layers,
        }
    }

    #[test]
    fn rejects_bad_geometry() {
        assert_eq!(model(&[]).validate(), Err(ModelError::NoLayers));
        let reg = LayerSpec::Regular(RegularLayer::full(64, 1));
        assert_eq!(model(&[reg]).validate(), Err(ModelError::NoSparseLayers));
        assert_eq!(
            model(&[LayerSpec::sparse_follower(656)]).validate(),
            Err(ModelError::FollowerWithoutLeader { layer: 0 })
        );
        assert_eq!(
            model(&[LayerSpec::sparse_leader(650, 132)]).validate(),
            Err(ModelError::RowNotAligned {
                layer: 0,
                field: "row_bytes",
                value: 650,
                multiple: 16
            })
        );
        let split = LayerSpec::Sparse(SparseLayer {
            row_bytes: 592,
            value_bytes: 584,
            compress_ratio: 1,
            indexer_row_bytes: Some(132),
            indexer_value_bytes: None,
            page_alignment: 1,
        });
        assert!(matches!(
            model(&[split]).validate(),
            Err(ModelError::RowNotAligned { layer: 0, .. })
        ));
        assert_eq!(
            model(&[
                LayerSpec::sparse_leader(656, 132),
                LayerSpec::sparse_leader(672, 132)
            ])
            .validate(),
            Err(ModelError::MixedSparseGeometry {
                layer: 1,
                field: "row_bytes",
                value: 672,
                expected: 656
            })
        );
        let odd = LayerSpec::Regular(RegularLayer::full(64, 3));
        assert!(matches!(
            model(&[LayerSpec::sparse_leader(656, 132), odd]).validate(),
            Err(ModelError::RatioDoesNotDivideBlock { layer: 1, .. })
        ));
        assert_eq!(
            model(&[LayerSpec::sparse_leader(656, 132)]).validate(),
            Ok(())
        );
    }

    fn split(row_bytes: u32, value_bytes: u32) -> LayerSpec {
        LayerSpec::Sparse(SparseLayer {
            row_bytes,
            value_bytes,
            compress_ratio: 1,
            indexer_row_bytes: Some(132),
            indexer_value_bytes: Some(128),
            page_alignment: 576,
        })
    }

    /// DeepSeek V4's fp8_ds_mla rows (576 value + 8 scale bytes) and its split 132-B indexer
    /// rows are valid; a scale part that is not a multiple of 4 is not, nor an indexer value
    /// part beyond its row.
    #[test]
    fn split_rows_need_16_byte_values_and_4_byte_scales() {
        assert_eq!(model(&[split(584, 576)]).validate(), Ok(()));
        assert_eq!(
            model(&[split(582, 576)]).validate(),
            Err(ModelError::RowNotAligned {
                layer: 0,
                field: "scale bytes (row_bytes - value_bytes)",
                value: 6,
                multiple: 4
            })
        );
        let LayerSpec::Sparse(mut s) = split(584, 576) else {
            unreachable!()
        };
        s.indexer_value_bytes = Some(133);
        assert!(matches!(
            model(&[LayerSpec::Sparse(s)]).validate(),
            Err(ModelError::IndexerValueBytes { value: 133, .. })
        ));
        s.indexer_value_bytes = None;
        s.page_alignment = 0;
        assert_eq!(
            model(&[LayerSpec::Sparse(s)]).validate(),
            Err(ModelError::ZeroField {
                layer: 0,
                field: "page_alignment"
            })
        );
        assert_eq!(padded_page_bytes(64, 584, 576), Some(37440));
        assert_eq!(padded_page_bytes(64, 132, 576), Some(8640));
        assert_eq!(padded_page_bytes(2, 584, 576), Some(1728));
        assert_eq!(padded_page_bytes(64, 656, 1), Some(41984));
    }

    #[test]
    fn regular_blocks_divide_the_model_block() {
        let mut swa = RegularLayer::windowed(584, 128);
        swa.block_tokens = Some(16);
        let layers = [LayerSpec::sparse_leader(656, 132), LayerSpec::Regular(swa)];
        assert_eq!(model(&layers).validate(), Ok(()));
        swa.block_tokens = Some(48);
        let layers = [LayerSpec::sparse_leader(656, 132), LayerSpec::Regular(swa)];
        assert_eq!(
            model(&layers).validate(),
            Err(ModelError::RegularBlockTokens {
                layer: 1,
                block_tokens: 48,
                model_block_tokens: 64
            })
        );
        let mut c = RegularLayer::full(64, 8);
        c.block_tokens = Some(4);
        let layers = [LayerSpec::sparse_leader(656, 132), LayerSpec::Regular(c)];
        assert!(matches!(
            model(&layers).validate(),
            Err(ModelError::RatioDoesNotDivideBlock {
                layer: 1,
                compress_ratio: 8,
                block_tokens: 4
            })
        ));
    }

    /// GLM-5's `index_topk_freq = 4`, `index_skip_topk_offset = 3`: 21 leaders of 78, at
    /// 0, 1, 2, 6, 10, …, 74; the rule is found again from the leaders.
    #[test]
    fn glm5_index_rule() {
        let rule = IndexRule {
            freq: 4,
            skip_offset: 3,
        };
        let leaders: std::vec::Vec<u32> = (0..78).filter(|&k| rule.leads(k)).collect();
        assert_eq!(leaders.len(), 21);
        assert_eq!(&leaders[..5], &[0, 1, 2, 6, 10]);
        assert_eq!(leaders.last(), Some(&74));
        let mut layers = [LayerSpec::sparse_leader(656, 132); 78];
        rule.apply(&mut layers, 132);
        let m = model(&layers);
        m.validate().unwrap();
        assert_eq!(m.num_leaders(), 21);
        assert_eq!(IndexRule::detect(&layers), Some(rule));
        // Every layer leading is no rule; neither is a pattern no (freq, offset) gives.
        assert_eq!(
            IndexRule::detect(&[LayerSpec::sparse_leader(656, 132); 8]),
            None
        );
        let mut odd = [LayerSpec::sparse_leader(656, 132); 8];
        odd[3] = LayerSpec::sparse_follower(656);
        odd[4] = LayerSpec::sparse_follower(656);
        odd[6] = LayerSpec::sparse_follower(656);
        assert_eq!(IndexRule::detect(&odd), None);
    }
}
