//! The prefix cache of resident pages: pages a request adopts from a prefix hit (on the GPU or
//! read from host), publishing and unpublishing a request's resident pages under their block
//! hashes, and staging a prefix that lives on host back onto the GPU for prefill.

use alloc::vec::Vec;

use super::{PageState, ResidentManager, ResidentTable};
use crate::coordinator::command::{OffloadCommand, PageTransfer, TableUpdate};
use crate::pool::{BlockKey, BlockPool};

impl ResidentManager {
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

    /// Stages the context of a prefill chunk (`docs/residency.md`, "Prefill over host-only context"): every
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
}
