//! Step scheduling: [`Coordinator::schedule`] gives a running request the blocks of its next
//! tokens (row mirrors, sealed pages, GPU prefix hashes, sliding windows), and
//! [`Coordinator::schedule_step`] runs the built-in policy for a whole step.

use alloc::boxed::Box;

use super::admission::largest_fit;
use super::request::{Import, Req, Status, empty_req};
use super::{
    Alloc, CoordError, Coordinator, OffloadCommand, PoolKind, RequestId, ScheduledRequest,
    StepSummary,
};

/// GPU blocks an allocation needs ([`Coordinator::gpu_need`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct GpuNeed {
    /// New pages in every group, regular columns and staged context.
    pub(super) blocks: u64,
    /// The hot region it is given (0 when it holds one or reads nothing from host).
    pub(super) hot: u64,
}

impl GpuNeed {
    /// Every block.
    #[inline]
    pub(super) fn total(self) -> u64 {
        self.blocks + self.hot
    }
}

impl Coordinator {
    /// Schedules `num_tokens` more tokens of running request `id` in the current step:
    /// allocates pages in every group (reclaiming resident pages when the GPU pool is short),
    /// plans the row mirrors of the rows it writes, and seals full pages. All `num_tokens` or
    /// none: [`Coordinator::schedule_step`]'s policy is the one that shrinks a chunk to what
    /// fits.
    pub fn schedule(&mut self, id: RequestId, num_tokens: u32) -> Result<Alloc, CoordError> {
        let slot = self.slot_of_id(id)?;
        let res = self
            .schedule_slot(slot, num_tokens, false)
            .map(|(alloc, _)| alloc);
        self.process_reused();
        res
    }

