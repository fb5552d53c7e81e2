//! The managers of the KV-cache groups (contract §4).
//!
//! Each manager owns the per-request table of its groups (one table per request, kept in the
//! request's record) and the rules that keep that table consistent. The pools are shared and
//! passed in by the coordinator — one GPU pool serves the indexer, regular, resident and hot
//! groups, one host pool serves the source group — as is the step's [`OffloadCommand`], where
//! every table change is recorded for the workers.
//!
//! | manager | layout groups | per-request table | pool |
//! |---|---|---|---|
//! | [`SourceManager`] | source (0) | [`SourceTable`]: a host block for every page, chained prefix hashes, the durable prefix | host |
//! | [`PagedManager`] | indexer (1), regular | [`PagedTable`]: ordinary paging, regular groups with their own block sizes, sliding windows | GPU |
//! | [`ResidentManager`] | resident (one per bucket) | [`ResidentTable`]: the GPU copy of each page or null, the page lifecycle, the unpinned blocks (lazy reclaim) | GPU |
//! | [`HotManager`] | hot (one per bucket) | [`HotRegion`]: exactly `hot_blocks_per_request` blocks per bucket, or none | GPU |
//!
//! What crosses managers (admission accounting, reclaim policy, transfers, preemption) is the
//! coordinator's job, in the sibling modules.

use alloc::collections::VecDeque;

use super::PoolKind;
#[cfg(doc)]
use super::command::OffloadCommand;
use crate::pool::BlockPool;

mod hot;
mod paged;
mod resident;
mod source;

pub(in crate::coordinator) use hot::{HotManager, HotRegion};
pub(in crate::coordinator) use paged::{PagedManager, PagedTable};
pub use resident::PageState;
pub(in crate::coordinator) use resident::{PassRefs, ResidentManager, ResidentTable, Unpinned};
pub(in crate::coordinator) use source::{SourceManager, SourceTable};

/// Frees released blocks that a finished or preempted request hands back: now, or — when an
/// issued, unfinished transfer still touches them — once transfer `defer_until` is durable
/// (queued in `deferred`, which [`super::Coordinator::report`] drains).
pub(in crate::coordinator) struct Release<'a> {
    /// Transfer the frees wait for, if any.
    pub(in crate::coordinator) defer_until: Option<u64>,
    /// The coordinator's deferred frees: `(transfer id, pool, block)`.
    pub(in crate::coordinator) deferred: &'a mut VecDeque<(u64, PoolKind, u32)>,
}

impl Release<'_> {
    /// Gives back block `b` of pool `kind` (skipping the null block).
    #[inline]
    pub(in crate::coordinator) fn block(&mut self, pool: &mut BlockPool, kind: PoolKind, b: u32) {
        if b == 0 {
            return;
        }
        match self.defer_until {
            Some(x) => self.deferred.push_back((x, kind, b)),
            None => {
                let _ = pool.free(b);
            }
        }
    }
}
