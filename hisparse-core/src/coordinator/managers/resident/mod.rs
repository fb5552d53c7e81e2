//! The resident manager: the GPU copy of every page of a request, one block per bucket (the
//! layers of resident group `2 + bucket`), and the page lifecycle.
//!
//! `dirty` (GPU only) → `pending` (host transfer in flight) → `clean` (host copy durable, GPU
//! copy still readable) → `unpinned` (GPU blocks back in the free queue, their bytes still
//! valid: the request keeps reading them from the GPU) → `reclaimed` (the pool handed a block to
//! someone else: entries null, "read from host"). A pending page may be marked
//! release-after-transfer (`pending-release`): it is unpinned as soon as its transfer is
//! durable. A page is a reclaim candidate only when it is sealed (full), outside the active tail
//! (the page the next token writes and the one before it, [`ACTIVE_TAIL_PAGES`] in all), and not
//! below the request's reclaim cursor; nothing is unpinned before its host copy is durable.
//!
//! # Lazy reclaim
//!
//! Unpinning gives the blocks back to the GPU pool's free queue without touching the data
//! plane: the resident entries still name them. The manager records each unpinned block's reuse
//! generation in the pool ([`crate::pool::Pool::generation`]), which the pool bumps the moment the
//! block leaves its free queue (no prefix-cache key: an insert and an eviction in the pool's
//! hash table per block cost more). The manager keeps the unpinned
//! blocks in the order they were freed; since the free queue hands out blocks in that order too
//! and nothing else can re-pin them (their prefix keys are dropped when unpinned), the blocks reused since the
//! last look are always at the front of that queue: [`ResidentManager::take_reused`] pops them
//! in O(reused). The coordinator then makes their pages `reclaimed` (null entries, in the same
//! command as the allocation that reused the block, so before the forward pass that overwrites
//! it). A request with unpinned pages always holds a hot region, so the fall-back needs no
//! memory.
//!
//! # Files
//!
//! This file holds the types and the table's bookkeeping; `pages.rs` the page state machine
//! (allocate, seal, durable, spill, release, the invariants), `prefix.rs` the prefix cache
//! (adopted and host-only hit pages, publishing, staging a host prefix back), `reclaim.rs`
//! reclaim (limits, candidates, passes, lazy unpinning, fall-back).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::coordinator::CoordError;
use crate::coordinator::error::out_of_memory;

/// Lifecycle state of one page of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageState {
    /// Only on the GPU.
    Dirty,
    /// Host transfer in flight.
    Pending,
    /// Host transfer in flight; the GPU copy is unpinned when it completes.
    PendingRelease,
    /// Host copy durable, GPU copy pinned and readable.
    Clean,
    /// Host copy durable; the GPU blocks are back in the free queue but not yet reused, so the
    /// request still reads them from the GPU.
    Unpinned,
    /// GPU copy gone; read from host.
    Reclaimed,
}

impl PageState {
    /// Whether the page's host copy is durable (clean, unpinned or reclaimed).
    #[inline]
    pub(in crate::coordinator) fn is_durable(self) -> bool {
        matches!(
            self,
            PageState::Clean | PageState::Unpinned | PageState::Reclaimed
        )
    }
}

/// The resident table and page lifecycle of one request.
#[derive(Clone, Debug, Default)]
pub(in crate::coordinator) struct ResidentTable {
    /// `page * num_buckets + b` → GPU block (0 = reclaimed: read from host).
    pub(super) blocks: Vec<u32>,
    /// Page → lifecycle state.
    pub(super) state: Vec<PageState>,
    /// Transfer id that made the page durable (0 = durable from the start).
    pub(super) xfer: Vec<u64>,
    /// Pages below are unpinned, reclaimed, marked for release, or prefix hits.
    pub(super) reclaim_cursor: u32,
    /// Non-eager: pages below have a transfer planned.
    pub(super) spill_cursor: u32,
    /// Pages with null resident entries.
    pub(super) host_only: u32,
    /// Pages marked release-after-transfer.
    pub(super) pending_release: u32,
    /// Pages unpinned (blocks in the free queue, bytes still valid).
    pub(super) unpinned: u32,
}

/// Read access and the cursor moves the rest of the coordinator needs; every other change of
/// a table goes through [`ResidentManager`], which keeps the counters in step with the states.
impl ResidentTable {
    /// Pages the table covers.
    pub(in crate::coordinator) fn pages(&self) -> u32 {
        self.state.len() as u32
    }

    /// The lifecycle state of page `p`, `None` beyond the table.
    pub(in crate::coordinator) fn state_of(&self, p: u32) -> Option<PageState> {
        self.state.get(p as usize).copied()
    }

    /// The transfer that made page `p` durable (0: durable from the start), `None` beyond the
    /// table.
    pub(in crate::coordinator) fn xfer_of(&self, p: u32) -> Option<u64> {
        self.xfer.get(p as usize).copied()
    }

