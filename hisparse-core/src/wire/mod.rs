//! Commands and worker reports as bytes, for engines whose scheduler and GPU workers (one per
//! tensor-parallel rank) are separate processes: the scheduler sends each step's
//! [`OffloadCommand`] to every worker, and each worker sends its [`WorkerReport`] back.
//!
//! ```
//! use hisparse_core::config::HiSparseConfig;
//! use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand, WorkerReport};
//! use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
//! use hisparse_core::presets::DEEPSEEK_V32;
//!
//! // Every process plans the same layout from the same inputs.
//! fn plan(gpu_blocks: u32) -> KvCacheConfig {
//!     let cfg = HiSparseConfig::new(DEEPSEEK_V32.top_k, 1100 * (2561024 + 515328));
//!     let mut input = LayoutInput::new(&DEEPSEEK_V32, &cfg, 0, 65536);
//!     input.num_gpu_blocks_override = Some(gpu_blocks);
//!     plan_layout(&input).unwrap()
//! }
//!
//! // The scheduler process: one fingerprint for the layout's lifetime, one buffer reused for
//! // every step's message.
//! let layout = plan(2000);
//! let fingerprint = layout.fingerprint();
//! let mut coord = Coordinator::new(layout, CoordinatorConfig::default()).unwrap();
//! coord.admit(7, &(0..300).collect::<Vec<u32>>()).unwrap();
//! let cmd = coord.step().unwrap();
//! let mut message = Vec::new();
//! cmd.encode_into(fingerprint, &mut message);
//! // ... `message` goes to every worker (a pipe, a socket, shared memory) ...
//!
//! // A worker process, with its own plan of the same layout.
//! let worker_fingerprint = plan(2000).fingerprint();
//! let received = OffloadCommand::from_bytes(&message, worker_fingerprint).unwrap();
//! assert_eq!(received, cmd);
//! // ... it executes `received` (the runtime's `begin_step`, the forward, `end_step`) and
//! // polls its transfers, which gives its report ...
//! let id = received.transfer_id.unwrap();
//! let report = WorkerReport { worker: 0, enqueued: vec![id], completed: vec![id] };
//! let reply = report.to_bytes(worker_fingerprint);
//!
//! // Back in the scheduler.
//! let r = WorkerReport::from_bytes(&reply, fingerprint).unwrap();
//! coord.report(r.worker, &r.enqueued, &r.completed).unwrap();
//!
//! // A worker planned for another layout refuses the command, as it does a damaged one.
//! let err = OffloadCommand::from_bytes(&message, plan(1999).fingerprint()).unwrap_err();
//! assert!(err.to_string().contains("planned for a different layout"));
//! let err = OffloadCommand::from_bytes(&message[..message.len() - 1], fingerprint).unwrap_err();
//! assert!(err.to_string().contains("cut short"));
//! ```
//!
//! # Format (version 2)
//!
//! A message is a header, a payload and a checksum. Every integer is fixed-width
//! little-endian: 2.3 times the bytes of LEB128 varints, but encoded and decoded with about a
//! third of the instructions (one bounds check per list element), which leaves the checksum as
//! most of the cost:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 4 | magic: `HSCM` (an [`OffloadCommand`]) or `HSWR` (a [`WorkerReport`]) |
//! | 4 | 2 | format version, `u16` ([`WIRE_VERSION`]) |
//! | 6 | 8 | layout fingerprint, `u64` ([`KvCacheConfig::fingerprint`]) |
//! | 14 | 8 | payload length `n`, `u64` |
//! | 22 | `n` | payload |
//! | 22 + `n` | 4 | CRC-32C (Castagnoli) of bytes `0 .. 22 + n`, `u32` |
//!
//! The magic and the version are the part every later version keeps, so any build can say what
//! a message is and which version wrote it. The payload is the message's fields in declaration
//! order: `u8` (1 byte), `u32` (4 bytes), `u64` (8 bytes), `flag` (1 byte, 0 or 1), `option<T>`
//! (a `flag`, then the value if it is 1), `list<T>` (a `u64` count, then that many `T`) and an
//! enum (a `u8` tag, then the variant's fields):
//!
//! | message | payload |
//! |---|---|
//! | [`OffloadCommand`] | `step` u64 · `transfer_id` option\<u64\> · `scheduled` list\<(`id` u64, `slot`, `first_token`, `num_tokens` u32, `fully_resident` flag)\> (21 B each) · `preempted` list\<u64\> · `refused` list\<(`id` u64, `reason`: a `u8` tag, then its fields: 0 `PrefillNeverFits` (`context_tokens` u32, `needed`, `capacity` u64), 1 `NeverFits` (`pool` u8: 0 GPU, 1 host; `needed`, `capacity` u64), 2 `OutOfMemory` (`bytes` u64), 3 `Internal` (none))\> · `started` list\<u32\> · `fully_resident` flag · `residency`, `host_blocks`, `block_tables` list\<(`slot`, `group`, `page`, `block` u32)\> (16 B each) · `new_host_blocks` list\<u32\> · `host_cow`, `gpu_cow` list\<(`src`, `dst` u32)\> · `restores` list\<(`bucket`, `device_block`, `host_block` u32)\> · `hot_assign` list\<(`slot`, `group` u32, `blocks` list\<u32\>)\> · `hot_release` list\<u32\> · `row_mirrors` list\<(`bucket`, `device_block`, `host_block`, `first_row`, `num_rows` u32)\> (20 B each) · `page_transfers` list\<(`bucket`, `device_block`, `host_block` u32)\> · `indexer_restores` list\<(`src`, `dst` u32)\> · `indexer_backups` list\<(`device_block`, `host_block`, `first_row`, `num_rows` u32)\> (16 B each) |
//! | [`WorkerReport`] | `worker` u32 · `enqueued` list\<u64\> · `completed` list\<u64\> |
//!
//! An empty command is 172 bytes. A DeepSeek V3.2 decode step of 256 requests at 32K context
//! under memory pressure (the scheduler bench's step: 256 scheduled requests, 1,536 row
//! mirrors, one per request and bucket, and 256 indexer backups) is 40,372 bytes;
//! `benches/benches/wire.rs` measures encoding and decoding it.
//!
//! # Decoding
//!
//! [`OffloadCommand::from_bytes`] and [`WorkerReport::from_bytes`] check everything before they
//! build anything, in this order, each failure a [`WireError`] that says what to change: the
//! magic (bytes that are no hisparse message, or a message of the other kind), the version, the
//! length (cut short, or bytes after the end), the checksum (corrupted), the layout fingerprint
//! (planned for a different layout), then every list count against the payload bytes left (a
//! damaged count never allocates more than the bytes given could hold) and every field's
//! encoding. A decoder does not check what only a layout knows (a block inside the pool, a
//! group index): the runtime checks a command against its layout before it executes it.
//!
//! A change to the format or to what the fingerprint covers bumps [`WIRE_VERSION`]; a build
//! reads its own version only.
//!
//! [`KvCacheConfig::fingerprint`]: crate::layout::KvCacheConfig::fingerprint

