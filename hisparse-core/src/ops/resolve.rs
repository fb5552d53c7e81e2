//! Residency resolve + swap-in planning (SPEC §5.2), one call per index group per decode step.
//!
//! Inputs per call: `T` token rows of `K` top-k token positions, each row tagged with
//! `req_id[t]` (`-1` = padding), which names the request's tables (see *Table row order* below
//! for the two conventions; by default it is the request's *state row* `r` and every table is
//! indexed by it). Per request the caller keeps:
//! * `resident_table[r][page]`: the GPU block still holding the page, or `≤ 0` (the null block)
//!   when the page must be read from host;
//! * `host_table[r][page]`: the host block holding the page's durable copy;
//! * `hot_table[r][slot / block_size]`: the GPU blocks of the request's hot region;
//! * `dgi[r][slot]`: the flat host row cached in hot slot `slot`, or `-1`;
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
//!   persistent per-request state, **`resident_table`, `dgi` and `lru`, has `S` rows indexed by
//!   the state row `s = idx_mapping[b]`**. A batch row is padding (outputs `-1`, counts 0, no
//!   state touched) when `s < 0` or `s ≥ S`, or when an earlier batch row maps to the same state
//!   row: **the batch row with the smallest index owns a state row**, every other batch row
//!   mapping to it is padding (whether or not that smaller row has token rows in this call — the
//!   rule reads `idx_mapping[0..b)` only, so every backend decides it the same way without
//!   ordering between requests). Everything else — the steps below — is the same, with `r`
//!   standing for `b` where `host_table` and `hot_table` are read and for `s` where
//!   `resident_table`, `dgi` and `lru` are.
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
//!    `dgi[r][..]` to `-1` first (a corrupt state is repaired deterministically, never read out of
//!    bounds);
//! 5. slots are scanned in LRU order: a slot whose `dgi` is a wanted `g` inside the host pool and
//!    not matched yet is a *hit* (so a row beyond the pool is never a hit, even if a corrupt `dgi`
//!    names it); every other slot is *evictable*;
//! 6. the m-th unmatched wanted row (a *miss*) takes the m-th evictable slot and its `dgi` becomes
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
//!    ([`super::stats`]; padding rows add 0, an empty batch adds the call).
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

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use super::stats::{CallStats, check_stats};
use super::{
    BufferLen, I32_BYTES, MAX_HOT_SLOTS, U16_BYTES, in_range, mul, need, need_declared, nonzero,
    physical_row,
};
use crate::error::{OpError, OpName};

const OP: OpName = OpName::Resolve;

/// Shape of one resolve call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResolveDesc {
    /// Token rows `T` (0 is an empty batch).
    pub num_tokens: u32,
    /// Top-k width `K`.
    pub top_k: u32,
    /// Requests `R`: the bound of `req_id`, and the rows of every per-request table in state-row
    /// order (of `host_table` and `hot_table` in batch-row order, see `num_state_rows`).
    pub num_requests: u32,
    /// Columns `M` of the resident and host page tables.
    pub max_pages: u32,
    /// Rows per page / block.
    pub block_size: u32,
    /// Hot slots per request (`device_buffer_size`, `K..=32768`).
    pub hot_slots: u32,
    /// Rows between consecutive GPU blocks in the flat attention view (≥ `block_size`).
    pub attention_block_stride: u32,
    /// Blocks in the host pool (flat host rows beyond `host_num_blocks * block_size` are outside).
    pub host_num_blocks: u32,
    /// Table row order (module docs): `None` — state-row order, `req_id` is the state row of
    /// every table; `Some(S)` — batch-row order, `req_id` is the batch row of `host_table` and
    /// `hot_table` (`num_requests` rows) and [`ResolveArgs::idx_mapping`] maps it to the state
    /// row of `resident_table`, `dgi` and `lru` (`S` rows, `1..=i32::MAX`).
    pub num_state_rows: Option<u32>,
    /// The slot of [`ResolveArgs::stats`] the call adds to ([`super::stats`]); not read without
    /// a stats buffer.
    pub stats_slot: u32,
}

/// Buffers of a resolve call.
#[derive(Debug)]
pub struct ResolveArgs<'a, B: ?Sized> {
    /// `i32[T]` request per token row: its state row, or in batch-row order its batch row
    /// (`-1` = padding).
    pub req_id: &'a B,
    /// `i32[T][K]` token positions.
    pub topk: &'a B,
    /// `i32[R][M]` resident GPU block per page (`≤ 0` = read from host); `i32[S][M]` by state
    /// row in batch-row order.
    pub resident_table: &'a B,
    /// `i32[R][M]` host block per page (by batch row in batch-row order).
    pub host_table: &'a B,
    /// `i32[R][hot_table_width]` GPU blocks of each hot region (by batch row in batch-row
    /// order).
    pub hot_table: &'a B,
    /// `i32[R][N]` (`i32[S][N]` in batch-row order) flat host row cached per hot slot
    /// (`-1` = empty). Updated.
    pub dgi: &'a mut B,
    /// `u16[R][N]` (`u16[S][N]` in batch-row order) LRU order of hot slots, least recent
    /// first. Updated.
    pub lru: &'a mut B,
    /// `i32[R]` batch row → state row, exactly when the descriptor's `num_state_rows` is
    /// `Some` (batch-row order); `None` in state-row order.
    pub idx_mapping: Option<&'a B>,
    /// `i32[T][K]` output physical rows.
    pub indices: &'a mut B,
    /// `i32[T]` output valid entries per row.
    pub valid_counts: &'a mut B,
    /// `i32[T]` output hits first appearing in each row.
    pub hit_counts: &'a mut B,
    /// `i32[T]` output plan entries of each row.
    pub miss_counts: &'a mut B,
    /// `i32[T][K]` output plan sources (flat host rows; `-1` = zero-fill or unused).
    pub miss_src: &'a mut B,
    /// `i32[T][K]` output plan destinations (flat device rows; `-1` = unused).
    pub miss_dst: &'a mut B,
    /// `u32[4 * n]` decode-path counters (`n > stats_slot`): the call adds its hits, misses,
    /// valid entries and one call to slot `stats_slot` ([`super::stats`]). `None`: nothing is
    /// counted.
    pub stats: Option<&'a mut B>,
}

