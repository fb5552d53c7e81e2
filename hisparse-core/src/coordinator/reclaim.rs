//! Reclaim: [`Coordinator::reclaim_resident_blocks`] frees GPU blocks by unpinning clean
//! resident pages (lazy reclaim: their bytes stay readable until the pool hands the blocks out
//! again), the low watermark that keeps blocks free ahead of need, the fall-back of pages whose
//! unpinned blocks were reused, and wait-instead-of-preempt.

use alloc::vec::Vec;

use super::managers::{PassRefs, Unpinned};
use super::request::Status;
use super::{Alloc, Coordinator, PoolKind};

/// The pool a reclaim pass starts from ([`Coordinator::plan_reclaim`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct PassStart<'a> {
    /// Free GPU blocks.
    pub(super) free: u32,
    /// Blocks about to be pinned by a start (one more reference each), sorted.
    pub(super) pinned: &'a [u32],
    /// The request (index in `reqs`) the pass passes over: a prefill chunk being planned.
    pub(super) skip: Option<u32>,
}

/// One request's part of a planned reclaim pass.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReclaimStep {
    /// The request's index in `reqs`.
    idx: u32,
    /// Its reclaim cursor moves to this page: the candidates before it are handled.
    end: u32,
    /// It is given a hot region (it held none).
    pub(super) converting: bool,
    /// Blocks its unpinned pages return to the free queue.
    freed: u32,
}

impl ReclaimStep {
    /// The request's index in `reqs`.
    pub(super) fn idx(&self) -> u32 {
        self.idx
    }
}

/// What a planned reclaim pass does.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ReclaimPlan {
    /// Blocks it returns to the free queue, net of the hot regions it gives (as
    /// [`Coordinator::reclaim_resident_blocks`] counts them).
    pub(super) freed: u32,
    /// Free GPU blocks after it.
    pub(super) free_after: u32,
    /// Whether it awaits transfers ([`Coordinator::reclaim`]).
    pub(super) awaits: bool,
    /// Pages it marks release-after-transfer (releases then in flight).
    pub(super) marked: u32,
}

impl Coordinator {
    /// Whether releases are in flight (pages marked release-after-transfer, or blocks of
    /// finished requests and copy-on-write sources waiting for a transfer): an allocation that
    /// finds the pools short then answers [`super::Alloc::Wait`] rather than preempting.
    #[inline]
    pub(super) fn io_in_flight(&self) -> bool {
        self.in_flight_release > 0 || !self.deferred.is_empty()
    }

    /// What an allocation that found `pool` short answers: wait when releases are in flight or
    /// when the reclaim pass it ran `awaits` transfers ([`Coordinator::reclaim`]), else no
    /// space (someone must be preempted, or finish).
    #[inline]
    pub(super) fn short_of(&self, pool: PoolKind, awaits: bool) -> Alloc {
        if awaits || self.io_in_flight() {
            Alloc::Wait
        } else {
            Alloc::NoSpace(pool)
        }
    }

    /// The shortfall an allocation that needs `need` GPU blocks and finds `free` asks a reclaim
    /// pass for: what it lacks, and at least `reclaim_min_blocks` (one pass then serves many
    /// allocations).
    #[inline]
    pub(super) fn reclaim_want(&self, need: u64, free: u32) -> u32 {
        let short = need.saturating_sub(u64::from(free));
        short
            .max(u64::from(self.cfg.reclaim_min_blocks))
            .min(u64::from(u32::MAX)) as u32
    }

    /// What an allocation that found `pool` short after the reclaim pass `plan` answers
    /// ([`Coordinator::short_of`]): the pages the pass marks release-after-transfer are
    /// releases in flight too.
    #[inline]
    pub(super) fn short_after(&self, pool: PoolKind, plan: &ReclaimPlan) -> Alloc {
        self.short_of(pool, plan.awaits || plan.marked > 0)
    }

    /// Blocks the low watermark keeps free ahead of need: the hot region of one request (so a
    /// request that must start reading from host can always be given one) or a tenth of the
    /// pool, whichever is more. Free blocks include unpinned ones, whose bytes stay readable
    /// until they are handed out, so keeping them costs no host reads.
    #[inline]
    pub(super) fn low_watermark(&self) -> u32 {
        self.hot.cost().max(self.kv.num_gpu_blocks / 10)
    }

