//! Why a model description is refused: [`ModelError`], each message naming the layer and
//! field and what to change.

use core::fmt;

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
    /// An index rule ([`IndexRule`](super::IndexRule)) makes a sparse layer a leader but the description gives
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
