//! The resident manager: the GPU copy of every page of a request, one block per bucket (the
//! layers of resident group `2 + bucket`), and the page lifecycle.
//!
//! `dirty` (GPU only) → `pending` (host transfer in flight) → `clean` (host copy durable, GPU
//! copy still readable) → `reclaimed` (GPU blocks back in the pool, entries null: "read from
//! host"). A pending page may be marked release-after-transfer (`pending-release`): it is
//! reclaimed as soon as its transfer is durable. A page is a reclaim candidate only when it is
//! sealed (full), outside the active tail (the page the next token writes and the one before
//! it, [`ACTIVE_TAIL_PAGES`] in all), and not below the request's reclaim cursor; nothing is
//! reclaimed before its host copy is durable.

use alloc::vec::Vec;

use super::{PoolKind, Release};
use crate::coordinator::CoordError;
use crate::coordinator::command::{OffloadCommand, PageTransfer, TableUpdate};
use crate::coordinator::error::out_of_memory;
use crate::layout::ACTIVE_TAIL_PAGES;
use crate::pool::BlockPool;

// Page states.
pub(in crate::coordinator) const DIRTY: u8 = 0;
pub(in crate::coordinator) const PENDING: u8 = 1;
pub(in crate::coordinator) const PENDING_RELEASE: u8 = 2;
pub(in crate::coordinator) const CLEAN: u8 = 3;
pub(in crate::coordinator) const RECLAIMED: u8 = 4;

/// Lifecycle state of one page of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageState {
    /// Only on the GPU.
    Dirty,
    /// Host transfer in flight.
    Pending,
    /// Host transfer in flight; the GPU copy is released when it completes.
    PendingRelease,
    /// Host copy durable, GPU copy still readable.
    Clean,
    /// GPU copy released; read from host.
    Reclaimed,
}

/// The public state of a stored page state.
pub(in crate::coordinator) fn page_state(s: u8) -> PageState {
    match s {
        DIRTY => PageState::Dirty,
        PENDING => PageState::Pending,
        PENDING_RELEASE => PageState::PendingRelease,
        CLEAN => PageState::Clean,
        _ => PageState::Reclaimed,
    }
}

/// The resident table and page lifecycle of one request.
#[derive(Clone, Debug, Default)]
pub(in crate::coordinator) struct ResidentTable {
    /// `page * num_buckets + b` → GPU block (0 = reclaimed: read from host).
    pub(in crate::coordinator) blocks: Vec<u32>,
    /// Page → lifecycle state (`DIRTY` ..= `RECLAIMED`).
    pub(in crate::coordinator) state: Vec<u8>,
    /// Transfer id that made the page durable (0 = durable from the start).
    pub(in crate::coordinator) xfer: Vec<u64>,
    /// Pages below are reclaimed, marked for release, or prefix hits.
    pub(in crate::coordinator) reclaim_cursor: u32,
    /// Non-eager: pages below have a transfer planned.
    pub(in crate::coordinator) spill_cursor: u32,
    /// Pages with null resident entries.
    pub(in crate::coordinator) host_only: u32,
    /// Pages marked release-after-transfer.
    pub(in crate::coordinator) pending_release: u32,
}

/// The resident groups (one per bucket) and the page lifecycle.
#[derive(Clone, Copy, Debug)]
pub(in crate::coordinator) struct ResidentManager {
    num_buckets: u32,
    block_tokens: u32,
}

impl ResidentManager {
    /// The resident manager for `num_buckets` buckets of `block_tokens`-token pages.
    #[inline]
    pub(in crate::coordinator) fn new(num_buckets: u32, block_tokens: u32) -> Self {
        ResidentManager {
            num_buckets,
            block_tokens,
        }
    }

    /// Number of buckets (resident groups); a page costs one GPU block per bucket.
    #[inline]
    pub(in crate::coordinator) fn num_buckets(&self) -> u32 {
        self.num_buckets
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
            .map_err(|_| out_of_memory::<u8>("page states", pages))?;
        t.xfer
            .try_reserve(pages)
            .map_err(|_| out_of_memory::<u64>("page transfer ids", pages))?;
        t.blocks
            .try_reserve(blocks)
            .map_err(|_| out_of_memory::<u32>("resident page tables", blocks))
    }

    /// Whether some page reads from host now or will once its transfer completes (the request
    /// then needs a hot region).
    #[inline]
    pub(in crate::coordinator) fn reads_from_host(&self, t: &ResidentTable) -> bool {
        t.host_only > 0 || t.pending_release > 0
    }

    /// Appends a prefix-hit page: durable on host from the start, never resident.
    #[inline]
    pub(in crate::coordinator) fn push_hit_page(&self, t: &mut ResidentTable) {
        for _ in 0..self.num_buckets {
            t.blocks.push(0);
        }
        t.state.push(RECLAIMED);
        t.xfer.push(0);
    }

    /// Makes page `p` resident again from host block `host_block` (a copy-on-write tail): new
    /// blocks, the host → device restores, and the page is dirty (the forward writes its last
    /// row).
    #[inline]
    pub(in crate::coordinator) fn restore(
        &self,
        t: &mut ResidentTable,
        p: usize,
        host_block: u32,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
    ) {
        let nb = self.num_buckets as usize;
        for bk in 0..nb {
            let rb = gpu.allocate().unwrap_or(0);
            t.blocks[p * nb + bk] = rb;
            out.restores.push(PageTransfer {
                bucket: bk as u32,
                device_block: rb,
                host_block,
            });
        }
        // Rows 0..block_size-1 are restored; the last row is written by the forward.
        t.state[p] = DIRTY;
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
        t.state.push(DIRTY);
        t.xfer.push(0);
    }

