//! The layer kinds a model lists: [`SparseLayer`] (through HiSparse), [`RegularLayer`] (paged
//! on the GPU) and [`LayerSpec`], one of the two.

#[cfg(feature = "serde")]
const fn one() -> u32 {
    1
}

#[cfg(feature = "serde")]
fn is_one(v: &u32) -> bool {
    *v == 1
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
    /// the data plane's copies start ([`copied_page_bytes`](super::copied_page_bytes)).
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
