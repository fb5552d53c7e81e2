//! Reclaim: [`Coordinator::reclaim_resident_blocks`] frees GPU blocks by releasing clean
//! resident pages, and tells allocation to wait instead of preempting while releases are in
//! flight.

use super::managers::{CLEAN, DIRTY, PENDING, PENDING_RELEASE};
use super::{Alloc, Coordinator, PoolKind};

impl Coordinator {
    /// Whether releases are in flight (pages marked release-after-transfer, or blocks of
    /// finished requests waiting for a transfer): an allocation that finds the pools short
    /// then answers [`super::Alloc::Wait`] rather than preempting.
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

    /// Frees GPU blocks by reclaiming clean resident pages (SPEC §4): visits running requests
    /// with the most candidates first, oldest pages first; releases clean pages at once, marks
    /// pending ones release-after-transfer (and, without eager mirroring, plans the spill of
    /// dirty full pages with release-after-transfer); converts a request without a hot region
    /// only when the pages it frees exceed the region's cost. Returns the blocks freed now.
    pub fn reclaim_resident_blocks(&mut self, shortfall: u32) -> u32 {
        self.reclaim(shortfall).0
    }

    /// [`Coordinator::reclaim_resident_blocks`], also saying whether the pass *awaits
    /// transfers*: some request without a hot region has enough candidates to pay for one, but
    /// too few of them are clean yet (their host copies are in flight, or — without eager
    /// mirroring — about to be spilled). Its conversion becomes possible once those transfers
    /// complete, so an allocation still short should wait rather than preempt.
    pub(super) fn reclaim(&mut self, shortfall: u32) -> (u32, bool) {
        let mut awaits = false;
        let mut scratch = core::mem::take(&mut self.scratch);
        scratch.clear();
        for &idx in &self.running {
            if let Some(r) = &self.reqs[idx as usize] {
                let c = self
                    .resident
                    .candidates(&r.resident, r.pages, r.num_computed);
                if c > 0 {
                    scratch.push((c, idx));
                }
            }
        }
        // Most candidates first; ties by age (running order is admission order).
        scratch.sort_by_key(|a| core::cmp::Reverse(a.0));
        let nb = self.resident.num_buckets();
        let hot_cost = self.hot.cost();
        let mut freed = 0u32;
        let mut progress = 0u32;
        for &(c, idx) in &scratch {
            if progress >= shortfall {
                break;
            }
            let Some(mut r) = self.reqs[idx as usize].take() else {
                continue;
            };
            let limit = self.resident.reclaim_limit(r.pages, r.num_computed);
            let converting = r.hot.blocks.is_empty();
            if converting {
                // Worth it only when the pages it frees exceed the region's cost, and possible
                // only when the region can be paid once its clean pages are released.
                let clean = (r.resident.reclaim_cursor..limit)
                    .filter(|&p| r.resident.state[p as usize] == CLEAN)
                    .count() as u32;
                let worth_it = c > self.hot.blocks_per_request();
                if !worth_it
                    || u64::from(self.gpu.num_free()) + u64::from(clean) * u64::from(nb)
                        < u64::from(hot_cost)
                {
                    // Worth it but not payable yet: every candidate is sealed, so the rest
                    // become clean as their transfers complete.
                    awaits |= worth_it;
                    self.reqs[idx as usize] = Some(r);
                    continue;
                }
            }
            let mut p = r.resident.reclaim_cursor;
            // A converted request gives up every candidate: the region is paid for once.
            while p < limit && (converting || progress < shortfall) {
                match r.resident.state[p as usize] {
                    CLEAN => {
                        let row = r.row;
                        self.resident.release_page(
                            &mut r.resident,
                            p,
                            &mut self.gpu,
                            &mut self.out,
                            row,
                        );
                        freed += nb;
                        progress += nb;
                    }
                    PENDING => {
                        r.resident.state[p as usize] = PENDING_RELEASE;
                        r.resident.pending_release += 1;
                        self.in_flight_release += nb;
                        progress += nb;
                    }
                    DIRTY => {
                        // Full but not yet transferred (eager mirroring off): spill it now.
                        self.plan_spill(&mut r, p);
                        r.resident.state[p as usize] = PENDING_RELEASE;
                        r.resident.pending_release += 1;
                        self.in_flight_release += nb;
                        progress += nb;
                    }
                    _ => {}
                }
                p += 1;
            }
            r.resident.reclaim_cursor = p;
            if converting {
                self.hot
                    .give(&mut r.hot, &mut self.gpu, &mut self.out, r.row);
                freed = freed.saturating_sub(hot_cost);
                progress = progress.saturating_sub(hot_cost);
            }
            self.reqs[idx as usize] = Some(r);
        }
        self.scratch = scratch;
        (freed, awaits)
    }
}
