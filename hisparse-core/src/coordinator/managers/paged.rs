//! The paged manager: ordinary GPU paging for the indexer group and the regular groups.
//!
//! The indexer group pages like the sparse layers: one block per page (`block_tokens` tokens),
//! allocated with the page's resident blocks. A regular group has its own block size
//! (`KvCacheGroup::block_tokens`, dividing the page): its table has one column per block of its
//! own, and a page covers `block_tokens / group block tokens` columns. A sliding-window group
//! keeps only the columns its window still needs: before a step computing tokens
//! `first..target` it allocates the columns from the one holding token `first - window`; after
//! it, it gives back the columns wholly before the window of the earliest token a rollback of
//! that step's speculative tokens may return to ([`PagedManager::slide_windows`]).
//!
//! Prefix caching: once a page is full, its indexer block and the regular columns it covers
//! publish prefix hashes in the GPU pool right away (these groups live only on the GPU, so there
//! is no durability to wait for; a column's key is derived from its page's hash and its place in
//! the page). A request whose prompt hits the host prefix cache re-pins them: every block of
//! the hit pages in the indexer and full-attention groups, but in a sliding-window group only
//! the columns the window of the first recomputed token needs — the rest of the prefix is never
//! read there, so a hit needs only the window's last blocks on the GPU.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::{PoolKind, Release};
use crate::coordinator::CoordError;
use crate::coordinator::command::{OffloadCommand, TableUpdate};
use crate::coordinator::error::out_of_memory;
use crate::layout::KvCacheConfig;
use crate::ops::BlockPair;
use crate::pool::{BlockKey, BlockPool, PoolError};

/// The blocks one request holds in one regular group: columns `first..first + blocks.len()`.
#[derive(Clone, Debug, Default)]
pub(in crate::coordinator) struct Columns {
    /// Column of `blocks[0]` (columns below were given back, or never needed).
    pub(in crate::coordinator) first: u32,
    /// Column → GPU block, from `first` on.
    pub(in crate::coordinator) blocks: VecDeque<u32>,
}

impl Columns {
    /// One past the last column held.
    #[inline]
    fn end(&self) -> u32 {
        self.first + self.blocks.len() as u32
    }

    /// Block of column `c` (0 when not held).
    #[inline]
    pub(in crate::coordinator) fn get(&self, c: u32) -> u32 {
        c.checked_sub(self.first)
            .and_then(|i| self.blocks.get(i as usize))
            .copied()
            .unwrap_or(0)
    }
}

/// The indexer and regular block tables of one request.
#[derive(Clone, Debug, Default)]
pub(in crate::coordinator) struct PagedTable {
    /// Page → indexer block.
    pub(in crate::coordinator) indexer: Vec<u32>,
    /// Per regular group: the columns it holds.
    pub(in crate::coordinator) regular: Vec<Columns>,
}

impl PagedTable {
    /// Every GPU block the table holds.
    pub(in crate::coordinator) fn blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.indexer
            .iter()
            .copied()
            .chain(self.regular.iter().flat_map(|c| c.blocks.iter().copied()))
    }

    /// Whether the table holds GPU block `b`.
    pub(in crate::coordinator) fn holds(&self, b: u32) -> bool {
        self.indexer.contains(&b) || self.regular.iter().any(|c| c.blocks.contains(&b))
    }
}

/// One regular group's paging rules.
#[derive(Clone, Copy, Debug)]
struct Group {
    /// Layout group index.
    group: u32,
    /// Tokens per block.
    block_tokens: u32,
    /// Sliding window in tokens.
    window: Option<u32>,
    /// Columns per page (`page tokens / block_tokens`).
    per_page: u32,
}

impl Group {
    /// Column of token `t`.
    #[inline]
    fn column(&self, t: u32) -> u32 {
        t / self.block_tokens
    }

    /// Columns covering tokens `0..t`.
    #[inline]
    fn columns(&self, t: u32) -> u32 {
        t.div_ceil(self.block_tokens)
    }

