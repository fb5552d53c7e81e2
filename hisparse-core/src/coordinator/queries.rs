//! Admission queries for an engine that keeps its own scheduler: before it picks a step's batch
//! it asks whether a request would fit now ([`Coordinator::can_start`],
//! [`Coordinator::can_schedule`]) and why not, what each tier has free ([`Coordinator::free`])
//! and what a request needs ([`Coordinator::needs`]).
//!
//! The queries change nothing, and answer exactly what the operation would decide now: they
//! ask the same need computations ([`Coordinator::gpu_need_tokens`],
//! [`Coordinator::plan_start`], [`Coordinator::plan_import_start`]) and, where the free pool
//! alone is short, the same reclaim plan ([`Coordinator::plan_reclaim`]) the operation then
//! carries out. The one thing they cannot foresee is the allocator refusing the coordinator's
//! own bookkeeping ([`CoordError::OutOfMemory`]).

use alloc::vec::Vec;

use super::admission::{StartPlan, largest_fit};
use super::managers::SourceTable;
use super::reclaim::{PassStart, ReclaimPlan};
use super::request::{Import, Req};
use super::{Alloc, CoordError, Coordinator, PoolKind, RequestId};
use crate::pool::BlockKey;

/// What [`Coordinator::can_start`] or [`Coordinator::can_schedule`] finds: the answer the
/// operation would give now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Admission {
    /// The operation's answer: scheduled, wait (releases in flight), or no space in a pool.
    pub outcome: Alloc,
    /// Tokens it would schedule (0 unless scheduled): all of them for
    /// [`Coordinator::schedule`]; for [`Coordinator::start`], its first chunk (fewer than the
    /// budget when the prompt has fewer left or the free GPU pool holds less).
    pub tokens: u32,
    /// Whether it would reclaim resident pages first: the free GPU pool alone is short.
    pub reclaims: bool,
}

/// What each tier has free now ([`Coordinator::free`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TierFree {
    /// Free GPU blocks: unpinned resident pages' blocks and blocks the prefix cache keeps
    /// (reusable by a prefix hit until handed out) count as free.
    pub gpu_blocks: u32,
    /// Usable GPU blocks (all but the null block).
    pub gpu_capacity: u32,
    /// GPU blocks carrying a prefix-cache key (held, or free and still reusable).
    pub gpu_cached: u32,
    /// Free host blocks (prefix-cached ones included).
    pub host_blocks: u32,
    /// Usable host blocks.
    pub host_capacity: u32,
    /// Host blocks carrying a prefix-cache key.
    pub host_cached: u32,
    /// GPU blocks one hot region costs (every bucket).
    pub hot_region_blocks: u32,
    /// Hot regions the free GPU pool could give now.
    pub hot_regions_free: u32,
    /// Requests holding a hot region.
    pub hot_regions_held: u32,
    /// Data-plane state rows free (`max_running` minus the running requests).
    pub rows: u32,
}

/// What a request needs ([`Coordinator::needs`]): for its next tokens, the blocks they take
/// out of the free pools; for its whole context, what the layout says it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Needs {
    /// Tokens the next-step figures are for: the `n` asked for a running request; for a
    /// waiting one, the first chunk a start with a budget of `n` tokens schedules before the
    /// free pools shrink it.
    pub tokens: u32,
    /// GPU blocks those tokens take out of the free pool: new pages in every group, regular
    /// columns, prefill context staged from host, a hot region, and prefix-hit blocks a start
    /// re-pins from the free queue.
    pub gpu_blocks: u64,
    /// Of `gpu_blocks`, the hot region's (0 when it holds one or reads nothing from host).
    pub hot_region_blocks: u64,
    /// Host blocks those tokens take out of the free pool (new pages, and prefix-hit pages a
    /// start re-pins from the free queue).
    pub host_blocks: u64,
    /// Tokens of the request (prompt and appended).
    pub context_tokens: u32,
    /// GPU blocks its whole context holds at the least (the cheaper of all on the GPU and
    /// HiSparse's resident tail and hot region; admission's rule).
    pub context_gpu_blocks: u64,
    /// GPU blocks a prefill over its whole context holds (a restart recomputes it all).
    pub context_prefill_gpu_blocks: u64,
    /// Host blocks its whole context holds: one per page.
    pub context_host_blocks: u64,
}

impl Coordinator {
    /// What each tier has free now. Pure.
    pub fn free(&self) -> TierFree {
        let hot = self.hot.cost();
        TierFree {
            gpu_blocks: self.gpu.num_free(),
            gpu_capacity: self.gpu.num_blocks() - 1,
            gpu_cached: self.gpu.num_cached(),
            host_blocks: self.host.num_free(),
            host_capacity: self.host.num_blocks() - 1,
            host_cached: self.host.num_cached(),
            hot_region_blocks: hot,
            hot_regions_free: self.gpu.num_free().checked_div(hot).unwrap_or(0),
            hot_regions_held: self
                .running
                .iter()
                .filter_map(|&s| self.reqs[s as usize].as_deref())
                .filter(|r| !r.hot.blocks.is_empty())
                .count() as u32,
            rows: self.cfg.max_running - self.running.len() as u32,
        }
    }

