//! Transfers: the device → host copies planned in a step (row mirrors and whole-page spills)
//! under the step's transfer id, worker reports (FIFO, several workers), durability, and what a
//! durable transfer makes happen (clean pages, releases after transfer, deferred frees, the
//! durable prefix and its host prefix hashes).

use alloc::vec::Vec;

use super::request::{Req, Status};
use super::{CoordError, Coordinator, PageTransfer, PoolKind, RowMirror};
use crate::ops::RowSpan;

/// A page waiting for its transfer to become durable (queued in transfer-id order).
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingPage {
    /// The transfer.
    pub(super) xfer: u64,
    /// The request's index in `Coordinator::reqs`.
    pub(super) slot: u32,
    /// The request's generation (a finished or preempted request's pages are stale).
    pub(super) generation: u32,
    /// The page.
    pub(super) page: u32,
}

/// What one worker (tensor-parallel rank) has to tell the coordinator since its last report:
/// the arguments of [`Coordinator::report`] as one value, which a worker process can send to
/// the scheduler's (see [`crate::wire`] for its bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct WorkerReport {
    /// The worker (tensor-parallel rank).
    pub worker: u32,
    /// Transfer batches enqueued since the last report, oldest first.
    pub enqueued: Vec<u64>,
    /// Transfer batches that completed since the last report, oldest first.
    pub completed: Vec<u64>,
}

impl WorkerReport {
    /// Whether there is nothing to report.
    pub fn is_empty(&self) -> bool {
        self.enqueued.is_empty() && self.completed.is_empty()
    }
}

/// The last transfer ids one worker reported.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct WorkerState {
    /// Last id enqueued.
    pub(super) enqueued: u64,
    /// Last id completed.
    pub(super) completed: u64,
}

impl Coordinator {
    /// With eager mirroring: plans the row mirrors of the rows tokens `first..target` write
    /// (one span per page and bucket, coalesced) and the backups of their indexer rows, and
    /// seals the pages they fill (up to `sealed1 = target / block_tokens`, which the caller has
    /// at hand), which go pending under the current transfer id. Inlined into the step loop's decode path.
    #[inline(always)]
    pub(super) fn plan_row_mirrors<const POW2: bool>(
        &mut self,
        r: &mut Req,
        first: u32,
        target: u32,
        sealed1: u32,
    ) {
        let (row0, row1) = (
            self.row_tokens.div::<POW2>(first),
            self.row_tokens.div::<POW2>(target),
        );
        let sealed0 = self.page_tokens.div::<POW2>(first);
        let bs = self.kv.block_size;
        let id_now = self.current_xfer;
        // The indexer rows these tokens write, in the same batch (see `indexer.rs`).
        if let Some(ix) = self.indexer_rows {
            let before = self.out.indexer_backups.len();
            ix.plan_tokens(
                first,
                target,
                &r.paged.indexer,
                &r.source.blocks,
                &mut self.out.indexer_backups,
            );
            if self.out.indexer_backups.len() > before {
                r.last_xfer = id_now;
            }
        }
        if row1 > row0 {
            let mut row = row0;
            while row < row1 {
                let page = self.page_rows.div::<POW2>(row);
                let end = ((page + 1) * bs).min(row1);
                let (host_block, first_row, num_rows) = (
                    r.source.blocks[page as usize],
                    self.page_rows.rem::<POW2>(row),
                    end - row,
                );
                // One span per bucket, written with one capacity check (every request, every
                // decode step).
                let blocks = self.resident.page_blocks(&r.resident, page);
                self.out.row_mirrors.extend(blocks.iter().zip(0u32..).map(
                    |(&device_block, bucket)| RowMirror {
                        bucket,
                        span: RowSpan {
                            device_block,
                            host_block,
                            first_row,
                            num_rows,
                        },
                    },
                ));
                row = end;
            }
            r.last_xfer = id_now;
            for p in sealed0..sealed1 {
                if self.resident.seal(&mut r.resident, p, id_now) {
                    self.pending_pages.push_back(PendingPage {
                        xfer: id_now,
                        slot: r.slot,
                        generation: r.generation,
                        page: p,
                    });
                }
            }
            r.resident.raise_spill_cursor(sealed1);
        }
    }

