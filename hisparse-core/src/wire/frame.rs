//! The frame every message shares (header, payload, checksum) and the payload's primitives:
//! fixed-width little-endian integers, flags, lists — written by [`Encoder`], read back by
//! [`Decoder`], which checks each against the bytes left before it takes anything.

use alloc::vec::Vec;

use super::checksum::crc32c;
use super::{CHECKSUM_BYTES, HEADER_BYTES, MessageKind, WIRE_VERSION, WireError};
use crate::layout::LayoutFingerprint;

/// Offsets of the header's fields.
const VERSION_AT: usize = 4;
const FINGERPRINT_AT: usize = 6;
const LENGTH_AT: usize = 14;

/// Builds one message at the end of a buffer: [`Encoder::begin`] writes the header, the payload
/// is appended through the `put_*` methods, [`Encoder::finish`] fills in the length and appends
/// the checksum.
pub(super) struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Encoder<'a> {
    /// Appends the header of a `kind` message for the layout `fingerprint` (the payload length
    /// is filled in by [`Encoder::finish`]), reserving room for `payload_bytes` more.
    pub(super) fn begin(
        out: &'a mut Vec<u8>,
        kind: MessageKind,
        fingerprint: LayoutFingerprint,
        payload_bytes: usize,
    ) -> Self {
        out.reserve(
            HEADER_BYTES
                .saturating_add(payload_bytes)
                .saturating_add(CHECKSUM_BYTES),
        );
        let start = out.len();
        out.extend_from_slice(&kind.magic());
        out.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        out.extend_from_slice(&fingerprint.as_u64().to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        Encoder { out, start }
    }

    /// A `u32`, 4 bytes little-endian.
    #[inline]
    pub(super) fn put_u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// `N` `u32`s (at most 6), 4 bytes little-endian each, with one append: an element's
    /// fields.
    #[inline(always)]
    pub(super) fn put_u32s<const N: usize>(&mut self, values: [u32; N]) {
        const { assert!(N <= 6) };
        let mut bytes = [0u8; 24];
        for (i, v) in values.into_iter().enumerate() {
            bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        self.out.extend_from_slice(&bytes[..4 * N]);
    }

    /// A `u64`, 8 bytes little-endian.
    #[inline]
    pub(super) fn put_u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// A flag byte: 0 or 1.
    #[inline]
    pub(super) fn put_flag(&mut self, v: bool) {
        self.put_u8(u8::from(v));
    }

    /// One byte (a flag, or a variant's tag).
    #[inline]
    pub(super) fn put_u8(&mut self, v: u8) {
        self.out.push(v);
    }

    /// A list: its length (`u64`), then each element.
    pub(super) fn put_list<T: WireValue>(&mut self, items: &[T]) {
        self.put_u64(items.len() as u64);
        for item in items {
            item.put(self);
        }
    }

    /// Fills in the payload length and appends the checksum of the whole message.
    pub(super) fn finish(self) {
        let payload = (self.out.len() - self.start - HEADER_BYTES) as u64;
        let at = self.start + LENGTH_AT;
        self.out[at..at + 8].copy_from_slice(&payload.to_le_bytes());
        let crc = crc32c(&self.out[self.start..]);
        self.out.extend_from_slice(&crc.to_le_bytes());
    }
}

/// Bytes of a list of `items` without what its elements hold beyond [`WireValue::MIN_BYTES`]
/// (a hot region's blocks): what an encoder reserves.
pub(super) fn list_bytes<T: WireValue>(items: &[T]) -> usize {
    items
        .len()
        .saturating_mul(T::MIN_BYTES as usize)
        .saturating_add(8)
}

/// A value the payload carries, with its encoding in both directions.
pub(super) trait WireValue: Sized {
    /// The bytes one encoded value takes (the fewest, for one holding a list): a list's count is
    /// checked against the bytes left divided by this before anything is allocated.
    const MIN_BYTES: u64;
    /// Appends the value.
    fn put(&self, e: &mut Encoder<'_>);
    /// Reads one value; `field` names it in errors.
    fn take(d: &mut Decoder<'_>, field: &'static str) -> Result<Self, WireError>;
}

impl WireValue for u64 {
    const MIN_BYTES: u64 = 8;
    fn put(&self, e: &mut Encoder<'_>) {
        e.put_u64(*self);
    }
    fn take(d: &mut Decoder<'_>, field: &'static str) -> Result<Self, WireError> {
        d.u64(field)
    }
}

impl WireValue for u32 {
    const MIN_BYTES: u64 = 4;
    fn put(&self, e: &mut Encoder<'_>) {
        e.put_u32(*self);
    }
    fn take(d: &mut Decoder<'_>, field: &'static str) -> Result<Self, WireError> {
        d.u32(field)
    }
}

/// Checks a message's frame — magic, version, length, checksum, layout fingerprint, in that
/// order — and returns a [`Decoder`] over its payload.
pub(super) fn open(
    bytes: &[u8],
    kind: MessageKind,
    fingerprint: LayoutFingerprint,
) -> Result<Decoder<'_>, WireError> {
    let actual = bytes.len() as u64;
    let minimum = (HEADER_BYTES + CHECKSUM_BYTES) as u64;
    let truncated = |needed| WireError::Truncated {
        kind,
        needed,
        actual,
    };
    // Magic and version first: they are the part of the header every version keeps.
    let Some(magic) = bytes.first_chunk::<4>() else {
        return Err(truncated(minimum));
    };
    if *magic != kind.magic() {
        return Err(match MessageKind::from_magic(*magic) {
            Some(found) => WireError::WrongKind { kind, found },
            None => WireError::Foreign {
                kind,
                found: *magic,
            },
        });
    }
    let Some(version) = bytes.get(VERSION_AT..VERSION_AT + 2) else {
        return Err(truncated(minimum));
    };
    let version = u16::from_le_bytes([version[0], version[1]]);
    if version != WIRE_VERSION {
        return Err(WireError::UnsupportedVersion {
            kind,
            found: version,
        });
    }
    let Some(header) = bytes.first_chunk::<HEADER_BYTES>() else {
        return Err(truncated(minimum));
    };
    let field_u64 = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&header[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let payload_len = field_u64(LENGTH_AT);
    // Saturating: a corrupted length near 2^64 reads as "needs more bytes than exist".
    let total = payload_len.saturating_add(minimum);
    if actual < total {
        return Err(truncated(total));
    }
    if actual > total {
        return Err(WireError::TrailingBytes {
            kind,
            expected: total,
            actual,
        });
    }
    // `total == actual` fits in usize.
    let (body, stored) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    let stored = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
    let computed = crc32c(body);
    if stored != computed {
        return Err(WireError::ChecksumMismatch {
            kind,
            stored,
            computed,
        });
    }
    let found = field_u64(FINGERPRINT_AT);
    if found != fingerprint.as_u64() {
        return Err(WireError::LayoutMismatch {
            kind,
            found,
            expected: fingerprint.as_u64(),
        });
    }
    Ok(Decoder {
        rest: &body[HEADER_BYTES..],
        kind,
    })
}

/// Reads a payload front to back; every read checks the bytes left first.
pub(super) struct Decoder<'a> {
    rest: &'a [u8],
    kind: MessageKind,
}

impl Decoder<'_> {
    /// A [`WireError::Malformed`] for `field`.
    #[cold]
    pub(super) fn malformed(&self, field: &'static str, problem: &'static str) -> WireError {
        WireError::Malformed {
            kind: self.kind,
            field,
            problem,
        }
    }

    /// The next `N` bytes.
    #[inline(always)]
    fn bytes<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let Some((head, rest)) = self.rest.split_first_chunk::<N>() else {
            return Err(self.malformed(field, "the payload ends inside it"));
        };
        self.rest = rest;
        Ok(*head)
    }

    /// A `u32`, 4 bytes little-endian.
    #[inline(always)]
    pub(super) fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        self.bytes(field).map(u32::from_le_bytes)
    }

    /// `N` `u32`s, 4 bytes little-endian each, with one bounds check: an element's fields.
    #[inline(always)]
    pub(super) fn u32s<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u32; N], WireError> {
        let Some((head, rest)) = self.rest.split_at_checked(4 * N) else {
            return Err(self.malformed(field, "the payload ends inside it"));
        };
        self.rest = rest;
        Ok(core::array::from_fn(|i| {
            u32::from_le_bytes([
                head[4 * i],
                head[4 * i + 1],
                head[4 * i + 2],
                head[4 * i + 3],
            ])
        }))
    }

    /// A `u64`, 8 bytes little-endian.
    #[inline(always)]
    pub(super) fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        self.bytes(field).map(u64::from_le_bytes)
    }

    /// A flag byte (0 or 1).
    #[inline(always)]
    pub(super) fn flag(&mut self, field: &'static str) -> Result<bool, WireError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.malformed(field, "a flag byte other than 0 or 1")),
        }
    }

    /// One byte (a flag, or a variant's tag).
    #[inline(always)]
    pub(super) fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        self.bytes::<1>(field).map(|[b]| b)
    }

    /// A list count that the bytes left can hold, `min_bytes` per element.
    fn count(&mut self, field: &'static str, min_bytes: u64) -> Result<usize, WireError> {
        let count = self.u64(field)?;
        let bytes_left = self.rest.len() as u64;
        if count > bytes_left / min_bytes {
            return Err(WireError::CountTooLarge {
                kind: self.kind,
                field,
                count,
                bytes_left,
            });
        }
        // At most `bytes_left`, which is a slice length: fits in usize.
        Ok(count as usize)
    }

    /// A list of `T`.
    pub(super) fn list<T: WireValue>(&mut self, field: &'static str) -> Result<Vec<T>, WireError> {
        let n = self.count(field, T::MIN_BYTES)?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(T::take(self, field)?);
        }
        Ok(items)
    }

    /// Checks the payload was read to its end.
    pub(super) fn finish(self) -> Result<(), WireError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.malformed("payload", "bytes left after the last field"))
        }
    }
}
