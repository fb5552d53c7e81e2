//! Data-plane operations: validated descriptors and the reference implementation of each.
//!
//! A descriptor (`*Desc`) holds the *shape* of one operation: sizes, strides, layouts. It is
//! plain data and validates itself. The argument structs (`*Args`) name the buffers an operation
//! reads and writes; they are generic over the buffer type so the same struct serves every backend
//! and the reference (which uses plain slices).
//!
//! The reference functions in each submodule *are* the specification (§5 of `docs/contract.md`,
//! which the crates cite as "contract §N"): every backend must produce bit-identical outputs,
//! including every `-1`, every LRU order and every copied byte. They are written for clarity,
//! not speed.
//!
//! Element types in device buffers: indices and block ids are `i32`, LRU orders are `u16`, all
//! in native byte order. `-1` means "no row".

pub mod copy;
pub mod indexer_backup;
pub mod invalidate;
pub mod pinned;
pub mod remap;
#[cfg(feature = "alloc")]
pub mod resolve;
pub mod slot_mapping;
pub mod stats;
#[cfg(feature = "alloc")]
pub mod swap_in;
pub mod table;

pub use copy::{
    BlockPair, COPY_ALIGNMENT, Direction, GatherArgs, GatherDesc, LayerPair, PageCopyDesc,
    PageLayout, RowCopyDesc, RowSpan, RowUnit,
};
pub use indexer_backup::{IndexerBackupArgs, IndexerBackupDesc};
pub use invalidate::{InvalidateArgs, InvalidateDesc};
pub use pinned::{
    HostLimits, LockedMemory, MAX_PINNED_PERCENT, PINNED_ALIGNMENT, PinnedBudgetError,
    check_host_pool, check_pinned_budget,
};
pub use remap::{DcpSplit, RemapArgs, RemapDesc, RemapModesArgs, RemapModesDesc, fill_remap_row};
pub use slot_mapping::{SlotMappingArgs, SlotMappingDesc};
pub use stats::{
    CallStats, STATS_CALLS, STATS_HITS, STATS_MISSES, STATS_SLOT_BYTES, STATS_SLOT_WORDS,
    STATS_VALID,
};
pub use table::{HotResetDesc, TableWrite, TableWriteDesc};

#[cfg(feature = "alloc")]
pub use resolve::{ResolveArgs, ResolveBuffers, ResolveDesc, ResolveSizes, ResolveSlices};

use crate::error::{OpError, OpName};

/// Size in bytes of one `i32` element.
pub const I32_BYTES: u64 = 4;
/// Size in bytes of one `u16` LRU element.
pub const U16_BYTES: u64 = 2;
/// Largest hot buffer: LRU slots are 16-bit.
pub const MAX_HOT_SLOTS: u32 = 32768;

/// Reports the size of a buffer in bytes. Implemented for slices (the reference) and by every
/// backend for its buffer types, so descriptors can check arguments without knowing the backend.
pub trait BufferLen {
    /// Length in bytes.
    fn byte_len(&self) -> u64;
}

impl<T> BufferLen for [T] {
    fn byte_len(&self) -> u64 {
        core::mem::size_of_val(self) as u64
    }
}

impl<T: BufferLen + ?Sized> BufferLen for &T {
    fn byte_len(&self) -> u64 {
        (**self).byte_len()
    }
}

impl<T: BufferLen + ?Sized> BufferLen for &mut T {
    fn byte_len(&self) -> u64 {
        (**self).byte_len()
    }
}

/// `a * b` with an [`OpError::Overflow`] naming `field`.
pub(crate) fn mul(op: OpName, field: &'static str, a: u64, b: u64) -> Result<u64, OpError> {
    a.checked_mul(b).ok_or(OpError::Overflow { op, field })
}

/// Checks that `buffer` holds at least `elements * elem_bytes` bytes.
pub(crate) fn need(
    op: OpName,
    buffer: &'static str,
    actual: u64,
    elements: u64,
    elem_bytes: u64,
) -> Result<(), OpError> {
    let needed = mul(op, buffer, elements, elem_bytes)?;
    if actual < needed {
        return Err(OpError::BufferTooSmall {
            op,
            buffer,
            needed,
            actual,
        });
    }
    Ok(())
}

/// Checks an optional buffer against its descriptor's declaration of it (one rule for every op
/// with an optional input). Declared (`entries` is `Some`) and given (`actual` is `Some`): it
/// must hold `entries * elem_bytes` bytes. Declared but not given: too small (0 bytes). Given
/// but not declared: a [`OpError::Mismatch`] of `given_field` against `declared_field`, so the
/// caller learns which declaration to add. Neither: nothing to check.
pub(crate) fn need_declared(
    op: OpName,
    buffer: &'static str,
    actual: Option<u64>,
    entries: Option<u64>,
    elem_bytes: u64,
    given_field: &'static str,
    declared_field: &'static str,
) -> Result<(), OpError> {
    match (entries, actual) {
        (Some(n), Some(len)) => need(op, buffer, len, n, elem_bytes),
        (None, None) => Ok(()),
        (Some(n), None) => Err(OpError::BufferTooSmall {
            op,
            buffer,
            needed: mul(op, buffer, n, elem_bytes)?,
            actual: 0,
        }),
        (None, Some(_)) => Err(OpError::Mismatch {
            op,
            field: given_field,
            value: 1,
            expected_field: declared_field,
            expected: 0,
        }),
    }
}

/// Checks `value` is positive.
pub(crate) fn nonzero(op: OpName, field: &'static str, value: u64) -> Result<(), OpError> {
    if value == 0 {
        Err(OpError::Zero { op, field })
    } else {
        Ok(())
    }
}

/// Checks `min <= value <= max`.
pub(crate) fn in_range(
    op: OpName,
    field: &'static str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<(), OpError> {
    if value < min || value > max {
        Err(OpError::OutOfRange {
            op,
            field,
            value,
            min,
            max,
        })
    } else {
        Ok(())
    }
}

/// Checks `value % alignment == 0`.
pub(crate) fn aligned(
    op: OpName,
    field: &'static str,
    value: u64,
    alignment: u64,
) -> Result<(), OpError> {
    if !value.is_multiple_of(alignment) {
        Err(OpError::Misaligned {
            op,
            field,
            value,
            alignment,
        })
    } else {
        Ok(())
    }
}

/// `block * stride + offset` as an `i32` physical row, or `-1` when `block` is negative or the
/// result does not fit an `i32`. Every backend must compute physical rows exactly this way.
#[inline]
pub fn physical_row(block: i32, stride_rows: u32, offset: u32) -> i32 {
    if block < 0 {
        return -1;
    }
    let row = block as i64 * stride_rows as i64 + offset as i64;
    if row > i32::MAX as i64 {
        -1
    } else {
        row as i32
    }
}
