//! Model presets as data, and a lookup by name.
//!
//! | name | sparse layers | index groups | row (value + scale) | block | top-k |
//! |---|---|---|---|---|---|
//! | `deepseek-v3.2` | 61 | 61 (every layer leads) | 656 B contiguous | 64 tokens = 64 rows | 2048 |
//! | `glm-5` | 78 | 21 (`index_topk_freq` 4, `index_skip_topk_offset` 3) | 656 B contiguous | 64 tokens = 64 rows | 2048 |
//! | `deepseek-v4` | 21 (C4A, ratio 4) | 21 | 584 B split (576 + 8), pages padded to 576 B | 256 tokens = 64 compressed rows | 512 |
//!
//! * **DeepSeek V3.2** (published config): 61 MLA layers with DSA. fp8 KV row 656 B = 512 fp8
//!   latent + 16 B (four fp32 tile scales) + 128 B bf16 rope (64 dims); indexer row 132 B = 128
//!   fp8 + one fp32 scale.
//! * **GLM-5** (GLM-5's configs): 78 DSA layers with the V3.2 row format; the layers that run an
//!   indexer follow `index_topk_freq = 4` and `index_skip_topk_offset = 3` ([`IndexRule`]): 21
//!   leaders at layers 0, 1, 2, 6, 10, …, 74, each followed by the layers up to the next.
//! * **DeepSeek V4** (its KV-cache specs as vLLM declares them for the model): 43 attention
//!   layers — 2 sliding-window-only layers, then alternating 21 C4A layers (compress ratio 4)
//!   and 20 C128A layers (ratio 128). Every cache is a tensor of its own, in layer order; per
//!   layer:
//!   - a **sliding-window** cache (every layer): window 128, 64-token blocks of 584-B rows,
//!     page 64 × 584 = 37,376 B padded to 37,440 B;
//!   - C4A layers: the **compressed KV** through HiSparse, fp8_ds_mla state rows of 584 B split
//!     into 576 value bytes (448 B fp8 NoPE + 128 B bf16 RoPE) and 8 scale bytes (7 UE8M0
//!     scales + 1 pad), 64 states per 256-token block, page padded to a multiple of 576 B (the
//!     FlashMLA packing): 37,440 B; each leads its index group with a 132-B indexer row (128 fp8
//!     values then a 4-B scale, split like the KV page): 64 × 132 = 8,448 B padded to 8,640 B;
//!     then its **compressor state** (kv and score states of 2 × 4 tokens, fp32: 8,192 B per
//!     token, 4-token blocks, window 8: page 32,832 B) and its **indexer's compressor state**
//!     (2,048 B per token, 4-token blocks, window 8: page 8,640 B);
//!   - C128A layers: the **compressed KV** as a regular GPU cache (2 states of 584 B per
//!     256-token block: 1,168 B padded to 1,728 B), then its **compressor state** (4,096 B per
//!     token, 8-token blocks, window 128: page 32,832 B).
//!
//!   146 KV-cache tensors in all; the host pool holds the 21 C4A layers: 21 × 37,440 = 786,240 B
//!   per block.

use core::fmt;

use crate::model::{IndexRule, LayerSpec, ModelSpec, RegularKind, RegularLayer, SparseLayer};

/// DeepSeek V3.2 fp8 MLA row: 512 fp8 + 16 B scales + 128 B bf16 rope.
pub const V32_ROW_BYTES: u32 = 656;
/// DeepSeek V3.2 indexer row: 128 fp8 + 4 B scale.
pub const V32_INDEXER_ROW_BYTES: u32 = 132;

const V32_LAYERS: [LayerSpec; 61] =
    [LayerSpec::sparse_leader(V32_ROW_BYTES, V32_INDEXER_ROW_BYTES); 61];

/// GLM-5's index schedule.
pub const GLM5_INDEX_RULE: IndexRule = IndexRule {
    freq: 4,
    skip_offset: 3,
};

