//! Model geometry: which KV-cache tensors a model has and how big their rows are (contract §2).
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
//! the sparse layers' rows per block, the *block size* of contract §2 (64 for DeepSeek V3.2; for a
//! DeepSeek-V4-style model, 256 tokens / ratio 4 = 64 compressed rows).
//!
//! Models are plain data. [`ModelSpec`] borrows its layer list (works without `alloc`; the
//! presets in [`crate::presets`] are `'static`); with `alloc`, `OwnedModel` owns it and is
//! what a user-described model (for example from JSON under the `serde` feature) deserialises to.
//!
//! # Files
//!
//! This file holds [`ModelSpec`], its validation and the page-size rules; `layers.rs` the layer
//! kinds, `index_rule.rs` the [`IndexRule`], `error.rs` [`ModelError`], `owned.rs`
//! [`OwnedModel`] (with `alloc`) and `json.rs` its JSON form (with `serde`).

use crate::ops::COPY_ALIGNMENT;

mod error;
mod index_rule;
#[cfg(feature = "serde")]
mod json;
mod layers;
#[cfg(feature = "alloc")]
mod owned;

pub use error::ModelError;
pub use index_rule::IndexRule;
pub use layers::{LayerSpec, RegularKind, RegularLayer, SparseLayer};
#[cfg(feature = "alloc")]
pub use owned::OwnedModel;

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

    /// Rows per block of the sparse layers (the contract's *block size*), once validated.
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

#[cfg(test)]
mod tests;
