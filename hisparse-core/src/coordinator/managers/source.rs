//! The source manager: the host pool's side of every request.
//!
//! Every page of a request gets a host block — the durable home of its sparse rows — as soon as
//! the request starts (the whole prompt) or grows (decode). Full pages get chained prefix hashes;
//! a page's hash is published in the host prefix cache only once the page is inside the
//! request's contiguous durable prefix ([`SourceTable::ready_prefix`]), so a later request never
//! reuses a host page whose copy is still in flight. A request that reuses every page of its
//! prompt takes a private copy (copy-on-write) of the shared last page.

use alloc::vec::Vec;

use super::resident::ResidentTable;
use super::{PoolKind, Release};
use crate::coordinator::CoordError;
use crate::coordinator::command::{OffloadCommand, TableUpdate};
use crate::coordinator::error::out_of_memory;
use crate::ops::BlockPair;
use crate::pool::{BlockKey, BlockPool, PoolError};

const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = parent ^ 0x9E37_79B9_7F4A_7C15;
    for &t in tokens {
        h ^= u64::from(t);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
        h ^= h >> 29;
    }
    h
}

/// The source table of one request.
#[derive(Clone, Debug, Default)]
pub(in crate::coordinator) struct SourceTable {
    /// Page → host block.
    pub(in crate::coordinator) blocks: Vec<u32>,
    /// Chained prefix hash of every full page computed so far.
    pub(in crate::coordinator) hashes: Vec<u64>,
    /// Length in pages of the contiguous durable prefix.
    pub(in crate::coordinator) ready_prefix: u32,
}

/// Host blocks for every page, prefix hashes, the host prefix cache (group 0) and host
/// copy-on-write.
#[derive(Clone, Copy, Debug)]
pub(in crate::coordinator) struct SourceManager {
    block_tokens: u32,
    caching: bool,
}

impl SourceManager {
    /// The source manager for `block_tokens`-token pages; `caching`: prefix caching is enabled
    /// and possible (no sliding-window group).
    #[inline]
    pub(in crate::coordinator) fn new(block_tokens: u32, caching: bool) -> Self {
        SourceManager {
            block_tokens,
            caching,
        }
    }

    /// Whether prefix hashes are looked up and published (host and GPU groups alike).
    #[inline]
    pub(in crate::coordinator) fn caching(&self) -> bool {
        self.caching
    }

    /// Makes room for `pages` more host pages without reallocating; a size the allocator
    /// refuses is an error.
    #[inline]
    pub(in crate::coordinator) fn try_reserve(
        &self,
        t: &mut SourceTable,
        pages: usize,
    ) -> Result<(), CoordError> {
        t.blocks
            .try_reserve(pages)
            .map_err(|_| out_of_memory::<u32>("host page table", pages))?;
        let more = pages.saturating_sub(t.hashes.len());
        t.hashes
            .try_reserve(more)
            .map_err(|_| out_of_memory::<u64>("prefix hashes", more))
    }

    /// Recomputes the hashes of every full page of `tokens` (a request starting).
    #[inline]
    pub(in crate::coordinator) fn hash_prompt(&self, t: &mut SourceTable, tokens: &[u32]) {
        let bt = self.block_tokens;
        let len = tokens.len() as u32;
        t.hashes.clear();
        let mut h = HASH_SEED;
        for p in 0..len / bt {
            h = chain_hash(h, &tokens[(p * bt) as usize..((p + 1) * bt) as usize]);
            t.hashes.push(h);
        }
    }

    /// Extends the hashes to the first `sealed` pages of `tokens` (pages that became full).
    #[inline]
    pub(in crate::coordinator) fn hash_sealed(
        &self,
        t: &mut SourceTable,
        tokens: &[u32],
        sealed: u32,
    ) {
        let bt = self.block_tokens;
        while (t.hashes.len() as u32) < sealed {
            let p = t.hashes.len() as u32;
            let parent = if p == 0 {
                HASH_SEED
            } else {
                t.hashes[p as usize - 1]
            };
            let h = chain_hash(parent, &tokens[(p * bt) as usize..((p + 1) * bt) as usize]);
            t.hashes.push(h);
        }
    }

    /// Whether a durable host page with prefix hash `hash` is cached.
    #[inline]
    pub(in crate::coordinator) fn is_cached(&self, host: &BlockPool, hash: u64) -> bool {
        host.lookup(BlockKey { group: 0, hash }).is_some()
    }

    /// Re-pins the cached host block of prefix hash `hash` as the request's next page.
    #[inline]
    pub(in crate::coordinator) fn pin_hit(
        &self,
        t: &mut SourceTable,
        host: &mut BlockPool,
        hash: u64,
    ) -> Result<(), PoolError> {
        let hb = host.lookup(BlockKey { group: 0, hash }).unwrap_or(0);
        host.touch(hb)?;
        t.blocks.push(hb);
        Ok(())
    }