/// The table rows of one request: `batch` for `host_table` and `hot_table`, `state` for
/// `resident_table`, `dgi` and `lru` (the same row in state-row order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestRows {
    /// Row of `host_table` and `hot_table`.
    pub batch: usize,
    /// Row of `resident_table`, `dgi` and `lru`.
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

impl ResolveDesc {
    /// Columns of the hot table: `ceil(hot_slots / block_size)`; 0 when `block_size` is 0
    /// (which [`ResolveDesc::validate`] refuses).
    pub const fn hot_table_width(&self) -> u32 {
        if self.block_size == 0 {
            0
        } else {
            self.hot_slots.div_ceil(self.block_size)
        }
    }

    /// Rows of the host pool, `host_num_blocks * block_size`, saturating at `i64::MAX` (beyond
    /// the `i32` rows [`ResolveDesc::validate`] allows).
    pub const fn host_rows(&self) -> i64 {
        (self.host_num_blocks as i64).saturating_mul(self.block_size as i64)
    }

    /// Checks the descriptor on its own.
    pub fn validate(&self) -> Result<(), OpError> {
        nonzero(OP, "top_k", self.top_k.into())?;
        nonzero(OP, "num_requests", self.num_requests.into())?;
        nonzero(OP, "max_pages", self.max_pages.into())?;
        nonzero(OP, "block_size", self.block_size.into())?;
        nonzero(OP, "host_num_blocks", self.host_num_blocks.into())?;
        in_range(
            OP,
            "hot_slots",
            self.hot_slots.into(),
            self.top_k.into(),
            MAX_HOT_SLOTS.into(),
        )?;
        in_range(
            OP,
            "attention_block_stride",
            self.attention_block_stride.into(),
            self.block_size.into(),
            i32::MAX as u64,
        )?;
        in_range(
            OP,
            "host_num_blocks * block_size",
            self.host_rows() as u64,
            1,
            i32::MAX as u64,
        )?;
        if let Some(s) = self.num_state_rows {
            in_range(OP, "num_state_rows", s.into(), 1, i32::MAX as u64)?;
        }
        Ok(())
    }

    /// Rows of `resident_table`, `dgi` and `lru`: `num_state_rows` in batch-row order, else
    /// `num_requests`.
    pub const fn state_table_rows(&self) -> u32 {
        match self.num_state_rows {
            Some(s) => s,
            None => self.num_requests,
        }
    }

    /// Checks the descriptor and every buffer's size. Call before touching memory.
    pub fn check(&self, a: &ResolveSizes) -> Result<(), OpError> {
        self.validate()?;
        let t = u64::from(self.num_tokens);
        let tk = mul(OP, "topk", t, self.top_k.into())?;
        let r = u64::from(self.num_requests);
        let state = u64::from(self.state_table_rows());
        let resident = mul(OP, "resident_table", state, self.max_pages.into())?;
        let pages = mul(OP, "host_table", r, self.max_pages.into())?;
        let slots = mul(OP, "dgi", state, self.hot_slots.into())?;
        let hot = mul(OP, "hot_table", r, self.hot_table_width().into())?;
        need_declared(
            OP,
            "idx_mapping",
            a.idx_mapping,
            self.num_state_rows.map(|_| r),
            I32_BYTES,
            "idx_mapping (given)",
            "num_state_rows (declared)",
        )?;
        need(OP, "req_id", a.req_id, t, I32_BYTES)?;
        need(OP, "topk", a.topk, tk, I32_BYTES)?;
        need(OP, "resident_table", a.resident_table, resident, I32_BYTES)?;
        need(OP, "host_table", a.host_table, pages, I32_BYTES)?;
        need(OP, "hot_table", a.hot_table, hot, I32_BYTES)?;
        need(OP, "dgi", a.dgi, slots, I32_BYTES)?;
        need(OP, "lru", a.lru, slots, U16_BYTES)?;
        need(OP, "indices", a.indices, tk, I32_BYTES)?;
        need(OP, "valid_counts", a.valid_counts, t, I32_BYTES)?;
        need(OP, "hit_counts", a.hit_counts, t, I32_BYTES)?;
        need(OP, "miss_counts", a.miss_counts, t, I32_BYTES)?;
        need(OP, "miss_src", a.miss_src, tk, I32_BYTES)?;
        need(OP, "miss_dst", a.miss_dst, tk, I32_BYTES)?;
        check_stats(OP, a.stats, self.stats_slot)
    }

    /// State row of token row `req` in state-row order, or `None` for padding (in batch-row
    /// order, the batch row; see [`ResolveDesc::request_rows`]).
    #[inline]
    pub fn state_row(&self, req: i32) -> Option<usize> {
        usize::try_from(req)
            .ok()
            .filter(|&r| r < self.num_requests as usize)
    }

    /// The state row batch row `b` owns in batch-row order (module docs): `idx_mapping[b]` when
    /// it lies in `0..num_state_rows` and no batch row before `b` maps to it, else `None`
    /// (padding). `b` must be below `num_requests` and `idx_mapping` hold `num_requests`
    /// entries. Costs `b` reads; a backend may compute the same owners another way.
    pub fn owned_state_row(&self, idx_mapping: &[i32], b: usize) -> Option<usize> {
        let s = idx_mapping[b];
        let in_range = usize::try_from(s)
            .ok()
            .filter(|&s| s < self.state_table_rows() as usize)?;
        (!idx_mapping[..b].contains(&s)).then_some(in_range)
    }

    /// The table rows of token row `req` in either order, or `None` for padding. `idx_mapping`
    /// is the call's (present exactly in batch-row order, checked by [`ResolveDesc::check`]).
    #[inline]
    pub fn request_rows(&self, req: i32, idx_mapping: Option<&[i32]>) -> Option<RequestRows> {
        let b = self.state_row(req)?;
        let state = match idx_mapping {
            Some(map) => self.owned_state_row(map, b)?,
            None => b,
        };
        Some(RequestRows { batch: b, state })
    }

