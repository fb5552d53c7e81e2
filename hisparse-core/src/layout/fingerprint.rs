//! [`KvCacheConfig::fingerprint`]: a stable 64-bit identity of everything in a layout that gives
//! a per-step command its meaning, so a worker can refuse a command planned for another layout.

use core::fmt;

use super::{GroupKind, GroupLayer, IndexGroup, KvCacheConfig, KvCacheGroup};
use crate::config::HiSparseConfig;
use crate::model::RegularKind;
use crate::wire::checksum::Fnv1a64;

/// A layout's fingerprint ([`KvCacheConfig::fingerprint`]): equal for two layouts exactly when
/// (up to a 2⁻⁶⁴ chance) a command planned for one means the same for the other.
///
/// Compute it once per layout and keep it: hashing a large layout costs microseconds, and the
/// wire codec ([`crate::wire`]) takes it on every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayoutFingerprint(u64);

impl LayoutFingerprint {
    /// The 64-bit value (as the wire header carries it).
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for LayoutFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Feeds the fingerprint hash: every value widened to 8 little-endian bytes, every list
/// preceded by its length and every option by a presence word, so distinct layouts feed
/// distinct byte strings.
struct FieldHasher(Fnv1a64);

impl FieldHasher {
    fn u64(&mut self, v: u64) {
        self.0.write_u64(v);
    }

    fn u32(&mut self, v: u32) {
        self.u64(u64::from(v));
    }

    fn flag(&mut self, v: bool) {
        self.u64(u64::from(v));
    }

    fn option(&mut self, v: Option<u32>) {
        match v {
            None => self.u64(0),
            Some(v) => {
                self.u64(1);
                self.u32(v);
            }
        }
    }

    fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }
}

impl KvCacheConfig {
    /// A stable 64-bit hash (FNV-1a over a fixed little-endian encoding; the same on every
    /// platform and build) of every field that gives an [`OffloadCommand`] its meaning: the
    /// groups and their layers, pool sizes and strides, block and row geometry, the hot buffer,
    /// and the configuration the workers size their buffers by. Two fields are left out: the
    /// model's `model` name (a label: a renamed model keeps its commands) and
    /// `config.host_budget_bytes` (a planner input; what it decides, `host_num_blocks` and
    /// `host_block_stride`, is hashed).
    ///
    /// The wire codec carries it in every message header ([`crate::wire`]), and a worker whose
    /// layout's fingerprint differs refuses the message.
    ///
    /// [`OffloadCommand`]: crate::coordinator::OffloadCommand
    pub fn fingerprint(&self) -> LayoutFingerprint {
        // Exhaustive destructuring, here and for every nested type: a new field does not
        // compile until it is hashed or deliberately left out (and a change to what is hashed
        // is a wire format change: bump `wire::WIRE_VERSION`).
        let KvCacheConfig {
            model: _,
            config,
            block_tokens,
            block_size,
            sparse_compress_ratio,
            row_bytes,
            value_bytes,
            page_alignment,
            shared_host_pool,
            groups,
            num_buckets,
            index_groups,
            bytes_per_block,
            attention_block_stride,
            num_gpu_blocks,
            host_block_stride,
            host_num_blocks,
            device_buffer_size,
            hot_blocks_per_request,
            max_model_len,
            max_pages_per_request,
        } = self;
        let mut h = FieldHasher(Fnv1a64::new());
        let HiSparseConfig {
            top_k,
            device_buffer_size: configured_buffer,
            eager_host_mirror,
            host_budget_bytes: _,
            max_query_len,
        } = config;
        h.u32(*top_k);
        h.option(*configured_buffer);
        h.flag(*eager_host_mirror);
        h.u32(*max_query_len);
        for v in [
            *block_tokens,
            *block_size,
            *sparse_compress_ratio,
            *row_bytes,
            *value_bytes,
            *page_alignment,
        ] {
            h.u32(v);
        }
        h.flag(*shared_host_pool);
        h.len(groups.len());
        for g in groups {
            hash_group(&mut h, g);
        }
        h.u32(*num_buckets);
        h.len(index_groups.len());
        for ig in index_groups {
            let IndexGroup {
                leader,
                layers,
                bucket,
            } = ig;
            h.u32(*leader);
            h.len(layers.len());
            for &l in layers {
                h.u32(l);
            }
            h.u32(*bucket);
        }
        h.u64(*bytes_per_block);
        h.u32(*attention_block_stride);
        h.u32(*num_gpu_blocks);
        h.u64(*host_block_stride);
        h.u32(*host_num_blocks);
        h.u32(*device_buffer_size);
        h.u32(*hot_blocks_per_request);
        h.u32(*max_model_len);
        h.u32(*max_pages_per_request);
        LayoutFingerprint(h.0.finish())
    }
}

fn hash_group(h: &mut FieldHasher, g: &KvCacheGroup) {
    let KvCacheGroup {
        kind,
        bucket,
        sliding_window,
        block_tokens,
        cache,
        page_bytes,
        layers,
    } = g;
    // Fixed codes, not discriminants: reordering the enums must not change fingerprints.
    h.u64(match kind {
        GroupKind::Source => 1,
        GroupKind::Indexer => 2,
        GroupKind::Resident => 3,
        GroupKind::Hot => 4,
        GroupKind::Regular => 5,
    });
    h.option(*bucket);
    h.option(*sliding_window);
    h.u32(*block_tokens);
    h.option(cache.map(|c| match c {
        RegularKind::Attention => 1,
        RegularKind::SlidingWindow => 2,
        RegularKind::CompressorState => 3,
    }));
    h.u64(*page_bytes);
    h.len(layers.len());
    for l in layers {
        let GroupLayer {
            layer,
            index_in_group,
            offset,
            page_bytes,
            rows_per_block,
            row_bytes,
            value_bytes,
        } = l;
        h.u32(*layer);
        h.u32(*index_in_group);
        h.u64(*offset);
        h.u64(*page_bytes);
        h.u32(*rows_per_block);
        h.u32(*row_bytes);
        h.u32(*value_bytes);
    }
}

