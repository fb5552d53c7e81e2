//! The paged manager: ordinary GPU paging for the indexer group and the regular groups.
//!
//! Every page of a request has one GPU block in the indexer group and one in each regular group,
//! allocated together with the page's resident blocks. Full pages publish their prefix hashes in
//! the GPU pool right away (these groups live only on the GPU, so there is no durability to wait
//! for); a request whose prompt hits the host prefix cache re-pins them. Sliding-window regular
//! groups give back the blocks that fall out of their window (and then nothing is cached).

use alloc::vec;
use alloc::vec::Vec;

use super::{PoolKind, Release};
use crate::coordinator::CoordError;
use crate::coordinator::command::{OffloadCommand, TableUpdate};
use crate::coordinator::error::out_of_memory;
use crate::layout::KvCacheConfig;
use crate::ops::BlockPair;
use crate::pool::{BlockKey, BlockPool, PoolError};

/// The indexer and regular block tables of one request.
#[derive(Clone, Debug, Default)]
pub(in crate::coordinator) struct PagedTable {
    /// Page → indexer block.
    pub(in crate::coordinator) indexer: Vec<u32>,
    /// `page * num_regular + g` → block of regular group `g` (0 once out of a sliding window).
    pub(in crate::coordinator) regular: Vec<u32>,
    /// Per regular group: pages below were given back (sliding window).
    pub(in crate::coordinator) window_cursor: Vec<u32>,
}

/// Ordinary GPU paging of the indexer group (layout group 1) and the regular groups.
#[derive(Clone, Debug)]
pub(in crate::coordinator) struct PagedManager {
    /// Regular group layout indices, and whether each has a sliding window.
    regular_groups: Vec<(u32, Option<u32>)>,
    has_window: bool,
    block_tokens: u32,
}

impl PagedManager {
    /// The paged manager of `kv`'s indexer and regular groups.
    #[inline]
    pub(in crate::coordinator) fn new(kv: &KvCacheConfig) -> Self {
        let regular_groups: Vec<(u32, Option<u32>)> = kv
            .regular_groups()
            .map(|g| (g as u32, kv.groups[g].sliding_window))
            .collect();
        let has_window = regular_groups.iter().any(|g| g.1.is_some());
        PagedManager {
            regular_groups,
            has_window,
            block_tokens: kv.block_tokens,
        }
    }

    /// Whether a regular group has a sliding window (then no prefix is ever cached).
    #[inline]
    pub(in crate::coordinator) fn has_window(&self) -> bool {
        self.has_window
    }

    /// GPU blocks one page costs in these groups (the indexer block and one per regular group).
    #[inline]
    pub(in crate::coordinator) fn blocks_per_page(&self) -> u64 {
        1 + self.regular_groups.len() as u64
    }

    /// An empty table for a new request.
    #[inline]
    pub(in crate::coordinator) fn new_table(&self) -> PagedTable {
        PagedTable {
            indexer: Vec::new(),
            regular: Vec::new(),
            window_cursor: vec![0; self.regular_groups.len()],
        }
    }

    /// Makes room for `pages` more pages without reallocating; a size the allocator refuses is
    /// an error, and the table is unchanged.
    #[inline]
    pub(in crate::coordinator) fn try_reserve(
        &self,
        t: &mut PagedTable,
        pages: usize,
    ) -> Result<(), CoordError> {
        let regular = pages.saturating_mul(self.regular_groups.len());
        t.indexer
            .try_reserve(pages)
            .map_err(|_| out_of_memory::<u32>("indexer page table", pages))?;
        t.regular
            .try_reserve(regular)
            .map_err(|_| out_of_memory::<u32>("regular page tables", regular))
    }

    /// Whether every group still caches a block with prefix hash `hash`.
    #[inline]
    pub(in crate::coordinator) fn is_cached(&self, gpu: &BlockPool, hash: u64) -> bool {
        if gpu.lookup(BlockKey { group: 1, hash }).is_none() {
            return false;
        }
        !self
            .regular_groups
            .iter()
            .any(|&(g, _)| gpu.lookup(BlockKey { group: g, hash }).is_none())
    }

    /// Re-pins the cached blocks of prefix hash `hash` as the request's next page.
    #[inline]
    pub(in crate::coordinator) fn pin_hit(
        &self,
        t: &mut PagedTable,
        gpu: &mut BlockPool,
        hash: u64,
    ) -> Result<(), PoolError> {
        let ib = gpu.lookup(BlockKey { group: 1, hash }).unwrap_or(0);
        gpu.touch(ib)?;
        t.indexer.push(ib);
        for &(g, _) in &self.regular_groups {
            let b = gpu.lookup(BlockKey { group: g, hash }).unwrap_or(0);
            gpu.touch(b)?;
            t.regular.push(b);
        }
        Ok(())
    }

    /// Undoes [`PagedManager::pin_hit`] (a start that did not fit): the blocks keep their
    /// hashes and go to the tail of the LRU queue.
    #[inline]
    pub(in crate::coordinator) fn unpin(&self, t: &mut PagedTable, gpu: &mut BlockPool) {
        let _ = gpu.free_reverse(&t.regular);
        let _ = gpu.free_reverse(&t.indexer);
        t.indexer.clear();
        t.regular.clear();
    }

