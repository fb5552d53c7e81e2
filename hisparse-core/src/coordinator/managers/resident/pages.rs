//! The page state machine: allocating a page (dirty), sealing it (pending), its transfer
//! becoming durable (clean, or unpinned after a release-after-transfer), spills and unseals,
//! giving a request's pages back, and the table's invariants.

use super::{PageState, ResidentManager, ResidentTable};
use crate::coordinator::command::{OffloadCommand, TableUpdate};
use crate::coordinator::managers::{PoolKind, Release};
use crate::pool::BlockPool;

impl ResidentManager {
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