    /// Classifies token `tok` of state row `r` in state-row order (step 2).
    pub fn classify(
        &self,
        resident_table: &[i32],
        host_table: &[i32],
        r: usize,
        tok: i32,
    ) -> Entry {
        self.classify_rows(
            resident_table,
            host_table,
            RequestRows { batch: r, state: r },
            tok,
        )
    }

    /// Classifies token `tok` of the request with table rows `rows` (step 2): the resident
    /// table is read at `rows.state`, the host table at `rows.batch`.
    pub fn classify_rows(
        &self,
        resident_table: &[i32],
        host_table: &[i32],
        rows: RequestRows,
        tok: i32,
    ) -> Entry {
        if tok < 0 {
            return Entry::Invalid;
        }
        let bs = self.block_size as i64;
        let page = tok as i64 / bs;
        if page >= i64::from(self.max_pages) {
            return Entry::Invalid;
        }
        let off = (tok as i64 % bs) as u32;
        let m = self.max_pages as usize;
        let resident = resident_table[rows.state * m + page as usize];
        if resident > 0 {
            return match physical_row(resident, self.attention_block_stride, off) {
                -1 => Entry::Invalid,
                row => Entry::Resident(row),
            };
        }
        match physical_row(
            host_table[rows.batch * m + page as usize],
            self.block_size,
            off,
        ) {
            -1 => Entry::Invalid,
            g => Entry::Host(g),
        }
    }

    /// Flat device row of hot slot `slot` of hot-table row `r` (the state row in state-row
    /// order, the batch row in batch-row order).
    #[inline]
    pub fn hot_row(&self, hot_table: &[i32], r: usize, slot: u32) -> i32 {
        let w = self.hot_table_width() as usize;
        let block = hot_table[r * w + (slot / self.block_size) as usize];
        physical_row(block, self.attention_block_stride, slot % self.block_size)
    }

    /// Whether `lru` is a permutation of `0..hot_slots`.
    pub fn lru_is_permutation(&self, lru: &[u16]) -> bool {
        let mut seen = vec![false; self.hot_slots as usize];
        lru.iter().all(|&s| {
            let fresh = seen.get(s as usize).is_some_and(|&v| !v);
            if fresh {
                seen[s as usize] = true;
            }
            fresh
        })
    }
}

/// Byte sizes of every resolve argument: what [`ResolveDesc::check`] compares against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // one field per argument of the same name
pub struct ResolveSizes {
    pub req_id: u64,
    pub topk: u64,
    pub resident_table: u64,
    pub host_table: u64,
    pub hot_table: u64,
    pub dgi: u64,
    pub lru: u64,
    pub indices: u64,
    pub valid_counts: u64,
    pub hit_counts: u64,
    pub miss_counts: u64,
    pub miss_src: u64,
    pub miss_dst: u64,
    /// `None` when no `idx_mapping` is given.
    pub idx_mapping: Option<u64>,
    /// `None` when no `stats` buffer is given.
    pub stats: Option<u64>,
}

/// The resolve arguments as typed slices, for the reference implementation.
#[derive(Debug)]
#[allow(missing_docs)] // fields mirror [`ResolveArgs`]
pub struct ResolveSlices<'a> {
    pub req_id: &'a [i32],
    pub topk: &'a [i32],
    pub resident_table: &'a [i32],
    pub host_table: &'a [i32],
    pub hot_table: &'a [i32],
    pub dgi: &'a mut [i32],
    pub lru: &'a mut [u16],
    pub indices: &'a mut [i32],
    pub valid_counts: &'a mut [i32],
    pub hit_counts: &'a mut [i32],
    pub miss_counts: &'a mut [i32],
    pub miss_src: &'a mut [i32],
    pub miss_dst: &'a mut [i32],
    pub idx_mapping: Option<&'a [i32]>,
    /// The stats words as `i32` (the bits of the `u32` counters, [`CallStats::add_to`]).
    pub stats: Option<&'a mut [i32]>,
}

macro_rules! sizes_of {
    ($a:expr) => {
        ResolveSizes {
            req_id: $a.req_id.byte_len(),
            topk: $a.topk.byte_len(),
            resident_table: $a.resident_table.byte_len(),
            host_table: $a.host_table.byte_len(),
            hot_table: $a.hot_table.byte_len(),
            dgi: $a.dgi.byte_len(),
            lru: $a.lru.byte_len(),
            indices: $a.indices.byte_len(),
            valid_counts: $a.valid_counts.byte_len(),
            hit_counts: $a.hit_counts.byte_len(),
            miss_counts: $a.miss_counts.byte_len(),
            miss_src: $a.miss_src.byte_len(),
            miss_dst: $a.miss_dst.byte_len(),
            idx_mapping: $a.idx_mapping.map(|m| m.byte_len()),
            stats: $a.stats.as_ref().map(|s| s.byte_len()),
        }
    };
}

/// The same arguments, borrowed from `$a` for a shorter call.
macro_rules! reborrow {
    ($a:expr, $args:ident) => {
        $args {
            req_id: $a.req_id,
            topk: $a.topk,
            resident_table: $a.resident_table,
            host_table: $a.host_table,
            hot_table: $a.hot_table,
            dgi: &mut *$a.dgi,
            lru: &mut *$a.lru,
            indices: &mut *$a.indices,
            valid_counts: &mut *$a.valid_counts,
            hit_counts: &mut *$a.hit_counts,
            miss_counts: &mut *$a.miss_counts,
            miss_src: &mut *$a.miss_src,
            miss_dst: &mut *$a.miss_dst,
            idx_mapping: $a.idx_mapping,
            stats: $a.stats.as_deref_mut(),
        }
    };
}

