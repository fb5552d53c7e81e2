//! [`OwnedModel`]: a model that owns its layer list, what a user-described model deserialises
//! to (its JSON form is the `json` module).

use super::{LayerSpec, ModelSpec};

/// A model that owns its layer list: what a user-described model deserialises to.
///
/// As JSON (with the `serde` feature) a model is
/// `{"name", "block_tokens", "top_k", "layers": [..], "index_topk_freq"?, "index_skip_topk_offset"?}`
/// where each entry of `layers` is `{"sparse": {..}}` or `{"regular": {..}}`, optionally with
/// `"repeat": n` for `n` identical consecutive layers. With `index_topk_freq` (and
/// `index_skip_topk_offset`, default 0) the sparse layers' roles follow the [`IndexRule`](super::IndexRule): a
/// follower's `indexer_row_bytes` is dropped, and a leader without one takes the first one the
/// description gives. Unknown fields are refused with their name (a typo must not silently
/// change the layout). Printing a model writes runs of equal layers as `repeat` entries and the
/// index rule when one describes its leaders.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(try_from = "super::json::ModelFile", into = "super::json::ModelFile")
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