    /// Tops the free GPU pool up to the low watermark (plus `reclaim_min_blocks`, so one pass
    /// serves several steps) by unpinning clean pages of requests that already hold a hot
    /// region and marking their pending ones release-after-transfer. Nothing is spilled and no
    /// request is converted to a hot region ahead of need. A pass runs again only once the free
    /// pool has dropped by `max(reclaim_min_blocks, watermark / 8)` since the last one (a pool
    /// that cannot reach the watermark — most pages already on host — would otherwise rescan
    /// every running request every step), or when less than a hot region is free.
    pub(super) fn keep_low_watermark(&mut self) {
        let free = self.gpu.num_free();
        let mark = self.low_watermark();
        if free >= mark {
            self.free_after_watermark = free;
            return;
        }
        let hysteresis = self.cfg.reclaim_min_blocks.max(mark / 8).max(1);
        let urgent = free < self.hot.cost();
        if !urgent && free.saturating_add(hysteresis) > self.free_after_watermark {
            return;
        }
        let want = (mark - free).saturating_add(self.cfg.reclaim_min_blocks);
        self.reclaim_pass(want, false);
        self.process_reused();
        self.free_after_watermark = self.gpu.num_free();
    }

    /// Frees GPU blocks by reclaiming clean resident pages (contract §4): visits running requests
    /// with the most candidates first, oldest pages first; unpins clean pages at once (their
    /// blocks return to the free queue, their bytes stay readable until reused), marks pending
    /// ones release-after-transfer (and, without eager mirroring, plans the spill of dirty full
    /// pages with release-after-transfer); converts a request without a hot region only when the
    /// pages it frees exceed the region's cost. Returns the blocks freed now.
    pub fn reclaim_resident_blocks(&mut self, shortfall: u32) -> u32 {
        let freed = self.reclaim(shortfall).0;
        self.process_reused();
        freed
    }

    /// [`Coordinator::reclaim_resident_blocks`], also saying whether the pass *awaits
    /// transfers*: some request without a hot region has enough candidates to pay for one, but
    /// too few of them are clean yet (their host copies are in flight, or — without eager
    /// mirroring — about to be spilled). Its conversion becomes possible once those transfers
    /// complete, so an allocation still short should wait rather than preempt.
    #[inline]
    pub(super) fn reclaim(&mut self, shortfall: u32) -> (u32, bool) {
        self.reclaim_pass(shortfall, true)
    }

    /// One reclaim pass for `shortfall` blocks; `convert`: requests without a hot region may be
    /// given one (an allocation is short), else only requests holding one give up pages (the
    /// low watermark). Planned first ([`Coordinator::plan_reclaim`], which the admission
    /// queries ask too), then carried out.
    fn reclaim_pass(&mut self, shortfall: u32, convert: bool) -> (u32, bool) {
        let mut steps = core::mem::take(&mut self.reclaim_steps);
        let mut scratch = core::mem::take(&mut self.scratch);
        let pass = PassStart {
            free: self.gpu.num_free(),
            pinned: &[],
            skip: None,
        };
        let plan = self.plan_reclaim(shortfall, convert, pass, &mut scratch, &mut steps);
        self.scratch = scratch;
        let nb = self.resident.num_buckets();
        for step in &steps {
            let Some(mut r) = self.reqs[step.idx as usize].take() else {
                continue;
            };
            let (owner, row) = ((r.slot, r.generation), r.row);
            let mut spills = core::mem::take(&mut self.spill_scratch);
            spills.clear();
            let got = self.resident.reclaim_pages(
                &mut r.resident,
                step.end,
                (owner, row),
                &mut self.gpu,
                &mut self.out,
                &mut spills,
            );
            debug_assert_eq!(got.freed, step.freed, "reclaim carried out unlike its plan");
            // Full but not yet transferred (eager mirroring off): spilled now, released after.
            for &p in &spills {
                self.plan_spill(&mut r, p);
                self.resident.mark_release(&mut r.resident, p);
            }
            self.spill_scratch = spills;
            self.in_flight_release += got.marked * nb;
            if step.converting {
                self.hot
                    .give(&mut r.hot, &mut self.gpu, &mut self.out, r.row);
            }
            self.reqs[step.idx as usize] = Some(r);
        }
        self.reclaim_steps = steps;
        debug_assert_eq!(
            self.gpu.num_free(),
            plan.free_after,
            "reclaim freed unlike its plan"
        );
        (plan.freed, plan.awaits)
    }