    /// What request `id` needs for its next `n` tokens (computed ones for a running request,
    /// which may be more than it holds yet; a start's first chunk for a waiting one) and for
    /// its whole context. Pure. Errors: an unknown or refused request, `n` = 0 or past
    /// `max_model_len`, an import whose writes are incomplete.
    pub fn needs(&self, id: RequestId, n: u32) -> Result<Needs, CoordError> {
        let r = self.req(id).ok_or(CoordError::UnknownRequest { id })?;
        if n == 0 {
            return Err(CoordError::NotEnoughTokens {
                id,
                requested: 0,
                available: r.tokens.len() as u32 - r.num_computed,
            });
        }
        let len = r.tokens.len() as u32;
        let mut needs = Needs {
            tokens: n,
            gpu_blocks: 0,
            hot_region_blocks: 0,
            host_blocks: 0,
            context_tokens: len,
            context_gpu_blocks: self.kv.gpu_blocks_per_request(len).min_needed(),
            context_prefill_gpu_blocks: self.kv.prefill_gpu_blocks(len),
            context_host_blocks: u64::from(self.kv.pages_for(len)),
        };
        if r.status == super::request::Status::Running {
            let target = u64::from(r.num_computed) + u64::from(n);
            if target > u64::from(self.kv.max_model_len) {
                return Err(CoordError::TooLong {
                    id,
                    tokens: target,
                    max_model_len: self.kv.max_model_len,
                });
            }
            let prefill = r.num_computed < r.prefill_end;
            let gpu = self.gpu_need_tokens(r, n, prefill);
            let pages = self.kv.pages_for(target as u32);
            (needs.gpu_blocks, needs.hot_region_blocks) = (gpu.total(), gpu.hot);
            needs.host_blocks = u64::from(self.host_need_pages(r, pages));
            return Ok(needs);
        }
        self.startable_state(r)?;
        match r.import {
            Import::Ready(imported) => {
                let plan = self.plan_import_start(r, imported, n);
                needs.tokens = plan.chunk;
                needs.gpu_blocks = self.import_gpu_need(&plan, r, plan.chunk);
                needs.hot_region_blocks = plan.hot;
                needs.host_blocks = u64::from(self.import_host_need(&plan, plan.chunk));
            }
            _ => {
                let (plan, hashes) = self.plan_start_of(r, n);
                let (host_pins, gpu_pins) = self.start_pins_free(&plan, &hashes);
                needs.tokens = plan.chunk;
                needs.gpu_blocks = self.start_gpu_need(&plan, plan.chunk) + u64::from(gpu_pins);
                needs.host_blocks = plan.host_need() + u64::from(host_pins);
            }
        }
        Ok(needs)
    }

    /// What [`Coordinator::schedule`]`(id, n)` would answer now — the same error, or the
    /// outcome and whether it would reclaim first — without changing anything.
    pub fn can_schedule(&self, id: RequestId, n: u32) -> Result<Admission, CoordError> {
        let r = self.req(id).ok_or(CoordError::UnknownRequest { id })?;
        if r.status != super::request::Status::Running {
            return Err(r.status_error());
        }
        let available = r.tokens.len() as u32 - r.num_computed;
        if n > available || n == 0 {
            return Err(CoordError::NotEnoughTokens {
                id,
                requested: n,
                available,
            });
        }
        if self.decodes_in_place(r, n) {
            return Ok(scheduled(n, false));
        }
        let pages = self.kv.pages_for(r.num_computed + n);
        if self.host_need_pages(r, pages) > self.host.num_free() {
            return Ok(short(self.short_of(PoolKind::Host, false), false));
        }
        let prefill = r.num_computed < r.prefill_end;
        let need = self.gpu_need_tokens(r, n, prefill);
        let free = self.gpu.num_free();
        if need.total() <= u64::from(free) {
            return Ok(scheduled(n, false));
        }
        // A prefill chunk's own pages stay put for the step: the pass passes it over.
        let pass = PassStart {
            free,
            pinned: &[],
            skip: prefill.then_some(r.slot),
        };
        let (plan, converted) = self.forecast_reclaim(need.total(), pass, Some(r.slot));
        // A request the pass converts holds its hot region afterwards.
        let need_after = if converted { need.blocks } else { need.total() };
        if need_after > u64::from(plan.free_after) {
            if prefill {
                self.check_prefill_fits(r)?;
            }
            return Ok(short(self.short_after(PoolKind::Gpu, &plan), true));
        }
        Ok(scheduled(n, true))
    }

