//! [`Coordinator::check_invariants`]: every invariant of the pools, the managers and the page
//! lifecycle, checked the slow way (for tests and debugging).

use alloc::vec;
use core::fmt;

use super::request::{Import, NO_ROW, Status};
use super::{Coordinator, PoolKind, RequestId};

/// A broken invariant found by [`Coordinator::check_invariants`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvariantViolation {
    /// What is wrong.
    pub what: &'static str,
    /// The request concerned, if any.
    pub request: Option<RequestId>,
    /// The page or block concerned, if any.
    pub index: Option<u32>,
}

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant violated: {}", self.what)?;
        if let Some(r) = self.request {
            write!(f, " (request {r})")?;
        }
        if let Some(i) = self.index {
            write!(f, " (index {i})")?;
        }
        Ok(())
    }
}

fn violation(
    what: &'static str,
    request: Option<RequestId>,
    index: Option<u32>,
) -> InvariantViolation {
    InvariantViolation {
        what,
        request,
        index,
    }
}

impl Coordinator {
    /// Checks that the coordinator is back to empty once an engine finished every request and
    /// every worker completed every transfer: no request known, every issued transfer durable,
    /// no release or publication waiting for one, and no GPU or host block held (so no hot
    /// region and no state row either) — then every invariant ([`Coordinator::check_invariants`]).
    /// Free blocks that keep a prefix-cache key (pages of finished requests a later prompt could
    /// hit, [`TierFree::gpu_cached`](super::TierFree::gpu_cached)) are free: they count as empty.
    /// What a simulation or a soak checks at its end, and the first leak it names.
    pub fn check_drained(&self) -> Result<(), InvariantViolation> {
        if let Some((&id, _)) = self.ids.iter().next() {
            return Err(violation("request not finished", Some(id), None));
        }
        let issued = self.current_xfer - 1;
        if self.durable != issued {
            return Err(violation(
                "transfer issued but not completed by every worker",
                None,
                u32::try_from(self.durable + 1).ok(),
            ));
        }
        if !self.deferred.is_empty() || !self.detached.is_empty() || !self.pending_pages.is_empty()
        {
            return Err(violation(
                "release or publication still waiting for a transfer",
                None,
                None,
            ));
        }
        for (what, held) in [
            ("GPU blocks still held", self.gpu.num_held()),
            ("host blocks still held", self.host.num_held()),
        ] {
            if held > 0 {
                return Err(violation(what, None, Some(held)));
            }
        }
        self.check_invariants()
    }

