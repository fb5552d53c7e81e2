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
//! generation in the pool ([`BlockPool::generation`]), which the pool bumps the moment the
//! block leaves its free queue (no prefix-cache key: an insert and an eviction in the pool's
//! hash table per block cost more). The manager keeps the unpinned
//! blocks in the order they were freed; since the free queue hands out blocks in that order too
//! and nothing else can re-pin them (their prefix keys are dropped when unpinned), the blocks reused since the
//! last look are always at the front of that queue: [`ResidentManager::take_reused`] pops them
//! in O(reused). The coordinator then makes their pages `reclaimed` (null entries, in the same
//! command as the allocation that reused the block, so before the forward pass that overwrites
//! it). A request with unpinned pages always holds a hot region, so the fall-back needs no
//! memory.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::{PoolKind, Release};
use crate::coordinator::CoordError;
use crate::coordinator::command::{OffloadCommand, PageTransfer, TableUpdate};
use crate::coordinator::error::out_of_memory;
use crate::layout::ACTIVE_TAIL_PAGES;
use crate::pool::{BlockKey, BlockPool};

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

/// Who an unpinned block belongs to: page `page` of the request in `Coordinator::reqs[slot]`
/// at generation `generation`, freed at the block's reuse generation `block_generation`.
#[derive(Clone, Copy, Debug)]
pub(in crate::coordinator) struct Unpinned {
    /// The GPU block.
    pub(in crate::coordinator) block: u32,
    /// The block's reuse generation in the pool when it was unpinned.
    pub(in crate::coordinator) block_generation: u32,
    /// The owner's index in `Coordinator::reqs`.
    pub(in crate::coordinator) slot: u32,
    /// The owner's generation when it unpinned the block.
    pub(in crate::coordinator) generation: u32,
    /// The owner's page.
    pub(in crate::coordinator) page: u32,
}

/// What [`ResidentManager::reclaim_pages`] did for one request.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::coordinator) struct Reclaimed {
    /// Blocks back in the free queue now.
    pub(in crate::coordinator) freed: u32,
    /// Blocks freed now or once transfers complete.
    pub(in crate::coordinator) progress: u32,
    /// Pages marked release-after-transfer (pending ones, and dirty ones to spill).
    pub(in crate::coordinator) marked: u32,
    /// The page the request's reclaim cursor moves to.
    pub(in crate::coordinator) end: u32,
    /// Blocks of pages it let go of (shared with another request) that no one else held:
    /// they return to the free queue too, though not counted as freed.
    pub(in crate::coordinator) unshared_blocks: u32,
}

/// GPU block references as a reclaim pass being planned sees them: the pool's, plus one for
/// each block a start is about to pin (`pinned`, sorted), minus those the shared pages the
/// pass let go of so far held.
pub(in crate::coordinator) struct PassRefs<'a> {
    gpu: &'a BlockPool,
    pinned: &'a [u32],
    released: Vec<u32>,
}

impl<'a> PassRefs<'a> {
    /// The pool's references, and one more on each of `pinned` (sorted).
    pub(in crate::coordinator) fn new(gpu: &'a BlockPool, pinned: &'a [u32]) -> Self {
        PassRefs {
            gpu,
            pinned,
            released: Vec::new(),
        }
    }

    fn refs(&self, b: u32) -> u64 {
        let pinned = self.pinned.binary_search(&b).is_ok();
        let released = self.released.iter().filter(|&&r| r == b).count();
        (u64::from(self.gpu.ref_count(b)) + u64::from(pinned)).saturating_sub(released as u64)
    }

    /// Whether another holder references one of `blocks` (a page's, one per bucket).
    fn shared(&self, blocks: &[u32]) -> bool {
        blocks.iter().any(|&b| self.refs(b) > 1)
    }

