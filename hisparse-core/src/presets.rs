//! Model presets as data, and a lookup by name.
//!
//! | name | sparse layers | index groups | row (value + scale) | block | top-k |
//! |---|---|---|---|---|---|
//! | `deepseek-v3.2` | 61 | 61 (every layer leads) | 656 B contiguous | 64 tokens = 64 rows | 2048 |
//! | `glm-5` | 78 | 20 (one indexer per 4 layers; the last group has 2) | 656 B contiguous | 64 tokens = 64 rows | 2048 |
//! | `deepseek-v4` | 21 (ratio 4) | 21 | 592 B split (576 + 16) | 256 tokens = 64 compressed rows | 512 |
//!
//! * **DeepSeek V3.2** (published config): 61 MLA layers with DSA. fp8 KV row 656 B = 512 fp8
//!   latent + 16 B (four fp32 tile scales) + 128 B bf16 rope (64 dims); indexer row 132 B = 128
//!   fp8 + one fp32 scale.
//! * **GLM-5-style** (illustrative): 78 DSA layers with the V3.2 row format, one indexer shared by
//!   each run of 4 consecutive layers (leaders at layers 0, 4, 8, …, 76; the others follow). The
//!   layer count follows the GLM-5 config; the sharing factor is the one HiSparse targets.
//! * **DeepSeek-V4-style** (illustrative): 43 attention layers: 2 sliding-window layers (window
//!   128, 592 B rows, uncompressed), then alternating 21 C4A layers (ratio 4, through HiSparse,
//!   each leading its own index group with a 132 B indexer row) and 20 C128A layers (ratio 128,
//!   regular GPU group). C4A rows are split pages: 576 value bytes (448 fp8 latent + 128 B bf16
//!   rope) and 16 scale bytes (fp32 tile scales padded to 16 B), both multiples of 16 as the data
//!   plane's `PageLayout` requires. Blocks cover 256 tokens = 64 compressed rows. The small
//!   per-layer sliding-window branch of the C4A/C128A layers is not modelled separately.

use core::fmt;

use crate::model::{LayerSpec, ModelSpec, RegularLayer, SparseLayer};

/// DeepSeek V3.2 fp8 MLA row: 512 fp8 + 16 B scales + 128 B bf16 rope.
pub const V32_ROW_BYTES: u32 = 656;
/// DeepSeek V3.2 indexer row: 128 fp8 + 4 B scale.
pub const V32_INDEXER_ROW_BYTES: u32 = 132;

const V32_LAYERS: [LayerSpec; 61] =
    [LayerSpec::sparse_leader(V32_ROW_BYTES, V32_INDEXER_ROW_BYTES); 61];

const GLM5_LAYERS: [LayerSpec; 78] = {
    let mut layers = [LayerSpec::sparse_follower(V32_ROW_BYTES); 78];
    let mut i = 0;
    while i < 78 {
        layers[i] = LayerSpec::sparse_leader(V32_ROW_BYTES, V32_INDEXER_ROW_BYTES);
        i += 4;
    }
    layers
};

/// DeepSeek-V4-style C4A split row: value part.
pub const V4_VALUE_BYTES: u32 = 576;
/// DeepSeek-V4-style C4A split row: whole row (value + 16 B scales).
pub const V4_ROW_BYTES: u32 = 592;

const V4_C4: LayerSpec = LayerSpec::Sparse(SparseLayer {
    row_bytes: V4_ROW_BYTES,
    value_bytes: V4_VALUE_BYTES,
    compress_ratio: 4,
    indexer_row_bytes: Some(V32_INDEXER_ROW_BYTES),
});
const V4_C128: LayerSpec = LayerSpec::Regular(RegularLayer {
    row_bytes: V4_ROW_BYTES,
    compress_ratio: 128,
    sliding_window: None,
});
const V4_SWA: LayerSpec = LayerSpec::Regular(RegularLayer {
    row_bytes: V4_ROW_BYTES,
    compress_ratio: 1,
    sliding_window: Some(128),
});

const V4_LAYERS: [LayerSpec; 43] = {
    let mut layers = [V4_SWA; 43];
    let mut i = 2;
    while i < 43 {
        layers[i] = if (i - 2) % 2 == 0 { V4_C4 } else { V4_C128 };
        i += 1;
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

/// The GLM-5-style preset (one indexer per 4 layers).
pub const GLM5: ModelSpec<'static> = ModelSpec {
    name: "glm-5",
    block_tokens: 64,
    top_k: 2048,
    layers: &GLM5_LAYERS,
};

/// The DeepSeek-V4-style preset (C4A layers through HiSparse, split rows, 256-token blocks).
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
        let leaders = GLM5
            .layers
            .iter()
            .filter(|l| l.as_sparse().is_some_and(|s| s.indexer_row_bytes.is_some()))
            .count();
        assert_eq!(leaders, 20);
        assert_eq!(DEEPSEEK_V4.num_sparse_layers(), 21);
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