    /// Undoes [`SourceManager::pin_hit`] (a start that did not fit): the blocks keep their
    /// hashes and go to the tail of the LRU queue.
    #[inline]
    pub(in crate::coordinator) fn unpin(&self, t: &mut SourceTable, host: &mut BlockPool) {
        let _ = host.free_reverse(&t.blocks);
        t.blocks.clear();
    }

    /// Gives page `p` a private host block: records the host → host copy, the new block (hot
    /// entries caching its old rows must go) and releases the shared source once the command
    /// is built (`after_build`), so that no request of this step is handed it. Returns the new
    /// block.
    #[inline]
    pub(in crate::coordinator) fn copy_on_write(
        &self,
        t: &mut SourceTable,
        p: usize,
        host: &mut BlockPool,
        out: &mut OffloadCommand,
        after_build: &mut Vec<(PoolKind, u32)>,
    ) -> u32 {
        let old = t.blocks[p];
        let nbk = host.allocate().unwrap_or(0);
        out.host_cow.push(BlockPair { src: old, dst: nbk });
        out.new_host_blocks.push(nbk);
        after_build.push((PoolKind::Host, old));
        t.blocks[p] = nbk;
        nbk
    }

    /// Records the host-table entries of pages `0..pages` (prefix hits) for state row `slot`.
    #[inline]
    pub(in crate::coordinator) fn hit_tables(
        &self,
        t: &SourceTable,
        slot: u32,
        pages: u32,
        out: &mut OffloadCommand,
    ) {
        for p in 0..pages {
            out.host_blocks.push(TableUpdate {
                slot,
                group: 0,
                page: p,
                block: t.blocks[p as usize],
            });
        }
    }

    /// Gives the request host blocks up to `pages` pages. The caller has checked that the host
    /// pool has them.
    #[inline(always)]
    pub(in crate::coordinator) fn grow(
        &self,
        t: &mut SourceTable,
        host: &mut BlockPool,
        out: &mut OffloadCommand,
        slot: u32,
        pages: u32,
    ) {
        while (t.blocks.len() as u32) < pages {
            let b = host.allocate().unwrap_or(0);
            out.new_host_blocks.push(b);
            out.host_blocks.push(TableUpdate {
                slot,
                group: 0,
                page: t.blocks.len() as u32,
                block: b,
            });
            t.blocks.push(b);
        }
    }

    /// Advances the durable prefix over the sealed pages (the first `sealed`) that are clean or
    /// unpinned or reclaimed, publishing their hashes in the host prefix cache: hashes are never published
    /// past the durable prefix.
    #[inline]
    pub(in crate::coordinator) fn advance_ready(
        &self,
        t: &mut SourceTable,
        resident: &ResidentTable,
        sealed: u32,
        host: &mut BlockPool,
    ) {
        while t.ready_prefix < sealed && resident.state[t.ready_prefix as usize].is_durable() {
            let p = t.ready_prefix as usize;
            if self.caching && p < t.hashes.len() {
                let _ = host.cache(
                    t.blocks[p],
                    BlockKey {
                        group: 0,
                        hash: t.hashes[p],
                    },
                );
            }
            t.ready_prefix += 1;
        }
    }

    /// Publishes durable host block `block` under prefix hash `hash` (a page of a released
    /// request; the block is still held).
    #[inline]
    pub(in crate::coordinator) fn publish(&self, host: &mut BlockPool, block: u32, hash: u64) {
        if self.caching {
            let _ = host.cache(block, BlockKey { group: 0, hash });
        }
    }

    /// Gives back every host block of the request (reverse order) and empties the table.
    #[inline]
    pub(in crate::coordinator) fn release(
        &self,
        t: &mut SourceTable,
        host: &mut BlockPool,
        release: &mut Release<'_>,
    ) {
        for &b in t.blocks.iter().rev() {
            release.block(host, PoolKind::Host, b);
        }
        t.blocks.clear();
        t.ready_prefix = 0;
    }

    /// Writes the host table as an `i32` row: page → host block, `-1` beyond the request.
    #[inline]
    pub(in crate::coordinator) fn row(&self, t: &SourceTable, out: &mut [i32]) {
        for (p, o) in out.iter_mut().enumerate() {
            *o = t.blocks.get(p).map_or(-1, |&b| b as i32);
        }
    }

    /// The table's invariants: no host prefix hash published past the durable prefix, and the
    /// durable prefix covers only durable pages (clean, unpinned, reclaimed).
    pub(in crate::coordinator) fn check(
        &self,
        t: &SourceTable,
        resident: &ResidentTable,
        host: &BlockPool,
    ) -> Result<(), (&'static str, Option<u32>)> {
        for p in 0..t.blocks.len() as u32 {
            let durable = p < t.ready_prefix;
            if !durable && host.key_of(t.blocks[p as usize]).is_some() {
                return Err((
                    "host prefix hash published past the durable prefix",
                    Some(p),
                ));
            }
        }
        for p in 0..t.ready_prefix {
            if !resident.state[p as usize].is_durable() {
                return Err(("ready prefix covers a page that is not durable", Some(p)));
            }
        }
        Ok(())
    }
}
