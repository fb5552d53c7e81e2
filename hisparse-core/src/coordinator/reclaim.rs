//! Reclaim: [`Coordinator::reclaim_resident_blocks`] frees GPU blocks by releasing clean
//! resident pages, and tells allocation to wait instead of preempting while releases are in
//! flight.

use super::request::{CLEAN, DIRTY, PENDING, PENDING_RELEASE, RECLAIMED, Req};
use super::{ACTIVE_TAIL_PAGES, Coordinator, TableUpdate};

impl Coordinator {
    pub(super) fn io_in_flight(&self) -> bool {
        self.in_flight_release > 0 || !self.deferred.is_empty()
    }

    /// Frees GPU blocks by reclaiming clean resident pages (SPEC §4): visits running requests
    /// with the most candidates first, oldest pages first; releases clean pages at once, marks
    /// pending ones release-after-transfer (and, without eager mirroring, plans the spill of
    /// dirty full pages with release-after-transfer); converts a request without a hot region
    /// only when the pages it frees exceed the region's cost. Returns the blocks freed now.
    pub fn reclaim_resident_blocks(&mut self, shortfall: u32) -> u32 {
        let mut scratch = core::mem::take(&mut self.scratch);
        scratch.clear();
        for &idx in &self.running {
            if let Some(r) = &self.reqs[idx as usize] {
                let c = candidates(r, self.kv.block_tokens);
                if c > 0 {
                    scratch.push((c, idx));
                }
            }
        }
        // Most candidates first; ties by age (running order is admission order).
        scratch.sort_by_key(|a| core::cmp::Reverse(a.0));
        let nb = self.num_buckets;
        let hot_cost = self.hot_cost();
        let mut freed = 0u32;
        let mut progress = 0u32;
        for &(c, idx) in &scratch {
            if progress >= shortfall {
                break;
            }
            let Some(mut r) = self.reqs[idx as usize].take() else {
                continue;
            };
            let limit = reclaim_limit(&r, self.kv.block_tokens);
            let converting = r.hot.is_empty();
            if converting {
                // Worth it only when the pages it frees exceed the region's cost, and possible
                // only when the region can be paid once its clean pages are released.
                let clean = (r.reclaim_cursor..limit)
                    .filter(|&p| r.state[p as usize] == CLEAN)
                    .count() as u32;
                if c <= self.hot_per || self.gpu.num_free() + clean * nb < hot_cost {
                    self.reqs[idx as usize] = Some(r);
                    continue;
                }
            }
            let mut p = r.reclaim_cursor;
            // A converted request gives up every candidate: the region is paid for once.
            while p < limit && (converting || progress < shortfall) {
                match r.state[p as usize] {
                    CLEAN => {
                        self.release_page(&mut r, p);
                        freed += nb;
                        progress += nb;
                    }
                    PENDING => {
                        r.state[p as usize] = PENDING_RELEASE;
                        r.pending_release += 1;
                        self.in_flight_release += nb;
                        progress += nb;
                    }
                    DIRTY => {
                        // Full but not yet transferred (eager mirroring off): spill it now.
                        self.plan_spill(&mut r, p);
                        r.state[p as usize] = PENDING_RELEASE;
                        r.pending_release += 1;
                        self.in_flight_release += nb;
                        progress += nb;
                    }
                    _ => {}
                }
                p += 1;
            }
            r.reclaim_cursor = p;
            if converting {
                self.give_hot_region(&mut r);
                freed = freed.saturating_sub(hot_cost);
                progress = progress.saturating_sub(hot_cost);
            }
            self.reqs[idx as usize] = Some(r);
        }
        self.scratch = scratch;
        freed
    }

    pub(super) fn release_page(&mut self, r: &mut Req, p: u32) {
        let nb = self.num_buckets;
        for bk in 0..nb {
            let i = (p * nb + bk) as usize;
            let b = core::mem::replace(&mut r.resident[i], 0);
            if b != 0 {
                let _ = self.gpu.free(b);
            }
            self.out.residency.push(TableUpdate {
                slot: r.row,
                group: 2 + bk,
                page: p,
                block: 0,
            });
        }
        r.state[p as usize] = RECLAIMED;
        r.host_only += 1;
    }
}

pub(super) fn reclaim_limit(r: &Req, bt: u32) -> u32 {
    let sealed = r.num_computed / bt;
    r.pages.saturating_sub(ACTIVE_TAIL_PAGES).min(sealed)
}

pub(super) fn candidates(r: &Req, bt: u32) -> u32 {
    reclaim_limit(r, bt).saturating_sub(r.reclaim_cursor)
}
