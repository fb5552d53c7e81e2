//! Residency resolve + swap-in planning (contract §5.2), one call per index group per decode step.
//!
//! Inputs per call: `T` token rows of `K` top-k token positions, each row tagged with
//! `req_id[t]` (`-1` = padding), which names the request's tables (see *Table row order* below
//! for the two conventions; by default it is the request's *state row* `r` and every table is
//! indexed by it). Per request the caller keeps:
//! * `resident_table[r][page]`: the GPU block still holding the page, or `≤ 0` (the null block)
//!   when the page must be read from host;
//! * `host_table[r][page]`: the host block holding the page's durable copy;
//! * `hot_table[r][slot / block_size]`: the GPU blocks of the request's hot region;
//! * `slot_host_rows[r][slot]`: the flat host row cached in hot slot `slot`, or `-1`;
//! * `lru[r]`: a permutation of `0..hot_slots` (`u16`), index 0 least recently used.
//!
//! # Table row order
//!
//! * **State-row order** (the default, [`ResolveDesc::num_state_rows`] `None`, no
//!   `idx_mapping`): `req_id[t]` is the request's state row `r`, `0 ≤ r < num_requests`, and all
//!   five tables have `num_requests` rows indexed by `r`.
//! * **Batch-row order** ([`ResolveDesc::num_state_rows`] `Some(S)`, with
//!   [`ResolveArgs::idx_mapping`] `i32[num_requests]`) — the original engine's convention, so an
//!   engine that builds its per-step tables in batch order needs no reordering: `req_id[t]` is the
//!   token row's *batch row* `b`, `0 ≤ b < num_requests`; the tables the engine builds for this
//!   step's batch, **`host_table` and `hot_table`, have `num_requests` rows indexed by `b`**; the
//!   persistent per-request state, **`resident_table`, `slot_host_rows` and `lru`, has `S` rows indexed by
//!   the state row `s = idx_mapping[b]`**. A batch row is padding (outputs `-1`, counts 0, no
//!   state touched) when `s < 0` or `s ≥ S`, or when an earlier batch row maps to the same state
//!   row: **the batch row with the smallest index owns a state row**, every other batch row
//!   mapping to it is padding (whether or not that smaller row has token rows in this call — the
//!   rule reads `idx_mapping[0..b)` only, so every backend decides it the same way without
//!   ordering between requests). Everything else — the steps below — is the same, with `r`
//!   standing for `b` where `host_table` and `hot_table` are read and for `s` where
//!   `resident_table`, `slot_host_rows` and `lru` are.
//!
//! The two orders are the same function: a batch-order call equals the state-order call whose
//! `req_id` names the owning batch rows' state rows and whose host and hot tables are permuted to
//! state rows (the conformance suite checks exactly that).
//!
//! Per request (all token rows with the same `req_id`, in row order, are resolved together against
//! the request's single state — speculative decoding):
//! 1. a row whose `req_id` is negative or `≥ num_requests` (or, in batch-row order, whose batch
//!    row owns no state row) is padding: outputs `-1`, counts 0, and touches no state;
//! 2. each entry is classified: `tok < 0` or page `tok / block_size ≥ max_pages` → invalid (`-1`);
//!    a resident page → the resident physical row
//!    `resident_table[r][page] * attention_block_stride + tok % block_size`; otherwise, when the
//!    host block is `≥ 0`, the flat host row `g = host_block * block_size + tok % block_size`;
//!    a negative host block, or a row that does not fit an `i32`, → invalid;
//! 3. the *wanted* list is the distinct `g` in order of first appearance (row by row, column by
//!    column); if it is empty the request's state is left exactly as it was;
//! 4. if `lru[r]` is not a permutation of `0..hot_slots` it is reset to the identity and every
//!    `slot_host_rows[r][..]` to `-1` first (a corrupt state is repaired deterministically, never read out of
//!    bounds);
//! 5. slots are scanned in LRU order: a slot whose `slot_host_rows` is a wanted `g` inside the host pool and
//!    not matched yet is a *hit* (so a row beyond the pool is never a hit, even if a corrupt `slot_host_rows`
//!    names it); every other slot is *evictable*;
//! 6. the m-th unmatched wanted row (a *miss*) takes the m-th evictable slot and its `slot_host_rows` becomes
//!    `g` — or `-1` when `g` lies beyond the host pool (`≥ host_num_blocks * block_size`), whose hot
//!    row is then zero-filled by the gather. Misses beyond the evictable slots get no slot and
//!    resolve to `-1`;
//! 7. the new LRU order is: unused evictable slots (old order), miss slots (miss order), hit slots
//!    (old order);
//! 8. outputs: `indices[t][j]` = the resident row, or the hot row of `g`'s slot
//!    (`hot_table[r][slot / block_size] * attention_block_stride + slot % block_size`), or `-1`;
//!    `valid_counts[t]` = entries of row `t` that are not `-1`; each miss is a plan entry
//!    `(miss_src, miss_dst)` = (`g` or `-1` beyond the pool, hot row) stored in the row where `g`
//!    first appears, at `[t][0..miss_counts[t]]` (the rest of the plan row is `-1`);
//!    `hit_counts[t]` = hits first appearing in row `t`;
//! 9. with a `stats` buffer ([`ResolveArgs::stats`]), the call adds `Σ hit_counts`,
//!    `Σ miss_counts`, `Σ valid_counts` and one call to slot [`ResolveDesc::stats_slot`]
//!    ([`crate::ops::stats`]; padding rows add 0, an empty batch adds the call).
//!
//! # Several rows of one request (speculative decoding)
//!
//! All token rows with the same `req_id` — adjacent or not, in row order — are resolved as one
//! against the request's single state, so a step of `q = max_query_len` rows needs up to
//! `q × top_k` distinct hot slots (the default hot buffer, `(q + 1) × top_k`, keeps one more
//! top-k of slack). The LRU order after the call is, exactly:
//!
//! 1. the evictable slots no miss took, in their old LRU order;
//! 2. the miss slots, in the order the misses first appear — row by row (in row order), column
//!    by column — whichever row they first appear in;
//! 3. the hit slots, in their **old LRU order** (not in the order the rows asked for them): a
//!    slot hit by several rows moves once.
//!
//! A request's rows never change another request's state; each miss's plan entry is stored in
//! the row where its host row first appears, so a later row of the same request that wants it
//! counts neither a hit nor a miss and reads the slot the earlier row's miss fills.
//!
//! The gather itself ([`super::copy::gather_rows`]) is a separate call so followers can apply the
//! leader's plan to their own layers.
//!
//! # Files
//!
//! This file holds the reference [`resolve`] and the entries it classifies; `desc.rs` the
//! descriptor and its checks, `buffers.rs` the call's buffer sizes and slices.

