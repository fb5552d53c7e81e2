//! The per-request record: every manager's table of one request, its tokens and cursors, and
//! the page lifecycle states.

use alloc::vec::Vec;

use super::RequestId;

// Page states.
pub(super) const DIRTY: u8 = 0;
pub(super) const PENDING: u8 = 1;
pub(super) const PENDING_RELEASE: u8 = 2;
pub(super) const CLEAN: u8 = 3;
pub(super) const RECLAIMED: u8 = 4;

/// Lifecycle state of one page of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageState {
    /// Only on the GPU.
    Dirty,
    /// Host transfer in flight.
    Pending,
    /// Host transfer in flight; the GPU copy is released when it completes.
    PendingRelease,
    /// Host copy durable, GPU copy still readable.
    Clean,
    /// GPU copy released; read from host.
    Reclaimed,
}

pub(super) fn page_state(s: u8) -> PageState {
    match s {
        DIRTY => PageState::Dirty,
        PENDING => PageState::Pending,
        PENDING_RELEASE => PageState::PendingRelease,
        CLEAN => PageState::Clean,
        _ => PageState::Reclaimed,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    Waiting,
    Running,
}

#[derive(Clone, Debug)]
pub(super) struct Req {
    pub(super) id: RequestId,
    pub(super) generation: u32,
    pub(super) status: Status,
    /// Index in `Coordinator::reqs`.
    pub(super) slot: u32,
    /// Data-plane state row while running (`NO_ROW` otherwise).
    pub(super) row: u32,
    pub(super) tokens: Vec<u32>,
    pub(super) num_computed: u32,
    /// Pages with GPU blocks (indexer, regular, resident).
    pub(super) pages: u32,
    pub(super) host: Vec<u32>,
    pub(super) indexer: Vec<u32>,
    /// `page * num_regular + g`.
    pub(super) regular: Vec<u32>,
    /// `page * num_buckets + b`.
    pub(super) resident: Vec<u32>,
    pub(super) state: Vec<u8>,
    /// Transfer id that made the page durable (0 = durable from the start).
    pub(super) xfer: Vec<u64>,
    pub(super) hashes: Vec<u64>,
    /// `bucket * hot_blocks_per_request + i`; empty = no hot region.
    pub(super) hot: Vec<u32>,
    /// Pages below are reclaimed, marked for release, or prefix hits.
    pub(super) reclaim_cursor: u32,
    /// Non-eager: pages below have a transfer planned.
    pub(super) spill_cursor: u32,
    /// Pages with null resident entries.
    pub(super) host_only: u32,
    /// Pages marked release-after-transfer.
    pub(super) pending_release: u32,
    pub(super) ready_prefix: u32,
    /// Prefix-hit pages (read from host from the start).
    pub(super) hit_pages: u32,
    /// Per regular group: pages below were given back (sliding window).
    pub(super) window_cursor: Vec<u32>,
    /// Largest transfer id that touches this request's blocks.
    pub(super) last_xfer: u64,
}

pub(super) const NO_ROW: u32 = u32::MAX;

pub(super) const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

pub(super) fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = parent ^ 0x9E37_79B9_7F4A_7C15;
    for &t in tokens {
        h ^= u64::from(t);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
        h ^= h >> 29;
    }
    h
}

pub(super) fn empty_req() -> Req {
    Req {
        id: 0,
        generation: 0,
        status: Status::Waiting,
        slot: 0,
        row: NO_ROW,
        tokens: Vec::new(),
        num_computed: 0,
        pages: 0,
        host: Vec::new(),
        indexer: Vec::new(),
        regular: Vec::new(),
        resident: Vec::new(),
        state: Vec::new(),
        xfer: Vec::new(),
        hashes: Vec::new(),
        hot: Vec::new(),
        reclaim_cursor: 0,
        spill_cursor: 0,
        host_only: 0,
        pending_release: 0,
        ready_prefix: 0,
        hit_pages: 0,
        window_cursor: Vec::new(),
        last_xfer: 0,
    }
}
