//! Reclaim: which pages may go (the reclaim limit, candidates, spills), planning and running a
//! reclaim pass, unpinning pages lazily and noticing reused blocks (the module docs of
//! [`super`] under "Lazy reclaim"), and the fall-back of a page whose block was reused.

use alloc::vec::Vec;

use super::{PageState, ResidentManager, ResidentTable};
use crate::coordinator::command::{OffloadCommand, TableUpdate};
use crate::layout::ACTIVE_TAIL_PAGES;
use crate::pool::BlockPool;

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

impl ResidentManager {
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
    pub(super) fn intact(gpu: &BlockPool, u: &Unpinned) -> bool {
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
    pub(super) fn forget(gpu: &mut BlockPool, b: u32) {
        if gpu.is_free(b) {
            let _ = gpu.bump_generation(b);
        }
    }
}
