//! The per-step [`OffloadCommand`] (plain data) and how the coordinator ends a step by building
//! it ([`Coordinator::build_offload_command`]).

use alloc::vec::Vec;

use super::{Coordinator, RefusalReason, RequestId};
use crate::ops::{BlockPair, RowSpan};

/// A request scheduled in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ScheduledRequest {
    /// The request.
    pub id: RequestId,
    /// Its state row in every per-request table of the data plane.
    pub slot: u32,
    /// First token computed in this step.
    pub first_token: u32,
    /// Tokens computed in this step.
    pub num_tokens: u32,
    /// Whether every page of the request is resident (no host reads).
    pub fully_resident: bool,
}

/// A request refused while a step was scheduled: its blocks are given back and it is in no
/// queue; the engine fails it (or shortens it: finish it and admit a shorter one) and calls
/// [`Coordinator::finish`]. The step goes on for every other request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RefusedRequest {
    /// The request.
    pub id: RequestId,
    /// Why.
    pub reason: RefusalReason,
}

/// A change of one per-request table entry (page → block; block 0 = null).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TableUpdate {
    /// State row.
    pub slot: u32,
    /// Group index in the layout (`KvCacheConfig::groups`).
    pub group: u32,
    /// Page.
    pub page: u32,
    /// New block (0 = null: for resident groups, "read from host").
    pub block: u32,
}

/// A hot region given to a request: reset the slot's LRU to the identity and its `slot_host_rows` to `-1`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HotAssignment {
    /// State row.
    pub slot: u32,
    /// Hot group index in the layout.
    pub group: u32,
    /// The `hot_blocks_per_request` GPU blocks of the region.
    pub blocks: Vec<u32>,
}

/// A page copy between a GPU block and a host block, for the layers of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PageTransfer {
    /// Bucket (resident group `2 + bucket`): the layers to copy.
    pub bucket: u32,
    /// GPU block.
    pub device_block: u32,
    /// Host block.
    pub host_block: u32,
}

/// Rows of one page to mirror device → host, for the layers of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RowMirror {
    /// Bucket: the layers to copy.
    pub bucket: u32,
    /// The rows.
    pub span: RowSpan,
}

