//! The JSON form of [`OwnedModel`](super::OwnedModel): `repeat` runs and the index rule, unknown
//! fields refused by name.

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