use alloc::collections::BTreeMap;

use alloc::vec;

use alloc::vec::Vec;

use super::stats::CallStats;

use crate::error::{OpError, OpName};

const OP: OpName = OpName::Resolve;

/// The table rows of one request: `batch` for `host_table` and `hot_table`, `state` for
/// `resident_table`, `slot_host_rows` and `lru` (the same row in state-row order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestRows {
    /// Row of `host_table` and `hot_table`.
    pub batch: usize,
    /// Row of `resident_table`, `slot_host_rows` and `lru`.
    pub state: usize,
}

/// One classified top-k entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Outside the request's pages, or negative: output `-1`.
    Invalid,
    /// Still on the GPU: this physical row.
    Resident(i32),
    /// Read from host: this flat host row.
    Host(i32),
}

/// Reference resolve over typed slices. Checks shapes first; writes nothing on error.
pub fn resolve(desc: &ResolveDesc, a: ResolveSlices<'_>) -> Result<(), OpError> {
    desc.check(&a.sizes())?;
    let ResolveSlices {
        req_id,
        topk,
        resident_table,
        host_table,
        hot_table,
        slot_host_rows,
        lru,
        indices,
        valid_counts,
        hit_counts,
        miss_counts,
        miss_src,
        miss_dst,
        idx_mapping,
        stats,
    } = a;
    let (t_count, k, n) = (
        desc.num_tokens as usize,
        desc.top_k as usize,
        desc.hot_slots as usize,
    );
    let tk = t_count * k;
    indices[..tk].fill(-1);
    miss_src[..tk].fill(-1);
    miss_dst[..tk].fill(-1);
    for c in [
        &mut valid_counts[..t_count],
        &mut hit_counts[..t_count],
        &mut miss_counts[..t_count],
    ] {
        c.fill(0);
    }

    let mut done = vec![false; t_count];
    for first in 0..t_count {
        if done[first] {
            continue;
        }
        let Some(rows_of) = desc.request_rows(req_id[first], idx_mapping) else {
            done[first] = true;
            continue;
        };
        // `h`: row of the host and hot tables; `r`: row of the resident table, slot_host_rows and LRU.
        let (h, r) = (rows_of.batch, rows_of.state);
        let rows: Vec<usize> = (first..t_count)
            .filter(|&t| req_id[t] == req_id[first])
            .collect();
        for &t in &rows {
            done[t] = true;
        }

        // Steps 2-3: classify, collect wanted host rows in order of first appearance.
        let mut entries = Vec::with_capacity(rows.len() * k);
        let mut wanted: Vec<(i32, usize)> = Vec::new(); // (g, first row)
        let mut wanted_at: BTreeMap<i32, usize> = BTreeMap::new();
        for &t in &rows {
            for j in 0..k {
                let e = desc.classify_rows(resident_table, host_table, rows_of, topk[t * k + j]);
                if let Entry::Host(g) = e {
                    wanted_at.entry(g).or_insert_with(|| {
                        wanted.push((g, t));
                        wanted.len() - 1
                    });
                }
                entries.push(e);
            }
        }
        let mut slot_of: Vec<Option<u32>> = vec![None; wanted.len()];
        if !wanted.is_empty() {
            let slot_host_rows_r = &mut slot_host_rows[r * n..(r + 1) * n];
            let lru_r = &mut lru[r * n..(r + 1) * n];
            // Step 4: repair a corrupt LRU.
            if !desc.lru_is_permutation(lru_r) {
                for (i, s) in lru_r.iter_mut().enumerate() {
                    *s = i as u16;
                }
                slot_host_rows_r.fill(-1);
            }
            // Step 5: hits and evictables in LRU order.
            let mut hits = Vec::new();
            let mut evictable = Vec::new();
            for &s in lru_r.iter() {
                let cached = slot_host_rows_r[s as usize];
                let in_pool = cached >= 0 && i64::from(cached) < desc.host_rows();
                match wanted_at.get(&cached) {
                    Some(&w) if in_pool && slot_of[w].is_none() => {
                        slot_of[w] = Some(s.into());
                        hits.push(s);
                        hit_counts[wanted[w].1] += 1;
                    }
                    _ => evictable.push(s),
                }
            }
            // Step 6: misses take evictable slots in order.
            let mut used = 0usize;
            let mut miss_slots = Vec::new();
            for (w, &(g, t)) in wanted.iter().enumerate() {
                if slot_of[w].is_some() || used == evictable.len() {
                    continue;
                }
                let s = evictable[used];
                used += 1;
                let in_pool = i64::from(g) < desc.host_rows();
                slot_host_rows_r[s as usize] = if in_pool { g } else { -1 };
                slot_of[w] = Some(s.into());
                miss_slots.push(s);
                let m = miss_counts[t] as usize;
                miss_src[t * k + m] = if in_pool { g } else { -1 };
                miss_dst[t * k + m] = desc.hot_row(hot_table, h, s.into());
                miss_counts[t] += 1;
            }
            // Step 7: new LRU order.
            let new_order: Vec<u16> = evictable[used..]
                .iter()
                .chain(&miss_slots)
                .chain(&hits)
                .copied()
                .collect();
            lru_r.copy_from_slice(&new_order);
        }

        // Step 8: outputs.
        for (i, &t) in rows.iter().enumerate() {
            let mut valid = 0;
            for j in 0..k {
                let v = match entries[i * k + j] {
                    Entry::Invalid => -1,
                    Entry::Resident(row) => row,
                    Entry::Host(g) => match slot_of[wanted_at[&g]] {
                        Some(s) => desc.hot_row(hot_table, h, s),
                        None => -1,
                    },
                };
                indices[t * k + j] = v;
                valid += i32::from(v != -1);
            }
            valid_counts[t] = valid;
        }
    }
    // Step 9: the call's counters.
    if let Some(stats) = stats {
        CallStats::of_resolve(
            &hit_counts[..t_count],
            &miss_counts[..t_count],
            &valid_counts[..t_count],
        )
        .add_to(stats, desc.stats_slot);
    }
    Ok(())
}

mod buffers;
mod desc;

pub use buffers::{ResolveBuffers, ResolveSizes, ResolveSlices};
pub use desc::{ResolveArgs, ResolveDesc};

#[cfg(test)]
mod tests;