/// Everything the workers do in one step, as plain data.
///
/// Order of execution: (1) reset the `started` rows, release `hot_release` regions, apply
/// `host_blocks`, `residency`, `block_tables`, `hot_assign`,
/// to the tables and hot states; invalidate hot entries caching rows of
/// `new_host_blocks`; (2) `host_cow` (host → host pages, in the host pool and in the indexer
/// host cache), then `restores` and `indexer_restores` (host → device pages, which read the
/// copied host blocks), then `gpu_cow` (whole GPU blocks); (3) the forward pass; (4) the
/// after-forward copies `row_mirrors`, `page_transfers` and `indexer_backups` (device → host),
/// as the batch `transfer_id`. A step with copy-on-write has a transfer id even when it has no
/// after-forward copies: the copy-on-write sources stay allocated until every worker has
/// completed that batch (which it does after the step's forward pass, so after the copies).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct OffloadCommand {
    /// Step number (from 1).
    pub step: u64,
    /// Id of the after-forward copy batch, if the step has any.
    pub transfer_id: Option<u64>,
    /// Requests computed in this step.
    pub scheduled: Vec<ScheduledRequest>,
    /// Requests preempted in this step (their slots are free; their tokens will be recomputed).
    pub preempted: Vec<RequestId>,
    /// Requests refused in this step (their slots are free, they will not run again): fail
    /// them and [`Coordinator::finish`] them.
    pub refused: Vec<RefusedRequest>,
    /// State rows given to a request in this step: reset them first (resident and block tables
    /// to 0, host table to -1, no hot region), then apply the updates.
    pub started: Vec<u32>,
    /// Every scheduled request is fully resident: the fast path (remap only, no resolve).
    pub fully_resident: bool,
    /// Resident-table changes (per request, per resident group).
    pub residency: Vec<TableUpdate>,
    /// Host-table changes (group = the source group, 0).
    pub host_blocks: Vec<TableUpdate>,
    /// Indexer and regular block-table changes.
    pub block_tables: Vec<TableUpdate>,
    /// Host blocks newly given to requests: invalidate hot entries caching their old rows.
    pub new_host_blocks: Vec<u32>,
    /// Host copy-on-write pairs (`src` → `dst` host blocks), before the forward.
    pub host_cow: Vec<BlockPair>,
    /// GPU copy-on-write pairs (`src` → `dst` whole GPU blocks), before the forward.
    pub gpu_cow: Vec<BlockPair>,
    /// Host → device page restores (a copy-on-write tail page made resident), before the forward.
    pub restores: Vec<PageTransfer>,
    /// Hot regions given out.
    pub hot_assign: Vec<HotAssignment>,
    /// Slots whose hot regions were released.
    pub hot_release: Vec<u32>,
    /// After-forward row mirrors (device → host).
    pub row_mirrors: Vec<RowMirror>,
    /// After-forward whole-page spills (device → host).
    pub page_transfers: Vec<PageTransfer>,
    /// Indexer pages restored host → device before the forward (`src` = host block of the
    /// page in the indexer host cache, `dst` = the request's indexer GPU block): an imported
    /// request's keys, which its transfer wrote into the indexer host cache.
    pub indexer_restores: Vec<BlockPair>,
    /// After-forward indexer backups (device → host, in the batch `transfer_id`): per page, the
    /// indexer rows the step wrote (or, with a whole-page spill, every row of the page), from
    /// the request's indexer GPU block (`device_block`) to the page's host block
    /// (`host_block`) in the indexer host cache. Rows count indexer rows (a compressed indexer
    /// writes one row per `tokens_per_row` tokens), in every indexer layer. A page's host copy
    /// is durable, and published, only with its indexer rows (see `indexer.rs`).
    pub indexer_backups: Vec<RowSpan>,
}

impl OffloadCommand {
    /// Empties every list (keeping the buffers) for the next step.
    pub(super) fn clear(&mut self) {
        self.transfer_id = None;
        self.scheduled.clear();
        self.preempted.clear();
        self.refused.clear();
        self.started.clear();
        self.fully_resident = true;
        self.residency.clear();
        self.host_blocks.clear();
        self.block_tables.clear();
        self.new_host_blocks.clear();
        self.host_cow.clear();
        self.gpu_cow.clear();
        self.restores.clear();
        self.hot_assign.clear();
        self.hot_release.clear();
        self.row_mirrors.clear();
        self.page_transfers.clear();
        self.indexer_restores.clear();
        self.indexer_backups.clear();
    }

    /// Whether the step has after-forward copies (and so a transfer id).
    pub(super) fn has_copies(&self) -> bool {
        !self.row_mirrors.is_empty()
            || !self.page_transfers.is_empty()
            || !self.indexer_backups.is_empty()
    }

    /// Drops every table change, start and schedule entry of state row `slot` (its request was
    /// preempted or finished before the command was built).
    pub(super) fn purge_slot(&mut self, slot: u32) {
        self.started.retain(|&s| s != slot);
        self.scheduled.retain(|s| s.slot != slot);
        self.residency.retain(|u| u.slot != slot);
        self.host_blocks.retain(|u| u.slot != slot);
        self.block_tables.retain(|u| u.slot != slot);
        self.hot_assign.retain(|h| h.slot != slot);
    }

