//! Block pool (contract §4): reference-counted blocks with an LRU free queue and an optional prefix
//! cache of block hashes.
//!
//! * Block 0 is the **null block**: never handed out, never freed, never counted as free.
//! * The free queue is LRU, an intrusive doubly-linked list threaded through the per-block nodes
//!   (link `0` means "none", which is free because block 0 is never queued). Initially blocks `1..n` in id
//!   order; allocation takes the head, a block whose reference count drops to 0 goes to the tail.
//!   A request frees its blocks in reverse ([`Pool::free_reverse`]): its last block reaches
//!   the tail first and is reused first, so its first block (the most shareable prefix) stays
//!   cached longest.
//! * [`Pool::touch`] re-pins a block: a free block with a cached hash leaves the queue.
//! * Prefix cache: a held block may be given a `(group, hash)` key ([`Pool::cache`]);
//!   [`Pool::lookup`] finds it while the block is held or free-but-not-yet-reused. When a
//!   free block is handed out again it is *evicted*: its key is dropped.
//! * Reuse generation ([`Pool::generation`]): a per-block counter bumped whenever the block
//!   leaves the free queue ([`Pool::allocate`], [`Pool::allocate_into`] and
//!   `BlockPool::allocate_n`, a [`Pool::touch`] of a free block) or on request ([`Pool::bump_generation`]). A
//!   caller that frees a block whose bytes it may still read records the generation: while the
//!   block is free with that generation, nobody has been handed it. Cheaper than a key of its
//!   own in the prefix cache (no hash-table insert and eviction).
//!
//! Every operation is O(1) (hash-table operations expected O(1): open addressing with linear
//! probing and backward-shift deletion, at most half full) and allocates nothing: all storage is
//! sized at construction.
//!
//! # Two storages, one set of rules
//!
//! [`Pool`] holds these rules once, over a [`PoolStorage`]:
//! * [`BlockPool`] (with `alloc`): the bookkeeping on the heap, any block count up to `u32::MAX`
//!   the allocator grants ([`PoolError::OutOfMemory`] otherwise).
//! * [`FixedBlockPool<BLOCKS, KEY_SLOTS>`](FixedBlockPool) (always, no allocator needed): the
//!   bookkeeping in arrays, up to `BLOCKS` blocks ([`PoolError::OverCapacity`] beyond), for a
//!   runtime without a heap. `KEY_SLOTS` is [`key_slots`]`(BLOCKS)`.
//!
//! Both hand out the same blocks in the same order for the same calls.
//!
//! ```
//! use hisparse_core::pool::{BlockKey, FixedBlockPool, key_slots};
//! let mut pool = FixedBlockPool::<16, { key_slots(16) }>::new(8).unwrap();
//! let mut blocks = [0u32; 3];
//! pool.allocate_into(&mut blocks).unwrap();
//! assert_eq!(blocks, [1, 2, 3]);
//! assert!(pool.cache(1, BlockKey { group: 0, hash: 7 }).unwrap());
//! pool.free_reverse(&blocks).unwrap();
//! assert_eq!(pool.lookup(BlockKey { group: 0, hash: 7 }), Some(1));
//! assert_eq!(pool.num_free(), 7);
//! ```

#[cfg(feature = "alloc")]
use alloc::vec::Vec;

mod error;
mod storage;

pub use error::PoolError;
#[cfg(feature = "alloc")]
pub use storage::HeapStorage;
use storage::{EMPTY, NIL, Node, Slot};
pub use storage::{FixedStorage, PoolStorage, key_slots};

/// A prefix-cache key: the group that owns the block and the chained hash of its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    /// KV-cache group index.
    pub group: u32,
    /// Chained hash of the block's tokens and every block before it.
    pub hash: u64,
}

