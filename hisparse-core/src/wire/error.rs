//! [`WireError`]: why bytes are not a message this build can decode.

use core::fmt;

use super::{MessageKind, WIRE_VERSION};

/// Why bytes could not be decoded as a message. Each variant names the message kind it was
/// decoding and says what to change; nothing was built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The bytes end before the message does (the empty slice included).
    Truncated {
        /// What was being decoded.
        kind: MessageKind,
        /// Bytes the message needs (its header and checksum at least; the whole message once
        /// the header is read).
        needed: u64,
        /// Bytes given.
        actual: u64,
    },
    /// The bytes go on after the message ends.
    TrailingBytes {
        /// What was being decoded.
        kind: MessageKind,
        /// Bytes the message has, by its header.
        expected: u64,
        /// Bytes given.
        actual: u64,
    },
    /// The bytes do not start with the magic of any hisparse message: not a hisparse blob.
    Foreign {
        /// What was being decoded.
        kind: MessageKind,
        /// The first four bytes.
        found: [u8; 4],
    },
    /// The bytes are a hisparse message of another kind (a worker report given to the command
    /// decoder, or the other way round).
    WrongKind {
        /// What was being decoded.
        kind: MessageKind,
        /// What the bytes are.
        found: MessageKind,
    },
    /// The message was written in a format version this build does not read.
    UnsupportedVersion {
        /// What was being decoded.
        kind: MessageKind,
        /// The message's version.
        found: u16,
    },
    /// The bytes changed after they were written: the checksum does not match.
    ChecksumMismatch {
        /// What was being decoded.
        kind: MessageKind,
        /// The checksum the message carries.
        stored: u32,
        /// The checksum of the bytes received.
        computed: u32,
    },
    /// The message was planned for a different layout.
    LayoutMismatch {
        /// What was being decoded.
        kind: MessageKind,
        /// The fingerprint the message carries.
        found: u64,
        /// The fingerprint of the decoder's layout.
        expected: u64,
    },
    /// A list claims more entries than the bytes left could hold (checked before anything is
    /// allocated).
    CountTooLarge {
        /// What was being decoded.
        kind: MessageKind,
        /// The list.
        field: &'static str,
        /// Entries it claims.
        count: u64,
        /// Payload bytes left for them.
        bytes_left: u64,
    },
    /// A field is not in the form this format's encoder writes: a flag other than 0 or 1, an
    /// enum tag this version does not define, the payload ending inside a field, or bytes after
    /// the last field.
    Malformed {
        /// What was being decoded.
        kind: MessageKind,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated {
                kind,
                needed: _,
                actual: 0,
            } => write!(
                f,
                "{kind}: the blob is empty (0 bytes); send the encoded {kind}'s bytes"
            ),
            WireError::Truncated {
                kind,
                needed,
                actual,
            } => write!(
                f,
                "{kind}: the blob ends after {actual} bytes but the message needs {needed}; it was cut short in transit — send every byte of the message (check the channel's framing)"
            ),
            WireError::TrailingBytes {
                kind,
                expected,
                actual,
            } => write!(
                f,
                "{kind}: {actual} bytes given but the message is {expected} bytes long; pass exactly one message (split the stream at message boundaries)"
            ),
            WireError::Foreign { kind, found } => write!(
                f,
                "{kind}: the bytes start with {found:02x?}, not the magic {:02x?} (\"{}\"): this is not a hisparse message — check what the channel carries",
                kind.magic(),
                kind.magic().escape_ascii()
            ),
            WireError::WrongKind { kind, found } => write!(
                f,
                "{kind}: these bytes are a {found}, not a {kind}; decode them with {}",
                found.decoder()
            ),
            WireError::UnsupportedVersion { kind, found } => write!(
                f,
                "{kind}: wire format version {found} ({} hisparse), but this build reads version {WIRE_VERSION}; run the scheduler and the workers from the same hisparse release",
                if found > WIRE_VERSION {
                    "written by a newer"
                } else {
                    "written by an older"
                }
            ),
            WireError::ChecksumMismatch {
                kind,
                stored,
                computed,
            } => write!(
                f,
                "{kind}: corrupted — the message's CRC-32C is {stored:08x} but its bytes give {computed:08x}; the bytes changed in transit or in memory: resend it and check the channel"
            ),
            WireError::LayoutMismatch {
                kind,
                found,
                expected,
            } => write!(
                f,
                "{kind}: planned for a different layout (fingerprint {found:016x}, this side's layout {expected:016x}) — the scheduler and the workers must use the same layout: plan it from the same model, configuration and memory figures on both sides"
            ),
            WireError::CountTooLarge {
                kind,
                field,
                count,
                bytes_left,
            } => write!(
                f,
                "{kind}: `{field}` claims {count} entries but only {bytes_left} payload bytes are left for them; the blob was not written by a hisparse encoder (or was altered and its checksum recomputed)"
            ),
            WireError::Malformed {
                kind,
                field,
                problem,
            } => write!(
                f,
                "{kind}: `{field}`: {problem}; the blob was not written by a hisparse encoder (or was altered and its checksum recomputed)"
            ),
        }
    }
}

impl crate::error::Error for WireError {
    fn kind(&self) -> crate::error::ErrorKind {
        // Every variant is bytes the caller handed over that cannot be used as they are.
        crate::error::ErrorKind::InvalidArgument
    }
}

impl core::error::Error for WireError {}
