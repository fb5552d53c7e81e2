//! Block pool (SPEC §4): reference-counted blocks with an LRU free queue and an optional prefix
//! cache of block hashes.
//!
//! * Block 0 is the **null block**: never handed out, never freed, never counted as free.
//! * The free queue is LRU, an intrusive doubly-linked list kept in two `Vec<u32>`s (link `0`
//!   means "none", which is free because block 0 is never queued). Initially blocks `1..n` in id
//!   order; allocation takes the head, a block whose reference count drops to 0 goes to the tail.
//!   A request frees its blocks in reverse ([`BlockPool::free_reverse`]): its last block reaches
//!   the tail first and is reused first, so its first block (the most shareable prefix) stays
//!   cached longest.
//! * [`BlockPool::touch`] re-pins a block: a free block with a cached hash leaves the queue.
//! * Prefix cache: a held block may be given a `(group, hash)` key ([`BlockPool::cache`]);
//!   [`BlockPool::lookup`] finds it while the block is held or free-but-not-yet-reused. When a
//!   free block is handed out again it is *evicted*: its key is dropped.
//! * Reuse generation ([`BlockPool::generation`]): a per-block counter bumped whenever the block
//!   leaves the free queue ([`BlockPool::allocate`], [`BlockPool::allocate_n`], a
//!   [`BlockPool::touch`] of a free block) or on request ([`BlockPool::bump_generation`]). A
//!   caller that frees a block whose bytes it may still read records the generation: while the
//!   block is free with that generation, nobody has been handed it. Cheaper than a key of its
//!   own in the prefix cache (no hash-table insert and eviction).
//!
//! Every operation is O(1) (hash-table operations expected O(1): open addressing with linear
//! probing and backward-shift deletion, at most half full) and allocates nothing: all storage is
//! sized at construction.

use alloc::vec::Vec;
use core::fmt;

const NIL: u32 = 0;
const EMPTY: u32 = 0;

/// A misuse of a [`BlockPool`]. Every variant names the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// Fewer free blocks than requested; nothing was allocated.
    OutOfBlocks {
        /// Blocks requested.
        requested: u32,
        /// Blocks free.
        free: u32,
    },
    /// The null block (0) cannot be freed, touched or cached.
    NullBlock,
    /// The block id is outside the pool.
    OutOfRange {
        /// The block id.
        block: u32,
        /// Blocks in the pool.
        num_blocks: u32,
    },
    /// The block is already free.
    DoubleFree {
        /// The block id.
        block: u32,
    },
    /// The block is not held (reference count 0), so it cannot be given a hash.
    NotHeld {
        /// The block id.
        block: u32,
    },
    /// A pool needs at least one block (the null block).
    Empty,
    /// The block already holds `u32::MAX` references; nothing was changed.
    TooManyReferences {
        /// The block id.
        block: u32,
    },
    /// The pool's bookkeeping could not be allocated (the allocator refused `bytes` bytes for
    /// `num_blocks` blocks); nothing was allocated.
    OutOfMemory {
        /// Blocks asked for.
        num_blocks: u32,
        /// Bytes of bookkeeping they need.
        bytes: u64,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PoolError::OutOfBlocks { requested, free } => {
                write!(f, "pool: {requested} blocks requested but only {free} free")
            }
            PoolError::NullBlock => f.write_str("pool: block 0 is the null block"),
            PoolError::OutOfRange { block, num_blocks } => {
                write!(f, "pool: block {block} is outside 0..{num_blocks}")
            }
            PoolError::DoubleFree { block } => write!(f, "pool: block {block} is already free"),
            PoolError::NotHeld { block } => write!(f, "pool: block {block} is not held"),
            PoolError::Empty => f.write_str("pool: `num_blocks` must be at least 1"),
            PoolError::TooManyReferences { block } => write!(
                f,
                "pool: block {block} already holds {} references; free some before touching it again",
                u32::MAX
            ),
            PoolError::OutOfMemory { num_blocks, bytes } => write!(
                f,
                "pool: {num_blocks} blocks need {bytes} B of bookkeeping, which could not be allocated; plan a smaller pool"
            ),
        }
    }
}