impl<B: BufferLen + ?Sized> ResolveArgs<'_, B> {
    /// Byte sizes of every argument.
    pub fn sizes(&self) -> ResolveSizes {
        sizes_of!(self)
    }

    /// The same buffers, borrowed for one call, so the caller keeps them for the next (the
    /// gather of the miss plan the call writes).
    pub fn reborrow(&mut self) -> ResolveArgs<'_, B> {
        reborrow!(self, ResolveArgs)
    }
}

impl ResolveSlices<'_> {
    /// Byte sizes of every argument.
    pub fn sizes(&self) -> ResolveSizes {
        sizes_of!(self)
    }

    /// The same slices, borrowed for one call (as [`ResolveArgs::reborrow`]).
    pub fn reborrow(&mut self) -> ResolveSlices<'_> {
        reborrow!(self, ResolveSlices)
    }
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
        dgi,
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
        // `h`: row of the host and hot tables; `r`: row of the resident table, dgi and LRU.
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
            let dgi_r = &mut dgi[r * n..(r + 1) * n];
            let lru_r = &mut lru[r * n..(r + 1) * n];
            // Step 4: repair a corrupt LRU.
            if !desc.lru_is_permutation(lru_r) {
                for (i, s) in lru_r.iter_mut().enumerate() {
                    *s = i as u16;
                }
                dgi_r.fill(-1);
            }
            // Step 5: hits and evictables in LRU order.
            let mut hits = Vec::new();
            let mut evictable = Vec::new();
            for &s in lru_r.iter() {
                let cached = dgi_r[s as usize];
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
                dgi_r[s as usize] = if in_pool { g } else { -1 };
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

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// A small world: `R` requests, block size 4, 4 pages per request; page `p` of request `r`
    /// lives in host block `4r + p` (so token `tok` of request `r` is host row `16r + tok`); the
    /// hot region of request `r` is GPU blocks `10 + r*w ..`, attention stride 4, so slot `s` of
    /// request 0 is physical row `40 + s`.
    struct World {
        desc: ResolveDesc,
        resident: Vec<i32>,
        host: Vec<i32>,
        hot: Vec<i32>,
        dgi: Vec<i32>,
        lru: Vec<u16>,
        /// The stats buffer the calls add to (slot `desc.stats_slot`), if any.
        stats: Option<Vec<i32>>,
    }

    #[derive(Debug, PartialEq)]
    struct Out {
        indices: Vec<i32>,
        valid: Vec<i32>,
        hits: Vec<i32>,
        misses: Vec<i32>,
        src: Vec<i32>,
        dst: Vec<i32>,
    }

    impl World {
        fn new(requests: u32, top_k: u32, hot_slots: u32) -> Self {
            Self::with_state_rows(requests, None, top_k, hot_slots)
        }

        /// The tables of a batch-row-order call: `state_rows` state rows (resident, dgi, LRU)
        /// and `batch_rows` batch rows (host, hot), 2 top-k entries and 4 hot slots (one GPU
        /// block per hot-table row: batch row b's slot s is physical row 40 + 4b + s).
        fn batch(batch_rows: u32, state_rows: u32) -> Self {
            Self::with_state_rows(batch_rows, Some(state_rows), 2, 4)
        }

        /// `requests` rows of host and hot tables; `state_rows` of resident, dgi and LRU when
        /// given (batch-row order), else `requests` of them too (state-row order).
        fn with_state_rows(
            requests: u32,
            state_rows: Option<u32>,
            top_k: u32,
            hot_slots: u32,
        ) -> Self {
            let desc = ResolveDesc {
                num_tokens: 0,
                top_k,
                num_requests: requests,
                max_pages: 4,
                block_size: 4,
                hot_slots,
                attention_block_stride: 4,
                host_num_blocks: 4 * requests,
                num_state_rows: state_rows,
                stats_slot: 0,
            };
            let w = desc.hot_table_width() as i32;
            let n = hot_slots as usize;
            let state = state_rows.unwrap_or(requests) as usize;
            World {
                desc,
                resident: vec![0; 4 * state],
                host: (0..4 * requests as i32).collect(),
                hot: (0..requests as i32 * w).map(|i| 10 + i).collect(),
                dgi: vec![-1; state * n],
                lru: (0..state * n).map(|i| (i % n) as u16).collect(),
                stats: None,
            }
        }

        fn lru(&self, r: usize) -> &[u16] {
            let n = self.desc.hot_slots as usize;
            &self.lru[r * n..(r + 1) * n]
        }

        fn dgi(&self, r: usize) -> &[i32] {
            let n = self.desc.hot_slots as usize;
            &self.dgi[r * n..(r + 1) * n]
        }

        fn step(&mut self, req_id: &[i32], topk: &[i32]) -> Out {
            self.call(None, req_id, topk).unwrap()
        }

        /// One resolve call, in batch-row order when `map` (the `idx_mapping`) is given.
        fn call(
            &mut self,
            map: Option<&[i32]>,
            req_id: &[i32],
            topk: &[i32],
        ) -> Result<Out, OpError> {
            let t = req_id.len();
            let tk = topk.len();
            let desc = ResolveDesc {
                num_tokens: t as u32,
                ..self.desc
            };
            let mut o = Out {
                indices: vec![7; tk],
                valid: vec![7; t],
                hits: vec![7; t],
                misses: vec![7; t],
                src: vec![7; tk],
                dst: vec![7; tk],
            };
            resolve(
                &desc,
                ResolveSlices {
                    req_id,
                    topk,
                    resident_table: &self.resident,
                    host_table: &self.host,
                    hot_table: &self.hot,
                    dgi: &mut self.dgi,
                    lru: &mut self.lru,
                    indices: &mut o.indices,
                    valid_counts: &mut o.valid,
                    hit_counts: &mut o.hits,
                    miss_counts: &mut o.misses,
                    miss_src: &mut o.src,
                    miss_dst: &mut o.dst,
                    idx_mapping: map,
                    stats: self.stats.as_deref_mut(),
                },
            )?;
            Ok(o)
        }
    }

    #[test]
    fn exact_hits_misses_slot_choice_and_lru_order() {
        let mut w = World::new(1, 2, 4);
        // Two misses take the two least recent slots (0, 1).
        let o = w.step(&[0], &[0, 1]);
        assert_eq!(o.indices, [40, 41]);
        assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (2, 0, 2));
        assert_eq!((o.src, o.dst), (vec![0, 1], vec![40, 41]));
        assert_eq!(w.dgi(0), [0, 1, -1, -1]);
        assert_eq!(w.lru(0), [2, 3, 0, 1]);
        // Host row 1 hits slot 1; host row 5 misses into the least recent evictable slot (2).
        // New order: unused evictables (3, 0), the miss (2), the hit (1).
        let o = w.step(&[0], &[1, 5]);
        assert_eq!(o.indices, [41, 42]);
        assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (2, 1, 1));
        assert_eq!((o.src, o.dst), (vec![5, -1], vec![42, -1]));
        assert_eq!(w.dgi(0), [0, 1, 5, -1]);
        assert_eq!(w.lru(0), [3, 0, 2, 1]);
        // A hit and no miss: the hit still moves to the most recent end.
        let o = w.step(&[0], &[5, -1]);
        assert_eq!(o.indices, [42, -1]);
        assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (1, 1, 0));
        assert_eq!(w.lru(0), [3, 0, 1, 2]);
        // Row 0 hits slot 0, row 9 misses into slot 3.
        let o = w.step(&[0], &[0, 9]);
        assert_eq!(o.indices, [40, 43]);
        assert_eq!(w.dgi(0), [0, 1, 5, 9]);
        assert_eq!(w.lru(0), [1, 2, 3, 0]);
    }

    #[test]
    fn misses_follow_a_non_identity_lru() {
        let mut w = World::new(1, 2, 4);
        w.lru = vec![3, 1, 0, 2];
        let o = w.step(&[0], &[6, 2]);
        // First miss (row 6) takes slot 3, the second (row 2) slot 1.
        assert_eq!(o.indices, [43, 41]);
        assert_eq!(o.dst[..2], [43, 41]);
        assert_eq!(w.dgi(0), [-1, 2, -1, 6]);
        assert_eq!(w.lru(0), [0, 2, 3, 1]);
    }

    #[test]
    fn padding_rows_output_minus_one_and_touch_nothing() {
        let mut w = World::new(2, 2, 4);
        w.dgi[0] = 3;
        let (dgi, lru) = (w.dgi.clone(), w.lru.clone());
        let o = w.step(&[-1, 2, i32::MIN], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(o.indices, [-1; 6]);
        assert_eq!(
            (o.valid, o.hits, o.misses),
            (vec![0; 3], vec![0; 3], vec![0; 3])
        );
        assert_eq!((o.src, o.dst), (vec![-1; 6], vec![-1; 6]));
        assert_eq!((w.dgi, w.lru), (dgi, lru));
    }

    #[test]
    fn duplicates_within_a_row_resolve_once() {
        let mut w = World::new(1, 4, 4);
        let o = w.step(&[0], &[1, 1, 5, 1]);
        assert_eq!(o.indices, [40, 40, 41, 40]);
        assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (4, 0, 2));
        assert_eq!(o.src, [1, 5, -1, -1]);
        assert_eq!(w.lru(0), [2, 3, 0, 1]);
        // Again: both are hits, counted once each.
        let o = w.step(&[0], &[5, 1, 5, 5]);
        assert_eq!(o.indices, [41, 40, 41, 41]);
        assert_eq!((o.hits[0], o.misses[0]), (2, 0));
    }

    #[test]
    fn resident_pages_come_first_and_leave_the_lru_alone() {
        let mut w = World::new(1, 2, 4);
        w.step(&[0], &[0, 1]);
        let lru = w.lru.clone();
        // Page 0 is resident on GPU block 7 although host rows 0 and 1 are cached hot.
        w.resident[0] = 7;
        let o = w.step(&[0], &[1, 3]);
        assert_eq!(o.indices, [29, 31]);
        assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (2, 0, 0));
        assert_eq!(w.lru, lru, "a fully resident row changes no LRU");
        // Mixed: the resident entry bypasses the slots, the host entry misses.
        let o = w.step(&[0], &[2, 4]);
        assert_eq!(o.indices, [30, 42]);
        assert_eq!(o.misses[0], 1);
        // A null block (0) or a negative one means "read from host".
        w.resident[0] = -1;
        let o = w.step(&[0], &[0, 4]);
        assert_eq!(o.indices, [40, 42]);
        assert_eq!(o.hits[0], 2);
    }

    #[test]
    fn invalid_entries_are_minus_one() {
        let mut w = World::new(1, 4, 4);
        w.host[2] = -1; // page 2 has no host block
        let o = w.step(&[0], &[-1, 16, 9, i32::MIN]);
        assert_eq!(o.indices, [-1; 4]);
        assert_eq!(o.valid[0], 0);
        assert_eq!(w.lru(0), [0, 1, 2, 3], "nothing wanted: no LRU change");
        let o = w.step(&[0], &[15, i32::MAX, 3, -7]);
        assert_eq!(o.indices, [40, -1, 41, -1]);
        assert_eq!(o.valid[0], 2);
    }

    #[test]
    fn host_row_beyond_the_pool_zero_fills_and_never_hits() {
        let mut w = World::new(1, 2, 4);
        w.host[3] = 9; // beyond the 4-block pool: rows 36..40
        let o = w.step(&[0], &[12, 1]);
        assert_eq!(o.indices, [40, 41]);
        assert_eq!((o.src, o.dst), (vec![-1, 1], vec![40, 41]));
        assert_eq!(w.dgi(0), [-1, 1, -1, -1]);
        // Even a (corrupt) dgi naming the beyond-pool row is not a hit: it misses again.
        w.dgi[0] = 36;
        let o = w.step(&[0], &[12, 13]);
        assert_eq!(o.hits[0], 0);
        assert_eq!(o.misses[0], 2);
        assert_eq!(o.src[..2], [-1, -1]);
    }

    #[test]
    fn several_requests_keep_separate_state() {
        let mut w = World::new(2, 2, 4);
        // Interleaved rows; request 1's tokens are host rows 16 + tok.
        let o = w.step(&[1, 0, 1], &[0, 1, 0, 1, 2, 0]);
        // Request 1 resolves rows 0 and 2 together: wanted 16, 17, 18; slots 0, 1, 2 of its
        // region (GPU block 11 → rows 44..48).
        assert_eq!(o.indices, [44, 45, 40, 41, 46, 44]);
        assert_eq!(o.misses, [2, 2, 1]);
        assert_eq!(o.src, [16, 17, 0, 1, 18, -1]);
        assert_eq!(o.dst, [44, 45, 40, 41, 46, -1]);
        assert_eq!(w.dgi(0), [0, 1, -1, -1]);
        assert_eq!(w.dgi(1), [16, 17, 18, -1]);
        assert_eq!(w.lru(1), [3, 0, 1, 2]);
    }

    #[test]
    fn speculative_rows_share_one_state_and_number_misses_by_first_appearance() {
        let mut w = World::new(1, 2, 4);
        w.step(&[0], &[0, 1]); // slots 0, 1 hold rows 0, 1; lru [2, 3, 0, 1]
        let o = w.step(&[0, 0], &[2, 1, 3, 2]);
        // Wanted in order: 2 (row 0), 1 (row 0, hit), 3 (row 1). Misses: 2 → slot 2, 3 → slot 3.
        assert_eq!(o.indices, [42, 41, 43, 42]);
        assert_eq!((o.hits.clone(), o.misses.clone()), (vec![1, 0], vec![1, 1]));
        assert_eq!((o.src, o.dst), (vec![2, -1, 3, -1], vec![42, -1, 43, -1]));
        assert_eq!(o.valid, [2, 2]);
        assert_eq!(w.lru(0), [0, 2, 3, 1]);
    }

    /// The LRU order after a call with several rows of one request (module docs): unused
    /// evictables in old order, then misses by first appearance across the rows, then hits in
    /// their old LRU order — here with the request's rows interleaved with another request's.
    #[test]
    fn several_rows_of_one_request_give_the_documented_lru_order() {
        let mut w = World::new(2, 3, 8);
        // Request 0: slots 0..3 cache rows 0, 1, 2; LRU [3, 4, 5, 6, 7, 0, 1, 2].
        w.step(&[0], &[0, 1, 2]);
        assert_eq!(w.lru(0), [3, 4, 5, 6, 7, 0, 1, 2]);
        let other = w.lru(1).to_vec();
        // Rows of request 0 (rows 0 and 2) around a row of request 1. Request 0 wants, in order
        // of first appearance: 2 (hit, slot 2), 6 (miss), 0 (hit, slot 0) from row 0; then 7
        // (miss), 6 (again: no count), 1 (hit, slot 1) from row 2.
        let o = w.step(&[0, 1, 0], &[2, 6, 0, 4, 5, 6, 7, 6, 1]);
        // Misses take the least recent evictables 3 and 4, in first-appearance order.
        assert_eq!(o.indices[..3], [42, 43, 40]);
        assert_eq!(o.indices[6..], [44, 43, 41]);
        assert_eq!((o.hits[0], o.misses[0]), (2, 1));
        assert_eq!((o.hits[2], o.misses[2]), (1, 1));
        assert_eq!(
            (o.src[..1].to_vec(), o.dst[..1].to_vec()),
            (vec![6], vec![43])
        );
        assert_eq!(
            (o.src[6..7].to_vec(), o.dst[6..7].to_vec()),
            (vec![7], vec![44])
        );
        // Unused evictables (5, 6, 7), the misses (3, 4), the hits in old order (0, 1, 2) —
        // not in the order the rows asked for them (2, 0, 1).
        assert_eq!(w.lru(0), [5, 6, 7, 3, 4, 0, 1, 2]);
        assert_eq!(w.dgi(0), [0, 1, 2, 6, 7, -1, -1, -1]);
        // Request 1's row missed rows 4, 5 and 6 (host rows 20, 21, 22 of its own table) in its
        // own state only.
        assert_eq!(&w.lru(1)[5..], &[other[0], other[1], other[2]]);
    }

    #[test]
    fn misses_beyond_the_evictable_slots_get_minus_one() {
        let mut w = World::new(1, 2, 2);
        let o = w.step(&[0, 0], &[0, 1, 2, 3]);
        assert_eq!(o.indices, [40, 41, -1, -1]);
        assert_eq!(o.valid, [2, 0]);
        assert_eq!(o.misses, [2, 0]);
        assert_eq!(o.src, [0, 1, -1, -1]);
        assert_eq!(w.lru(0), [0, 1]);
        // Hits are kept before misses take slots: row 1 hits, 2 takes the only evictable slot.
        let o = w.step(&[0, 0], &[1, 2, 3, 1]);
        assert_eq!(o.indices, [41, 40, -1, 41]);
        assert_eq!(w.dgi(0), [2, 1]);
    }

    #[test]
    fn a_corrupt_lru_is_repaired_first() {
        for bad in [vec![0u16, 0, 1, 2], vec![0, 1, 2, 4], vec![3, 2, 1, 9]] {
            let mut w = World::new(1, 2, 4);
            w.lru = bad;
            w.dgi = vec![5, 6, 7, 8];
            let o = w.step(&[0], &[5, 6]);
            // Reset to identity, dgi cleared: both miss into slots 0 and 1.
            assert_eq!(o.indices, [40, 41]);
            assert_eq!(o.hits[0], 0);
            assert_eq!(w.dgi(0), [5, 6, -1, -1]);
            assert_eq!(w.lru(0), [2, 3, 0, 1]);
        }
        // A corrupt LRU with nothing wanted is left as it is.
        let mut w = World::new(1, 2, 4);
        w.lru = vec![1, 1, 1, 1];
        w.step(&[0], &[-1, -1]);
        assert_eq!(w.lru(0), [1, 1, 1, 1]);
    }

    #[test]
    fn stats_add_the_sums_of_the_row_counts_and_one_call() {
        let mut w = World::new(2, 2, 4);
        w.stats = Some(vec![1, 2, 3, 4, -1, -2, 0, -1]);
        w.desc.stats_slot = 1;
        // Request 0 misses 0 and 1 in row 0 and 2 in row 2 (row 2's 1 counts nothing); a
        // padding row; request 1 misses 16 + 3.
        let o = w.step(&[0, -1, 0, 1], &[0, 1, 0, 1, 1, 2, 3, -1]);
        assert_eq!((o.hits, o.misses), (vec![0; 4], vec![2, 0, 1, 1]));
        assert_eq!(o.valid, [2, 0, 2, 1]);
        // Slot 0 untouched; slot 1: hits +0, misses +4 (wraps), valid +5, calls +1 (wraps).
        assert_eq!(w.stats.as_deref(), Some(&[1, 2, 3, 4, -1, 2, 5, 0][..]));
        // An empty batch counts the call; a hit counts in word 0.
        w.step(&[], &[]);
        let o = w.step(&[0], &[2, -1]);
        assert_eq!((o.hits[0], o.misses[0], o.valid[0]), (1, 0, 1));
        assert_eq!(w.stats.as_deref(), Some(&[1, 2, 3, 4, 0, 2, 6, 2][..]));
        // A buffer without the slot is refused before anything is written.
        w.stats = Some(vec![9; 7]);
        let (dgi, lru) = (w.dgi.clone(), w.lru.clone());
        let e = w.call(None, &[0], &[5, 6]).unwrap_err();
        assert!(
            matches!(
                e,
                OpError::BufferTooSmall {
                    buffer: "stats",
                    needed: 32,
                    actual: 28,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!((w.dgi, w.lru, w.stats), (dgi, lru, Some(vec![9; 7])));
    }

    #[test]
    fn empty_batch_changes_nothing() {
        let mut w = World::new(2, 2, 4);
        let (dgi, lru) = (w.dgi.clone(), w.lru.clone());
        let o = w.step(&[], &[]);
        assert!(o.indices.is_empty());
        assert_eq!((w.dgi, w.lru), (dgi, lru));
    }

    #[test]
    fn short_buffers_are_rejected_before_any_write() {
        let w = World::new(1, 2, 4);
        let desc = ResolveDesc {
            num_tokens: 1,
            ..w.desc
        };
        let (mut dgi, mut lru) = (w.dgi.clone(), w.lru.clone());
        let mut indices = vec![7; 2];
        let mut short = vec![7; 1];
        let err = resolve(
            &desc,
            ResolveSlices {
                req_id: &[0],
                topk: &[0, 1],
                resident_table: &w.resident,
                host_table: &w.host,
                hot_table: &w.hot,
                dgi: &mut dgi,
                lru: &mut lru,
                indices: &mut indices,
                valid_counts: &mut [7],
                hit_counts: &mut [7],
                miss_counts: &mut [7],
                miss_src: &mut [7, 7],
                miss_dst: &mut short,
                idx_mapping: None,
                stats: None,
            },
        )
        .unwrap_err();
        assert!(matches!(
            err,
            OpError::BufferTooSmall {
                buffer: "miss_dst",
                ..
            }
        ));
        assert_eq!((dgi, lru, indices), (w.dgi, w.lru, vec![7, 7]));
        let bad = ResolveDesc {
            hot_slots: 1,
            ..desc
        };
        assert!(matches!(
            bad.validate(),
            Err(OpError::OutOfRange {
                field: "hot_slots",
                ..
            })
        ));
    }

    #[test]
    fn batch_row_order_reads_host_and_hot_by_batch_row_and_state_by_state_row() {
        // Batch rows 0, 1 own state rows 2, 0; state row 1 is untouched.
        let mut w = World::batch(2, 3);
        let map = [2, 0];
        // State row 0 (batch row 1) has page 0 resident on GPU block 7.
        w.resident[0] = 7;
        // Batch row 1 wants tokens 1 (resident: 7*4+1) and 5 (host row 16+5 → slot 0 of block 11).
        // Batch row 0 wants tokens 2 and 3 (host rows 2, 3 → slots 0, 1 of block 10).
        let o = w.call(Some(&map), &[1, 0], &[1, 5, 2, 3]).unwrap();
        assert_eq!(o.indices, [29, 44, 40, 41]);
        assert_eq!(
            (o.valid, o.hits, o.misses),
            (vec![2, 2], vec![0, 0], vec![1, 2])
        );
        assert_eq!((o.src, o.dst), (vec![21, -1, 2, 3], vec![44, -1, 40, 41]));
        assert_eq!(w.dgi(0), [21, -1, -1, -1]);
        assert_eq!(w.dgi(1), [-1; 4]);
        assert_eq!(w.dgi(2), [2, 3, -1, -1]);
        assert_eq!(w.lru(0), [1, 2, 3, 0]);
        assert_eq!(w.lru(1), [0, 1, 2, 3]);
        assert_eq!(w.lru(2), [2, 3, 0, 1]);
        // Next step the batch is reordered: batch row 0 is now state row 0's request and batch
        // row 1 state row 2's. Host rows follow the batch rows' host tables (token 5 of batch
        // row 0 is host row 5, not the 21 state row 0 caches; tokens 3, 2 of batch row 1 are
        // host rows 19, 18, not state row 2's cached 3, 2), hot rows the batch rows' hot tables.
        let o = w.call(Some(&[0, 2]), &[0, 1], &[5, -1, 3, 2]).unwrap();
        assert_eq!(o.indices, [41, -1, 46, 47]);
        assert_eq!((o.hits, o.misses), (vec![0, 0], vec![1, 2]));
        assert_eq!(w.dgi(0), [21, 5, -1, -1]);
        assert_eq!(w.dgi(2), [2, 3, 19, 18]);
        assert_eq!(w.lru(2), [0, 1, 2, 3]);
    }

    #[test]
    fn unowned_duplicate_negative_and_out_of_range_state_rows_are_padding() {
        let mut w = World::batch(5, 3);
        w.dgi[0] = 9;
        let (dgi, lru) = (w.dgi.clone(), w.lru.clone());
        // Batch row 0 → -1, 1 → 3 (≥ S), 2 → 1, 3 → 1 (owned by 2: padding), 4 → i32::MIN.
        let map = [-1, 3, 1, 1, i32::MIN];
        let o = w.call(Some(&map), &[0, 1, 3, 4, 5, -1], &[0; 12]).unwrap();
        assert_eq!(o.indices, [-1; 12]);
        assert_eq!(
            (o.valid, o.hits, o.misses),
            (vec![0; 6], vec![0; 6], vec![0; 6])
        );
        assert_eq!((o.src, o.dst), (vec![-1; 12], vec![-1; 12]));
        assert_eq!((w.dgi.clone(), w.lru.clone()), (dgi, lru));
        // The owner (batch row 2) resolves against state row 1; its rows interleave with the
        // duplicate's, which stays padding.
        let o = w.call(Some(&map), &[3, 2, 2], &[0, 1, 0, 1, 6, 1]).unwrap();
        assert_eq!(o.indices[..2], [-1, -1]);
        assert_eq!(o.indices[2..], [48, 49, 50, 49]);
        assert_eq!(o.misses, [0, 2, 1]);
        assert_eq!(w.dgi(1), [32, 33, 38, -1]);
        // The owner does not need token rows of its own: batch row 3 stays padding.
        let o = w.call(Some(&map), &[3], &[0, 1]).unwrap();
        assert_eq!(o.indices, [-1, -1]);
        let desc = w.desc;
        assert_eq!(desc.owned_state_row(&map, 2), Some(1));
        assert_eq!(desc.owned_state_row(&map, 3), None);
        assert_eq!(
            desc.request_rows(2, Some(&map)),
            Some(RequestRows { batch: 2, state: 1 })
        );
        assert_eq!(desc.request_rows(5, Some(&map)), None);
    }

    #[test]
    fn batch_row_order_equals_state_row_order_over_permuted_tables() {
        // Four batch rows over six state rows; the same workload in state-row order: req_id
        // names state rows, host and hot tables permuted to state rows.
        let map = [4, 1, 5, 0];
        let mut batch = World::batch(4, 6);
        let mut state = World::new(6, 2, 4);
        state.desc.host_num_blocks = batch.desc.host_num_blocks;
        for (b, &s) in map.iter().enumerate() {
            let s = s as usize;
            state.host[4 * s..4 * s + 4].copy_from_slice(&batch.host[4 * b..4 * b + 4]);
            state.hot[s] = batch.hot[b];
            batch.resident[4 * s + 1] = 20 + s as i32;
            state.resident[4 * s + 1] = 20 + s as i32;
        }
        let steps: [(&[i32], &[i32]); 4] = [
            (&[0, 1, 2, 3], &[0, 1, 2, 3, 4, 5, 6, 7]),
            (&[2, 2, 0, -1], &[5, 9, 9, 10, 0, 14, 3, 3]),
            (&[3, 1, 3], &[7, 0, 7, 12, 13, 1]),
            (&[], &[]),
        ];
        for (req, topk) in steps {
            let o = batch.call(Some(&map), req, topk).unwrap();
            let mapped: Vec<i32> = req
                .iter()
                .map(|&b| usize::try_from(b).map_or(-1, |b| map[b]))
                .collect();
            assert_eq!(o, state.step(&mapped, topk), "req {req:?}");
            assert_eq!((&batch.dgi, &batch.lru), (&state.dgi, &state.lru));
        }
    }

    #[test]
    fn batch_row_order_is_checked_before_any_write() {
        let mut w = World::batch(2, 3);
        let before = (w.dgi.clone(), w.lru.clone());
        let err = w.call(None, &[0], &[0, 1]).unwrap_err();
        assert!(
            matches!(
                err,
                OpError::BufferTooSmall {
                    buffer: "idx_mapping",
                    ..
                }
            ),
            "{err}"
        );
        let err = w.call(Some(&[0]), &[0], &[0, 1]).unwrap_err();
        assert!(
            matches!(
                err,
                OpError::BufferTooSmall {
                    buffer: "idx_mapping",
                    ..
                }
            ),
            "{err}"
        );
        // Resident table, dgi and LRU are sized by the state rows.
        w.resident.truncate(8);
        let err = w.call(Some(&[0, 1]), &[0], &[0, 1]).unwrap_err();
        assert!(
            matches!(
                err,
                OpError::BufferTooSmall {
                    buffer: "resident_table",
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!((w.dgi.clone(), w.lru.clone()), before);
        // A mapping without the declared order, and an empty state-row count, are refused.
        let mut s = World::new(1, 2, 4);
        s.desc.num_tokens = 1;
        let (mut dgi, mut lru) = (s.dgi.clone(), s.lru.clone());
        let err = resolve(
            &s.desc,
            ResolveSlices {
                req_id: &[0],
                topk: &[0, 1],
                resident_table: &s.resident,
                host_table: &s.host,
                hot_table: &s.hot,
                dgi: &mut dgi,
                lru: &mut lru,
                indices: &mut [7; 2],
                valid_counts: &mut [7],
                hit_counts: &mut [7],
                miss_counts: &mut [7],
                miss_src: &mut [7; 2],
                miss_dst: &mut [7; 2],
                idx_mapping: Some(&[0]),
                stats: None,
            },
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                OpError::Mismatch {
                    field: "idx_mapping (given)",
                    ..
                }
            ),
            "{err}"
        );
        let zero = ResolveDesc {
            num_state_rows: Some(0),
            ..s.desc
        };
        assert!(matches!(
            zero.validate(),
            Err(OpError::OutOfRange {
                field: "num_state_rows",
                ..
            })
        ));
    }
}
