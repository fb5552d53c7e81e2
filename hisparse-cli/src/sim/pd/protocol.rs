//! What the two processes of `simulate --pd nixl` say to each other (one JSON line per message
//! over the prefill process's stdin and stdout) and the helpers both sides use.

use std::time::Duration;

use hisparse_core::layout::KvCacheConfig;
use hisparse_nixl::{DecodeOffer, MemoryKind, Region};
use serde::{Deserialize, Serialize};

use super::super::engine::SimSetup;
use super::{PageManifest, WriteLayout};
use crate::error::CliError;

/// How long either side waits for the other before it calls the run stalled.
pub(super) const SILENCE: Duration = Duration::from_secs(120);

/// Bulk writes of the transport's own figure (the best is reported).
pub(super) const BULK_REPEATS: u32 = 3;

/// What the prefill process is told first.
#[derive(Serialize, Deserialize)]
pub(super) struct Hello {
    pub(super) backend: String,
    pub(super) device: Option<String>,
    pub(super) setup: SimSetup,
    /// The prefill side's own layout (the same pages, a larger GPU pool).
    pub(super) prefill_kv: KvCacheConfig,
    pub(super) offer: DecodeOffer,
    /// How requests are written.
    pub(super) write: WriteLayout,
}

/// Where a bulk write reads from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum BulkSource {
    /// Host memory of the prefill process.
    Host,
    /// Memory of the prefill side's device (GPU memory on a GPU backend).
    Device,
}

/// A message to the prefill process.
#[derive(Serialize, Deserialize)]
pub(super) enum ToPrefill {
    /// A plain write of `bytes` from `source` in descriptors of `descriptor_bytes` (the
    /// transport's own figure).
    Bulk {
        bytes: u64,
        source: BulkSource,
        descriptor_bytes: u64,
    },
    /// Start prefilling the requests.
    Start,
    /// The host blocks of a prefilled request.
    Manifest(PageManifest),
    /// Every request is done: exit.
    Done,
}

/// A message from the prefill process.
#[derive(Serialize, Deserialize)]
pub(super) enum FromPrefill {
    /// The agent is up: its name, the backend's and the device's.
    Ready(String, String, String),
    /// A bulk write completed: (seconds, descriptors).
    BulkSent(f64, u64),
    /// A request's prompt is prefilled: (request, tokens).
    Prefilled(u64, u32),
    /// A request's write completed.
    Sent {
        /// Bytes written.
        bytes: u64,
        /// Seconds from preparing the write to its completion.
        seconds: f64,
        /// Descriptors of the write.
        descriptors: u64,
        /// Seconds of the packing copies before it (0 page by page).
        pack_seconds: f64,
    },
    /// The prefill side failed.
    Failed(String),
}

pub(super) fn nixl_err(e: hisparse_nixl::PdError) -> CliError {
    CliError::failed(format!("nixl: {e}"))
}

pub(super) fn rt_err(what: &str) -> impl Fn(String) -> CliError + '_ {
    move |e| CliError::failed(format!("{what}: {e}"))
}

/// A region of `len` bytes at `address` of a pool (host memory or GPU `ordinal`).
pub(super) fn region(address: u64, len: u64, memory: MemoryKind) -> Region {
    Region {
        address,
        len,
        memory,
    }
}

/// The prompt of request `uid` (both sides use the same tokens).
pub(super) fn prompt(uid: u64, context: u32) -> Vec<u32> {
    (0..context)
        .map(|p| (uid as u32).wrapping_mul(1_000_003).wrapping_add(p))
        .collect()
}
