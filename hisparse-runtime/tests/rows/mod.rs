//! The synthetic forward pass and the byte-for-byte check of every row attention reads, shared
//! by the runtime's drivers (`end_to_end.rs`, `soak.rs`) on a [`LagDevice`].
//!
//! The KV row a token writes is deterministic from (layer, the token's whole prefix): a shared
//! prompt has the same rows in every request (prefix hits read what another request wrote),
//! and a token that replaces a rolled-back draft writes different bytes, so a stale row is a
//! mismatch.

#![allow(dead_code)]

use std::collections::HashMap;

use hisparse_core::coordinator::RequestId;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::model::{LayerSpec, ModelSpec, RegularLayer, SparseLayer};
use hisparse_runtime::Runtime;
use proptest::prelude::*;

use crate::lag::{LagBuffer, LagDevice};

/// Tokens per page of [`MODEL`].
pub const BT: u32 = 4;
/// [`MODEL`]'s top-k.
pub const TOP_K: u32 = 4;

/// A sparse layer of split 32-B rows; `indexer`: its indexer row (a leader) or none (a
/// follower).
const fn sparse(indexer: Option<u32>) -> LayerSpec {
    LayerSpec::Sparse(SparseLayer {
        row_bytes: 32,
        value_bytes: 16,
        compress_ratio: 1,
        indexer_row_bytes: indexer,
        indexer_value_bytes: None,
        page_alignment: 1,
    })
}

/// Two index groups (a leader with a follower, then a leader) of split 32-B rows (16 value
/// and 16 scale bytes), 16-B indexer rows, and a full-attention regular layer.
static LAYERS: [LayerSpec; 4] = [
    sparse(Some(16)),
    sparse(None),
    sparse(Some(16)),
    LayerSpec::Regular(RegularLayer {
        row_bytes: 16,
        compress_ratio: 1,
        sliding_window: None,
        block_tokens: None,
        page_alignment: 1,
        kind: hisparse_core::model::RegularKind::Attention,
    }),
];

/// The drivers' model: [`LAYERS`] in 4-token pages, top-k 4.
pub static MODEL: ModelSpec<'static> = ModelSpec {
    name: "drivers",
    block_tokens: BT,
    top_k: TOP_K,
    layers: &LAYERS,
};

/// The tests' generator: the conformance suite's SplitMix64.
pub use hisparse_conformance::SplitMix64 as Rng;

/// Mixes two words (SplitMix64's finaliser).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 31)
}

/// The KV row the forward pass writes for `layer` at a token whose prefix hashes to `prefix`
/// (a shared prefix therefore has the same rows in every request).
pub fn row_bytes_for(layer: u32, prefix: u64, len: usize) -> Vec<u8> {
    let mut h = mix(prefix, u64::from(layer) + 1);
    (0..len)
        .map(|i| {
            if i % 8 == 0 {
                h = mix(h, i as u64);
            }
            (h >> ((i % 8) * 8)) as u8
        })
        .collect()
}

/// A request's tokens as the engine holds them, with the prefix hash after each.
pub struct Req {
    /// The tokens.
    pub tokens: Vec<u32>,
    /// Prefix hash after each token.
    pub prefix: Vec<u64>,
}

impl Req {
    /// A request with prompt `tokens`.
    pub fn new(tokens: Vec<u32>) -> Self {
        let mut r = Req {
            tokens: Vec::new(),
            prefix: Vec::new(),
        };
        for t in tokens {
            r.push(t);
        }
        r
    }

    /// Appends token `t`.
    pub fn push(&mut self, t: u32) {
        let p = self.prefix.last().copied().unwrap_or(1);
        self.tokens.push(t);
        self.prefix.push(mix(p, u64::from(t)));
    }

    /// Gives back the last `n` tokens (rejected drafts).
    pub fn rollback(&mut self, n: usize) {
        let keep = self.tokens.len() - n;
        self.tokens.truncate(keep);
        self.prefix.truncate(keep);
    }
}

