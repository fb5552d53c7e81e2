//! The resolver's descriptor and arguments: [`ResolveDesc`] (its shape, and how it checks
//! a call's buffers and reads a request's rows) and [`ResolveArgs`].

use alloc::vec;

use super::{Entry, OP, RequestRows, ResolveSizes};
use crate::error::OpError;
use crate::ops::stats::check_stats;
use crate::ops::{
    I32_BYTES, MAX_HOT_SLOTS, U16_BYTES, in_range, mul, need, need_declared, nonzero, physical_row,
};

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
    /// row of `resident_table`, `slot_host_rows` and `lru` (`S` rows, `1..=i32::MAX`).
    pub num_state_rows: Option<u32>,
    /// The slot of [`ResolveArgs::stats`] the call adds to ([`crate::ops::stats`]); not read without
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
    pub slot_host_rows: &'a mut B,
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
    /// valid entries and one call to slot `stats_slot` ([`crate::ops::stats`]). `None`: nothing is
    /// counted.
    pub stats: Option<&'a mut B>,
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

    /// Rows of `resident_table`, `slot_host_rows` and `lru`: `num_state_rows` in batch-row order, else
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
        let slots = mul(OP, "slot_host_rows", state, self.hot_slots.into())?;
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
        need(OP, "slot_host_rows", a.slot_host_rows, slots, I32_BYTES)?;
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
