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

/// A sparse-attention layer served by HiSparse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SparseLayer {
    /// Bytes of one KV row (a multiple of 16; DeepSeek V3.2 fp8: 656 = 512 fp8 + 16 B scales +
    /// 128 B bf16 rope).
    pub row_bytes: u32,
    /// Value bytes of a row when pages are *split* (all value parts of a page first, then all scale
    /// parts); equal to `row_bytes` for contiguous rows. Value and scale parts must each be a
    /// multiple of 16 bytes.
    pub value_bytes: u32,
    /// Tokens per stored row (1 for V3.2; 4 for the C4A layers of a DeepSeek-V4-style model).
    pub compress_ratio: u32,
    /// Bytes of this layer's own indexer row (`Some` = index-group leader, `None` = follower of the
    /// leader before it). The indexer cache always stays on the GPU, so no alignment is required.
    pub indexer_row_bytes: Option<u32>,
}

/// A layer that stays fully on the GPU with ordinary paging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RegularLayer {
    /// Bytes of one KV row.
    pub row_bytes: u32,
    /// Tokens per stored row (1 for uncompressed layers).
    pub compress_ratio: u32,
    /// Sliding-window length in tokens (`None` = full attention). A sliding-window layer only
    /// needs the blocks covering the last `window` tokens.
    pub sliding_window: Option<u32>,
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
        })
    }

    /// A contiguous-row sparse layer following the index group leader before it.
    pub const fn sparse_follower(row_bytes: u32) -> Self {
        LayerSpec::Sparse(SparseLayer {
            row_bytes,
            value_bytes: row_bytes,
            compress_ratio: 1,
            indexer_row_bytes: None,
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

/// A model's KV-cache geometry, borrowing its layer list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelSpec<'a> {
    /// Name (presets: the lookup key of [`crate::presets::preset`]).
    pub name: &'a str,
    /// Tokens covered by one block of every GPU group and of the host pool.
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
    /// A sparse row part is not a multiple of 16 bytes (the data plane copies 16-byte units).
    RowNotAligned {
        /// Layer index.
        layer: usize,
        /// Field name (`row_bytes`, `value_bytes` or `scale bytes`).
        field: &'static str,
        /// The value given.
        value: u32,
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
            ModelError::RowNotAligned { layer, field, value } => write!(
                f,
                "model: layer {layer}: `{field}` = {value} must be a multiple of 16 bytes (pad the row)"
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
    /// Checks the geometry: sizes non-zero, sparse row parts multiples of 16, ratios dividing the
    /// block, a leader before every follower, one sparse row geometry.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.block_tokens == 0 {
            return Err(ModelError::ZeroBlockTokens);
        }
        if self.layers.is_empty() {
            return Err(ModelError::NoLayers);
        }
        let mut first: Option<SparseLayer> = None;
        for (layer, spec) in self.layers.iter().enumerate() {
            let (row_bytes, ratio) = match spec {
                LayerSpec::Sparse(s) => (s.row_bytes, s.compress_ratio),
                LayerSpec::Regular(r) => (r.row_bytes, r.compress_ratio),
            };
            if row_bytes == 0 {
                return Err(ModelError::ZeroField {
                    layer,
                    field: "row_bytes",
                });
            }
            if ratio == 0 {
                return Err(ModelError::ZeroField {
                    layer,
                    field: "compress_ratio",
                });
            }
            if !self.block_tokens.is_multiple_of(ratio) {
                return Err(ModelError::RatioDoesNotDivideBlock {
                    layer,
                    compress_ratio: ratio,
                    block_tokens: self.block_tokens,
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
    if s.value_bytes > s.row_bytes {
        return Err(ModelError::ValueBytesTooLarge {
            layer,
            value_bytes: s.value_bytes,
            row_bytes: s.row_bytes,
        });
    }
    for (field, value) in [
        ("row_bytes", s.row_bytes),
        ("value_bytes", s.value_bytes),
        (
            "scale bytes (row_bytes - value_bytes)",
            s.row_bytes - s.value_bytes,
        ),
    ] {
        if !value.is_multiple_of(16) {
            return Err(ModelError::RowNotAligned {
                layer,
                field,
                value,
            });
        }
    }
    Ok(())
}

/// A model that owns its layer list: what a user-described model deserialises to.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
        let reg = LayerSpec::Regular(RegularLayer {
            row_bytes: 64,
            compress_ratio: 1,
            sliding_window: None,
        });
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
                value: 650
            })
        );
        let split = LayerSpec::Sparse(SparseLayer {
            row_bytes: 592,
            value_bytes: 584,
            compress_ratio: 1,
            indexer_row_bytes: Some(132),
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
        let odd = LayerSpec::Regular(RegularLayer {
            row_bytes: 64,
            compress_ratio: 3,
            sliding_window: None,
        });
        assert!(matches!(
            model(&[LayerSpec::sparse_leader(656, 132), odd]).validate(),
            Err(ModelError::RatioDoesNotDivideBlock { layer: 1, .. })
        ));
        assert_eq!(
            model(&[LayerSpec::sparse_leader(656, 132)]).validate(),
            Ok(())
        );
    }
}