    /// Gives page `p` private blocks in every group: records the whole-block copies and
    /// releases the shared sources once the command is built (`after_build`).
    #[inline]
    pub(in crate::coordinator) fn copy_on_write(
        &self,
        t: &mut PagedTable,
        p: usize,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        after_build: &mut Vec<(PoolKind, u32)>,
    ) {
        let nr = self.regular_groups.len();
        for b in core::iter::once(&mut t.indexer[p]).chain(&mut t.regular[p * nr..(p + 1) * nr]) {
            let nbk = gpu.allocate().unwrap_or(0);
            out.gpu_cow.push(BlockPair { src: *b, dst: nbk });
            after_build.push((PoolKind::Gpu, *b));
            *b = nbk;
        }
    }

    /// Records the block-table entries of pages `0..pages` (prefix hits) for state row `slot`.
    #[inline]
    pub(in crate::coordinator) fn hit_tables(
        &self,
        t: &PagedTable,
        slot: u32,
        pages: u32,
        out: &mut OffloadCommand,
    ) {
        let nr = self.regular_groups.len();
        for p in 0..pages {
            let pu = p as usize;
            out.block_tables.push(TableUpdate {
                slot,
                group: 1,
                page: p,
                block: t.indexer[pu],
            });
            for gi in 0..nr {
                out.block_tables.push(TableUpdate {
                    slot,
                    group: self.regular_groups[gi].0,
                    page: p,
                    block: t.regular[pu * nr + gi],
                });
            }
        }
    }

    /// Allocates page `p` (the next one) in every group. The caller has checked that the GPU
    /// pool has the blocks.
    #[inline]
    pub(in crate::coordinator) fn allocate_page(
        &self,
        t: &mut PagedTable,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        slot: u32,
        p: u32,
    ) {
        let b = gpu.allocate().unwrap_or(0);
        t.indexer.push(b);
        out.block_tables.push(TableUpdate {
            slot,
            group: 1,
            page: p,
            block: b,
        });
        for &(g, _) in &self.regular_groups {
            let b = gpu.allocate().unwrap_or(0);
            t.regular.push(b);
            out.block_tables.push(TableUpdate {
                slot,
                group: g,
                page: p,
                block: b,
            });
        }
    }

    /// Publishes the prefix hashes of full pages `pages` in the GPU prefix cache.
    #[inline]
    pub(in crate::coordinator) fn publish(
        &self,
        t: &PagedTable,
        gpu: &mut BlockPool,
        hashes: &[u64],
        pages: core::ops::Range<u32>,
    ) {
        let nr = self.regular_groups.len();
        for p in pages {
            let hash = hashes[p as usize];
            let _ = gpu.cache(t.indexer[p as usize], BlockKey { group: 1, hash });
            for (gi, &(g, _)) in self.regular_groups.iter().enumerate() {
                let _ = gpu.cache(t.regular[p as usize * nr + gi], BlockKey { group: g, hash });
            }
        }
    }

    /// Sliding windows: gives back the blocks wholly before `num_computed - window`.
    #[inline]
    pub(in crate::coordinator) fn slide_windows(
        &self,
        t: &mut PagedTable,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        slot: u32,
        num_computed: u32,
    ) -> Result<(), PoolError> {
        if !self.has_window {
            return Ok(());
        }
        let nr = self.regular_groups.len();
        for gi in 0..nr {
            let (g, Some(w)) = self.regular_groups[gi] else {
                continue;
            };
            let keep_from = num_computed.saturating_sub(w) / self.block_tokens;
            while t.window_cursor[gi] < keep_from {
                let p = t.window_cursor[gi];
                let i = p as usize * nr + gi;
                let b = core::mem::replace(&mut t.regular[i], 0);
                if b != 0 {
                    gpu.free(b)?;
                    out.block_tables.push(TableUpdate {
                        slot,
                        group: g,
                        page: p,
                        block: 0,
                    });
                }
                t.window_cursor[gi] += 1;
            }
        }
        Ok(())
    }

    /// Restarts the sliding windows (a request starting).
    #[inline]
    pub(in crate::coordinator) fn reset_windows(&self, t: &mut PagedTable) {
        for c in t.window_cursor.iter_mut() {
            *c = 0;
        }
    }

    /// Gives back every block (regular groups, then the indexer, each in reverse order) and
    /// empties the table.
    #[inline]
    pub(in crate::coordinator) fn release(
        &self,
        t: &mut PagedTable,
        gpu: &mut BlockPool,
        release: &mut Release<'_>,
    ) {
        for &b in t.regular.iter().rev().chain(t.indexer.iter().rev()) {
            release.block(gpu, PoolKind::Gpu, b);
        }
        t.indexer.clear();
        t.regular.clear();
    }

    /// Block of page `p` in regular group `gi` (`0..num_regular`).
    #[inline]
    pub(in crate::coordinator) fn regular_block(&self, t: &PagedTable, p: usize, gi: usize) -> u32 {
        t.regular[p * self.regular_groups.len() + gi]
    }
}
