//! Portable error classification shared by every backend, and the typed error for malformed
//! operation descriptors.
//!
//! The core never names a backend type. Each backend defines its own error type and implements
//! [`Error`] for it, so generic code (conformance, the CLI, an engine) can react to the *kind* of
//! failure without knowing which GPU API produced it. This is the embedded-hal pattern.

use core::fmt;

/// What kind of failure an operation hit, independent of the backend that reports it.
///
/// Each variant says what the caller should do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A descriptor, buffer or argument is malformed. Fix the call; retrying cannot help.
    InvalidArgument,
    /// Device memory is exhausted. Free buffers or plan a smaller pool
    /// (`hisparse layout` shows what fits).
    OutOfDeviceMemory,
    /// Pinned (page-locked, device-visible) host memory could not be allocated, or the request
    /// exceeds the safe share of RAM. Lower the host budget.
    OutOfPinnedMemory,
    /// No driver, runtime library or device was found. Install the vendor runtime, or pick
    /// another backend; a test should report this as *skipped*.
    NotFound,
    /// The device or driver lacks a capability this operation needs (shared memory size,
    /// extension, compiler). Pick another device or backend.
    Unsupported,
    /// A kernel or shader failed to compile or load. This is a bug in the backend or an
    /// incompatible toolchain; report it with the message.
    Compilation,
    /// The device was lost or a launch faulted. The context is unusable; recreate it.
    DeviceLost,
    /// Any other backend failure; the message says more.
    Other,
}

impl ErrorKind {
    /// A short lowercase name, stable for logs and JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::OutOfDeviceMemory => "out of device memory",
            ErrorKind::OutOfPinnedMemory => "out of pinned memory",
            ErrorKind::NotFound => "not found",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Compilation => "compilation",
            ErrorKind::DeviceLost => "device lost",
            ErrorKind::Other => "other",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend error that can be classified portably.
pub trait Error: fmt::Debug + fmt::Display {
    /// The portable kind of this error.
    fn kind(&self) -> ErrorKind;
}

impl Error for core::convert::Infallible {
    fn kind(&self) -> ErrorKind {
        match *self {}
    }
}

/// Which data-plane operation a descriptor belongs to (used in error messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpName {
    /// [`crate::ops::remap`].
    Remap,
    /// `crate::ops::resolve` (with `alloc`).
    Resolve,
    /// [`crate::ops::copy`] row gather from a miss plan.
    GatherRows,
    /// [`crate::ops::copy`] whole-page copies.
    CopyPages,
    /// [`crate::ops::copy`] row-span copies.
    CopyRows,
    /// [`crate::ops::invalidate`].
    Invalidate,
    /// [`crate::ops::slot_mapping`].
    CompressedSlotMapping,
    /// Contiguous bulk copies ([`crate::ops::copy::check_bulk_copy`]).
    BulkCopy,
    /// Buffer allocation, upload or download.
    Buffer,
    /// [`crate::ops::table::write_table`].
    TableWrite,
    /// [`crate::ops::table::reset_hot_state`].
    HotReset,
    /// A copy inside one device buffer ([`crate::ops::copy::check_copy_within`]).
    CopyWithin,
    /// [`crate::ops::indexer_backup`].
    IndexerBackup,
}

impl fmt::Display for OpName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpName::Remap => "remap",
            OpName::Resolve => "resolve",
            OpName::GatherRows => "gather_rows",
            OpName::CopyPages => "copy_pages",
            OpName::CopyRows => "copy_rows",
            OpName::Invalidate => "invalidate",
            OpName::CompressedSlotMapping => "compressed_slot_mapping",
            OpName::BulkCopy => "bulk_copy",
            OpName::Buffer => "buffer",
            OpName::TableWrite => "write_table",
            OpName::HotReset => "reset_hot_state",
            OpName::IndexerBackup => "indexer_backup",
            OpName::CopyWithin => "copy_within_device",
        })
    }
}