    /// Whether page `p` is reclaimed (read from host).
    #[inline]
    pub(in crate::coordinator) fn is_reclaimed(&self, t: &ResidentTable, p: u32) -> bool {
        t.state.get(p as usize) == Some(&RECLAIMED)
    }

    /// GPU block of page `p` in `bucket`.
    #[inline]
    pub(in crate::coordinator) fn block(&self, t: &ResidentTable, p: u32, bucket: u32) -> u32 {
        t.blocks[(p * self.num_buckets + bucket) as usize]
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
        if t.state[p as usize] != DIRTY {
            return false;
        }
        t.state[p as usize] = PENDING;
        t.xfer[p as usize] = xfer;
        true
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

    /// Releases the GPU blocks of page `p` (its host copy is durable): entries become null for
    /// state row `row`, the page is reclaimed.
    #[inline]
    pub(in crate::coordinator) fn release_page(
        &self,
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
            if b != 0 {
                let _ = gpu.free(b);
            }
            out.residency.push(TableUpdate {
                slot: row,
                group: 2 + bk,
                page: p,
                block: 0,
            });
        }
        t.state[p as usize] = RECLAIMED;
        t.host_only += 1;
    }

    /// Page `p`'s transfer is durable: pending → clean; pending-release → reclaimed. Returns
    /// whether blocks were released (the in-flight release is over).
    #[inline]
    pub(in crate::coordinator) fn on_durable(
        &self,
        t: &mut ResidentTable,
        p: u32,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        row: u32,
    ) -> bool {
        match t.state[p as usize] {
            PENDING => {
                t.state[p as usize] = CLEAN;
                false
            }
            PENDING_RELEASE => {
                self.release_page(t, p, gpu, out, row);
                t.pending_release -= 1;
                true
            }
            _ => false,
        }
    }

    /// Gives back every resident block (reverse order) and empties the table. Returns the GPU
    /// blocks whose release-after-transfer is no longer in flight.
    #[inline]
    pub(in crate::coordinator) fn release(
        &self,
        t: &mut ResidentTable,
        gpu: &mut BlockPool,
        release: &mut Release<'_>,
    ) -> u32 {
        for &b in t.blocks.iter().rev() {
            release.block(gpu, PoolKind::Gpu, b);
        }
        let in_flight = t.pending_release * self.num_buckets;
        t.pending_release = 0;
        t.blocks.clear();
        t.state.clear();
        t.xfer.clear();
        t.host_only = 0;
        t.reclaim_cursor = 0;
        t.spill_cursor = 0;
        in_flight
    }

    /// The table's invariants for a running request with `pages` pages (`hit_pages` of them
    /// prefix hits) and `num_computed` tokens, when transfers up to `durable` are durable: table
    /// lengths; null entries exactly on reclaimed pages; nothing reclaimed (or clean) before its
    /// host copy is durable; the active tail (see [`ResidentManager::reclaim_limit`]) never
    /// reclaimed (prefix hits aside) nor marked for release; only sealed pages leave the dirty state; the counters.
    pub(in crate::coordinator) fn check(
        &self,
        t: &ResidentTable,
        pages: u32,
        hit_pages: u32,
        num_computed: u32,
        durable: u64,
    ) -> Result<(), (&'static str, Option<u32>)> {
        let nb = self.num_buckets as usize;
        let bt = self.block_tokens;
        let limit = self.reclaim_limit(pages, num_computed);
        if t.state.len() != pages as usize || t.blocks.len() != pages as usize * nb {
            return Err(("table length", None));
        }
        let (mut host_only, mut pend) = (0, 0);
        for p in 0..pages {
            let s = t.state[p as usize];
            let null = t.blocks[p as usize * nb..(p as usize + 1) * nb]
                .iter()
                .all(|&b| b == 0);
            let any_null = t.blocks[p as usize * nb..(p as usize + 1) * nb].contains(&0);
            if (s == RECLAIMED) != null || (s != RECLAIMED && any_null) {
                return Err(("resident entries disagree with page state", Some(p)));
            }
            if s == RECLAIMED {
                host_only += 1;
                if t.xfer[p as usize] > durable {
                    return Err(("page reclaimed before its host copy is durable", Some(p)));
                }
                if p >= hit_pages && p >= limit {
                    return Err(("active tail page reclaimed", Some(p)));
                }
            }
            if s == PENDING_RELEASE {
                pend += 1;
                if p >= limit {
                    return Err(("active tail page marked for release", Some(p)));
                }
            }
            if (s == CLEAN || s == RECLAIMED) && t.xfer[p as usize] > durable {
                return Err(("clean page not durable", Some(p)));
            }
            if (s != DIRTY) && (p + 1) * bt > num_computed {
                return Err(("unsealed page left the dirty state", Some(p)));
            }
        }
        if host_only != t.host_only || pend != t.pending_release {
            return Err(("page counters", None));
        }
        Ok(())
    }
}
