//! Where a pool keeps its bookkeeping: on the heap, sized at construction ([`HeapStorage`],
//! with `alloc`), or in arrays whose capacity is part of the type ([`FixedStorage`], always).
//! The pool's rules live once, in [`Pool`](super::Pool); a storage only hands out the two
//! slices they work on.

#[cfg(feature = "alloc")]
use alloc::vec::Vec;

use super::{BlockKey, PoolError};

/// A free link that means "none" (block 0, the null block, is never queued).
pub(super) const NIL: u32 = 0;
/// A key-table slot whose `block` is this is empty (the null block never carries a key).
pub(super) const EMPTY: u32 = 0;

/// Key-table slots a pool of `num_blocks` blocks uses: a power of two at least twice the block
/// count (at least 2), so the table is at most half full and every probe chain ends at an empty
/// slot. Write a [`FixedBlockPool`](super::FixedBlockPool)'s `KEY_SLOTS` with it:
/// `FixedBlockPool<64, { key_slots(64) }>`.
pub const fn key_slots(num_blocks: usize) -> usize {
    let slots = num_blocks.saturating_mul(2).next_power_of_two();
    if slots < 2 { 2 } else { slots }
}

/// A block's links, reference count, key position and generation, side by side (one cache
/// line serves every operation on a block).
#[derive(Clone, Copy, Debug, Default)]
pub struct Node {
    pub(super) prev: u32,
    pub(super) next: u32,
    pub(super) refs: u32,
    /// Position + 1 of the block's key in the key table, or 0 when it has no key. Kept in sync
    /// on every table move.
    pub(super) key_pos: u32,
    /// Reuse generation (wrapping): bumped each time the block leaves the free queue, and by
    /// [`Pool::bump_generation`](super::Pool::bump_generation).
    pub(super) generation: u32,
}

/// A prefix-key table slot.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub(super) key: BlockKey,
    pub(super) block: u32,
}

impl Slot {
    pub(super) const EMPTY: Slot = Slot {
        key: BlockKey { group: 0, hash: 0 },
        block: EMPTY,
    };
}

mod sealed {
    /// The two slices a pool works on. Sealed: the pool's invariants rest on the storages
    /// this module defines.
    pub trait Slices {
        /// One node per block, null block included (the pool's block count is its length).
        fn nodes(&self) -> &[super::Node];
        /// Mutable [`Slices::nodes`].
        fn nodes_mut(&mut self) -> &mut [super::Node];
        /// The prefix-key table; its length is a power of two.
        fn table(&self) -> &[super::Slot];
        /// Mutable [`Slices::table`].
        fn table_mut(&mut self) -> &mut [super::Slot];
    }
}
#[cfg(all(test, feature = "alloc"))]
pub(super) use sealed::Slices;

/// Storage of a [`Pool`](super::Pool)'s bookkeeping: [`HeapStorage`] or [`FixedStorage`]. The
/// trait is sealed; it exists so both pools run one implementation of the pool's rules.
pub trait PoolStorage: sealed::Slices {}

/// Bookkeeping on the heap, sized at construction: a 20-byte node per block and a prefix-key
/// table of [`key_slots`] 24-byte slots. The storage of [`BlockPool`](super::BlockPool).
#[cfg(feature = "alloc")]
#[derive(Clone, Debug)]
pub struct HeapStorage {
    nodes: Vec<Node>,
    table: Vec<Slot>,
}

#[cfg(feature = "alloc")]
impl HeapStorage {
    /// Storage for `num_blocks` blocks, allocated fallibly: a size the allocator refuses is
    /// [`PoolError::OutOfMemory`], not an abort.
    pub(super) fn new(num_blocks: u32) -> Result<Self, PoolError> {
        let n = num_blocks as usize;
        let cap = key_slots(n);
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
        nodes.resize(n, Node::default());
        table.resize(cap, Slot::EMPTY);
        Ok(HeapStorage { nodes, table })
    }
}

#[cfg(feature = "alloc")]
impl sealed::Slices for HeapStorage {
    #[inline]
    fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    #[inline]
    fn nodes_mut(&mut self) -> &mut [Node] {
        &mut self.nodes
    }
    #[inline]
    fn table(&self) -> &[Slot] {
        &self.table
    }
    #[inline]
    fn table_mut(&mut self) -> &mut [Slot] {
        &mut self.table
    }
}

#[cfg(feature = "alloc")]
impl PoolStorage for HeapStorage {}

/// Bookkeeping in arrays: room for `BLOCKS` blocks (null block included) and `KEY_SLOTS`
/// prefix-key slots, of which a pool of `n` blocks uses the first `n` nodes and the first
/// [`key_slots`]`(n)` slots — the same table a [`BlockPool`](super::BlockPool) of `n` blocks
/// has. `KEY_SLOTS` must be at least [`key_slots`]`(BLOCKS)` (checked when the type is used: a
/// smaller one does not compile). Size: `20 × BLOCKS + 24 × KEY_SLOTS` bytes plus a word; place
/// it in a `static` or on a stack that holds it.
#[derive(Clone, Debug)]
pub struct FixedStorage<const BLOCKS: usize, const KEY_SLOTS: usize> {
    nodes: [Node; BLOCKS],
    table: [Slot; KEY_SLOTS],
    num_blocks: usize,
    num_slots: usize,
}

impl<const BLOCKS: usize, const KEY_SLOTS: usize> FixedStorage<BLOCKS, KEY_SLOTS> {
    /// Refuses, at compile time, a key table too small for `BLOCKS` blocks.
    const KEY_TABLE_HOLDS_EVERY_BLOCK: () = assert!(
        KEY_SLOTS >= key_slots(BLOCKS),
        "FixedBlockPool: KEY_SLOTS must be at least key_slots(BLOCKS)"
    );

    /// Storage for `num_blocks` blocks; more than `BLOCKS` is [`PoolError::OverCapacity`].
    pub(super) fn new(num_blocks: u32) -> Result<Self, PoolError> {
        let () = Self::KEY_TABLE_HOLDS_EVERY_BLOCK;
        let n = num_blocks as usize;
        if n > BLOCKS {
            return Err(PoolError::OverCapacity {
                num_blocks,
                capacity: BLOCKS,
            });
        }
        Ok(FixedStorage {
            nodes: [Node::default(); BLOCKS],
            table: [Slot::EMPTY; KEY_SLOTS],
            num_blocks: n,
            num_slots: key_slots(n),
        })
    }
}

impl<const BLOCKS: usize, const KEY_SLOTS: usize> sealed::Slices
    for FixedStorage<BLOCKS, KEY_SLOTS>
{
    #[inline]
    fn nodes(&self) -> &[Node] {
        &self.nodes[..self.num_blocks]
    }
    #[inline]
    fn nodes_mut(&mut self) -> &mut [Node] {
        &mut self.nodes[..self.num_blocks]
    }
    #[inline]
    fn table(&self) -> &[Slot] {
        &self.table[..self.num_slots]
    }
    #[inline]
    fn table_mut(&mut self) -> &mut [Slot] {
        &mut self.table[..self.num_slots]
    }
}

impl<const BLOCKS: usize, const KEY_SLOTS: usize> PoolStorage for FixedStorage<BLOCKS, KEY_SLOTS> {}