    /// What [`Coordinator::start`]`(id, max_tokens)` would answer now — the same error, or the
    /// outcome, its first chunk and whether it would reclaim first — without changing
    /// anything.
    pub fn can_start(&self, id: RequestId, max_tokens: u32) -> Result<Admission, CoordError> {
        let r = self.startable(id)?;
        if let Import::Ready(imported) = r.import {
            return Ok(self.can_start_imported(r, imported, max_tokens));
        }
        let (plan, hashes) = self.plan_start_of(r, max_tokens);
        // Pinning the hit takes its cached free blocks out of the free queues.
        let (host_pins, gpu_pins) = self.start_pins_free(&plan, &hashes);
        if u64::from(self.host.num_free() - host_pins) < plan.host_need() {
            return Ok(short(self.short_of(PoolKind::Host, false), false));
        }
        let free = self.gpu.num_free() - gpu_pins;
        let need = |c| self.start_gpu_need(&plan, c);
        if u64::from(free) >= need(plan.chunk) {
            return Ok(scheduled(plan.chunk, false));
        }
        let mut pinned = plan.adopt_blocks.clone();
        pinned.sort_unstable();
        let pass = PassStart {
            free,
            pinned: &pinned,
            skip: None,
        };
        let (rp, _) = self.forecast_reclaim(need(plan.chunk), pass, None);
        let after = u64::from(rp.free_after);
        Ok(match largest_fit(plan.chunk, |c| need(c) <= after) {
            Some(c) => scheduled(c, true),
            None => short(self.short_after(PoolKind::Gpu, &rp), true),
        })
    }

    /// [`Coordinator::can_start`] of an imported request whose writes are complete.
    fn can_start_imported(&self, r: &Req, imported: u32, max_tokens: u32) -> Admission {
        let plan = self.plan_import_start(r, imported, max_tokens);
        let host_free = self.host.num_free();
        let Some(chunk) = largest_fit(plan.chunk, |c| self.import_host_need(&plan, c) <= host_free)
        else {
            return short(self.short_of(PoolKind::Host, false), false);
        };
        let free = self.gpu.num_free();
        let need = |c| self.import_gpu_need(&plan, r, c);
        if u64::from(free) >= need(chunk) {
            return scheduled(chunk, false);
        }
        let pass = PassStart {
            free,
            pinned: &[],
            skip: None,
        };
        let (rp, _) = self.forecast_reclaim(need(chunk), pass, None);
        let after = u64::from(rp.free_after);
        match largest_fit(chunk, |c| need(c) <= after) {
            Some(c) => scheduled(c, true),
            None => short(self.short_after(PoolKind::Gpu, &rp), true),
        }
    }

    /// The reclaim pass an allocation needing `need` GPU blocks from `pass` would run, and
    /// whether it converts the request in `reqs[converts]` (gives it a hot region).
    fn forecast_reclaim(
        &self,
        need: u64,
        pass: PassStart<'_>,
        converts: Option<u32>,
    ) -> (ReclaimPlan, bool) {
        let want = self.reclaim_want(need, pass.free);
        let (mut cands, mut steps) = (Vec::new(), Vec::new());
        let plan = self.plan_reclaim(want, true, pass, &mut cands, &mut steps);
        let converted = steps
            .iter()
            .any(|s| Some(s.idx()) == converts && s.converting);
        (plan, converted)
    }

    /// The start plan of waiting request `r` with a budget of `max_tokens`, and its prompt's
    /// prefix hashes (a start recomputes them).
    fn plan_start_of(&self, r: &Req, max_tokens: u32) -> (StartPlan, Vec<u64>) {
        let mut t = SourceTable::default();
        self.source.hash_prompt(&mut t, &r.tokens);
        let plan = self.plan_start(&r.tokens, &t.hashes, max_tokens);
        (plan, t.hashes)
    }

    /// Of the blocks a start planned as `plan` pins, those in the free queues now: `(host,
    /// GPU)` (pinning takes them out).
    fn start_pins_free(&self, plan: &StartPlan, hashes: &[u64]) -> (u32, u32) {
        let host = hashes[..plan.hit as usize]
            .iter()
            .filter(|&&hash| {
                self.host
                    .lookup(BlockKey { group: 0, hash })
                    .is_some_and(|b| self.host.is_free(b))
            })
            .count() as u32;
        let paged = if plan.hit > 0 {
            self.paged
                .hit_blocks_free(&self.gpu, hashes, plan.hit, plan.computed0)
        } else {
            0
        };
        let adopted = plan
            .adopt_blocks
            .iter()
            .filter(|&&b| self.gpu.is_free(b))
            .count() as u32;
        (host, paged + adopted)
    }

    /// [`Coordinator::startable`]'s verdict on a waiting request's own state (the row aside:
    /// needs do not depend on one being free).
    fn startable_state(&self, r: &Req) -> Result<(), CoordError> {
        match self.startable(r.id) {
            Ok(_) | Err(CoordError::NoFreeSlot) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// An [`Admission`] that schedules `tokens`.
fn scheduled(tokens: u32, reclaims: bool) -> Admission {
    Admission {
        outcome: Alloc::Scheduled,
        tokens,
        reclaims,
    }
}

/// An [`Admission`] that does not schedule: `outcome` says why.
fn short(outcome: Alloc, reclaims: bool) -> Admission {
    Admission {
        outcome,
        tokens: 0,
        reclaims,
    }
}
