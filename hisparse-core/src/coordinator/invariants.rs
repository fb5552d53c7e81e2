//! [`Coordinator::check_invariants`]: every invariant of the pools, the managers and the page
//! lifecycle, checked the slow way (for tests and debugging).

use alloc::vec;
use core::fmt;

use super::managers::{CLEAN, DIRTY, PENDING_RELEASE, RECLAIMED};
use super::request::Status;
use super::{ACTIVE_TAIL_PAGES, Coordinator, PoolKind, RequestId};

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
    /// Checks every invariant (O(everything); for tests and debugging): pool accounting (every
    /// block's reference count equals the references requests, hot regions and deferred frees
    /// hold — no leak, no double free), no page reclaimed before its host copy is durable, the
    /// last `ACTIVE_TAIL_PAGES` pages of a running request never reclaimed, host prefix hashes
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
        let nb = self.resident.num_buckets() as usize;
        let bt = self.kv.block_tokens;
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
            if running == waiting || running != (r.status == Status::Running) {
                return Err(violation("request in exactly one queue", rid, None));
            }
            if r.status == Status::Waiting {
                if !(r.source.blocks.is_empty()
                    && r.resident.blocks.is_empty()
                    && r.hot.blocks.is_empty())
                {
                    return Err(violation("waiting request holds blocks", rid, None));
                }
                continue;
            }
            for &b in r
                .paged
                .indexer
                .iter()
                .chain(&r.paged.regular)
                .chain(&r.resident.blocks)
                .chain(&r.hot.blocks)
            {
                if b != 0 {
                    gpu_refs[b as usize] += 1;
                }
            }
            for &b in &r.source.blocks {
                host_refs[b as usize] += 1;
            }
            if !r.hot.blocks.is_empty() && r.hot.blocks.len() != self.hot.cost() as usize {
                return Err(violation("partial hot region", rid, None));
            }
            if (r.resident.host_only > 0 || r.resident.pending_release > 0)
                && r.hot.blocks.is_empty()
            {
                return Err(violation("reads from host without a hot region", rid, None));
            }
            let pages = r.pages;
            if r.resident.state.len() != pages as usize
                || r.resident.blocks.len() != pages as usize * nb
            {
                return Err(violation("table length", rid, None));
            }
            let (mut host_only, mut pend) = (0, 0);
            for p in 0..pages {
                let s = r.resident.state[p as usize];
                let null = r.resident.blocks[p as usize * nb..(p as usize + 1) * nb]
                    .iter()
                    .all(|&b| b == 0);
                let any_null =
                    r.resident.blocks[p as usize * nb..(p as usize + 1) * nb].contains(&0);
                if (s == RECLAIMED) != null || (s != RECLAIMED && any_null) {
                    return Err(violation(
                        "resident entries disagree with page state",
                        rid,
                        Some(p),
                    ));
                }
                if s == RECLAIMED {
                    host_only += 1;
                    if r.resident.xfer[p as usize] > self.durable {
                        return Err(violation(
                            "page reclaimed before its host copy is durable",
                            rid,
                            Some(p),
                        ));
                    }
                    if p >= r.hit_pages && p + ACTIVE_TAIL_PAGES >= pages {
                        return Err(violation("active tail page reclaimed", rid, Some(p)));
                    }
                }
                if s == PENDING_RELEASE {
                    pend += 1;
                    if p + ACTIVE_TAIL_PAGES >= pages {
                        return Err(violation(
                            "active tail page marked for release",
                            rid,
                            Some(p),
                        ));
                    }
                }
                if (s == CLEAN || s == RECLAIMED) && r.resident.xfer[p as usize] > self.durable {
                    return Err(violation("clean page not durable", rid, Some(p)));
                }
                if (s != DIRTY) && (p + 1) * bt > r.num_computed {
                    return Err(violation(
                        "unsealed page left the dirty state",
                        rid,
                        Some(p),
                    ));
                }
            }
            if host_only != r.resident.host_only || pend != r.resident.pending_release {
                return Err(violation("page counters", rid, None));
            }
            in_flight += pend * self.resident.num_buckets();
            for p in 0..r.source.blocks.len() as u32 {
                let durable = p < r.source.ready_prefix;
                if !durable && self.host.key_of(r.source.blocks[p as usize]).is_some() {
                    return Err(violation(
                        "host prefix hash published past the durable prefix",
                        rid,
                        Some(p),
                    ));
                }
            }
            for p in 0..r.source.ready_prefix {
                if !matches!(r.resident.state[p as usize], CLEAN | RECLAIMED) {
                    return Err(violation(
                        "ready prefix covers a page that is not durable",
                        rid,
                        Some(p),
                    ));
                }
            }
        }
        if seen != self.ids.len() {
            return Err(violation("id map size", None, None));
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