impl crate::error::Error for PoolError {
    fn kind(&self) -> crate::error::ErrorKind {
        // An out-of-memory error included: the pool size is the caller's to lower.
        crate::error::ErrorKind::InvalidArgument
    }
}

impl core::error::Error for PoolError {}

/// A prefix-cache key: the group that owns the block and the chained hash of its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    /// KV-cache group index.
    pub group: u32,
    /// Chained hash of the block's tokens and every block before it.
    pub hash: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Node {
    prev: u32,
    next: u32,
    refs: u32,
    /// Position + 1 of the block's key in `table`, or 0 when it has no key. Kept in sync on
    /// every table move.
    key_pos: u32,
    /// Reuse generation (wrapping): bumped each time the block leaves the free queue, and by
    /// [`BlockPool::bump_generation`].
    generation: u32,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    key: BlockKey,
    block: u32,
}

/// A pool of `n` blocks (block 0 = null) with an LRU free queue and an optional prefix cache.
#[derive(Clone, Debug)]
pub struct BlockPool {
    /// Per block: links, reference count and key position, side by side (one cache line
    /// serves every operation on a block).
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
    num_free: u32,
    table: Vec<Slot>,
    mask: usize,
    num_cached: u32,
}

fn mix(key: BlockKey) -> usize {
    let h = (key.hash ^ u64::from(key.group).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (h ^ (h >> 31)) as usize
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, block 0 being the null block.
    ///
    /// The bookkeeping (a 20-byte node per block and a prefix-key table of two to four 24-byte
    /// slots per block) is allocated
    /// fallibly: a size the allocator refuses is [`PoolError::OutOfMemory`], not an abort.
    pub fn new(num_blocks: u32) -> Result<Self, PoolError> {
        if num_blocks == 0 {
            return Err(PoolError::Empty);
        }
        let n = num_blocks as usize;
        let cap = n.saturating_mul(2).next_power_of_two().max(2);
        let oom = || PoolError::OutOfMemory {
            num_blocks,
            bytes: (n as u64)
                .saturating_mul(core::mem::size_of::<Node>() as u64)
                .saturating_add((cap as u64).saturating_mul(core::mem::size_of::<Slot>() as u64)),
        };
        let mut nodes: Vec<Node> = Vec::new();
        nodes.try_reserve_exact(n).map_err(|_| oom())?;
        let mut table: Vec<Slot> = Vec::new();
        table.try_reserve_exact(cap).map_err(|_| oom())?;
        nodes.extend((0..n).map(|b| Node {
            prev: if b > 1 { b as u32 - 1 } else { NIL },
            next: if b >= 1 && b + 1 < n {
                b as u32 + 1
            } else {
                NIL
            },
            refs: 0,
            key_pos: 0,
            generation: 0,
        }));
        table.resize(
            cap,
            Slot {
                key: BlockKey { group: 0, hash: 0 },
                block: EMPTY,
            },
        );
        Ok(BlockPool {
            nodes,
            head: if n > 1 { 1 } else { NIL },
            tail: if n > 1 { num_blocks - 1 } else { NIL },
            num_free: num_blocks - 1,
            table,
            mask: cap - 1,
            num_cached: 0,
        })
    }

    /// Blocks in the pool, null block included.
    pub fn num_blocks(&self) -> u32 {
        self.nodes.len() as u32
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
        self.nodes.get(block as usize).map_or(0, |n| n.refs)
    }

    fn check(&self, block: u32) -> Result<(), PoolError> {
        if block == 0 {
            return Err(PoolError::NullBlock);
        }
        if block as usize >= self.nodes.len() {
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
        let (p, n) = (self.nodes[b as usize].prev, self.nodes[b as usize].next);
        if p == NIL {
            self.head = n;
        } else {
            self.nodes[p as usize].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.nodes[n as usize].prev = p;
        }
        self.nodes[b as usize].prev = NIL;
        self.nodes[b as usize].next = NIL;
        self.num_free -= 1;
    }

    #[inline]
    fn push_tail(&mut self, b: u32) {
        self.nodes[b as usize].prev = self.tail;
        self.nodes[b as usize].next = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.nodes[self.tail as usize].next = b;
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
        let n = self.nodes[b as usize].next;
        self.head = n;
        if n == NIL {
            self.tail = NIL;
        } else {
            self.nodes[n as usize].prev = NIL;
        }
        self.num_free -= 1;
        let node = &mut self.nodes[b as usize];
        node.refs = 1;
        node.generation = node.generation.wrapping_add(1);
        if node.key_pos != 0 {
            self.remove_key_of(b);
        }
        Some(b)
    }

    /// Allocates `count` blocks into `out` (appended), all or nothing.
    pub fn allocate_n(&mut self, count: u32, out: &mut Vec<u32>) -> Result<(), PoolError> {
        if count > self.num_free {
            return Err(PoolError::OutOfBlocks {
                requested: count,
                free: self.num_free,
            });
        }
        if count == 0 {
            return Ok(());
        }
        out.reserve(count as usize);
        // Walk `count` blocks from the head, then cut the queue once.
        let mut b = self.head;
        for _ in 0..count {
            out.push(b);
            let node = &mut self.nodes[b as usize];
            node.refs = 1;
            node.generation = node.generation.wrapping_add(1);
            if node.key_pos != 0 {
                self.remove_key_of(b);
            }
            b = self.nodes[b as usize].next;
        }
        self.head = b;
        if b == NIL {
            self.tail = NIL;
        } else {
            self.nodes[b as usize].prev = NIL;
        }
        self.num_free -= count;
        Ok(())
    }

    /// Drops one reference; a block reaching 0 goes to the tail of the free queue (keeping its
    /// key, so it can still be found by [`BlockPool::lookup`] until it is reused).
    #[inline]
    pub fn free(&mut self, block: u32) -> Result<(), PoolError> {
        self.check(block)?;
        let node = &mut self.nodes[block as usize];
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
            let Some(node) = self.nodes.get_mut(b as usize) else {
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
                    self.nodes[self.tail as usize].next = b;
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
        let refs = self.nodes[block as usize].refs;
        if refs == u32::MAX {
            return Err(PoolError::TooManyReferences { block });
        }
        if refs == 0 {
            self.unlink(block);
            let node = &mut self.nodes[block as usize];
            node.generation = node.generation.wrapping_add(1);
        }
        self.nodes[block as usize].refs = refs + 1;
        Ok(())
    }

    /// The reuse generation of `block` (0 for ids out of range): see the module docs. It
    /// wraps after 2^32 bumps.
    #[inline]
    pub fn generation(&self, block: u32) -> u32 {
        self.nodes.get(block as usize).map_or(0, |n| n.generation)
    }

    /// Bumps `block`'s reuse generation without moving it (whoever recorded the old one sees
    /// the block as changed). Ids out of range and the null block are refused.
    #[inline]
    pub fn bump_generation(&mut self, block: u32) -> Result<(), PoolError> {
        self.check(block)?;
        let node = &mut self.nodes[block as usize];
        node.generation = node.generation.wrapping_add(1);
        Ok(())
    }

    /// Gives held `block` the prefix-cache key `key`. Returns `false` (and changes nothing) when
    /// another block already carries `key` or `block` already has a key.
    pub fn cache(&mut self, block: u32, key: BlockKey) -> Result<bool, PoolError> {
        self.check(block)?;
        if self.nodes[block as usize].refs == 0 {
            return Err(PoolError::NotHeld { block });
        }
        if self.nodes[block as usize].key_pos != 0 || self.lookup(key).is_some() {
            return Ok(false);
        }
        let mut i = mix(key) & self.mask;
        while self.table[i].block != EMPTY {
            i = (i + 1) & self.mask;
        }
        self.table[i] = Slot { key, block };
        self.nodes[block as usize].key_pos = i as u32 + 1;
        self.num_cached += 1;
        Ok(true)
    }

    /// The block carrying `key`, if any (held, or free and not yet reused).
    pub fn lookup(&self, key: BlockKey) -> Option<u32> {
        let mut i = mix(key) & self.mask;
        loop {
            let s = &self.table[i];
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
        let p = self.nodes.get(block as usize)?.key_pos;
        (p != 0).then(|| self.table[p as usize - 1].key)
    }

    /// Drops `block`'s key, if any (its contents are about to change).
    pub fn uncache(&mut self, block: u32) -> Result<(), PoolError> {
        self.check(block)?;
        if self.nodes[block as usize].key_pos != 0 {
            self.remove_key_of(block);
        }
        Ok(())
    }

    fn remove_key_of(&mut self, block: u32) {
        let mut i = self.nodes[block as usize].key_pos as usize - 1;
        self.nodes[block as usize].key_pos = 0;
        self.num_cached -= 1;
        // Backward-shift deletion keeps every probe chain unbroken.
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let s = self.table[j];
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
                self.table[i] = s;
                self.nodes[s.block as usize].key_pos = i as u32 + 1;
                i = j;
            }
        }
        self.table[i].block = EMPTY;
    }

    /// Whether `block` is in the free queue.
    pub fn is_free(&self, block: u32) -> bool {
        block != 0 && (block as usize) < self.nodes.len() && self.nodes[block as usize].refs == 0
    }

    /// Checks every internal invariant (for tests): the queue is a consistent doubly-linked list
    /// of exactly the blocks with reference count 0 (null excluded), and the key table and
    /// per-block key positions agree. O(n).
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let mut count = 0u32;
        let mut prev = NIL;
        let mut b = self.head;
        while b != NIL {
            if self.nodes[b as usize].refs != 0 {
                return Err("held block in the free queue");
            }
            if self.nodes[b as usize].prev != prev {
                return Err("broken prev link");
            }
            count += 1;
            if count > self.num_blocks() {
                return Err("cycle in the free queue");
            }
            prev = b;
            b = self.nodes[b as usize].next;
        }
        if prev != self.tail {
            return Err("tail mismatch");
        }
        if count != self.num_free {
            return Err("free count mismatch");
        }
        let zero = self.nodes[1..].iter().filter(|n| n.refs == 0).count() as u32;
        if zero != self.num_free {
            return Err("free blocks missing from the queue");
        }
        if self.nodes[0].refs != 0 {
            return Err("null block referenced");
        }
        let mut keyed = 0;
        for (i, s) in self.table.iter().enumerate() {
            if s.block != EMPTY {
                keyed += 1;
                if self.nodes[s.block as usize].key_pos as usize != i + 1 {
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
mod tests {
    use super::*;

    fn key(h: u64) -> BlockKey {
        BlockKey { group: 0, hash: h }
    }

    #[test]
    fn lru_order_and_null() {
        let mut p = BlockPool::new(5).unwrap();
        assert_eq!(p.num_free(), 4);
        let a: Vec<u32> = (0..4).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(a, [1, 2, 3, 4]);
        assert_eq!(p.allocate(), None);
        p.free_reverse(&[1, 0, 3]).unwrap();
        // Reverse: 3 then 1 at the tail.
        assert_eq!(p.allocate(), Some(3));
        assert_eq!(p.allocate(), Some(1));
        assert_eq!(p.free(0), Err(PoolError::NullBlock));
        assert_eq!(
            p.free(9),
            Err(PoolError::OutOfRange {
                block: 9,
                num_blocks: 5
            })
        );
        p.free(2).unwrap();
        assert_eq!(p.free(2), Err(PoolError::DoubleFree { block: 2 }));
        p.check_invariants().unwrap();
        let mut out = Vec::new();
        assert_eq!(
            p.allocate_n(2, &mut out),
            Err(PoolError::OutOfBlocks {
                requested: 2,
                free: 1
            })
        );
        assert!(out.is_empty());
        assert_eq!(BlockPool::new(0).unwrap_err(), PoolError::Empty);
        let mut one = BlockPool::new(1).unwrap();
        assert_eq!(one.allocate(), None);
        one.check_invariants().unwrap();
    }

    #[test]
    fn refcounts_touch_and_prefix_cache() {
        let mut p = BlockPool::new(4).unwrap();
        let b = p.allocate().unwrap();
        assert!(p.cache(b, key(7)).unwrap());
        assert!(!p.cache(b, key(8)).unwrap());
        p.touch(b).unwrap();
        assert_eq!(p.ref_count(b), 2);
        p.free(b).unwrap();
        assert!(!p.is_free(b));
        p.free(b).unwrap();
        assert!(p.is_free(b));
        // Free but cached: still found; touch re-pins it.
        assert_eq!(p.lookup(key(7)), Some(b));
        p.touch(b).unwrap();
        assert_eq!(p.num_free(), 2);
        p.free(b).unwrap();
        // Reuse evicts: b is at the tail, so allocate the two others first.
        let x = p.allocate().unwrap();
        let y = p.allocate().unwrap();
        assert_ne!(x, b);
        assert_ne!(y, b);
        assert_eq!(p.allocate(), Some(b));
        assert_eq!(p.lookup(key(7)), None);
        assert_eq!(p.num_cached(), 0);
        assert_eq!(p.cache(3, key(1)).err(), None);
        p.check_invariants().unwrap();
    }

    #[test]
    fn touch_refuses_a_reference_count_overflow() {
        let mut p = BlockPool::new(3).unwrap();
        let b = p.allocate().unwrap();
        // 2^32 - 2 touches would take minutes; set the count the way they would leave it.
        p.nodes[b as usize].refs = u32::MAX - 1;
        p.touch(b).unwrap();
        assert_eq!(p.ref_count(b), u32::MAX);
        assert_eq!(p.touch(b), Err(PoolError::TooManyReferences { block: b }));
        assert_eq!(p.ref_count(b), u32::MAX, "a refused touch changes nothing");
        p.check_invariants().unwrap();
        assert!(std::format!("{}", PoolError::TooManyReferences { block: b }).contains("free"));
    }

    #[test]
    fn hash_table_survives_churn() {
        let n = 64u32;
        let mut p = BlockPool::new(n).unwrap();
        let mut held = Vec::new();
        let mut s = 1u64;
        for round in 0..2000u64 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if !s.is_multiple_of(3) {
                if let Some(b) = p.allocate() {
                    // Few distinct hashes force collisions and probe chains.
                    let _ = p.cache(b, key(s % 97)).unwrap();
                    held.push(b);
                }
            } else if !held.is_empty() {
                let b = held.swap_remove((s as usize / 3) % held.len());
                p.free(b).unwrap();
            }
            if round % 50 == 0 {
                p.check_invariants().unwrap();
            }
        }
        p.check_invariants().unwrap();
    }

    #[test]
    fn generation_changes_exactly_when_a_block_leaves_the_free_queue() {
        let mut p = BlockPool::new(4).unwrap();
        let b = p.allocate().unwrap();
        let g = p.generation(b);
        p.free(b).unwrap();
        // Freeing keeps it: a reader of the freed bytes sees the block untouched.
        assert_eq!(p.generation(b), g);
        // Re-pinning a free block changes it.
        p.touch(b).unwrap();
        assert_ne!(p.generation(b), g);
        // A second reference to a held block does not.
        let g = p.generation(b);
        p.touch(b).unwrap();
        assert_eq!(p.generation(b), g);
        p.free(b).unwrap();
        p.free(b).unwrap();
        assert_eq!(p.generation(b), g);
        // Handing it out again changes it, one at a time or in a batch.
        let mut out = Vec::new();
        p.allocate_n(3, &mut out).unwrap();
        assert!(out.contains(&b));
        assert_ne!(p.generation(b), g);
        let g = p.generation(b);
        p.free(b).unwrap();
        p.bump_generation(b).unwrap();
        assert_ne!(p.generation(b), g);
        assert!(p.is_free(b));
        assert_eq!(p.bump_generation(0), Err(PoolError::NullBlock));
        assert!(p.bump_generation(9).is_err());
        assert_eq!(p.generation(9), 0);
        p.check_invariants().unwrap();
    }
}