fn mix(key: BlockKey) -> usize {
    let h = (key.hash ^ u64::from(key.group).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (h ^ (h >> 31)) as usize
}

/// A pool of `n` blocks (block 0 = null) with an LRU free queue and an optional prefix cache,
/// over storage `S` (see the module docs).
#[derive(Clone, Debug)]
pub struct Pool<S: PoolStorage> {
    /// Per block: links, reference count and key position, side by side; and the key table.
    store: S,
    head: u32,
    tail: u32,
    num_free: u32,
    mask: usize,
    num_cached: u32,
}

/// The block pool on the heap: any size the allocator grants.
#[cfg(feature = "alloc")]
pub type BlockPool = Pool<HeapStorage>;

/// The block pool in arrays, for a runtime without an allocator: up to `BLOCKS` blocks (null
/// block included); `KEY_SLOTS` must be [`key_slots`]`(BLOCKS)` or more (a smaller table does
/// not compile).
pub type FixedBlockPool<const BLOCKS: usize, const KEY_SLOTS: usize> =
    Pool<FixedStorage<BLOCKS, KEY_SLOTS>>;

#[cfg(feature = "alloc")]
impl BlockPool {
    /// A pool of `num_blocks` blocks, block 0 being the null block.
    ///
    /// The bookkeeping (a 20-byte node per block and a prefix-key table of two to four 24-byte
    /// slots per block) is allocated fallibly: a size the allocator refuses is
    /// [`PoolError::OutOfMemory`], not an abort.
    pub fn new(num_blocks: u32) -> Result<Self, PoolError> {
        if num_blocks == 0 {
            return Err(PoolError::Empty);
        }
        Ok(Pool::with_storage(HeapStorage::new(num_blocks)?))
    }

    /// Allocates `count` blocks into `out` (appended), all or nothing.
    pub fn allocate_n(&mut self, count: u32, out: &mut Vec<u32>) -> Result<(), PoolError> {
        self.check_free(count)?;
        let start = out.len();
        out.resize(start + count as usize, 0);
        self.allocate_into(&mut out[start..])
    }
}

impl<const BLOCKS: usize, const KEY_SLOTS: usize> FixedBlockPool<BLOCKS, KEY_SLOTS> {
    /// A pool of `num_blocks` blocks (at most `BLOCKS`), block 0 being the null block. Builds
    /// the arrays by value: place the pool in a `static` or on a stack with room for
    /// `20 × BLOCKS + 24 × KEY_SLOTS` bytes.
    pub fn new(num_blocks: u32) -> Result<Self, PoolError> {
        if num_blocks == 0 {
            return Err(PoolError::Empty);
        }
        Ok(Pool::with_storage(FixedStorage::new(num_blocks)?))
    }
}

impl<S: PoolStorage> Pool<S> {
    /// The pool over `store`, whose node slice is non-empty and whose key table is a power of
    /// two longer than the node slice: blocks `1..n` queued in id order, no keys.
    fn with_storage(mut store: S) -> Self {
        let nodes = store.nodes_mut();
        let n = nodes.len();
        for (b, node) in nodes.iter_mut().enumerate() {
            *node = Node {
                prev: if b > 1 { b as u32 - 1 } else { NIL },
                next: if b >= 1 && b + 1 < n {
                    b as u32 + 1
                } else {
                    NIL
                },
                ..Node::default()
            };
        }
        store.table_mut().fill(Slot::EMPTY);
        let mask = store.table().len() - 1;
        let num_blocks = n as u32;
        Pool {
            store,
            head: if n > 1 { 1 } else { NIL },
            tail: if n > 1 { num_blocks - 1 } else { NIL },
            num_free: num_blocks - 1,
            mask,
            num_cached: 0,
        }
    }

    /// Blocks in the pool, null block included.
    pub fn num_blocks(&self) -> u32 {
        self.store.nodes().len() as u32
    }

    /// Blocks in the free queue.
    pub fn num_free(&self) -> u32 {
        self.num_free
    }

    /// Blocks held (reference count > 0); `num_free + num_held + 1 == num_blocks` always.
    pub fn num_held(&self) -> u32 {
        self.num_blocks() - 1 - self.num_free
    }

    /// Blocks that carry a prefix-cache key.
    pub fn num_cached(&self) -> u32 {
        self.num_cached
    }

    /// Reference count of `block` (0 for free blocks and the null block; 0 for ids out of range).
    pub fn ref_count(&self, block: u32) -> u32 {
        self.store.nodes().get(block as usize).map_or(0, |n| n.refs)
    }

    fn check(&self, block: u32) -> Result<(), PoolError> {
        if block == 0 {
            return Err(PoolError::NullBlock);
        }
        if block as usize >= self.store.nodes().len() {
            return Err(PoolError::OutOfRange {
                block,
                num_blocks: self.num_blocks(),
            });
        }
        Ok(())
    }

    /// Unlinks free block `b` from the queue.
    #[inline]
    fn unlink(&mut self, b: u32) {
        let (p, n) = (
            self.store.nodes()[b as usize].prev,
            self.store.nodes()[b as usize].next,
        );
        if p == NIL {
            self.head = n;
        } else {
            self.store.nodes_mut()[p as usize].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.store.nodes_mut()[n as usize].prev = p;
        }
        self.store.nodes_mut()[b as usize].prev = NIL;
        self.store.nodes_mut()[b as usize].next = NIL;
        self.num_free -= 1;
    }

    #[inline]
    fn push_tail(&mut self, b: u32) {
        self.store.nodes_mut()[b as usize].prev = self.tail;
        self.store.nodes_mut()[b as usize].next = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.store.nodes_mut()[self.tail as usize].next = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    /// Takes the least recently freed block (evicting its prefix-cache key), or `None` when the
    /// queue is empty.
    #[inline]
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        // Pop the head. A held block's links are never read, so they are left as they are.
        let n = self.store.nodes()[b as usize].next;
        self.head = n;
        if n == NIL {
            self.tail = NIL;
        } else {
            self.store.nodes_mut()[n as usize].prev = NIL;
        }
        self.num_free -= 1;
        let node = &mut self.store.nodes_mut()[b as usize];
        node.refs = 1;
        node.generation = node.generation.wrapping_add(1);
        if node.key_pos != 0 {
            self.remove_key_of(b);
        }
        Some(b)
    }

    /// Fills `out` with freshly allocated blocks (as many as it has room for), all or nothing:
    /// with fewer free blocks than `out.len()` it is [`PoolError::OutOfBlocks`] and nothing is
    /// allocated (`out` is left as it was).
    pub fn allocate_into(&mut self, out: &mut [u32]) -> Result<(), PoolError> {
        let count = u32::try_from(out.len()).unwrap_or(u32::MAX);
        self.check_free(count)?;
        // Walk `count` blocks from the head, then cut the queue once.
        let mut b = self.head;
        for slot in out.iter_mut() {
            *slot = b;
            let node = &mut self.store.nodes_mut()[b as usize];
            node.refs = 1;
            node.generation = node.generation.wrapping_add(1);
            if node.key_pos != 0 {
                self.remove_key_of(b);
            }
            b = self.store.nodes()[b as usize].next;
        }
        if count == 0 {
            return Ok(());
        }
        self.head = b;
        if b == NIL {
            self.tail = NIL;
        } else {
            self.store.nodes_mut()[b as usize].prev = NIL;
        }
        self.num_free -= count;
        Ok(())
    }

    /// [`PoolError::OutOfBlocks`] unless `count` blocks are free.
    fn check_free(&self, count: u32) -> Result<(), PoolError> {
        if count > self.num_free {
            return Err(PoolError::OutOfBlocks {
                requested: count,
                free: self.num_free,
            });
        }
        Ok(())
    }

    /// Drops one reference; a block reaching 0 goes to the tail of the free queue (keeping its
    /// key, so it can still be found by [`Pool::lookup`] until it is reused).
    #[inline]
    pub fn free(&mut self, block: u32) -> Result<(), PoolError> {
        self.check(block)?;
        let node = &mut self.store.nodes_mut()[block as usize];
        if node.refs == 0 {
            return Err(PoolError::DoubleFree { block });
        }
        node.refs -= 1;
        if node.refs == 0 {
            self.push_tail(block);
        }
        Ok(())
    }

    /// Frees `blocks` in reverse order (a request's blocks: its later blocks become reusable
    /// before its prefix). Null entries (0) are skipped. Stops at the first error.
    pub fn free_reverse(&mut self, blocks: &[u32]) -> Result<(), PoolError> {
        let num_blocks = self.num_blocks();
        for &b in blocks.iter().rev() {
            if b == 0 {
                continue;
            }
            let Some(node) = self.store.nodes_mut().get_mut(b as usize) else {
                return Err(PoolError::OutOfRange {
                    block: b,
                    num_blocks,
                });
            };
            if node.refs == 0 {
                return Err(PoolError::DoubleFree { block: b });
            }
            node.refs -= 1;
            if node.refs == 0 {
                node.prev = self.tail;
                node.next = NIL;
                if self.tail == NIL {
                    self.head = b;
                } else {
                    self.store.nodes_mut()[self.tail as usize].next = b;
                }
                self.tail = b;
                self.num_free += 1;
            }
        }
        Ok(())
    }

    /// Adds a reference; a free block leaves the queue (a prefix-cache hit re-pins it). A block
    /// that already holds `u32::MAX` references is refused with
    /// [`PoolError::TooManyReferences`] and left as it is.
    #[inline]
    pub fn touch(&mut self, block: u32) -> Result<(), PoolError> {
        self.check(block)?;
        let refs = self.store.nodes()[block as usize].refs;
        if refs == u32::MAX {
            return Err(PoolError::TooManyReferences { block });
        }
        if refs == 0 {
            self.unlink(block);
            let node = &mut self.store.nodes_mut()[block as usize];
            node.generation = node.generation.wrapping_add(1);
        }
        self.store.nodes_mut()[block as usize].refs = refs + 1;
        Ok(())
    }

    /// The reuse generation of `block` (0 for ids out of range): see the module docs. It
    /// wraps after 2^32 bumps.
    #[inline]
    pub fn generation(&self, block: u32) -> u32 {
        self.store
            .nodes()
            .get(block as usize)
            .map_or(0, |n| n.generation)
    }

    /// Bumps `block`'s reuse generation without moving it (whoever recorded the old one sees
    /// the block as changed). Ids out of range and the null block are refused.
    #[inline]
    pub fn bump_generation(&mut self, block: u32) -> Result<(), PoolError> {
        self.check(block)?;
        let node = &mut self.store.nodes_mut()[block as usize];
        node.generation = node.generation.wrapping_add(1);
        Ok(())
    }

    /// Gives held `block` the prefix-cache key `key`. Returns `false` (and changes nothing) when
    /// another block already carries `key` or `block` already has a key.
    pub fn cache(&mut self, block: u32, key: BlockKey) -> Result<bool, PoolError> {
        self.check(block)?;
        if self.store.nodes()[block as usize].refs == 0 {
            return Err(PoolError::NotHeld { block });
        }
        if self.store.nodes()[block as usize].key_pos != 0 || self.lookup(key).is_some() {
            return Ok(false);
        }
        let mut i = mix(key) & self.mask;
        while self.store.table()[i].block != EMPTY {
            i = (i + 1) & self.mask;
        }
        self.store.table_mut()[i] = Slot { key, block };
        self.store.nodes_mut()[block as usize].key_pos = i as u32 + 1;
        self.num_cached += 1;
        Ok(true)
    }

    /// The block carrying `key`, if any (held, or free and not yet reused).
    pub fn lookup(&self, key: BlockKey) -> Option<u32> {
        let mut i = mix(key) & self.mask;
        loop {
            let s = &self.store.table()[i];
            if s.block == EMPTY {
                return None;
            }
            if s.key == key {
                return Some(s.block);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The key `block` carries, if any.
    pub fn key_of(&self, block: u32) -> Option<BlockKey> {
        let p = self.store.nodes().get(block as usize)?.key_pos;
        (p != 0).then(|| self.store.table()[p as usize - 1].key)
    }

    /// Drops `block`'s key, if any (its contents are about to change).
    pub fn uncache(&mut self, block: u32) -> Result<(), PoolError> {
        self.check(block)?;
        if self.store.nodes()[block as usize].key_pos != 0 {
            self.remove_key_of(block);
        }
        Ok(())
    }

    fn remove_key_of(&mut self, block: u32) {
        let mut i = self.store.nodes()[block as usize].key_pos as usize - 1;
        self.store.nodes_mut()[block as usize].key_pos = 0;
        self.num_cached -= 1;
        // Backward-shift deletion keeps every probe chain unbroken.
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let s = self.store.table()[j];
            if s.block == EMPTY {
                break;
            }
            let home = mix(s.key) & self.mask;
            // Move `s` into the hole at `i` if its home is not cyclically in (i, j].
            let in_range = if i <= j {
                home > i && home <= j
            } else {
                home > i || home <= j
            };
            if !in_range {
                self.store.table_mut()[i] = s;
                self.store.nodes_mut()[s.block as usize].key_pos = i as u32 + 1;
                i = j;
            }
        }
        self.store.table_mut()[i].block = EMPTY;
    }

    /// Whether `block` is in the free queue.
    pub fn is_free(&self, block: u32) -> bool {
        block != 0
            && (block as usize) < self.store.nodes().len()
            && self.store.nodes()[block as usize].refs == 0
    }

    /// Checks every internal invariant (for tests): the queue is a consistent doubly-linked list
    /// of exactly the blocks with reference count 0 (null excluded), and the key table and
    /// per-block key positions agree. O(n).
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let mut count = 0u32;
        let mut prev = NIL;
        let mut b = self.head;
        while b != NIL {
            if self.store.nodes()[b as usize].refs != 0 {
                return Err("held block in the free queue");
            }
            if self.store.nodes()[b as usize].prev != prev {
                return Err("broken prev link");
            }
            count += 1;
            if count > self.num_blocks() {
                return Err("cycle in the free queue");
            }
            prev = b;
            b = self.store.nodes()[b as usize].next;
        }
        if prev != self.tail {
            return Err("tail mismatch");
        }
        if count != self.num_free {
            return Err("free count mismatch");
        }
        let zero = self.store.nodes()[1..]
            .iter()
            .filter(|n| n.refs == 0)
            .count() as u32;
        if zero != self.num_free {
            return Err("free blocks missing from the queue");
        }
        if self.store.nodes()[0].refs != 0 {
            return Err("null block referenced");
        }
        let mut keyed = 0;
        for (i, s) in self.store.table().iter().enumerate() {
            if s.block != EMPTY {
                keyed += 1;
                if self.store.nodes()[s.block as usize].key_pos as usize != i + 1 {
                    return Err("key position mismatch");
                }
                if self.lookup(s.key) != Some(s.block) {
                    return Err("key unreachable");
                }
            }
        }
        if keyed != self.num_cached {
            return Err("cached count mismatch");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