    /// Columns a request holding columns `first_col..end_col` (none when they are equal: then
    /// `first_col` is where its columns start) newly needs to compute tokens `first..target`:
    /// those from the window of `first` (or past what it holds) to `target`'s.
    #[inline]
    fn new_columns(&self, first_col: u32, end_col: u32, first: u32, target: u32) -> u64 {
        let from = if end_col == first_col {
            self.window_start(first).max(first_col)
        } else {
            end_col.max(self.window_start(first))
        };
        u64::from(self.columns(target).saturating_sub(from))
    }

    /// First column token `t` attends to (0 for a full group).
    #[inline]
    fn window_start(&self, t: u32) -> u32 {
        match self.window {
            Some(w) => t.saturating_sub(w) / self.block_tokens,
            None => 0,
        }
    }
}

/// The prefix key of column `k` of a page with prefix hash `hash` (the hash itself for the
/// first column, so groups with page-sized blocks key by the page's hash).
#[inline]
fn column_key(group: u32, hash: u64, k: u32) -> BlockKey {
    let hash = if k == 0 {
        hash
    } else {
        let mut h = hash ^ u64::from(k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 31;
        h.wrapping_mul(0xBF58_476D_1CE4_E5B9)
    };
    BlockKey { group, hash }
}

/// Ordinary GPU paging of the indexer group (layout group 1) and the regular groups.
#[derive(Clone, Debug)]
pub(in crate::coordinator) struct PagedManager {
    groups: Vec<Group>,
    has_window: bool,
    block_tokens: u32,
    /// Tokens of a step a rollback may give back (`max_query_len - 1`).
    spec_tokens: u32,
}

impl PagedManager {
    /// The paged manager of `kv`'s indexer and regular groups.
    #[inline]
    pub(in crate::coordinator) fn new(kv: &KvCacheConfig) -> Self {
        let bt = kv.block_tokens.max(1);
        let groups: Vec<Group> = kv
            .regular_groups()
            .map(|g| {
                let gbt = kv.group_block_tokens(g);
                Group {
                    group: g as u32,
                    block_tokens: gbt,
                    window: kv.groups[g].sliding_window,
                    per_page: (bt / gbt).max(1),
                }
            })
            .collect();
        let has_window = groups.iter().any(|g| g.window.is_some());
        PagedManager {
            groups,
            has_window,
            block_tokens: bt,
            spec_tokens: kv.config.max_query_len.max(1) - 1,
        }
    }

    /// Whether a regular group has a sliding window.
    #[inline]
    pub(in crate::coordinator) fn has_window(&self) -> bool {
        self.has_window
    }

    /// Whether the layout has regular groups (whose block counts do not follow the pages).
    #[inline]
    pub(in crate::coordinator) fn has_regular(&self) -> bool {
        !self.groups.is_empty()
    }

    /// GPU blocks one page costs in the indexer group.
    #[inline]
    pub(in crate::coordinator) fn blocks_per_page(&self) -> u64 {
        1
    }

    /// An empty table for a new request.
    #[inline]
    pub(in crate::coordinator) fn new_table(&self) -> PagedTable {
        PagedTable {
            indexer: Vec::new(),
            regular: (0..self.groups.len()).map(|_| Columns::default()).collect(),
        }
    }

    /// Makes room for `pages` more pages without reallocating (and for the window's columns of
    /// every sliding-window group); a size the allocator refuses is an error, and the table is
    /// unchanged.
    #[inline]
    pub(in crate::coordinator) fn try_reserve(
        &self,
        t: &mut PagedTable,
        pages: usize,
    ) -> Result<(), CoordError> {
        t.indexer
            .try_reserve(pages)
            .map_err(|_| out_of_memory::<u32>("indexer page table", pages))?;
        for (g, c) in self.groups.iter().zip(t.regular.iter_mut()) {
            let cols = match g.window {
                Some(w) => (u64::from(w) + 2 * u64::from(self.spec_tokens))
                    .div_ceil(u64::from(g.block_tokens))
                    .saturating_add(2)
                    .min(pages as u64 * u64::from(g.per_page)) as usize,
                None => pages.saturating_mul(g.per_page as usize),
            };
            c.blocks
                .try_reserve(cols)
                .map_err(|_| out_of_memory::<u32>("regular block tables", cols))?;
        }
        Ok(())
    }

    /// Regular-group blocks scheduling tokens `first..target` newly allocates (the indexer's
    /// are counted with the pages).
    #[inline]
    pub(in crate::coordinator) fn regular_need(
        &self,
        t: &PagedTable,
        first: u32,
        target: u32,
    ) -> u64 {
        self.groups
            .iter()
            .zip(&t.regular)
            .map(|(g, c)| g.new_columns(c.first, c.end(), first, target))
            .sum()
    }

    /// [`PagedManager::regular_need`] of a table holding just what a prefix hit of `hit` pages
    /// with first recomputed token `resume` pins ([`PagedManager::pin_hit`]): a start's need,
    /// decided before it pins anything.
    #[inline]
    pub(in crate::coordinator) fn hit_regular_need(
        &self,
        hit: u32,
        resume: u32,
        first: u32,
        target: u32,
    ) -> u64 {
        self.groups
            .iter()
            .map(|g| {
                let cols = self.hit_range(g, hit, resume);
                g.new_columns(cols.start, cols.end.max(cols.start), first, target)
            })
            .sum()
    }

    /// Whether page `p` (prefix hash `hash`) is cached in the indexer group and in every full
    /// regular group. With `indexer_on_host` (the page's indexer rows are backed up with its
    /// host copy) the indexer block need not be cached: a hit restores it from host.
    #[inline]
    pub(in crate::coordinator) fn is_cached(
        &self,
        gpu: &BlockPool,
        hash: u64,
        indexer_on_host: bool,
    ) -> bool {
        if !indexer_on_host && !Self::indexer_cached(gpu, hash) {
            return false;
        }
        self.groups
            .iter()
            .filter(|g| g.window.is_none())
            .all(|g| (0..g.per_page).all(|k| gpu.lookup(column_key(g.group, hash, k)).is_some()))
    }

    /// Whether the indexer block of the page with prefix hash `hash` is cached on the GPU.
    #[inline]
    pub(in crate::coordinator) fn indexer_cached(gpu: &BlockPool, hash: u64) -> bool {
        gpu.lookup(BlockKey { group: 1, hash }).is_some()
    }

    /// After [`PagedManager::pin_hit`] and the start's accounting: gives every hit page whose
    /// indexer block was not cached (pinned as `0`) a new block, and plans its restore from
    /// the page's host block (`host[p]`) in the indexer host cache. The caller has checked
    /// that the GPU pool has the blocks (a page it could not give one stays null, and nothing
    /// is restored into the null block).
    pub(in crate::coordinator) fn restore_uncached_indexer(
        &self,
        t: &mut PagedTable,
        gpu: &mut BlockPool,
        host: &[u32],
        out: &mut OffloadCommand,
    ) {
        for (p, b) in t.indexer.iter_mut().enumerate() {
            if *b != 0 {
                continue;
            }
            *b = gpu.allocate().unwrap_or(0);
            if let (Some(&src), true) = (host.get(p), *b != 0) {
                out.indexer_restores.push(BlockPair { src, dst: *b });
            }
        }
    }

    /// The columns a regular group pins for a prefix hit of `hit` pages whose first
    /// recomputed token is `resume`: every column of the hit in a full group; in a
    /// sliding-window group, from the one the window of `resume` starts in to the end of the
    /// hit.
    #[inline]
    fn hit_range(&self, g: &Group, hit: u32, resume: u32) -> core::ops::Range<u32> {
        match g.window {
            Some(_) => g.window_start(resume)..hit * g.per_page,
            None => 0..hit * g.per_page,
        }
    }

    /// The prefix keys of every block a prefix hit of `hit` pages (`hashes`, first recomputed
    /// token `resume`) pins, with where each goes: `None` for the indexer, `Some(i)` for
    /// regular group `i` (its columns in order, from [`PagedManager::hit_range`]'s start).
    fn hit_keys<'a>(
        &'a self,
        hashes: &'a [u64],
        hit: u32,
        resume: u32,
    ) -> impl Iterator<Item = (Option<usize>, BlockKey)> + 'a {
        let indexer = hashes[..hit as usize]
            .iter()
            .map(|&hash| (None, BlockKey { group: 1, hash }));
        let regular = self.groups.iter().enumerate().flat_map(move |(i, g)| {
            self.hit_range(g, hit, resume).map(move |col| {
                let (p, k) = (col / g.per_page, col % g.per_page);
                (Some(i), column_key(g.group, hashes[p as usize], k))
            })
        });
        indexer.chain(regular)
    }

    /// Of the blocks a prefix hit pins ([`PagedManager::pin_hit`]), those now in the free
    /// queue: pinning takes them out of it.
    pub(in crate::coordinator) fn hit_blocks_free(
        &self,
        gpu: &BlockPool,
        hashes: &[u64],
        hit: u32,
        resume: u32,
    ) -> u32 {
        self.hit_keys(hashes, hit, resume)
            .filter(|&(_, key)| gpu.lookup(key).is_some_and(|b| gpu.is_free(b)))
            .count() as u32
    }

    /// Whether every sliding-window group still caches the columns a prefix hit of `hit`
    /// pages (hashes `hashes`) with first recomputed token `resume` needs.
    pub(in crate::coordinator) fn windows_cached(
        &self,
        gpu: &BlockPool,
        hashes: &[u64],
        hit: u32,
        resume: u32,
    ) -> bool {
        self.groups.iter().filter(|g| g.window.is_some()).all(|g| {
            self.hit_range(g, hit, resume).all(|c| {
                let (p, k) = (c / g.per_page, c % g.per_page);
                hashes
                    .get(p as usize)
                    .is_some_and(|&h| gpu.lookup(column_key(g.group, h, k)).is_some())
            })
        })
    }

    /// GPU blocks a prefix hit of `hit` pages with first recomputed token `resume` pins.
    pub(in crate::coordinator) fn hit_pins(&self, hit: u32, resume: u32) -> u64 {
        let columns: u64 = self
            .groups
            .iter()
            .map(|g| self.hit_range(g, hit, resume).len() as u64)
            .sum();
        u64::from(hit) + columns
    }

    /// Regular groups: one new column each for the first token after a prefix hit (its own, or
    /// the copy of the shared one it writes).
    #[inline]
    pub(in crate::coordinator) fn num_groups(&self) -> u64 {
        self.groups.len() as u64
    }

    /// Re-pins the cached blocks of a prefix hit of `hit` pages (`hashes`, first recomputed
    /// token `resume`); the caller has checked that they are cached — but for indexer blocks
    /// restored from host, which are pinned as `0` until
    /// [`PagedManager::restore_uncached_indexer`] gives them blocks. On an error the table
    /// holds what was pinned so far (undo with [`PagedManager::unpin`]).
    pub(in crate::coordinator) fn pin_hit(
        &self,
        t: &mut PagedTable,
        gpu: &mut BlockPool,
        hashes: &[u64],
        hit: u32,
        resume: u32,
    ) -> Result<(), PoolError> {
        for (g, c) in self.groups.iter().zip(t.regular.iter_mut()) {
            c.first = self.hit_range(g, hit, resume).start;
        }
        for (at, key) in self.hit_keys(hashes, hit, resume) {
            let b = gpu.lookup(key).unwrap_or(0);
            if at.is_none() && b == 0 {
                // Not cached: restored from host once the start is accounted for.
                t.indexer.push(0);
                continue;
            }
            gpu.touch(b)?;
            match at {
                None => t.indexer.push(b),
                Some(i) => t.regular[i].blocks.push_back(b),
            }
        }
        Ok(())
    }

    /// Undoes [`PagedManager::pin_hit`] (a start that did not fit): the blocks keep their
    /// hashes and go to the tail of the LRU queue.
    #[inline]
    pub(in crate::coordinator) fn unpin(&self, t: &mut PagedTable, gpu: &mut BlockPool) {
        for c in t.regular.iter_mut().rev() {
            for &b in c.blocks.iter().rev() {
                let _ = gpu.free(b);
            }
            c.blocks.clear();
            c.first = 0;
        }
        let _ = gpu.free_reverse(&t.indexer);
        t.indexer.clear();
    }

    /// Gives the page holding token `token` (a copy-on-write tail) private blocks where that
    /// token is written: its indexer block and, in every regular group, the column holding the
    /// token. Records the whole-block copies and releases the shared sources once the command
    /// is built (`after_build`).
    #[inline]
    pub(in crate::coordinator) fn copy_on_write(
        &self,
        t: &mut PagedTable,
        token: u32,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        after_build: &mut Vec<(PoolKind, u32)>,
    ) {
        let p = (token / self.block_tokens) as usize;
        let mut cow = |b: &mut u32| {
            let nbk = gpu.allocate().unwrap_or(0);
            out.gpu_cow.push(BlockPair { src: *b, dst: nbk });
            after_build.push((PoolKind::Gpu, *b));
            *b = nbk;
        };
        if let Some(b) = t.indexer.get_mut(p) {
            cow(b);
        }
        for (g, c) in self.groups.iter().zip(t.regular.iter_mut()) {
            let col = g.column(token);
            if let Some(b) = col
                .checked_sub(c.first)
                .and_then(|i| c.blocks.get_mut(i as usize))
            {
                cow(b);
            }
        }
    }

    /// Records every block-table entry the table holds (prefix hits) for state row `slot`.
    #[inline]
    pub(in crate::coordinator) fn hit_tables(
        &self,
        t: &PagedTable,
        slot: u32,
        out: &mut OffloadCommand,
    ) {
        for (p, &block) in t.indexer.iter().enumerate() {
            out.block_tables.push(TableUpdate {
                slot,
                group: 1,
                page: p as u32,
                block,
            });
        }
        for (g, c) in self.groups.iter().zip(&t.regular) {
            for (i, &block) in c.blocks.iter().enumerate() {
                out.block_tables.push(TableUpdate {
                    slot,
                    group: g.group,
                    page: c.first + i as u32,
                    block,
                });
            }
        }
    }

    /// Allocates page `p` (the next one) in the indexer group. The caller has checked that the
    /// GPU pool has the block.
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
    }

    /// Allocates the regular columns tokens `first..target` need (see
    /// [`PagedManager::regular_need`], which the caller has checked the GPU pool holds).
    #[inline]
    pub(in crate::coordinator) fn allocate_columns(
        &self,
        t: &mut PagedTable,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        slot: u32,
        first: u32,
        target: u32,
    ) {
        for (g, c) in self.groups.iter().zip(t.regular.iter_mut()) {
            let start = g.window_start(first);
            if c.blocks.is_empty() {
                c.first = c.first.max(start);
            } else if c.end() < start {
                // Nothing held is needed any more (a defensive case: the windows slide after
                // every step).
                for b in c.blocks.drain(..) {
                    let _ = gpu.free(b);
                }
                c.first = start;
            }
            while c.end() < g.columns(target) {
                let b = gpu.allocate().unwrap_or(0);
                out.block_tables.push(TableUpdate {
                    slot,
                    group: g.group,
                    page: c.end(),
                    block: b,
                });
                c.blocks.push_back(b);
            }
        }
    }

    /// Publishes the prefix hashes of full pages `pages` in the GPU prefix cache: the indexer
    /// block and every column of the page a regular group still holds.
    #[inline]
    pub(in crate::coordinator) fn publish(
        &self,
        t: &PagedTable,
        gpu: &mut BlockPool,
        hashes: &[u64],
        pages: core::ops::Range<u32>,
    ) {
        for p in pages {
            let hash = hashes[p as usize];
            let _ = gpu.cache(t.indexer[p as usize], BlockKey { group: 1, hash });
            for (g, c) in self.groups.iter().zip(&t.regular) {
                for k in 0..g.per_page {
                    let b = c.get(p * g.per_page + k);
                    if b != 0 {
                        let _ = gpu.cache(b, column_key(g.group, hash, k));
                    }
                }
            }
        }
    }

    /// Withdraws the prefix hashes of pages `pages` (a rollback un-filled them).
    pub(in crate::coordinator) fn unpublish(
        &self,
        t: &PagedTable,
        gpu: &mut BlockPool,
        pages: core::ops::Range<u32>,
    ) {
        for p in pages {
            if let Some(&b) = t.indexer.get(p as usize) {
                let _ = gpu.uncache(b);
            }
            for (g, c) in self.groups.iter().zip(&t.regular) {
                for k in 0..g.per_page {
                    let b = c.get(p * g.per_page + k);
                    if b != 0 {
                        let _ = gpu.uncache(b);
                    }
                }
            }
        }
    }

    /// Sliding windows after a step that computed tokens `first..target`: gives back the
    /// columns wholly before the window of the earliest token the next step may start from
    /// (`target`, or after a rollback of up to `max_query_len - 1` of the step's tokens, no
    /// earlier than `first + 1`).
    #[inline]
    pub(in crate::coordinator) fn slide_windows(
        &self,
        t: &mut PagedTable,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        slot: u32,
        first: u32,
        target: u32,
    ) -> Result<(), PoolError> {
        if !self.has_window {
            return Ok(());
        }
        let earliest = target
            .saturating_sub(self.spec_tokens)
            .max(first.saturating_add(1))
            .min(target);
        for (g, c) in self.groups.iter().zip(t.regular.iter_mut()) {
            if g.window.is_none() {
                continue;
            }
            let keep_from = g.window_start(earliest);
            while c.first < keep_from {
                match c.blocks.pop_front() {
                    Some(b) => {
                        if b != 0 {
                            gpu.free(b)?;
                            out.block_tables.push(TableUpdate {
                                slot,
                                group: g.group,
                                page: c.first,
                                block: 0,
                            });
                        }
                        c.first += 1;
                    }
                    None => {
                        c.first = keep_from;
                    }
                }
            }
        }
        Ok(())
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
        for c in t.regular.iter_mut().rev() {
            for &b in c.blocks.iter().rev() {
                release.block(gpu, PoolKind::Gpu, b);
            }
            c.blocks.clear();
            c.first = 0;
        }
        for &b in t.indexer.iter().rev() {
            release.block(gpu, PoolKind::Gpu, b);
        }
        t.indexer.clear();
    }

    /// Block of column `col` in regular group `gi` (`0..num_regular`), 0 when not held.
    #[inline]
    pub(in crate::coordinator) fn regular_block(&self, t: &PagedTable, col: u32, gi: usize) -> u32 {
        t.regular.get(gi).map_or(0, |c| c.get(col))
    }

    /// The table's invariants for a request that computed `num_computed` tokens: no null block
    /// among the columns held, and every regular group holds at least the columns from the one
    /// the next token's window starts in to the last column of its tokens.
    pub(in crate::coordinator) fn check(
        &self,
        t: &PagedTable,
        num_computed: u32,
    ) -> Result<(), (&'static str, Option<u32>)> {
        for (g, c) in self.groups.iter().zip(&t.regular) {
            if c.blocks.contains(&0) {
                return Err(("null block in a regular table", Some(g.group)));
            }
            let need_end = g.columns(num_computed);
            let need_start = g.window_start(num_computed).min(need_end);
            if need_end > need_start && (c.first > need_start || c.end() < need_end) {
                return Err((
                    "regular group misses a column its window needs",
                    Some(g.group),
                ));
            }
        }
        Ok(())
    }
}