const GLM5_LAYERS: [LayerSpec; 78] = {
    let mut layers = [LayerSpec::sparse_follower(V32_ROW_BYTES); 78];
    let mut i = 0;
    while i < 78 {
        if GLM5_INDEX_RULE.leads(i as u32) {
            layers[i] = LayerSpec::sparse_leader(V32_ROW_BYTES, V32_INDEXER_ROW_BYTES);
        }
        i += 1;
    }
    layers
};

/// DeepSeek V4 fp8_ds_mla state row: value part (448 B fp8 NoPE + 128 B bf16 RoPE).
pub const V4_VALUE_BYTES: u32 = 576;
/// DeepSeek V4 fp8_ds_mla state row: whole row (value + 8 B of UE8M0 scales).
pub const V4_ROW_BYTES: u32 = 584;
/// DeepSeek V4 page alignment (FlashMLA's packing).
pub const V4_PAGE_ALIGNMENT: u32 = 576;
/// DeepSeek V4 indexer row: 128 fp8 values + a 4-B scale (split pages).
pub const V4_INDEXER_ROW_BYTES: u32 = 132;
/// DeepSeek V4 indexer row: value part.
pub const V4_INDEXER_VALUE_BYTES: u32 = 128;
/// Tensors of the DeepSeek V4 preset.
pub const V4_TENSORS: usize = 146;

const V4_C4A: LayerSpec = LayerSpec::Sparse(SparseLayer {
    row_bytes: V4_ROW_BYTES,
    value_bytes: V4_VALUE_BYTES,
    compress_ratio: 4,
    indexer_row_bytes: Some(V4_INDEXER_ROW_BYTES),
    indexer_value_bytes: Some(V4_INDEXER_VALUE_BYTES),
    page_alignment: V4_PAGE_ALIGNMENT,
});

const fn v4_regular(
    kind: RegularKind,
    row_bytes: u32,
    compress_ratio: u32,
    block_tokens: Option<u32>,
    sliding_window: Option<u32>,
) -> LayerSpec {
    LayerSpec::Regular(RegularLayer {
        row_bytes,
        compress_ratio,
        sliding_window,
        block_tokens,
        page_alignment: V4_PAGE_ALIGNMENT,
        kind,
    })
}

const V4_SWA: LayerSpec = v4_regular(
    RegularKind::SlidingWindow,
    V4_ROW_BYTES,
    1,
    Some(64),
    Some(128),
);
const V4_C128A: LayerSpec = v4_regular(RegularKind::Attention, V4_ROW_BYTES, 128, None, None);
/// C4 compressor: kv + score states of `coff × head_dim` = 2 × 512 fp32 each.
const V4_C4_STATE: LayerSpec = v4_regular(RegularKind::CompressorState, 8192, 1, Some(4), Some(8));
/// The C4A indexer's compressor: 2 × 2 × 128 fp32.
const V4_C4_INDEXER_STATE: LayerSpec =
    v4_regular(RegularKind::CompressorState, 2048, 1, Some(4), Some(8));
/// C128 compressor: kv + score states of 512 fp32 each, window 128.
const V4_C128_STATE: LayerSpec =
    v4_regular(RegularKind::CompressorState, 4096, 1, Some(8), Some(128));

const V4_LAYERS: [LayerSpec; V4_TENSORS] = {
    let mut layers = [V4_SWA; V4_TENSORS];
    let mut n = 0;
    let mut layer = 0;
    while layer < 43 {
        layers[n] = V4_SWA;
        n += 1;
        if layer >= 2 {
            if (layer - 2) % 2 == 0 {
                layers[n] = V4_C4A;
                layers[n + 1] = V4_C4_STATE;
                layers[n + 2] = V4_C4_INDEXER_STATE;
                n += 3;
            } else {
                layers[n] = V4_C128A;
                layers[n + 1] = V4_C128_STATE;
                n += 2;
            }
        }
        layer += 1;
    }
    layers
};