/// The first `n` `i32`s of `b`.
pub fn i32s(b: &LagBuffer, n: usize) -> Vec<i32> {
    let g = b.bytes();
    g.as_slice()[..n * 4]
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Writes `v` at the start of `b`.
pub fn set_i32s(b: &LagBuffer, v: &[i32]) {
    let mut g = b.bytes();
    for (c, x) in g.as_mut_slice().chunks_exact_mut(4).zip(v) {
        c.copy_from_slice(&x.to_ne_bytes());
    }
}

/// A test failure from any error.
pub fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// The forward pass: writes the KV row of every token a scheduled request computes into its
/// resident pages, straight into the device pool (the engine's kernels).
pub fn forward(
    rt: &mut Runtime<LagDevice>,
    kv: &KvCacheConfig,
    slot: u32,
    id: RequestId,
    positions: std::ops::Range<u32>,
    req: &Req,
) -> Result<(), TestCaseError> {
    let len = kv.row_bytes as usize;
    for pos in positions {
        let page = (pos / kv.block_size) as usize;
        for b in 0..kv.num_buckets {
            let blk = rt.resident_row(b, slot).unwrap()[page];
            prop_assert!(
                blk > 0,
                "token {} of request {} written to a null page",
                pos,
                id
            );
            for gl in &kv.groups[kv.resident_group(b)].layers {
                let l = kv.device_layout(gl.layer).unwrap();
                let bytes = row_bytes_for(gl.layer, req.prefix[pos as usize], len);
                let [(vo, vl), (so, sl)] = l.row_parts(blk as u32, pos % kv.block_size);
                let (_, pools) = rt.device_and_pools_mut();
                let mut d = pools.device.bytes();
                let d = d.as_mut_slice();
                d[vo as usize..(vo + vl) as usize].copy_from_slice(&bytes[..vl as usize]);
                d[so as usize..(so + sl) as usize].copy_from_slice(&bytes[vl as usize..]);
            }
        }
    }
    Ok(())
}

/// Checks that every top-k entry of index group `g` (`topk`: the positions each scheduled
/// `(state row, request)` of `sched` asked for, `-1` for none) reads, through the resolved
/// `rows`, the forward pass's bytes in every layer of the group; `counts`: the valid entries
/// per token row the runtime reported, when asked. Returns the rows checked.
#[allow(clippy::too_many_arguments)]
pub fn check_reads(
    rt: &Runtime<LagDevice>,
    kv: &KvCacheConfig,
    g: usize,
    sched: &[(u32, RequestId)],
    topk: &[i32],
    rows: &[i32],
    counts: Option<&[i32]>,
    reqs: &HashMap<RequestId, Req>,
) -> Result<u64, TestCaseError> {
    let k = kv.config.top_k as usize;
    let len = kv.row_bytes as usize;
    let mut checked = 0;
    let pool = rt.pools().device.bytes();
    let pool = pool.as_slice();
    for (i, &(slot, id)) in sched.iter().enumerate() {
        let r = &reqs[&id];
        let wanted = topk[i * k..(i + 1) * k].iter().filter(|&&t| t >= 0).count();
        if let Some(c) = counts {
            prop_assert_eq!(c[i], wanted as i32, "valid count of request {}", id);
        }
        for j in 0..k {
            let (tok, phys) = (topk[i * k + j], rows[i * k + j]);
            if tok < 0 {
                prop_assert_eq!(phys, -1, "request {}: no position, yet a row", id);
                continue;
            }
            prop_assert!(
                phys >= 0,
                "valid top-k entry {} of request {} resolved to -1",
                tok,
                id
            );
            for &layer in &kv.index_groups[g].layers {
                let l = kv.device_layout(layer).unwrap();
                let (blk, off) = l.locate(phys.into()).unwrap();
                let [(vo, vl), (so, sl)] = l.row_parts(blk, off);
                let mut got = pool[vo as usize..(vo + vl) as usize].to_vec();
                got.extend_from_slice(&pool[so as usize..(so + sl) as usize]);
                let want = row_bytes_for(layer, r.prefix[tok as usize], len);
                prop_assert_eq!(
                    got,
                    want,
                    "request {} (state row {}) token {} layer {} read wrong bytes from row {}",
                    id,
                    slot,
                    tok,
                    layer,
                    phys
                );
                checked += 1;
            }
        }
    }
    Ok(checked)
}
