//! The errors of the block pools.

use core::fmt;

/// A misuse of a block pool ([`Pool`](super::Pool), on the heap or of fixed capacity). Every variant names the block.
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
    /// A [`FixedBlockPool`](super::FixedBlockPool) was asked for more blocks than its capacity; nothing was built.
    OverCapacity {
        /// Blocks asked for.
        num_blocks: u32,
        /// The pool type's capacity (its `BLOCKS` parameter).
        capacity: usize,
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
            PoolError::OverCapacity {
                num_blocks,
                capacity,
            } => write!(
                f,
                "pool: {num_blocks} blocks asked of a fixed pool that holds at most {capacity}; plan a smaller pool or raise the pool type's `BLOCKS`"
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