    /// Drops the copies that would write into the blocks of a request released before the
    /// command was built: its after-forward copies when `own_batch` (they were planned in this
    /// batch), and copy-on-write and restores into its blocks. `indexer` is its indexer
    /// blocks.
    pub(super) fn purge_request_copies(
        &mut self,
        own_batch: bool,
        host: &[u32],
        paged_holds: impl Fn(u32) -> bool,
        resident: &[u32],
        resident_holds: impl Fn(u32) -> bool,
        indexer: &[u32],
    ) {
        if own_batch {
            // Its copies in the unbuilt batch must not run: drop them.
            self.row_mirrors.retain(|m| {
                !(host.contains(&m.span.host_block) && resident.contains(&m.span.device_block))
            });
            self.page_transfers
                .retain(|m| !(host.contains(&m.host_block) && resident.contains(&m.device_block)));
            self.indexer_backups
                .retain(|s| !(host.contains(&s.host_block) && indexer.contains(&s.device_block)));
        }
        // Indexer restores into its blocks (it holds every one) must not run either.
        self.indexer_restores.retain(|p| !indexer.contains(&p.dst));
        // Copy-on-write and restores into its blocks must not run either.
        if !(self.host_cow.is_empty() && self.gpu_cow.is_empty() && self.restores.is_empty()) {
            self.host_cow.retain(|p| !host.contains(&p.dst));
            self.gpu_cow.retain(|p| !paged_holds(p.dst));
            // Only blocks it holds: an unpinned page's blocks are free, and another request of
            // this step may have been given one (and restore into it).
            self.restores.retain(|t| !resident_holds(t.device_block));
        }
    }
}

impl Coordinator {
    /// Ends the current step and returns its command (see [`OffloadCommand`]).
    pub fn build_offload_command(&mut self) -> OffloadCommand {
        let mut cmd = OffloadCommand::default();
        self.build_offload_command_into(&mut cmd);
        cmd
    }

    /// Like [`Coordinator::build_offload_command`], reusing `cmd`'s buffers (no allocation in
    /// steady state).
    pub fn build_offload_command_into(&mut self, cmd: &mut OffloadCommand) {
        // Free blocks ahead of need (unpinning costs nothing in the data plane).
        self.keep_low_watermark();
        // Spills when eager mirroring is off.
        if !self.kv.config.eager_host_mirror {
            self.plan_step_spills();
        }
        // Unpinned blocks this step's allocations reused: their pages read from host from this
        // command on.
        self.process_reused();
        self.step_no += 1;
        self.out.step = self.step_no;
        // Reclaim later in the step may have changed residency: decide now — unless no
        // request's table started or stopped reading from host since the last command (the
        // common case), which leaves every entry's answer, written when it was scheduled, as
        // it is (no second visit of every scheduled request).
        let all = if self.resident.host_only_flips() == self.host_only_flips_built {
            // Debug builds (every test, the model proptest included) check the answers that
            // were kept against a fresh look.
            #[cfg(debug_assertions)]
            for s in &self.out.scheduled {
                let idx = self.row_owner[s.slot as usize];
                let now = self.reqs[idx as usize]
                    .as_ref()
                    .is_some_and(|r| r.resident.host_only() == 0);
                debug_assert_eq!(s.fully_resident, now, "stale fully_resident of {s:?}");
            }
            self.out.scheduled.iter().all(|s| s.fully_resident)
        } else {
            let mut all = true;
            for s in self.out.scheduled.iter_mut() {
                let idx = self.row_owner[s.slot as usize];
                s.fully_resident = self.reqs[idx as usize]
                    .as_ref()
                    .is_some_and(|r| r.resident.host_only() == 0);
                all &= s.fully_resident;
            }
            all
        };
        self.out.fully_resident = all;
        // A step with copy-on-write gets a transfer id even without after-forward copies: its
        // completion (after the forward, so after the copies before it) releases the sources.
        if self.out.has_copies() || !self.after_build.is_empty() {
            let id = self.current_xfer;
            self.out.transfer_id = Some(id);
            self.current_xfer += 1;
            for (pool, b) in self.after_build.drain(..) {
                self.deferred.push_back((id, pool, b));
            }
        } else {
            self.out.transfer_id = None;
        }
        core::mem::swap(cmd, &mut self.out);
        self.out.clear();
        self.host_only_flips_built = self.resident.host_only_flips();
    }
}
