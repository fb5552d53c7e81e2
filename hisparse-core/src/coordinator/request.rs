//! The per-request record: the request's tokens, progress and cursors, and one table per
//! manager.

use alloc::vec::Vec;

use super::managers::{HotRegion, PagedTable, ResidentTable, SourceTable};
use super::{CoordError, RefusalReason, RequestId};

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    /// Queued (never started, or preempted): holds no block.
    Waiting,
    /// Has a data-plane state row and blocks.
    Running,
    /// Refused while a step was scheduled: holds no block, in no queue, until finished.
    Refused(RefusalReason),
}

/// Where an imported request's KV is ([`super::Coordinator::reserve_import`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Import {
    /// Not imported (or started already).
    None,
    /// Host blocks named for the KV of this many tokens; the writes are not complete (the
    /// request is in no queue).
    Reserved(u32),
    /// The KV of this many tokens is durable in its host blocks; queued to start.
    Ready(u32),
}

/// Everything the coordinator knows about one request.
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
    /// Fewest computed tokens a rollback may leave: of the request's last scheduled chunk
    /// `first..target`, `max(first + 1, target - (max_query_len - 1))` (its first token and
    /// all but the last `max_query_len - 1` of its tokens stay).
    pub(super) rollback_floor: u32,
    /// Full pages below this are published in the GPU prefix cache. A page is published once
    /// every one of its tokens is below `rollback_floor`: a page filled by tokens a rollback may
    /// still take back must not be adopted by another request (it would share a block the
    /// rolled-back request writes again).
    pub(super) gpu_published: u32,
    /// Pages with GPU blocks (indexer, regular, resident).
    pub(super) pages: u32,
    /// Prefix-hit pages (read from host from the start).
    pub(super) hit_pages: u32,
    /// Largest transfer id that touches this request's blocks.
    pub(super) last_xfer: u64,
    /// Tokens below this are prefill (the prompt, or everything a restart recomputes): a chunk
    /// starting below it reads its whole earlier context on the GPU, staged there when some of
    /// it lives only on host. Set when the request starts.
    pub(super) prefill_end: u32,
    /// The step (`Coordinator::step_no + 1` while it is planned) whose prefill chunk this
    /// request was given: its pages stay on the GPU for that step (reclaim passes it over).
    pub(super) prefill_step: u64,
    /// The step (`Coordinator::step_no + 1` while it is planned) that last scheduled tokens of
    /// it: a rollback inside that step, before its command is built, is refused.
    pub(super) scheduled_step: u64,
    /// Whether its first tokens' KV is imported, and how far that is.
    pub(super) import: Import,
    /// Host blocks, prefix hashes, durable prefix ([`super::managers::SourceManager`]).
    pub(super) source: SourceTable,
    /// Indexer and regular blocks ([`super::managers::PagedManager`]).
    pub(super) paged: PagedTable,
    /// Resident blocks and page lifecycle ([`super::managers::ResidentManager`]).
    pub(super) resident: ResidentTable,
    /// Hot region ([`super::managers::HotManager`]).
    pub(super) hot: HotRegion,
}

impl Req {
    /// The error of a call that needs this request running (or, to start it, waiting) and
    /// found it elsewhere: a refused request says so and why.
    pub(super) fn status_error(&self) -> CoordError {
        match self.status {
            Status::Refused(reason) => CoordError::Refused {
                id: self.id,
                reason,
            },
            _ => CoordError::NotRunning { id: self.id },
        }
    }
}

/// `Req::row` of a request that is not running.
pub(super) const NO_ROW: u32 = u32::MAX;

/// A placeholder record (parked in `Coordinator::spare`).
pub(super) fn empty_req() -> Req {
    Req {
        id: 0,
        generation: 0,
        status: Status::Waiting,
        slot: 0,
        row: NO_ROW,
        tokens: Vec::new(),
        num_computed: 0,
        rollback_floor: 0,
        gpu_published: 0,
        pages: 0,
        hit_pages: 0,
        last_xfer: 0,
        prefill_end: 0,
        prefill_step: 0,
        scheduled_step: 0,
        import: Import::None,
        source: SourceTable::default(),
        paged: PagedTable::default(),
        resident: ResidentTable::default(),
        hot: HotRegion::default(),
    }
}
