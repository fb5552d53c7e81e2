//! Contiguous bulk copies between host memory and device buffers, and inside one buffer: the
//! bounds checks every backend applies and the reference copies.

use crate::error::{OpError, OpName};
use crate::ops::BufferLen;

/// Checks a contiguous copy of `bytes` from `src[src_offset..]` to `dst[dst_offset..]`
/// (bulk host↔device and device↔device copies, also the bandwidth ceilings of the benches).
pub fn check_bulk_copy(
    src_len: u64,
    src_offset: u64,
    dst_len: u64,
    dst_offset: u64,
    bytes: u64,
) -> Result<(), OpError> {
    const OP: OpName = OpName::BulkCopy;
    range_fits(OP, "src", src_len, src_offset, bytes)?;
    range_fits(OP, "dst", dst_len, dst_offset, bytes)
}

/// `bytes` from `offset` of `buffer` (of `len` bytes) lie inside it.
fn range_fits(
    op: OpName,
    buffer: &'static str,
    len: u64,
    offset: u64,
    bytes: u64,
) -> Result<(), OpError> {
    let needed = offset
        .checked_add(bytes)
        .ok_or(OpError::Overflow { op, field: buffer })?;
    if needed > len {
        return Err(OpError::BufferTooSmall {
            op,
            buffer,
            needed,
            actual: len,
        });
    }
    Ok(())
}

/// [`check_bulk_copy`] for two buffers, with offsets and size as `usize`.
pub fn check_bulk<S: BufferLen + ?Sized, D: BufferLen + ?Sized>(
    src: &S,
    src_offset: usize,
    dst: &D,
    dst_offset: usize,
    bytes: usize,
) -> Result<(), OpError> {
    check_bulk_copy(
        src.byte_len(),
        src_offset as u64,
        dst.byte_len(),
        dst_offset as u64,
        bytes as u64,
    )
}

/// Checks writing all of `src` into `dst` at byte `offset` (uploads, pinned writes).
pub fn check_write<D: BufferLen + ?Sized>(
    dst: &D,
    offset: usize,
    src: &[u8],
) -> Result<(), OpError> {
    check_bulk(src, 0, dst, offset, src.len())
}

/// Checks reading `dst.len()` bytes of `src` from byte `offset` (downloads, pinned reads).
pub fn check_read<S: BufferLen + ?Sized>(
    src: &S,
    offset: usize,
    dst: &[u8],
) -> Result<(), OpError> {
    check_bulk(src, offset, dst, 0, dst.len())
}

/// Checks a copy of `bytes` from `src_offset` to `dst_offset` inside one buffer of `len` bytes:
/// both ranges inside the buffer and disjoint (an overlapping copy has no single right answer
/// once a backend splits it across threads).
pub fn check_copy_within(
    len: u64,
    src_offset: u64,
    dst_offset: u64,
    bytes: u64,
) -> Result<(), OpError> {
    const OP: OpName = OpName::CopyWithin;
    range_fits(OP, "src", len, src_offset, bytes)?;
    range_fits(OP, "dst", len, dst_offset, bytes)?;
    if bytes > 0 && src_offset < dst_offset + bytes && dst_offset < src_offset + bytes {
        return Err(OpError::Overlap {
            op: OP,
            src: src_offset,
            dst: dst_offset,
            bytes,
        });
    }
    Ok(())
}

/// Reference copy inside one byte slice ([`check_copy_within`] first).
pub fn copy_within(
    buf: &mut [u8],
    src_offset: usize,
    dst_offset: usize,
    bytes: usize,
) -> Result<(), OpError> {
    check_copy_within(
        buf.len() as u64,
        src_offset as u64,
        dst_offset as u64,
        bytes as u64,
    )?;
    buf.copy_within(src_offset..src_offset + bytes, dst_offset);
    Ok(())
}

/// Reference bulk copy between two byte slices.
pub fn bulk_copy(
    src: &[u8],
    src_offset: usize,
    dst: &mut [u8],
    dst_offset: usize,
    bytes: usize,
) -> Result<(), OpError> {
    check_bulk(src, src_offset, dst, dst_offset, bytes)?;
    dst[dst_offset..dst_offset + bytes].copy_from_slice(&src[src_offset..src_offset + bytes]);
    Ok(())
}