/// A malformed operation descriptor or argument, found before any memory is touched.
///
/// Every variant names the operation and the offending field so the message alone says what to
/// fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpError {
    /// A size that must be positive is zero.
    Zero {
        /// Operation.
        op: OpName,
        /// Field name.
        field: &'static str,
    },
    /// A value lies outside its allowed inclusive range.
    OutOfRange {
        /// Operation.
        op: OpName,
        /// Field name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// A value must be a multiple of `alignment`.
    Misaligned {
        /// Operation.
        op: OpName,
        /// Field name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// Required alignment.
        alignment: u64,
    },
    /// A buffer is smaller than the descriptor says it must be.
    BufferTooSmall {
        /// Operation.
        op: OpName,
        /// Argument name.
        buffer: &'static str,
        /// Bytes the descriptor needs.
        needed: u64,
        /// Bytes the buffer has.
        actual: u64,
    },
    /// Two fields that must agree do not.
    Mismatch {
        /// Operation.
        op: OpName,
        /// First field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// Field it must equal.
        expected_field: &'static str,
        /// That field's value.
        expected: u64,
    },
    /// An element of a host-side list (page pairs, row spans) is out of range.
    ElementOutOfRange {
        /// Operation.
        op: OpName,
        /// List name.
        list: &'static str,
        /// Position in the list.
        index: usize,
        /// Field of the element.
        field: &'static str,
        /// The value given.
        value: u64,
        /// Exclusive upper bound.
        limit: u64,
    },
    /// An element of a host-side list must be strictly greater than the one before it (the
    /// list names each element once, in order).
    NotIncreasing {
        /// Operation.
        op: OpName,
        /// List name.
        list: &'static str,
        /// Position in the list.
        index: usize,
        /// Field of the element.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The previous element's value.
        previous: u64,
    },
    /// Two byte ranges of one buffer that must be disjoint overlap.
    Overlap {
        /// Operation.
        op: OpName,
        /// Start of the source range.
        src: u64,
        /// Start of the destination range.
        dst: u64,
        /// Length of both ranges.
        bytes: u64,
    },
    /// A size computation overflows the address space.
    Overflow {
        /// Operation.
        op: OpName,
        /// Field whose size overflows.
        field: &'static str,
    },
    /// The backend does not implement this mode of a valid operation (the descriptor was
    /// checked first, so the call itself is well formed): kind
    /// [`ErrorKind::Unsupported`]. Use a backend that has it (the CPU backend has every mode).
    Unsupported {
        /// Operation.
        op: OpName,
        /// The mode or feature, named as in the descriptor (`dcp`, `prefill_workspace`, …).
        feature: &'static str,
        /// The backend.
        backend: &'static str,
    },
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OpError::Zero { op, field } => write!(f, "{op}: `{field}` must be greater than 0"),
            OpError::OutOfRange {
                op,
                field,
                value,
                min,
                max,
            } => {
                write!(f, "{op}: `{field}` = {value} is outside {min}..={max}")
            }
            OpError::Misaligned {
                op,
                field,
                value,
                alignment,
            } => {
                write!(
                    f,
                    "{op}: `{field}` = {value} must be a multiple of {alignment}"
                )
            }
            OpError::BufferTooSmall {
                op,
                buffer,
                needed,
                actual,
            } => write!(
                f,
                "{op}: buffer `{buffer}` holds {actual} bytes but the descriptor needs {needed}"
            ),
            OpError::Mismatch {
                op,
                field,
                value,
                expected_field,
                expected,
            } => write!(
                f,
                "{op}: `{field}` = {value} must equal `{expected_field}` = {expected}"
            ),
            OpError::ElementOutOfRange {
                op,
                list,
                index,
                field,
                value,
                limit,
            } => write!(
                f,
                "{op}: `{list}[{index}].{field}` = {value} must be below {limit}"
            ),
            OpError::NotIncreasing {
                op,
                list,
                index,
                field,
                value,
                previous,
            } => write!(
                f,
                "{op}: `{list}[{index}].{field}` = {value} must be greater than the previous element's {previous} (sort the list and drop duplicates)"
            ),
            OpError::Overlap {
                op,
                src,
                dst,
                bytes,
            } => write!(
                f,
                "{op}: source bytes {src}..{} and destination bytes {dst}..{} overlap; copy through a second buffer or split the copy",
                src.saturating_add(bytes),
                dst.saturating_add(bytes)
            ),
            OpError::Overflow { op, field } => {
                write!(f, "{op}: size of `{field}` overflows the address space")
            }
            OpError::Unsupported {
                op,
                feature,
                backend,
            } => write!(
                f,
                "{op}: the {backend} backend does not implement `{feature}` yet; run it on a backend that does (cpu)"
            ),
        }
    }
}

impl Error for OpError {
    fn kind(&self) -> ErrorKind {
        match self {
            OpError::Unsupported { .. } => ErrorKind::Unsupported,
            _ => ErrorKind::InvalidArgument,
        }
    }
}

impl core::error::Error for OpError {}