    /// Checks every invariant (O(everything); for tests and debugging): pool accounting (every
    /// block's reference count equals the references requests, hot regions and deferred frees
    /// hold — no leak, no double free), no page reclaimed before its host copy is durable, the
    /// active tail of a running request (the page its next token writes and the one before it)
    /// never reclaimed, host prefix hashes
    /// only on durable pages, hot regions whole and present whenever a page reads from host, and
    /// slot bookkeeping.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.gpu
            .check_invariants()
            .map_err(|w| violation(w, None, None))?;
        self.host
            .check_invariants()
            .map_err(|w| violation(w, None, None))?;
        let mut gpu_refs = vec![0u32; self.kv.num_gpu_blocks as usize];
        let mut host_refs = vec![0u32; self.kv.host_num_blocks as usize];
        let mut in_flight = 0u32;
        let mut seen = 0usize;
        for (slot, r) in self.reqs.iter().enumerate() {
            let Some(r) = r else { continue };
            seen += 1;
            let rid = Some(r.id);
            if r.slot as usize != slot || self.ids.get(&r.id) != Some(&(slot as u32)) {
                return Err(violation("slot bookkeeping", rid, Some(slot as u32)));
            }
            let running = self.running.contains(&(slot as u32));
            let waiting = self.waiting.contains(&(slot as u32));
            let reserved = matches!(r.import, Import::Reserved(_));
            let refused = matches!(r.status, Status::Refused(_));
            // An import whose writes are not complete, and a refused request, are in neither
            // queue.
            let queues_ok = if reserved || refused {
                !running && !waiting
            } else {
                running != waiting
            };
            if !queues_ok || running != (r.status == Status::Running) {
                return Err(violation("request in exactly one queue", rid, None));
            }
            let row_ok = if r.status == Status::Running {
                self.row_owner.get(r.row as usize) == Some(&(slot as u32))
            } else {
                r.row == NO_ROW
            };
            if !row_ok {
                return Err(violation("data-plane row bookkeeping", rid, Some(r.row)));
            }
            if r.status != Status::Running {
                // An imported request holds the host blocks of its imported pages, nothing else
                // (a refused one nothing at all).
                let host_ok = match r.import {
                    Import::Reserved(n) | Import::Ready(n) => {
                        r.source.blocks.len() as u32 == self.kv.pages_for(n)
                    }
                    Import::None => r.source.blocks.is_empty(),
                };
                if !(host_ok && r.resident.blocks().is_empty() && r.hot.blocks.is_empty()) {
                    return Err(violation("waiting request holds blocks", rid, None));
                }
                for &b in &r.source.blocks {
                    host_refs[b as usize] += 1;
                }
                continue;
            }
            for b in r
                .paged
                .blocks()
                .chain(self.resident.held_blocks(&r.resident))
                .chain(r.hot.blocks.iter().copied())
            {
                if b != 0 {
                    gpu_refs[b as usize] += 1;
                }
            }
            for &b in &r.source.blocks {
                host_refs[b as usize] += 1;
            }
            let at = |(what, index)| violation(what, rid, index);
            self.hot
                .check(&r.hot, self.resident.needs_hot_region(&r.resident))
                .map_err(at)?;
            self.paged.check(&r.paged, r.num_computed).map_err(at)?;
            self.resident
                .check(
                    &r.resident,
                    (r.slot, r.generation),
                    r.pages,
                    r.hit_pages,
                    r.num_computed,
                    self.durable,
                    &self.gpu,
                )
                .map_err(at)?;
            in_flight += r.resident.pending_release() * self.resident.num_buckets();
            self.source
                .check(&r.source, &r.resident, &self.host)
                .map_err(at)?;
        }
        if seen != self.ids.len() {
            return Err(violation("id map size", None, None));
        }
        let owned = self.row_owner.iter().filter(|&&o| o != NO_ROW).count();
        if owned != self.running.len()
            || owned + self.free_rows.len() != self.row_owner.len()
            || self.row_owner.len() > self.cfg.max_running as usize
            || self
                .free_rows
                .iter()
                .any(|&row| self.row_owner.get(row as usize) != Some(&NO_ROW))
        {
            return Err(violation("data-plane row bookkeeping", None, None));
        }
        if in_flight != self.in_flight_release {
            return Err(violation("in-flight release counter", None, None));
        }
        for &(pool, b) in &self.after_build {
            match pool {
                PoolKind::Gpu => gpu_refs[b as usize] += 1,
                PoolKind::Host => host_refs[b as usize] += 1,
            }
        }
        for &(x, b, _) in &self.detached {
            let held = self
                .deferred
                .iter()
                .any(|&(y, pool, d)| y == x && pool == PoolKind::Host && d == b);
            if x <= self.durable || !held {
                return Err(violation(
                    "detached page not held until its publication",
                    None,
                    Some(b),
                ));
            }
        }
        for &(x, pool, b) in &self.deferred {
            if x <= self.durable {
                return Err(violation("deferred free past durable", None, Some(b)));
            }
            match pool {
                PoolKind::Gpu => gpu_refs[b as usize] += 1,
                PoolKind::Host => host_refs[b as usize] += 1,
            }
        }
        for (b, &want) in gpu_refs.iter().enumerate().skip(1) {
            if self.gpu.ref_count(b as u32) != want {
                return Err(violation(
                    "GPU block reference count (leak or double free)",
                    None,
                    Some(b as u32),
                ));
            }
        }
        for (b, &want) in host_refs.iter().enumerate().skip(1) {
            if self.host.ref_count(b as u32) != want {
                return Err(violation(
                    "host block reference count (leak or double free)",
                    None,
                    Some(b as u32),
                ));
            }
        }
        Ok(())
    }
}
