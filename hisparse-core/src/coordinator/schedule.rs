//! Step scheduling: [`Coordinator::schedule`] gives a running request the blocks of its next
//! tokens (row mirrors, sealed pages, GPU prefix hashes, sliding windows), and
//! [`Coordinator::schedule_step`] runs the built-in policy for a whole step.

use alloc::boxed::Box;

use super::request::{DIRTY, HASH_SEED, PENDING, Req, Status, chain_hash, empty_req};
use super::transfers::PendingPage;
use super::{
    Alloc, CoordError, Coordinator, OffloadCommand, PoolKind, RequestId, RowMirror,
    ScheduledRequest, StepSummary, TableUpdate,
};
use crate::ops::RowSpan;
use crate::pool::BlockKey;

impl Coordinator {
    /// Schedules `num_tokens` more tokens of running request `id` in the current step:
    /// allocates pages in every group (reclaiming resident pages when the GPU pool is short),
    /// plans the row mirrors of the rows it writes, and seals full pages.
    pub fn schedule(&mut self, id: RequestId, num_tokens: u32) -> Result<Alloc, CoordError> {
        let slot = self.slot_of_id(id)?;
        self.schedule_slot(slot, num_tokens)
    }

    pub(super) fn schedule_slot(
        &mut self,
        slot: u32,
        num_tokens: u32,
    ) -> Result<Alloc, CoordError> {
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return Err(CoordError::UnknownSlot { slot });
        };
        let res = if r.status != Status::Running {
            Err(CoordError::NotRunning { id: r.id })
        } else {
            self.schedule_inner(&mut r, num_tokens)
        };
        self.reqs[slot as usize] = Some(r);
        res
    }

    pub(super) fn schedule_inner(&mut self, r: &mut Box<Req>, n: u32) -> Result<Alloc, CoordError> {
        let available = r.tokens.len() as u32 - r.num_computed;
        if n > available || n == 0 {
            return Err(CoordError::NotEnoughTokens {
                id: r.id,
                requested: n,
                available,
            });
        }
        let target = r.num_computed + n;
        let target_pages = self.kv.pages_for(target);
        let new_pages = target_pages.saturating_sub(r.pages);
        let host_need = target_pages.saturating_sub(r.host.len() as u32);
        if host_need > self.host.num_free() {
            return Ok(if self.io_in_flight() {
                Alloc::Wait
            } else {
                Alloc::NoSpace(PoolKind::Host)
            });
        }
        let gpu_need = |c: &Self, r: &Req| {
            let hot = if (r.host_only > 0 || r.pending_release > 0) && r.hot.is_empty() {
                u64::from(c.hot_cost())
            } else {
                0
            };
            u64::from(new_pages) * c.gpu_cost_per_page() + hot
        };
        let need = gpu_need(self, r);
        if need > u64::from(self.gpu.num_free()) {
            let short = need - u64::from(self.gpu.num_free());
            // The request itself is a reclaim candidate: put it back while reclaiming.
            let slot = r.slot;
            let spare = self.spare.take().unwrap_or_else(|| Box::new(empty_req()));
            self.reqs[slot as usize] = Some(core::mem::replace(r, spare));
            let want = short.max(u64::from(self.cfg.reclaim_min_blocks));
            self.reclaim_resident_blocks(want.min(u64::from(u32::MAX)) as u32);
            let back = self.reqs[slot as usize]
                .take()
                .unwrap_or_else(|| Box::new(empty_req()));
            self.spare = Some(core::mem::replace(r, back));
            if gpu_need(self, r) > u64::from(self.gpu.num_free()) {
                return Ok(if self.io_in_flight() {
                    Alloc::Wait
                } else {
                    Alloc::NoSpace(PoolKind::Gpu)
                });
            }
        }
        if (r.host_only > 0 || r.pending_release > 0) && r.hot.is_empty() {
            self.give_hot_region(r);
        }
        let slot = r.row;
        let nb = self.num_buckets;
        // Host blocks for decode growth.
        while (r.host.len() as u32) < target_pages {
            let b = self.host.allocate().unwrap_or(0);
            self.out.new_host_blocks.push(b);
            self.out.host_blocks.push(TableUpdate {
                slot,
                group: 0,
                page: r.host.len() as u32,
                block: b,
            });
            r.host.push(b);
        }
        // GPU pages.
        for p in r.pages..target_pages {
            let b = self.gpu.allocate().unwrap_or(0);
            r.indexer.push(b);
            self.out.block_tables.push(TableUpdate {
                slot,
                group: 1,
                page: p,
                block: b,
            });
            for &(g, _) in &self.regular_groups {
                let b = self.gpu.allocate().unwrap_or(0);
                r.regular.push(b);
                self.out.block_tables.push(TableUpdate {
                    slot,
                    group: g,
                    page: p,
                    block: b,
                });
            }
            for bk in 0..nb {
                let b = self.gpu.allocate().unwrap_or(0);
                r.resident.push(b);
                self.out.residency.push(TableUpdate {
                    slot,
                    group: 2 + bk,
                    page: p,
                    block: b,
                });
            }
            r.state.push(DIRTY);
            r.xfer.push(0);
        }
        r.pages = target_pages;
        let first = r.num_computed;
        r.num_computed = target;
        self.out.scheduled.push(ScheduledRequest {
            id: r.id,
            slot,
            first_token: first,
            num_tokens: n,
            fully_resident: r.host_only == 0 && r.pending_release == 0,
        });
        // Rows written and pages sealed by this step.
        let ratio = self.kv.sparse_compress_ratio;
        let bs = self.kv.block_size;
        let bt = self.kv.block_tokens;
        let (row0, row1) = (first / ratio, target / ratio);
        let sealed0 = first / bt;
        let sealed1 = target / bt;
        let id_now = self.current_xfer;
        if self.kv.config.eager_host_mirror && row1 > row0 {
            let mut row = row0;
            while row < row1 {
                let page = row / bs;
                let end = ((page + 1) * bs).min(row1);
                for bk in 0..nb {
                    self.out.row_mirrors.push(RowMirror {
                        bucket: bk,
                        span: RowSpan {
                            device_block: r.resident[(page * nb + bk) as usize],
                            host_block: r.host[page as usize],
                            first_row: row % bs,
                            num_rows: end - row,
                        },
                    });
                }
                row = end;
            }
            r.last_xfer = id_now;
            for p in sealed0..sealed1 {
                if r.state[p as usize] == DIRTY {
                    r.state[p as usize] = PENDING;
                    r.xfer[p as usize] = id_now;
                    self.pending_pages.push_back(PendingPage {
                        xfer: id_now,
                        slot: r.slot,
                        generation: r.generation,
                        page: p,
                    });
                }
            }
            r.spill_cursor = r.spill_cursor.max(sealed1);
        }
        // Hashes of newly full pages; publish GPU-only groups now (host pages publish when
        // durable).
        while (r.hashes.len() as u32) < sealed1 {
            let p = r.hashes.len() as u32;
            let parent = if p == 0 {
                HASH_SEED
            } else {
                r.hashes[p as usize - 1]
            };
            let h = chain_hash(
                parent,
                &r.tokens[(p * bt) as usize..((p + 1) * bt) as usize],
            );
            r.hashes.push(h);
        }
        if self.cfg.enable_prefix_caching && !self.has_window {
            for p in sealed0.max(r.hit_pages)..sealed1 {
                let hash = r.hashes[p as usize];
                let _ = self
                    .gpu
                    .cache(r.indexer[p as usize], BlockKey { group: 1, hash });
                let nr = self.regular_groups.len();
                for (gi, &(g, _)) in self.regular_groups.iter().enumerate() {
                    let _ = self
                        .gpu
                        .cache(r.regular[p as usize * nr + gi], BlockKey { group: g, hash });
                }
            }
        }
        // Sliding windows: give back blocks wholly before `num_computed - window`.
        if self.has_window {
            let nr = self.regular_groups.len();
            for gi in 0..nr {
                let (g, Some(w)) = self.regular_groups[gi] else {
                    continue;
                };
                let keep_from = target.saturating_sub(w) / bt;
                while r.window_cursor[gi] < keep_from {
                    let p = r.window_cursor[gi];
                    let i = p as usize * nr + gi;
                    let b = core::mem::replace(&mut r.regular[i], 0);
                    if b != 0 {
                        self.gpu.free(b)?;
                        self.out.block_tables.push(TableUpdate {
                            slot,
                            group: g,
                            page: p,
                            block: 0,
                        });
                    }
                    r.window_cursor[gi] += 1;
                }
            }
        }
        Ok(Alloc::Scheduled)
    }

    /// Runs the built-in policy for one step (see the module docs) without building the
    /// command; [`Coordinator::build_offload_command`] ends the step.
    pub fn schedule_step(&mut self) -> Result<StepSummary, CoordError> {
        let mut sum = StepSummary::default();
        let mut budget = self.cfg.max_batched_tokens;
        let mql = self.kv.config.max_query_len;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let Some(r) = self.reqs[slot as usize].as_ref() else {
                i += 1;
                continue;
            };
            let left = r.tokens.len() as u32 - r.num_computed;
            let prefilling = r.num_computed < r.tokens.len() as u32 - 1;
            if left == 0 {
                i += 1;
                continue;
            }
            let n = if prefilling {
                left.min(budget)
            } else {
                left.min(mql).min(budget)
            };
            match self.schedule_slot(slot, n)? {
                Alloc::Scheduled => {
                    sum.scheduled += 1;
                    sum.tokens += n;
                    budget -= n;
                    i += 1;
                }
                Alloc::Wait => {
                    sum.waiting_on_reclaim += 1;
                    i += 1;
                }
                Alloc::NoSpace(_) => {
                    // Preempt the newest running request; possibly this one.
                    let victim = *self.running.last().unwrap_or(&slot);
                    self.preempt_slot(victim)?;
                    sum.preempted += 1;
                    if victim == slot {
                        // `running[i]` is now the next request.
                        continue;
                    }
                }
            }
        }
        // Start waiting requests while budget and slots allow; never preempt for them, and not
        // at all in a step where a running request had to wait or be preempted (the memory it
        // needs comes first; a victim must not restart at once).
        let pressed = sum.preempted > 0 || sum.waiting_on_reclaim > 0;
        while !pressed && budget > 0 && (self.running.len() as u32) < self.cfg.max_running {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            let Some(id) = self.reqs[slot as usize].as_ref().map(|r| r.id) else {
                self.waiting.pop_front();
                continue;
            };
            match self.start(id, budget)? {
                Alloc::Scheduled => {
                    let n = self.out.scheduled.last().map_or(0, |s| s.num_tokens);
                    sum.scheduled += 1;
                    sum.started += 1;
                    sum.tokens += n;
                    budget = budget.saturating_sub(n);
                }
                Alloc::Wait => {
                    sum.waiting_on_reclaim += 1;
                    break;
                }
                Alloc::NoSpace(_) => break,
            }
        }
        Ok(sum)
    }

    /// Runs [`Coordinator::schedule_step`] and returns the step's command.
    pub fn step(&mut self) -> Result<OffloadCommand, CoordError> {
        self.schedule_step()?;
        Ok(self.build_offload_command())
    }
}