    /// A page holding `blocks` lets go of them; returns how many of them it alone held (they
    /// go back to the free queue).
    fn release(&mut self, blocks: &[u32]) -> u32 {
        let alone = blocks.iter().filter(|&&b| self.refs(b) == 1).count() as u32;
        self.released.extend_from_slice(blocks);
        alone
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

    /// Appends a prefix-hit page that reads from host: durable on host from the start, never
    /// resident.
    #[inline]
    pub(in crate::coordinator) fn push_hit_page(&mut self, t: &mut ResidentTable) {
        for _ in 0..self.num_buckets {
            t.blocks.push(0);
        }
        t.state.push(PageState::Reclaimed);
        t.xfer.push(0);
        self.add_host_only(t);
    }

    /// Appends a prefix-hit page whose GPU copy is still valid: the request holds `blocks` (one
    /// per bucket, already re-pinned) and reads them; the page is clean (its host copy is
    /// durable: it was published).
    #[inline]
    pub(in crate::coordinator) fn push_adopted_page(&self, t: &mut ResidentTable, blocks: &[u32]) {
        t.blocks.extend_from_slice(blocks);
        t.state.push(PageState::Clean);
        t.xfer.push(0);
    }

    /// The resident blocks of prefix hash `hash` cached in the GPU pool, one per bucket, into
    /// `out` (cleared first); whether every bucket has one.
    #[inline]
    pub(in crate::coordinator) fn cached_page(
        &self,
        gpu: &BlockPool,
        hash: u64,
        out: &mut Vec<u32>,
    ) -> bool {
        out.clear();
        for bk in 0..self.num_buckets {
            match gpu.lookup(BlockKey {
                group: 2 + bk,
                hash,
            }) {
                Some(b) => out.push(b),
                None => return false,
            }
        }
        true
    }

    /// Publishes the GPU copies of sealed pages `pages` (prefix hashes `hashes`) in the GPU
    /// pool's prefix cache, so that a later request hitting their host pages can read them on
    /// the GPU while they last.
    #[inline]
    pub(in crate::coordinator) fn publish(
        &self,
        t: &ResidentTable,
        gpu: &mut BlockPool,
        hashes: &[u64],
        pages: core::ops::Range<u32>,
    ) {
        let nb = self.num_buckets;
        for p in pages {
            let Some(&hash) = hashes.get(p as usize) else {
                break;
            };
            if t.state
                .get(p as usize)
                .is_none_or(|s| matches!(s, PageState::Unpinned | PageState::Reclaimed))
            {
                continue;
            }
            for bk in 0..nb {
                let b = t.blocks[(p * nb + bk) as usize];
                if b != 0 {
                    let _ = gpu.cache(
                        b,
                        BlockKey {
                            group: 2 + bk,
                            hash,
                        },
                    );
                }
            }
        }
    }

    /// Withdraws the GPU prefix keys of pages `pages` (no longer full after a rollback).
    #[inline]
    pub(in crate::coordinator) fn unpublish(
        &self,
        t: &ResidentTable,
        gpu: &mut BlockPool,
        pages: core::ops::Range<u32>,
    ) {
        let nb = self.num_buckets;
        for p in pages {
            if t.state
                .get(p as usize)
                .is_none_or(|s| matches!(s, PageState::Unpinned | PageState::Reclaimed))
            {
                continue;
            }
            for bk in 0..nb {
                let b = t.blocks[(p * nb + bk) as usize];
                if b != 0 && gpu.key_of(b).is_some_and(|k| k.group == 2 + bk) {
                    let _ = gpu.uncache(b);
                }
            }
        }
    }

    /// Makes page `p` resident again from host block `host_block` (a copy-on-write tail): new
    /// blocks, the host → device restores, and the page is dirty (the forward writes its last
    /// row).
    #[inline]
    pub(in crate::coordinator) fn restore(
        &mut self,
        t: &mut ResidentTable,
        p: usize,
        host_block: u32,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
    ) {
        let nb = self.num_buckets as usize;
        if t.state[p] == PageState::Reclaimed {
            self.remove_host_only(t);
        }
        for bk in 0..nb {
            let rb = gpu.allocate().unwrap_or(0);
            let old = core::mem::replace(&mut t.blocks[p * nb + bk], rb);
            if old != 0 {
                let _ = gpu.free(old);
            }
            out.restores.push(PageTransfer {
                bucket: bk as u32,
                device_block: rb,
                host_block,
            });
        }
        // Rows 0..block_size-1 are restored; the last row is written by the forward.
        t.state[p] = PageState::Dirty;
    }

    /// Makes full page `p`, durable on host in `host_block` (an imported page), resident again:
    /// new blocks and the host → device restores, like [`ResidentManager::restore`], but the
    /// page is clean: every row is restored and its host copy stays the durable one.
    #[inline]
    pub(in crate::coordinator) fn restore_clean(
        &mut self,
        t: &mut ResidentTable,
        p: usize,
        host_block: u32,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
    ) {
        self.restore(t, p, host_block, gpu, out);
        t.state[p] = PageState::Clean;
        t.xfer[p] = 0;
    }

    /// Pages a prefill chunk of this request cannot read on the GPU as things stand: reclaimed
    /// ones (null entries) and unpinned ones (their blocks may be handed out by any
    /// allocation). Staging costs one GPU block per bucket for each.
    #[inline]
    pub(in crate::coordinator) fn pages_to_stage(&self, t: &ResidentTable) -> u32 {
        t.host_only + t.unpinned
    }

    /// Stages the context of a prefill chunk (SPEC: prefill over host-only context): every
    /// unpinned page is pinned again (its blocks leave the free queue with their bytes intact;
    /// the caller has let every reuse fall back first, so their blocks are all intact) and
    /// every reclaimed page gets new blocks, host → device restores from its host block
    /// `host_blocks[p]` and the resident entries for state row `row`. Both become clean
    /// resident pages (the host copy stays the durable one). The caller has checked that the
    /// pool holds [`ResidentManager::pages_to_stage`] pages' blocks. Returns the pages restored
    /// and the first page staged (`u32::MAX` when none).
    pub(in crate::coordinator) fn stage_context(
        &mut self,
        t: &mut ResidentTable,
        host_blocks: &[u32],
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        row: u32,
    ) -> (u32, u32) {
        let nb = self.num_buckets;
        let (mut restored, mut first) = (0u32, u32::MAX);
        // Unpinned pages first: their blocks are in the free queue, and the allocations for
        // the reclaimed pages below would otherwise be handed them.
        if t.unpinned > 0 {
            for p in 0..t.state.len() as u32 {
                if t.state[p as usize] != PageState::Unpinned {
                    continue;
                }
                let base = (p * nb) as usize;
                for bk in 0..nb as usize {
                    let b = t.blocks[base + bk];
                    // Leaving the free queue bumps its reuse generation: the queue entry
                    // becomes stale (not intact).
                    let _ = gpu.touch(b);
                }
                t.unpinned -= 1;
                t.state[p as usize] = PageState::Clean;
                first = first.min(p);
            }
        }
        if t.host_only > 0 {
            for p in 0..t.state.len() as u32 {
                if t.state[p as usize] != PageState::Reclaimed {
                    continue;
                }
                let base = (p * nb) as usize;
                let host_block = host_blocks.get(p as usize).copied().unwrap_or(0);
                for bk in 0..nb {
                    let b = gpu.allocate().unwrap_or(0);
                    t.blocks[base + bk as usize] = b;
                    out.residency.push(TableUpdate {
                        slot: row,
                        group: 2 + bk,
                        page: p,
                        block: b,
                    });
                    out.restores.push(PageTransfer {
                        bucket: bk,
                        device_block: b,
                        host_block,
                    });
                }
                self.remove_host_only(t);
                t.state[p as usize] = PageState::Clean;
                restored += 1;
                first = first.min(p);
            }
        }
        // Staged pages are ordinary clean pages from the next step on: reclaim may visit them.
        if first != u32::MAX {
            t.reclaim_cursor = t.reclaim_cursor.min(first);
        }
        (restored, first)
    }

    /// Records the resident-table entries of pages `0..pages` (prefix hits) for state row
    /// `slot`.
    #[inline]
    pub(in crate::coordinator) fn hit_tables(
        &self,
        t: &ResidentTable,
        slot: u32,
        pages: u32,
        out: &mut OffloadCommand,
    ) {
        let nb = self.num_buckets as usize;
        for p in 0..pages {
            let pu = p as usize;
            for bk in 0..nb {
                out.residency.push(TableUpdate {
                    slot,
                    group: 2 + bk as u32,
                    page: p,
                    block: t.blocks[pu * nb + bk],
                });
            }
        }
    }

    /// Allocates page `p` (the next one) in every bucket; it starts dirty. The caller has
    /// checked that the GPU pool has the blocks.
    #[inline]
    pub(in crate::coordinator) fn allocate_page(
        &self,
        t: &mut ResidentTable,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        slot: u32,
        p: u32,
    ) {
        for bk in 0..self.num_buckets {
            let b = gpu.allocate().unwrap_or(0);
            t.blocks.push(b);
            out.residency.push(TableUpdate {
                slot,
                group: 2 + bk,
                page: p,
                block: b,
            });
        }
        t.state.push(PageState::Dirty);
        t.xfer.push(0);
    }

    /// Whether page `p` reads, or may at any allocation read, from host (reclaimed or
    /// unpinned): a rollback must not reach it.
    #[inline]
    pub(in crate::coordinator) fn is_released(&self, t: &ResidentTable, p: u32) -> bool {
        matches!(
            t.state.get(p as usize),
            Some(PageState::Reclaimed | PageState::Unpinned)
        )
    }

    /// GPU blocks of page `p`, one per bucket in bucket order.
    #[inline]
    pub(in crate::coordinator) fn page_blocks<'a>(
        &self,
        t: &'a ResidentTable,
        p: u32,
    ) -> &'a [u32] {
        let nb = self.num_buckets as usize;
        let at = p as usize * nb;
        &t.blocks[at..at + nb]
    }

    /// GPU block of page `p` in `bucket`.
    #[inline]
    pub(in crate::coordinator) fn block(&self, t: &ResidentTable, p: u32, bucket: u32) -> u32 {
        t.blocks[(p * self.num_buckets + bucket) as usize]
    }

    /// The GPU blocks the request holds references to (unpinned pages' blocks are in the free
    /// queue; null entries are skipped).
    pub(in crate::coordinator) fn held_blocks<'a>(
        &self,
        t: &'a ResidentTable,
    ) -> impl Iterator<Item = u32> + 'a {
        let nb = self.num_buckets as usize;
        t.blocks
            .iter()
            .enumerate()
            .filter(move |&(i, &b)| b != 0 && t.state[i / nb] != PageState::Unpinned)
            .map(|(_, &b)| b)
    }

    /// Writes the table of `bucket` as an `i32` row: page → GPU block, `0` (the null block) for
    /// pages read from host and for pages beyond the request's `pages`.
    #[inline]
    pub(in crate::coordinator) fn row(
        &self,
        t: &ResidentTable,
        pages: u32,
        bucket: u32,
        out: &mut [i32],
    ) {
        let nb = self.num_buckets as usize;
        for (p, o) in out.iter_mut().enumerate() {
            *o = if p < pages as usize && (bucket as usize) < nb {
                t.blocks[p * nb + bucket as usize] as i32
            } else {
                0
            };
        }
    }

    /// A dirty page `p` goes pending under transfer `xfer`. Returns whether it was dirty.
    #[inline]
    pub(in crate::coordinator) fn seal(&self, t: &mut ResidentTable, p: u32, xfer: u64) -> bool {
        if t.state[p as usize] != PageState::Dirty {
            return false;
        }
        t.state[p as usize] = PageState::Pending;
        t.xfer[p as usize] = xfer;
        true
    }

    /// Page `p`'s state and the transfer that last wrote its host copy (0: none).
    #[inline]
    pub(in crate::coordinator) fn page_state(&self, t: &ResidentTable, p: u32) -> (PageState, u64) {
        (t.state[p as usize], t.xfer[p as usize])
    }

    /// Whether page `p` is on its way off the GPU: marked for release after its transfer, or
    /// unpinned (its block free, its bytes readable until the block is reused).
    #[inline]
    pub(in crate::coordinator) fn is_leaving(&self, t: &ResidentTable, p: u32) -> bool {
        matches!(
            t.state[p as usize],
            PageState::PendingRelease | PageState::Unpinned
        )
    }

    /// A rollback took tokens out of page `p`: a sealed (pending or clean) page is dirty again
    /// and its host copy no longer counts. Other states are left as they are.
    #[inline]
    pub(in crate::coordinator) fn unseal(&self, t: &mut ResidentTable, p: u32) {
        if matches!(t.state[p as usize], PageState::Pending | PageState::Clean) {
            t.state[p as usize] = PageState::Dirty;
            t.xfer[p as usize] = 0;
        }
    }

    /// Page `p` gets a whole-page spill under transfer `xfer`: it goes pending.
    #[inline]
    pub(in crate::coordinator) fn spill(&self, t: &mut ResidentTable, p: u32, xfer: u64) {
        t.state[p as usize] = PageState::Pending;
        t.xfer[p as usize] = xfer;
    }

    /// End (exclusive) of the pages that may be reclaimed: the sealed pages before the active
    /// tail: the page the next token writes (`num_computed / block_tokens`) and the pages before
    /// it, [`ACTIVE_TAIL_PAGES`] in all. Counting from the next token rather than from the
    /// allocated pages matters when the last page is full: the page before it can then go, so
    /// a request growing by one page holds two resident pages, as
    /// [`crate::layout::KvCacheConfig::gpu_blocks_per_request`] counts, not three.
    #[inline]
    pub(in crate::coordinator) fn reclaim_limit(&self, pages: u32, num_computed: u32) -> u32 {
        let next = num_computed / self.block_tokens;
        next.saturating_add(1)
            .saturating_sub(ACTIVE_TAIL_PAGES)
            .min(pages)
    }

    /// Reclaim candidates of a request: pages from its reclaim cursor to its reclaim limit.
    #[inline]
    pub(in crate::coordinator) fn candidates(
        &self,
        t: &ResidentTable,
        pages: u32,
        num_computed: u32,
    ) -> u32 {
        self.reclaim_limit(pages, num_computed)
            .saturating_sub(t.reclaim_cursor)
    }

    /// Among the candidates `from..limit`, the pages reclaim would free: clean ones no other
    /// request shares (`refs`: the references as the pass sees them), and those whose host
    /// copies are in flight or about to be spilled (pending, dirty; never shared: nothing
    /// unsealed or not durable is adopted).
    #[inline]
    pub(in crate::coordinator) fn freeable_between(
        &self,
        t: &ResidentTable,
        from: u32,
        limit: u32,
        refs: &PassRefs<'_>,
    ) -> (u32, u32) {
        let (mut clean, mut in_flight) = (0, 0);
        for p in from..limit {
            match t.state[p as usize] {
                PageState::Clean if !refs.shared(self.page_blocks(t, p)) => clean += 1,
                PageState::Pending | PageState::Dirty => in_flight += 1,
                _ => {}
            }
        }
        (clean, in_flight)
    }

    /// Whether another request holds a block of page `p` too (an adopted prefix-hit page).
    #[inline]
    fn is_shared(&self, t: &ResidentTable, p: u32, gpu: &BlockPool) -> bool {
        self.page_blocks(t, p).iter().any(|&b| gpu.ref_count(b) > 1)
    }

    /// Without eager mirroring: the sealed dirty pages (of the first `sealed`) from the spill
    /// cursor on, at most `budget` of them (counted down), into `out`; the cursor moves past
    /// every page looked at.
    pub(in crate::coordinator) fn next_spills(
        &self,
        t: &mut ResidentTable,
        sealed: u32,
        budget: &mut u32,
        out: &mut Vec<u32>,
    ) {
        while t.spill_cursor < sealed && *budget > 0 {
            let p = t.spill_cursor;
            if t.state[p as usize] == PageState::Dirty {
                out.push(p);
                *budget -= 1;
            }
            t.spill_cursor = t.spill_cursor.max(p + 1);
        }
    }

    /// Decides, without changing anything, what reclaiming the candidates of one request from
    /// its reclaim cursor to `limit` does, oldest first, until `budget` blocks are freed or
    /// coming: clean pages are unpinned (their blocks freed, or — shared with another request —
    /// let go of, which `refs` records), pending ones marked release-after-transfer, and —
    /// when `spill_dirty` (an allocation is short) — sealed dirty pages spilled and marked;
    /// without it a dirty page ends the scan (the low watermark waits for the step's own
    /// spills). [`ResidentManager::reclaim_pages`] carries it out.
    pub(in crate::coordinator) fn plan_pages(
        &self,
        t: &ResidentTable,
        limit: u32,
        budget: u32,
        spill_dirty: bool,
        refs: &mut PassRefs<'_>,
    ) -> Reclaimed {
        let nb = self.num_buckets;
        let mut got = Reclaimed::default();
        let mut p = t.reclaim_cursor;
        while p < limit && got.progress < budget {
            match t.state[p as usize] {
                PageState::Clean => {
                    let blocks = self.page_blocks(t, p);
                    if refs.shared(blocks) {
                        // Its blocks no one else holds return to the free queue all the same.
                        got.unshared_blocks += refs.release(blocks);
                    } else {
                        got.freed += nb;
                        got.progress += nb;
                    }
                }
                PageState::Pending => {
                    got.marked += 1;
                    got.progress += nb;
                }
                PageState::Dirty if spill_dirty => {
                    got.marked += 1;
                    got.progress += nb;
                }
                PageState::Dirty => break,
                _ => {}
            }
            p += 1;
        }
        got.end = p;
        got
    }

    /// Carries out [`ResidentManager::plan_pages`]'s decision for the pages from the reclaim
    /// cursor to `end`: clean pages unpinned (see [`ResidentManager::unpin_page`]), pending
    /// ones marked release-after-transfer, dirty ones (planned only when an allocation is
    /// short) put in `spills` for the caller to spill and mark. Moves the cursor to `end`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::coordinator) fn reclaim_pages(
        &mut self,
        t: &mut ResidentTable,
        end: u32,
        (owner, row): ((u32, u32), u32),
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        spills: &mut Vec<u32>,
    ) -> Reclaimed {
        let nb = self.num_buckets;
        let mut got = Reclaimed::default();
        for p in t.reclaim_cursor..end {
            match t.state[p as usize] {
                PageState::Clean => {
                    let n = self.unpin_page(t, p, owner, row, gpu, out);
                    got.freed += n;
                    got.progress += n;
                }
                PageState::Pending => {
                    self.mark_release(t, p);
                    got.marked += 1;
                    got.progress += nb;
                }
                PageState::Dirty => {
                    spills.push(p);
                    got.marked += 1;
                    got.progress += nb;
                }
                _ => {}
            }
        }
        t.reclaim_cursor = end;
        got.end = end;
        got
    }

    /// A pending page `p` is marked release-after-transfer. Returns whether it was pending.
    #[inline]
    pub(in crate::coordinator) fn mark_release(&self, t: &mut ResidentTable, p: u32) -> bool {
        if t.state[p as usize] != PageState::Pending {
            return false;
        }
        t.state[p as usize] = PageState::PendingRelease;
        t.pending_release += 1;
        true
    }

    /// Unpins clean page `p` of the request in `reqs[slot]` (`owner`: slot and generation;
    /// state row `row`): its blocks go back to the free queue, marked so that their reuse is
    /// seen ([`ResidentManager::take_reused`]); the resident entries stay. A page whose blocks
    /// another request shares (a prefix hit adopted them) would not return to the queue: this
    /// request lets go of it at once instead (entries null, recorded for `row`; the request
    /// holds a hot region), and the last holder's release frees it. Returns the blocks freed.
    pub(in crate::coordinator) fn unpin_page(
        &mut self,
        t: &mut ResidentTable,
        p: u32,
        owner: (u32, u32),
        row: u32,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
    ) -> u32 {
        let nb = self.num_buckets;
        let base = (p * nb) as usize;
        if self.is_shared(t, p, gpu) {
            for bk in 0..nb {
                let b = core::mem::replace(&mut t.blocks[base + bk as usize], 0);
                let _ = gpu.free(b);
                out.residency.push(TableUpdate {
                    slot: row,
                    group: 2 + bk,
                    page: p,
                    block: 0,
                });
            }
            t.state[p as usize] = PageState::Reclaimed;
            self.add_host_only(t);
            return 0;
        }
        for bk in 0..nb {
            let b = t.blocks[base + bk as usize];
            // A GPU prefix key it carried goes: the page is no longer adoptable once unpinned
            // (and nobody can re-pin the block through a lookup).
            let _ = gpu.uncache(b);
            let _ = gpu.free(b);
            self.unpinned.push_back(Unpinned {
                block: b,
                block_generation: gpu.generation(b),
                slot: owner.0,
                generation: owner.1,
                page: p,
            });
        }
        t.state[p as usize] = PageState::Unpinned;
        t.unpinned += 1;
        nb
    }

    /// Whether unpinned block `u` is still in the free queue, untouched since it was unpinned.
    #[inline]
    fn intact(gpu: &BlockPool, u: &Unpinned) -> bool {
        gpu.is_free(u.block) && gpu.generation(u.block) == u.block_generation
    }

    /// Pops the unpinned blocks the pool has handed out since the last call (they are at the
    /// front: see the module docs) into `out`; stale entries (their page fell back already or
    /// their request ended) are dropped on the way.
    pub(in crate::coordinator) fn take_reused(&mut self, gpu: &BlockPool, out: &mut Vec<Unpinned>) {
        while let Some(u) = self.unpinned.front() {
            if Self::intact(gpu, u) {
                break;
            }
            out.push(*u);
            self.unpinned.pop_front();
        }
    }

    /// Whether unpinned entry `u` still describes page `u.page` of `t` (the caller has matched
    /// the request and its generation).
    #[inline]
    pub(in crate::coordinator) fn owns(&self, t: &ResidentTable, u: &Unpinned) -> bool {
        let nb = self.num_buckets;
        t.state.get(u.page as usize) == Some(&PageState::Unpinned)
            && t.blocks[(u.page * nb) as usize..((u.page + 1) * nb) as usize].contains(&u.block)
    }

    /// An unpinned page `p` whose block the pool handed out falls back to host: every bucket's
    /// entry becomes null for state row `row` (its other blocks stay in the free queue as plain
    /// free blocks).
    pub(in crate::coordinator) fn fall_back(
        &mut self,
        t: &mut ResidentTable,
        p: u32,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        row: u32,
    ) {
        let nb = self.num_buckets;
        for bk in 0..nb {
            let i = (p * nb + bk) as usize;
            let b = core::mem::replace(&mut t.blocks[i], 0);
            Self::forget(gpu, b);
            out.residency.push(TableUpdate {
                slot: row,
                group: 2 + bk,
                page: p,
                block: 0,
            });
        }
        t.state[p as usize] = PageState::Reclaimed;
        t.unpinned -= 1;
        self.add_host_only(t);
    }

    /// Drops the mark of unpinned block `b` if the pool has not handed it out (it stays a plain
    /// free block; bumping its reuse generation makes its queue entry stale).
    #[inline]
    fn forget(gpu: &mut BlockPool, b: u32) {
        if gpu.is_free(b) {
            let _ = gpu.bump_generation(b);
        }
    }

    /// Page `p`'s transfer is durable: pending → clean; pending-release → unpinned. Returns
    /// whether a release-after-transfer is over.
    #[inline]
    pub(in crate::coordinator) fn on_durable(
        &mut self,
        t: &mut ResidentTable,
        p: u32,
        owner: (u32, u32),
        row: u32,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
    ) -> bool {
        match t.state[p as usize] {
            PageState::Pending => {
                t.state[p as usize] = PageState::Clean;
                false
            }
            PageState::PendingRelease => {
                t.state[p as usize] = PageState::Clean;
                t.pending_release -= 1;
                self.unpin_page(t, p, owner, row, gpu, out);
                true
            }
            _ => false,
        }
    }

    /// Gives back every resident block (reverse order; unpinned pages' blocks are in the free
    /// queue already and lose their marks) and empties the table. Returns the GPU blocks whose
    /// release-after-transfer is no longer in flight.
    #[inline]
    pub(in crate::coordinator) fn release(
        &mut self,
        t: &mut ResidentTable,
        gpu: &mut BlockPool,
        release: &mut Release<'_>,
    ) -> u32 {
        let nb = self.num_buckets as usize;
        for (i, &b) in t.blocks.iter().enumerate().rev() {
            if t.state[i / nb] == PageState::Unpinned {
                Self::forget(gpu, b);
            } else {
                release.block(gpu, PoolKind::Gpu, b);
            }
        }
        let in_flight = t.pending_release * self.num_buckets;
        t.pending_release = 0;
        t.blocks.clear();
        t.state.clear();
        t.xfer.clear();
        if t.host_only > 0 {
            self.host_only_flips += 1;
        }
        t.host_only = 0;
        t.unpinned = 0;
        t.reclaim_cursor = 0;
        t.spill_cursor = 0;
        in_flight
    }

    /// The table's invariants for a running request with `pages` pages (`hit_pages` of them
    /// prefix hits) and `num_computed` tokens, when transfers up to `durable` are durable: table
    /// lengths; null entries exactly on reclaimed pages; nothing unpinned or reclaimed (or
    /// clean) before its host copy is durable; the active tail (see
    /// [`ResidentManager::reclaim_limit`]) never unpinned or reclaimed (prefix hits aside) nor
    /// marked for release; only sealed pages leave the dirty state; an unpinned page's blocks
    /// are free and still carry the marks of entries of this request (`owner`: its index and
    /// generation) — a reused block's page has fallen back; the counters.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::coordinator) fn check(
        &self,
        t: &ResidentTable,
        owner: (u32, u32),
        pages: u32,
        hit_pages: u32,
        num_computed: u32,
        durable: u64,
        gpu: &BlockPool,
    ) -> Result<(), (&'static str, Option<u32>)> {
        let nb = self.num_buckets as usize;
        let bt = self.block_tokens;
        let limit = self.reclaim_limit(pages, num_computed);
        if t.state.len() != pages as usize || t.blocks.len() != pages as usize * nb {
            return Err(("table length", None));
        }
        let (mut host_only, mut pend, mut unpinned) = (0, 0, 0);
        for p in 0..pages {
            let s = t.state[p as usize];
            let entries = &t.blocks[p as usize * nb..(p as usize + 1) * nb];
            let null = entries.iter().all(|&b| b == 0);
            let any_null = entries.contains(&0);
            if (s == PageState::Reclaimed) != null || (s != PageState::Reclaimed && any_null) {
                return Err(("resident entries disagree with page state", Some(p)));
            }
            let released = matches!(s, PageState::Reclaimed | PageState::Unpinned);
            if released {
                if t.xfer[p as usize] > durable {
                    return Err(("page released before its host copy is durable", Some(p)));
                }
                if p >= hit_pages && p >= limit {
                    return Err(("active tail page released", Some(p)));
                }
            }
            match s {
                PageState::Reclaimed => host_only += 1,
                PageState::Unpinned => {
                    unpinned += 1;
                    for &b in entries {
                        let marked = self.unpinned.iter().any(|u| {
                            u.block == b
                                && u.page == p
                                && (u.slot, u.generation) == owner
                                && Self::intact(gpu, u)
                        });
                        if !marked {
                            return Err((
                                "unpinned page's block not in the free queue under its mark",
                                Some(p),
                            ));
                        }
                    }
                }
                PageState::PendingRelease => {
                    pend += 1;
                    if p >= limit {
                        return Err(("active tail page marked for release", Some(p)));
                    }
                }
                _ => {}
            }
            if s.is_durable() && t.xfer[p as usize] > durable {
                return Err(("clean page not durable", Some(p)));
            }
            if (s != PageState::Dirty) && (p + 1) * bt > num_computed {
                return Err(("unsealed page left the dirty state", Some(p)));
            }
        }
        if host_only != t.host_only || pend != t.pending_release || unpinned != t.unpinned {
            return Err(("page counters", None));
        }
        Ok(())
    }
}