    /// Without eager mirroring: plans this step's whole-page spills of sealed dirty pages,
    /// running requests in order, at most `max_spill_pages_per_step` of them (the resident
    /// manager picks each request's pages and moves its spill cursor).
    pub(super) fn plan_step_spills(&mut self) {
        let mut budget = self.cfg.max_spill_pages_per_step;
        let mut pages = core::mem::take(&mut self.spill_scratch);
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            if let Some(mut r) = self.reqs[slot as usize].take() {
                let sealed = r.num_computed / self.kv.block_tokens;
                pages.clear();
                self.resident
                    .next_spills(&mut r.resident, sealed, &mut budget, &mut pages);
                for &p in &pages {
                    self.plan_spill(&mut r, p);
                }
                self.reqs[slot as usize] = Some(r);
            }
            i += 1;
        }
        self.spill_scratch = pages;
    }

    /// Plans the whole-page spill of page `p` (every bucket) under the current transfer id;
    /// the page goes pending.
    pub(super) fn plan_spill(&mut self, r: &mut Req, p: u32) {
        let id_now = self.current_xfer;
        for bk in 0..self.resident.num_buckets() {
            self.out.page_transfers.push(PageTransfer {
                bucket: bk,
                device_block: self.resident.block(&r.resident, p, bk),
                host_block: r.source.blocks[p as usize],
            });
        }
        if let Some(ix) = self.indexer_rows {
            ix.plan_page(
                p,
                &r.paged.indexer,
                &r.source.blocks,
                &mut self.out.indexer_backups,
            );
        }
        self.resident.spill(&mut r.resident, p, id_now);
        r.last_xfer = id_now;
        self.pending_pages.push_back(PendingPage {
            xfer: id_now,
            slot: r.slot,
            generation: r.generation,
            page: p,
        });
        r.resident.raise_spill_cursor(p + 1);
    }

    /// Records a worker's progress: transfer ids it has `enqueued` and `completed`, each in FIFO
    /// order. When every worker has completed a transfer, its effects apply (see the module
    /// docs).
    pub fn report(
        &mut self,
        worker: u32,
        enqueued: &[u64],
        completed: &[u64],
    ) -> Result<(), CoordError> {
        let issued = self.current_xfer - 1;
        let w = self
            .workers
            .get_mut(worker as usize)
            .ok_or(CoordError::UnknownWorker {
                worker,
                num_workers: self.cfg.num_workers,
            })?;
        // Validate everything before changing anything.
        let (mut e, mut c) = (w.enqueued, w.completed);
        for &id in enqueued {
            if id != e + 1 || id > issued {
                return Err(CoordError::OutOfOrderReport {
                    worker,
                    what: "enqueued",
                    id,
                    expected: e + 1,
                });
            }
            e = id;
        }
        for &id in completed {
            if id != c + 1 || id > e {
                return Err(CoordError::OutOfOrderReport {
                    worker,
                    what: "completed",
                    id,
                    expected: c + 1,
                });
            }
            c = id;
        }
        w.enqueued = e;
        w.completed = c;
        let durable = self.workers.iter().map(|w| w.completed).min().unwrap_or(0);
        if durable > self.durable {
            self.durable = durable;
            self.apply_durable();
        }
        Ok(())
    }

    /// Applies everything transfers up to `self.durable` made happen.
    pub(super) fn apply_durable(&mut self) {
        // Releases of finished requests wait for the last transfer that touched them; those
        // ids are not monotone across requests, so sweep the (short) queue.
        let durable = self.durable;
        // Detached publication first: the deferred frees below hold the blocks until now.
        let (source, host) = (&self.source, &mut self.host);
        self.detached.retain(|&(x, b, hash)| {
            if x > durable {
                return true;
            }
            source.publish(host, b, hash);
            false
        });
        let (gpu, host) = (&mut self.gpu, &mut self.host);
        self.deferred.retain(|&(x, pool, b)| {
            if x > durable {
                return true;
            }
            let _ = match pool {
                PoolKind::Gpu => gpu.free(b),
                PoolKind::Host => host.free(b),
            };
            false
        });
        let nb = self.resident.num_buckets();
        while let Some(&pp) = self.pending_pages.front() {
            if pp.xfer > self.durable {
                break;
            }
            self.pending_pages.pop_front();
            let Some(mut r) = self.reqs[pp.slot as usize].take() else {
                continue;
            };
            if r.generation == pp.generation
                && r.status == Status::Running
                && r.resident.xfer_of(pp.page) == Some(pp.xfer)
            {
                let (owner, row) = ((r.slot, r.generation), r.row);
                if self.resident.on_durable(
                    &mut r.resident,
                    pp.page,
                    owner,
                    row,
                    &mut self.gpu,
                    &mut self.out,
                ) {
                    self.in_flight_release -= nb;
                }
                // Pages a rollback can still reach (filled by the request's last step past
                // its rollback floor) are neither durable prefix nor published yet: another
                // request must not adopt a page its writer may fill again.
                let sealed = r.num_computed.min(r.rollback_floor) / self.kv.block_tokens;
                let ready = r.source.ready_prefix;
                self.source
                    .advance_ready(&mut r.source, &r.resident, sealed, &mut self.host);
                if self.source.caching() {
                    // With its host page, a durable page's GPU copy is published: a request
                    // hitting the page reads it on the GPU while the blocks are not reused.
                    // Durable means the forward that wrote it is complete.
                    self.resident.publish(
                        &r.resident,
                        &mut self.gpu,
                        &r.source.hashes,
                        ready..r.source.ready_prefix,
                    );
                }
            }
            self.reqs[pp.slot as usize] = Some(r);
        }
    }
}
