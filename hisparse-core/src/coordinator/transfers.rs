//! Transfers: spill planning under the current transfer id, worker reports (FIFO, several
//! workers), durability, and what a durable transfer makes happen (clean pages, releases after
//! transfer, deferred frees, the durable prefix and host prefix hashes).

use super::request::{CLEAN, PENDING, PENDING_RELEASE, RECLAIMED, Req, Status};
use super::{CoordError, Coordinator, PageTransfer, PoolKind};
use crate::pool::BlockKey;

#[derive(Clone, Copy, Debug)]
pub(super) struct PendingPage {
    pub(super) xfer: u64,
    pub(super) slot: u32,
    pub(super) generation: u32,
    pub(super) page: u32,
}

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct WorkerState {
    pub(super) enqueued: u64,
    pub(super) completed: u64,
}

impl Coordinator {
    pub(super) fn plan_spill(&mut self, r: &mut Req, p: u32) {
        let id_now = self.current_xfer;
        for bk in 0..self.num_buckets {
            self.out.page_transfers.push(PageTransfer {
                bucket: bk,
                device_block: r.resident[(p * self.num_buckets + bk) as usize],
                host_block: r.host[p as usize],
            });
        }
        r.state[p as usize] = PENDING;
        r.xfer[p as usize] = id_now;
        r.last_xfer = id_now;
        self.pending_pages.push_back(PendingPage {
            xfer: id_now,
            slot: r.slot,
            generation: r.generation,
            page: p,
        });
        if p >= r.spill_cursor {
            r.spill_cursor = p + 1;
        }
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

    pub(super) fn apply_durable(&mut self) {
        // Releases of finished requests wait for the last transfer that touched them; those
        // ids are not monotone across requests, so sweep the (short) queue.
        let durable = self.durable;
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
        let nb = self.num_buckets;
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
                && r.xfer.get(pp.page as usize) == Some(&pp.xfer)
            {
                match r.state[pp.page as usize] {
                    PENDING => r.state[pp.page as usize] = CLEAN,
                    PENDING_RELEASE => {
                        self.release_page(&mut r, pp.page);
                        r.pending_release -= 1;
                        self.in_flight_release -= nb;
                    }
                    _ => {}
                }
                self.advance_ready(&mut r);
            }
            self.reqs[pp.slot as usize] = Some(r);
        }
    }

    pub(super) fn advance_ready(&mut self, r: &mut Req) {
        let sealed = r.num_computed / self.kv.block_tokens;
        while r.ready_prefix < sealed
            && matches!(r.state[r.ready_prefix as usize], CLEAN | RECLAIMED)
        {
            let p = r.ready_prefix as usize;
            if self.cfg.enable_prefix_caching && !self.has_window && p < r.hashes.len() {
                let _ = self.host.cache(
                    r.host[p],
                    BlockKey {
                        group: 0,
                        hash: r.hashes[p],
                    },
                );
            }
            r.ready_prefix += 1;
        }
    }
}