/// The DeepSeek V3.2 preset.
pub const DEEPSEEK_V32: ModelSpec<'static> = ModelSpec {
    name: "deepseek-v3.2",
    block_tokens: 64,
    top_k: 2048,
    layers: &V32_LAYERS,
};

/// The GLM-5 preset (21 index groups by its `index_topk_freq` / `index_skip_topk_offset`).
pub const GLM5: ModelSpec<'static> = ModelSpec {
    name: "glm-5",
    block_tokens: 64,
    top_k: 2048,
    layers: &GLM5_LAYERS,
};

/// The DeepSeek V4 preset (C4A layers through HiSparse, split padded pages, 256-token blocks,
/// sliding-window and compressor-state caches with their own block sizes).
pub const DEEPSEEK_V4: ModelSpec<'static> = ModelSpec {
    name: "deepseek-v4",
    block_tokens: 256,
    top_k: 512,
    layers: &V4_LAYERS,
};

/// Every preset, in the order [`PRESET_NAMES`] lists them.
pub const PRESETS: [ModelSpec<'static>; 3] = [DEEPSEEK_V32, GLM5, DEEPSEEK_V4];

/// Names accepted by [`preset`].
pub const PRESET_NAMES: [&str; 3] = ["deepseek-v3.2", "glm-5", "deepseek-v4"];

/// No preset has the requested name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownPreset {
    /// The valid names.
    pub valid: &'static [&'static str],
}

impl fmt::Display for UnknownPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown model preset; valid names: ")?;
        for (i, n) in self.valid.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(n)?;
        }
        Ok(())
    }
}

impl crate::error::Error for UnknownPreset {
    fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::InvalidArgument
    }
}

impl core::error::Error for UnknownPreset {}

/// Looks a preset up by name (ASCII case-insensitive).
///
/// ```
/// let m = hisparse_core::presets::preset("deepseek-v3.2").unwrap();
/// assert_eq!(m.layers.len(), 61);
/// assert!(hisparse_core::presets::preset("llama").is_err());
/// ```
pub fn preset(name: &str) -> Result<ModelSpec<'static>, UnknownPreset> {
    PRESETS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
        .copied()
        .ok_or(UnknownPreset {
            valid: &PRESET_NAMES,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_named() {
        for (m, n) in PRESETS.iter().zip(PRESET_NAMES) {
            assert_eq!(m.name, n);
            m.validate().unwrap();
            assert_eq!(preset(n).unwrap(), *m);
        }
        assert_eq!(DEEPSEEK_V32.num_sparse_layers(), 61);
        assert_eq!(GLM5.num_sparse_layers(), 78);
        assert_eq!(GLM5.num_leaders(), 21);
        assert_eq!(IndexRule::detect(GLM5.layers), Some(GLM5_INDEX_RULE));
        assert_eq!(DEEPSEEK_V4.num_sparse_layers(), 21);
        assert_eq!(DEEPSEEK_V4.layers.len(), V4_TENSORS);
        let regular = |k: RegularKind| {
            DEEPSEEK_V4
                .layers
                .iter()
                .filter(|l| matches!(l, LayerSpec::Regular(r) if r.kind == k))
                .count()
        };
        assert_eq!(regular(RegularKind::SlidingWindow), 43);
        assert_eq!(regular(RegularKind::CompressorState), 62);
        assert_eq!(regular(RegularKind::Attention), 20);
        assert_eq!(DEEPSEEK_V4.sparse_block_size(), Some(64));
        assert_eq!(DEEPSEEK_V32.sparse_block_size(), Some(64));
    }

    #[test]
    fn unknown_lists_names() {
        let e = preset("nope").unwrap_err();
        assert_eq!(
            std::format!("{e}"),
            "unknown model preset; valid names: deepseek-v3.2, glm-5, deepseek-v4"
        );
        assert!(preset("DeepSeek-V3.2").is_ok());
    }
}
