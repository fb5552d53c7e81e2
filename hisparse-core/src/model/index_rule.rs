//! The index rule: which sparse layers lead an index group (own an indexer), as GLM-5 and
//! DeepSeek V3.2's configurations state it (`index_topk_freq`, `index_skip_topk_offset`).

use super::LayerSpec;

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