    /// Every resident entry, `page * num_buckets + bucket` → GPU block (0: read from host).
    pub(in crate::coordinator) fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Pages whose resident entries are null (read from host).
    pub(in crate::coordinator) fn host_only(&self) -> u32 {
        self.host_only
    }

    /// Pages marked release-after-transfer.
    pub(in crate::coordinator) fn pending_release(&self) -> u32 {
        self.pending_release
    }

    /// Pages unpinned (blocks in the free queue, bytes still valid).
    pub(in crate::coordinator) fn unpinned(&self) -> u32 {
        self.unpinned
    }

    /// Pages below are unpinned, reclaimed, marked for release, or prefix hits.
    pub(in crate::coordinator) fn reclaim_cursor(&self) -> u32 {
        self.reclaim_cursor
    }

    /// Both cursors of a request that starts with pages it did not write itself (prefix hits,
    /// adopted GPU copies, imports): reclaim scans from `reclaim`, spills plan from `spill`.
    pub(in crate::coordinator) fn set_cursors(&mut self, reclaim: u32, spill: u32) {
        self.reclaim_cursor = reclaim;
        self.spill_cursor = spill;
    }

    /// Non-eager spills: pages below `p` have a transfer planned (the cursor only moves up).
    pub(in crate::coordinator) fn raise_spill_cursor(&mut self, p: u32) {
        self.spill_cursor = self.spill_cursor.max(p);
    }

    /// A rollback to `p` sealed pages: pages from `p` on have no transfer planned any more.
    pub(in crate::coordinator) fn lower_spill_cursor(&mut self, p: u32) {
        self.spill_cursor = self.spill_cursor.min(p);
    }
}

/// The resident groups (one per bucket), the page lifecycle and the unpinned blocks.
#[derive(Clone, Debug)]
pub(in crate::coordinator) struct ResidentManager {
    num_buckets: u32,
    block_tokens: u32,
    /// Unpinned blocks in the order they were freed (stale entries are skipped when popped).
    unpinned: VecDeque<Unpinned>,
    /// Times a request's table went from no page read from host to some, or back (its
    /// `host_only` crossed zero): while this stands still, every request's "fully resident"
    /// answer stands too, so a command's entries computed earlier in the step hold.
    host_only_flips: u64,
}

impl ResidentManager {
    /// The resident manager for `num_buckets` buckets of `block_tokens`-token pages.
    #[inline]
    pub(in crate::coordinator) fn new(num_buckets: u32, block_tokens: u32) -> Self {
        ResidentManager {
            num_buckets,
            block_tokens,
            unpinned: VecDeque::new(),
            host_only_flips: 0,
        }
    }

    /// Number of buckets (resident groups); a page costs one GPU block per bucket.
    #[inline]
    pub(in crate::coordinator) fn num_buckets(&self) -> u32 {
        self.num_buckets
    }

    /// How many times a table's `host_only` crossed zero so far (see the field).
    #[inline]
    pub(in crate::coordinator) fn host_only_flips(&self) -> u64 {
        self.host_only_flips
    }

    /// One more page of `t` reads from host.
    #[inline]
    fn add_host_only(&mut self, t: &mut ResidentTable) {
        if t.host_only == 0 {
            self.host_only_flips += 1;
        }
        t.host_only += 1;
    }

    /// One page of `t` fewer reads from host.
    #[inline]
    fn remove_host_only(&mut self, t: &mut ResidentTable) {
        t.host_only -= 1;
        if t.host_only == 0 {
            self.host_only_flips += 1;
        }
    }

    /// Makes room for `pages` more pages without reallocating; a size the allocator refuses is
    /// an error.
    #[inline]
    pub(in crate::coordinator) fn try_reserve(
        &self,
        t: &mut ResidentTable,
        pages: usize,
    ) -> Result<(), CoordError> {
        let blocks = pages.saturating_mul(self.num_buckets as usize);
        t.state
            .try_reserve(pages)
            .map_err(|_| out_of_memory::<PageState>("page states", pages))?;
        t.xfer
            .try_reserve(pages)
            .map_err(|_| out_of_memory::<u64>("page transfer ids", pages))?;
        t.blocks
            .try_reserve(blocks)
            .map_err(|_| out_of_memory::<u32>("resident page tables", blocks))
    }

    /// Whether some page reads from host now, or may at any allocation (unpinned pages), or will
    /// once its transfer completes: the request then needs a hot region.
    #[inline]
    pub(in crate::coordinator) fn needs_hot_region(&self, t: &ResidentTable) -> bool {
        t.host_only > 0 || t.pending_release > 0 || t.unpinned > 0
    }
}

mod pages;
mod prefix;
mod reclaim;

pub(in crate::coordinator) use reclaim::{PassRefs, Unpinned};