pub(crate) mod checksum;
mod error;
mod frame;
mod messages;
#[cfg(test)]
mod tests;

use core::fmt;

#[cfg(doc)]
use crate::coordinator::{OffloadCommand, WorkerReport};
pub use crate::layout::LayoutFingerprint;
pub use error::WireError;

/// The format version this build writes and reads.
pub const WIRE_VERSION: u16 = 2;

/// Bytes of a message header (magic, version, fingerprint, payload length).
pub const HEADER_BYTES: usize = 22;

/// Bytes of the checksum after the payload.
pub const CHECKSUM_BYTES: usize = 4;

/// The kinds of message the format carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageKind {
    /// A step's [`OffloadCommand`] (scheduler → workers).
    Command,
    /// A [`WorkerReport`] (worker → scheduler).
    WorkerReport,
}

impl MessageKind {
    const ALL: [MessageKind; 2] = [MessageKind::Command, MessageKind::WorkerReport];

    /// The four bytes a message of this kind starts with.
    pub const fn magic(self) -> [u8; 4] {
        match self {
            MessageKind::Command => *b"HSCM",
            MessageKind::WorkerReport => *b"HSWR",
        }
    }

    /// The kind whose magic `magic` is.
    pub fn from_magic(magic: [u8; 4]) -> Option<MessageKind> {
        Self::ALL.into_iter().find(|k| k.magic() == magic)
    }

    /// The function that decodes this kind (named in errors).
    const fn decoder(self) -> &'static str {
        match self {
            MessageKind::Command => "OffloadCommand::from_bytes",
            MessageKind::WorkerReport => "WorkerReport::from_bytes",
        }
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MessageKind::Command => "command",
            MessageKind::WorkerReport => "worker report",
        })
    }
}