    /// Schedules up to `num_tokens` tokens of the request in `reqs[slot]` — exactly that many
    /// unless `shrink` — and returns the outcome and the tokens scheduled.
    pub(super) fn schedule_slot(
        &mut self,
        slot: u32,
        num_tokens: u32,
        shrink: bool,
    ) -> Result<(Alloc, u32), CoordError> {
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return Err(CoordError::UnknownSlot { slot });
        };
        let res = if r.status != Status::Running {
            Err(r.status_error())
        } else {
            self.schedule_inner(&mut r, num_tokens, shrink)
        };
        self.reqs[slot as usize] = Some(r);
        res
    }

    /// Whether `n` (at least one) more tokens of running request `r` are a decode within the
    /// pages it holds (every request, nearly every step): nothing to allocate, stage or
    /// reclaim — the need computations of [`Coordinator::schedule_allocating`] would all come
    /// to zero (no new page, GPU or host; a hot region held or not needed; no regular columns).
    #[inline(always)]
    pub(super) fn decodes_in_place(&self, r: &Req, n: u32) -> bool {
        let held = r.pages.min(r.source.blocks.len() as u32);
        r.num_computed >= r.prefill_end
            && u64::from(r.num_computed + n) <= u64::from(held) * u64::from(self.kv.block_tokens)
            && !self.paged.has_regular()
            && (!r.hot.blocks.is_empty() || !self.resident.needs_hot_region(&r.resident))
    }

    /// Tokens of `n` (from `r.num_computed`) whose pages fit in `max_pages` pages.
    #[inline]
    fn tokens_within(&self, r: &Req, n: u32, max_pages: u64) -> u32 {
        let end = max_pages.saturating_mul(u64::from(self.kv.block_tokens));
        end.saturating_sub(u64::from(r.num_computed))
            .min(u64::from(n)) as u32
    }

    /// GPU blocks `r` needs for `new_pages` more pages: theirs in the indexer and resident
    /// groups, and the hot region when it reads from host without one. For a prefill chunk
    /// (`prefill`), also the blocks that stage its context on the GPU (every page that is not
    /// pinned there now); after staging, only pages marked release-after-transfer may still
    /// fall back to host, so only they call for a hot region.
    #[inline]
    fn gpu_need(&self, r: &Req, new_pages: u32, prefill: bool) -> GpuNeed {
        let mut need = GpuNeed {
            blocks: u64::from(new_pages) * self.gpu_cost_per_page(),
            hot: 0,
        };
        // The staging term only on the prefill branch: decode (every request, every step)
        // skips it.
        let reads_host = if prefill {
            need.blocks += u64::from(self.resident.pages_to_stage(&r.resident))
                * u64::from(self.resident.num_buckets());
            r.resident.pending_release() > 0
        } else {
            self.resident.needs_hot_region(&r.resident)
        };
        if reads_host && r.hot.blocks.is_empty() {
            need.hot = u64::from(self.hot.cost());
        }
        need
    }

    /// GPU blocks scheduling `n` more tokens of `r` needs in every group (`prefill`: see
    /// [`Coordinator::gpu_need`]).
    #[inline]
    pub(super) fn gpu_need_tokens(&self, r: &Req, n: u32, prefill: bool) -> GpuNeed {
        let target = r.num_computed + n;
        let pages = self.kv.pages_for(target).saturating_sub(r.pages);
        let mut need = self.gpu_need(r, pages, prefill);
        if self.paged.has_regular() {
            need.blocks += self.paged.regular_need(&r.paged, r.num_computed, target);
        }
        need
    }

    /// Host blocks scheduling tokens up to page `target_pages` of `r` allocates.
    #[inline]
    pub(super) fn host_need_pages(&self, r: &Req, target_pages: u32) -> u32 {
        target_pages.saturating_sub(r.source.blocks.len() as u32)
    }

    /// Schedules `n` tokens of `r` (fewer when `shrink` and the pools hold less): a decode
    /// within the pages held commits at once, everything else goes through
    /// [`Coordinator::schedule_allocating`]. The step loop takes the first branch itself.
    pub(super) fn schedule_inner(
        &mut self,
        r: &mut Box<Req>,
        n: u32,
        shrink: bool,
    ) -> Result<(Alloc, u32), CoordError> {
        let available = r.tokens.len() as u32 - r.num_computed;
        if n > available || n == 0 {
            return Err(CoordError::NotEnoughTokens {
                id: r.id,
                requested: n,
                available,
            });
        }
        if self.decodes_in_place(r, n) {
            let (pages, marked) = (r.pages, r.prefill_step);
            return self
                .commit_tokens(r, n, pages, marked)
                .map(|()| (Alloc::Scheduled, n));
        }
        self.schedule_allocating(r, n, shrink)
    }

    /// [`Coordinator::schedule_inner`] for a chunk that may need blocks: host pages, GPU pages
    /// (reclaiming when the pool is short), a hot region, staging of a prefill chunk's context,
    /// regular columns. `n` is at least one and at most the tokens available.
    #[inline(never)]
    fn schedule_allocating(
        &mut self,
        r: &mut Box<Req>,
        n: u32,
        shrink: bool,
    ) -> Result<(Alloc, u32), CoordError> {
        // `target_pages` is recomputed only when the chunk shrinks.
        let (mut n, mut target_pages) = (n, self.kv.pages_for(r.num_computed + n));
        let held_host = r.source.blocks.len() as u32;
        if self.host_need_pages(r, target_pages) > self.host.num_free() {
            let fit =
                self.tokens_within(r, n, u64::from(held_host) + u64::from(self.host.num_free()));
            if !shrink || fit == 0 {
                return Ok((self.short_of(PoolKind::Host, false), 0));
            }
            n = fit;
            target_pages = self.kv.pages_for(r.num_computed + n);
        }
        // A prefill chunk reads its whole earlier context on the GPU: its pages stay there for
        // this step (reclaim passes the request over: the mark is set before any reclaim, kept
        // when the chunk is scheduled and taken back on every other outcome) and those that
        // are not are staged.
        let prefill = r.num_computed < r.prefill_end;
        let marked_before = r.prefill_step;
        let need = self.gpu_need_tokens(r, n, prefill).total();
        if need > u64::from(self.gpu.num_free()) {
            if prefill {
                r.prefill_step = self.step_no + 1;
            }
            let want = self.reclaim_want(need, self.gpu.num_free());
            // The request itself is a reclaim candidate: put it back while reclaiming.
            let slot = r.slot;
            let spare = self.spare.take().unwrap_or_else(|| Box::new(empty_req()));
            self.reqs[slot as usize] = Some(core::mem::replace(r, spare));
            let (_, awaits) = self.reclaim(want);
            let back = self.reqs[slot as usize]
                .take()
                .unwrap_or_else(|| Box::new(empty_req()));
            self.spare = Some(core::mem::replace(r, back));
            let free = u64::from(self.gpu.num_free());
            if self.gpu_need_tokens(r, n, prefill).total() > free {
                if prefill && let Err(e) = self.check_prefill_fits(r) {
                    r.prefill_step = marked_before;
                    return Err(e);
                }
                let fit = if !shrink {
                    0
                } else if self.paged.has_regular() {
                    largest_fit(n, |c| self.gpu_need_tokens(r, c, prefill).total() <= free)
                        .unwrap_or(0)
                } else {
                    let hot = self.gpu_need(r, 0, prefill).total();
                    if free >= hot {
                        let pages = (free - hot) / self.gpu_cost_per_page();
                        self.tokens_within(r, n, u64::from(r.pages) + pages)
                    } else {
                        0
                    }
                };
                if fit == 0 {
                    r.prefill_step = marked_before;
                    return Ok((self.short_of(PoolKind::Gpu, awaits), 0));
                }
                n = fit;
                target_pages = self.kv.pages_for(r.num_computed + n);
            }
        }
        let target = r.num_computed + n;
        if prefill {
            r.prefill_step = self.step_no + 1;
            if self.resident.pages_to_stage(&r.resident) > 0 {
                self.stage_prefill_context(r);
            }
        }
        if self.resident.needs_hot_region(&r.resident) && r.hot.blocks.is_empty() {
            self.hot
                .give(&mut r.hot, &mut self.gpu, &mut self.out, r.row);
        }
        let slot = r.row;
        // Host blocks for decode growth.
        self.source.grow(
            &mut r.source,
            &mut self.host,
            &mut self.out,
            slot,
            target_pages,
        );
        // GPU pages, and the regular groups' blocks.
        for p in r.pages..target_pages {
            self.paged
                .allocate_page(&mut r.paged, &mut self.gpu, &mut self.out, slot, p);
            self.resident
                .allocate_page(&mut r.resident, &mut self.gpu, &mut self.out, slot, p);
        }
        let first = r.num_computed;
        if self.paged.has_regular() {
            self.paged.allocate_columns(
                &mut r.paged,
                &mut self.gpu,
                &mut self.out,
                slot,
                first,
                target,
            );
        }
        self.commit_tokens(r, n, target_pages, marked_before)
            .map(|()| (Alloc::Scheduled, n))
    }

    /// The tokens `num_computed..num_computed + n` of `r` are scheduled, every block they need
    /// held (`target_pages` pages): the scheduled entry, the rollback floor, row mirrors and
    /// sealed pages, prefix hashes and GPU publication, sliding windows. `marked_before` is the
    /// prefill mark to restore if the windows refuse.
    #[inline(always)]
    fn commit_tokens(
        &mut self,
        r: &mut Req,
        n: u32,
        target_pages: u32,
        marked_before: u64,
    ) -> Result<(), CoordError> {
        // One test of the layout for the whole commit, none per division.
        if self.pow2_layout {
            self.commit_tokens_in::<true>(r, n, target_pages, marked_before)
        } else {
            self.commit_tokens_in::<false>(r, n, target_pages, marked_before)
        }
    }

    /// [`Coordinator::commit_tokens`] for a layout whose page and row sizes are all powers of
    /// two (`POW2`) or not.
    #[inline(always)]
    fn commit_tokens_in<const POW2: bool>(
        &mut self,
        r: &mut Req,
        n: u32,
        target_pages: u32,
        marked_before: u64,
    ) -> Result<(), CoordError> {
        let slot = r.row;
        let first = r.num_computed;
        let target = first + n;
        r.pages = r.pages.max(target_pages);
        r.num_computed = target;
        r.scheduled_step = self.step_no + 1;
        let spec = self.kv.config.max_query_len.max(1) - 1;
        r.rollback_floor = target.saturating_sub(spec).max(first + 1).min(target);
        self.out.scheduled.push(ScheduledRequest {
            id: r.id,
            slot,
            first_token: first,
            num_tokens: n,
            fully_resident: r.resident.host_only() == 0,
        });
        // Rows written and pages sealed by this step.
        let sealed1 = self.page_tokens.div::<POW2>(target);
        if self.kv.config.eager_host_mirror {
            self.plan_row_mirrors::<POW2>(r, first, target, sealed1);
        }
        // Hashes of newly full pages; publish GPU-only groups now (host pages publish when
        // durable).
        self.source.hash_sealed(&mut r.source, &r.tokens, sealed1);
        if self.source.caching() {
            // Only pages no rollback can reach (every token below the rollback floor); the
            // rest are published by the request's next step, once its floor moved past them.
            let publishable = self.page_tokens.div::<POW2>(r.rollback_floor).min(sealed1);
            let from = r.gpu_published.max(r.hit_pages);
            if from < publishable {
                self.paged
                    .publish(&r.paged, &mut self.gpu, &r.source.hashes, from..publishable);
            }
            r.gpu_published = r.gpu_published.max(publishable);
        }
        // Sliding windows: give back the blocks no later step (or rollback) reads.
        if self.paged.has_window()
            && let Err(e) = self.paged.slide_windows(
                &mut r.paged,
                &mut self.gpu,
                &mut self.out,
                slot,
                first,
                target,
            )
        {
            r.prefill_step = marked_before;
            return Err(e.into());
        }
        Ok(())
    }

    /// Runs the built-in policy for one step (see the module docs) without building the
    /// command; [`Coordinator::build_offload_command`] ends the step.
    ///
    /// A request whose scheduling or start meets an error (a restart whose recomputed context
    /// outgrew the GPU pool: [`CoordError::PrefillNeverFits`]) does not stop the step: it is
    /// refused — its blocks given back, out of every queue, reported in the command's
    /// [`OffloadCommand::refused`] and by [`Coordinator::refusal`] — and the step goes on for
    /// the others. The engine fails it and [`Coordinator::finish`]es it.
    pub fn schedule_step(&mut self) -> Result<StepSummary, CoordError> {
        let mut sum = StepSummary::default();
        let mut budget = self.cfg.max_batched_tokens;
        let mql = self.kv.config.max_query_len;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            // Out of its slot while the step looks at it (`commit_tokens` borrows `self`).
            let Some(mut r) = self.reqs[slot as usize].take() else {
                i += 1;
                continue;
            };
            let len = r.tokens.len() as u32;
            let left = len - r.num_computed;
            if left == 0 {
                self.reqs[slot as usize] = Some(r);
                i += 1;
                continue;
            }
            let n = if r.num_computed < len - 1 {
                left.min(budget)
            } else {
                left.min(mql).min(budget)
            };
            // Decode within the pages held (every request, nearly every step): committed here,
            // without `schedule_slot`'s second lookup and its outcome.
            if r.status == Status::Running && self.decodes_in_place(&r, n) {
                let (pages, marked) = (r.pages, r.prefill_step);
                let res = self.commit_tokens(&mut r, n, pages, marked);
                self.reqs[slot as usize] = Some(r);
                match res {
                    Ok(()) => {
                        sum.scheduled += 1;
                        sum.tokens += n;
                        budget -= n;
                        i += 1;
                    }
                    Err(e) => {
                        self.refuse_slot(slot, &e);
                        sum.refused += 1;
                    }
                }
                continue;
            }
            self.reqs[slot as usize] = Some(r);
            // A chunk (or a speculative decode) shrinks to what fits before anyone is
            // preempted.
            match self.schedule_slot(slot, n, true) {
                Err(e) => {
                    // One request's refusal is not the step's: report it, go on with the rest
                    // (`running[i]` is now the next request).
                    self.refuse_slot(slot, &e);
                    sum.refused += 1;
                }
                Ok((Alloc::Scheduled, n)) => {
                    sum.scheduled += 1;
                    sum.tokens += n;
                    budget -= n;
                    i += 1;
                }
                Ok((Alloc::Wait, _)) => {
                    sum.waiting_on_reclaim += 1;
                    i += 1;
                }
                Ok((Alloc::NoSpace(_), _)) => {
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
            match self.start(id, budget) {
                // Every running row is not taken (the loop's condition): nothing to refuse.
                Err(CoordError::NoFreeSlot) => break,
                Err(e) => {
                    self.refuse_slot(slot, &e);
                    sum.refused += 1;
                }
                Ok(Alloc::Scheduled) => {
                    let n = self.out.scheduled.last().map_or(0, |s| s.num_tokens);
                    sum.scheduled += 1;
                    sum.started += 1;
                    sum.tokens += n;
                    budget = budget.saturating_sub(n);
                }
                Ok(Alloc::Wait) => {
                    sum.waiting_on_reclaim += 1;
                    break;
                }
                Ok(Alloc::NoSpace(PoolKind::Host)) if self.running.is_empty() => {
                    // Nothing runs to free host blocks: the only ones held are those of imports
                    // (which need none for their imported pages). The head (a preempted request
                    // that needs its blocks back, or an import that needs a new page) would wait
                    // for the imports queued behind it forever, and they for the head: start
                    // the first of them that fits.
                    let mut k = 1;
                    while k < self.waiting.len() {
                        let s = self.waiting[k];
                        k += 1;
                        let Some(id) = self.reqs[s as usize]
                            .as_ref()
                            .filter(|r| matches!(r.import, Import::Ready(_)))
                            .map(|r| r.id)
                        else {
                            continue;
                        };
                        match self.start(id, budget) {
                            Ok(Alloc::Scheduled) => {
                                let n = self.out.scheduled.last().map_or(0, |s| s.num_tokens);
                                sum.scheduled += 1;
                                sum.started += 1;
                                sum.tokens += n;
                                break;
                            }
                            Ok(_) | Err(CoordError::NoFreeSlot) => {}
                            Err(e) => {
                                self.refuse_slot(s, &e);
                                sum.refused += 1;
                                k -= 1;
                            }
                        }
                    }
                    break;
                }
                Ok(Alloc::NoSpace(_)) => break,
            }
        }
        self.process_reused();
        Ok(sum)
    }

    /// Runs [`Coordinator::schedule_step`] and returns the step's command.
    pub fn step(&mut self) -> Result<OffloadCommand, CoordError> {
        self.schedule_step()?;
        Ok(self.build_offload_command())
    }
}