    /// Decides, without changing anything, what a reclaim pass for `shortfall` blocks
    /// ([`Coordinator::reclaim_pass`]) does from the pool `pass` describes: visits running
    /// requests with the most candidates first, oldest pages first; unpins clean pages, marks
    /// pending ones release-after-transfer (and, when `convert`, plans the spill of dirty full
    /// pages with release-after-transfer); converts a request without a hot region (when
    /// `convert`) only when the pages it frees exceed the region's cost and pay for it. Each
    /// request's part goes to `steps`, in order; `cands` is scratch.
    pub(super) fn plan_reclaim(
        &self,
        shortfall: u32,
        convert: bool,
        pass: PassStart<'_>,
        cands: &mut Vec<(u32, u32)>,
        steps: &mut Vec<ReclaimStep>,
    ) -> ReclaimPlan {
        cands.clear();
        steps.clear();
        for &idx in &self.running {
            if Some(idx) == pass.skip {
                continue;
            }
            if let Some(r) = &self.reqs[idx as usize] {
                if !convert && r.hot.blocks.is_empty() {
                    continue;
                }
                // A prefill chunk of this step reads every page of its context on the GPU.
                if r.prefill_step == self.step_no + 1 {
                    continue;
                }
                let c = self
                    .resident
                    .candidates(&r.resident, r.pages, r.num_computed);
                if c > 0 {
                    cands.push((c, idx));
                }
            }
        }
        // Most candidates first; ties by age (running order is admission order).
        cands.sort_by_key(|a| core::cmp::Reverse(a.0));
        let nb = self.resident.num_buckets();
        let hot_cost = self.hot.cost();
        let mut refs = PassRefs::new(&self.gpu, pass.pinned);
        let mut plan = ReclaimPlan {
            free_after: pass.free,
            ..ReclaimPlan::default()
        };
        let mut progress = 0u32;
        for &(_, idx) in cands.iter() {
            if progress >= shortfall {
                break;
            }
            let Some(r) = self.reqs[idx as usize].as_deref() else {
                continue;
            };
            let limit = self.resident.reclaim_limit(r.pages, r.num_computed);
            let converting = r.hot.blocks.is_empty();
            if converting {
                // Worth it only when the pages it frees exceed the region's cost, and possible
                // only when the region can be paid once its clean pages are unpinned.
                // Pages another request shares free nothing; only the others count.
                let (clean, in_flight) = self.resident.freeable_between(
                    &r.resident,
                    r.resident.reclaim_cursor(),
                    limit,
                    &refs,
                );
                let worth_it = clean + in_flight > self.hot.blocks_per_request();
                let free = u64::from(plan.free_after);
                let pays =
                    |pages: u32| free + u64::from(pages) * u64::from(nb) >= u64::from(hot_cost);
                if !worth_it || !pays(clean) {
                    // Worth it but not payable yet: the candidates in flight become clean as
                    // their transfers complete; wait for them if they will pay.
                    plan.awaits |= worth_it && pays(clean + in_flight);
                    continue;
                }
            }
            // A converted request gives up every candidate: the region is paid for once.
            let budget = if converting {
                u32::MAX
            } else {
                shortfall - progress
            };
            let got = self
                .resident
                .plan_pages(&r.resident, limit, budget, convert, &mut refs);
            plan.free_after += got.freed + got.unshared_blocks;
            plan.freed += got.freed;
            plan.marked += got.marked;
            progress = progress.saturating_add(got.progress);
            if converting {
                // `HotManager::give` takes the region only when the pool can pay it whole.
                if plan.free_after >= hot_cost {
                    plan.free_after -= hot_cost;
                }
                plan.freed = plan.freed.saturating_sub(hot_cost);
                progress = progress.saturating_sub(hot_cost);
            }
            steps.push(ReclaimStep {
                idx,
                end: got.end,
                converting,
                freed: got.freed,
            });
        }
        plan
    }

    /// Pages whose unpinned blocks the pool handed out since the last look fall back to host:
    /// their resident entries become null in the current command, so the data plane stops
    /// reading them before the forward pass that overwrites the blocks. Every owner holds a hot
    /// region (unpinning needs one), so this allocates nothing.
    pub(super) fn process_reused(&mut self) {
        let mut reused: Vec<Unpinned> = core::mem::take(&mut self.reused);
        reused.clear();
        self.resident.take_reused(&self.gpu, &mut reused);
        for u in &reused {
            let Some(r) = self.reqs.get_mut(u.slot as usize).and_then(Option::as_mut) else {
                continue;
            };
            if r.generation != u.generation
                || r.status != Status::Running
                || !self.resident.owns(&r.resident, u)
            {
                continue;
            }
            let row = r.row;
            self.resident
                .fall_back(&mut r.resident, u.page, &mut self.gpu, &mut self.out, row);
        }
        self.reused = reused;
    }
}