#[cfg(test)]
mod tests {
    use alloc::string::ToString;

    use super::*;
    use crate::layout::{LayoutInput, plan_layout};
    use crate::presets::DEEPSEEK_V32;

    fn v32_layout() -> KvCacheConfig {
        let cfg = HiSparseConfig::new(DEEPSEEK_V32.top_k, 64 << 30);
        plan_layout(&LayoutInput::new(&DEEPSEEK_V32, &cfg, 40 << 30, 131072)).unwrap()
    }

    #[test]
    fn the_fingerprint_is_stable() {
        // Pinned: the same on every platform and build. It changes only with a deliberate change
        // to what the fingerprint covers, which bumps WIRE_VERSION, or to the planner's rules,
        // which give this layout other numbers (the host budget holding the indexer host cache
        // too gave it fewer host blocks).
        let kv = v32_layout();
        assert_eq!(kv.fingerprint().to_string(), "e1fa60f944355b6b");
        assert_eq!(kv.fingerprint(), v32_layout().fingerprint());
    }

    #[test]
    fn the_fingerprint_sees_every_field_that_gives_a_command_its_meaning() {
        let base = v32_layout();
        let fp = base.fingerprint();
        type Edit = fn(&mut KvCacheConfig);
        let changes: &[(&str, Edit)] = &[
            ("config.top_k", |k| k.config.top_k += 1),
            ("config.device_buffer_size", |k| {
                k.config.device_buffer_size = None
            }),
            ("config.eager_host_mirror", |k| {
                k.config.eager_host_mirror ^= true
            }),
            ("config.max_query_len", |k| k.config.max_query_len += 1),
            ("block_tokens", |k| k.block_tokens += 1),
            ("block_size", |k| k.block_size += 1),
            ("sparse_compress_ratio", |k| k.sparse_compress_ratio += 1),
            ("row_bytes", |k| k.row_bytes += 1),
            ("value_bytes", |k| k.value_bytes -= 1),
            ("page_alignment", |k| k.page_alignment += 1),
            ("shared_host_pool", |k| k.shared_host_pool ^= true),
            ("groups (one fewer)", |k| {
                k.groups.pop();
            }),
            ("groups[].kind", |k| k.groups[8].kind = GroupKind::Regular),
            ("groups[].bucket", |k| k.groups[2].bucket = Some(9)),
            ("groups[].sliding_window", |k| {
                k.groups[2].sliding_window = Some(0)
            }),
            ("groups[].block_tokens", |k| k.groups[1].block_tokens += 1),
            ("groups[].cache", |k| {
                k.groups[1].cache = Some(Default::default())
            }),
            ("groups[].page_bytes", |k| k.groups[3].page_bytes += 1),
            ("groups[].layers[].layer", |k| {
                k.groups[0].layers[5].layer += 1
            }),
            ("groups[].layers[].index_in_group", |k| {
                k.groups[0].layers[5].index_in_group += 1
            }),
            ("groups[].layers[].offset", |k| {
                k.groups[4].layers[1].offset += 1
            }),
            ("groups[].layers[].page_bytes", |k| {
                k.groups[4].layers[1].page_bytes += 1
            }),
            ("groups[].layers[].rows_per_block", |k| {
                k.groups[4].layers[1].rows_per_block += 1
            }),
            ("groups[].layers[].row_bytes", |k| {
                k.groups[1].layers[1].row_bytes += 1
            }),
            ("groups[].layers[].value_bytes", |k| {
                k.groups[1].layers[1].value_bytes += 1
            }),
            ("num_buckets", |k| k.num_buckets += 1),
            ("index_groups[].leader", |k| k.index_groups[3].leader += 1),
            ("index_groups[].layers", |k| {
                k.index_groups[3].layers.push(4)
            }),
            ("index_groups[].bucket", |k| k.index_groups[3].bucket += 1),
            ("bytes_per_block", |k| k.bytes_per_block += 1),
            ("attention_block_stride", |k| k.attention_block_stride += 1),
            ("num_gpu_blocks", |k| k.num_gpu_blocks -= 1),
            ("host_block_stride", |k| k.host_block_stride += 1),
            ("host_num_blocks", |k| k.host_num_blocks -= 1),
            ("device_buffer_size", |k| k.device_buffer_size += 1),
            ("hot_blocks_per_request", |k| k.hot_blocks_per_request += 1),
            ("max_model_len", |k| k.max_model_len += 1),
            ("max_pages_per_request", |k| k.max_pages_per_request += 1),
        ];
        for (field, edit) in changes {
            let mut kv = base.clone();
            edit(&mut kv);
            assert_ne!(kv, base, "{field}: the edit changed nothing");
            assert_ne!(kv.fingerprint(), fp, "{field} is not in the fingerprint");
        }
        // The two fields left out: a label and a planner input whose outcome is hashed.
        let mut kv = base.clone();
        kv.model = "renamed".into();
        kv.config.host_budget_bytes += 4096;
        assert_eq!(kv.fingerprint(), fp);
    }
}
