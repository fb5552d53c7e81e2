//! Step 0 of the loop: when each request arrives. Without a shared prefix every request is
//! admitted at once; with one, one after another, each once the previous one's prefill is
//! durable on host (so later requests find the prefix in the host prefix cache); with the prefix
//! on host only, the first request runs alone and the rest arrive together once its pages'
//! GPU copies are dropped. `--import` requests arrive with their prompt's KV written into host
//! blocks instead of prefilling it.

use hisparse_core::coordinator::{CoordError, Coordinator, RequestId};

use super::{Ranks, SimSetup, coord_err};
use crate::error::CliResult;
use crate::sim::report::SimReport;

/// The prompt of request `uid`: the shared prefix's tokens, then its own.
pub(super) fn prompt(s: &SimSetup, uid: RequestId) -> Vec<u32> {
    (0..s.context)
        .map(|p| {
            if p < s.shared_prefix {
                0x5EED_0000 + p
            } else {
                (uid as u32).wrapping_mul(1_000_003).wrapping_add(p)
            }
        })
        .collect()
}

/// The requests still to arrive, and when.
pub(super) struct Admission {
    uids: Vec<RequestId>,
    next: usize,
    /// The step at which the next request arrives (`None`: not decided yet).
    at_step: Option<u64>,
    staggered: bool,
    /// With the prefix on host: after the first request, the others arrive together.
    all_at_once: bool,
}

impl Admission {
    /// Requests `1..=s.requests`, the first arriving at once.
    pub(super) fn new(s: &SimSetup) -> Self {
        Admission {
            uids: (1..=u64::from(s.requests)).collect(),
            next: 0,
            at_step: Some(0),
            staggered: s.shared_prefix > 0,
            all_at_once: false,
        }
    }

    /// Whether some request has not arrived yet.
    pub(super) fn pending(&self) -> bool {
        self.next < self.uids.len()
    }

    /// Admits the requests due at step `step_no`; `last_issued` is the newest copy batch.
    pub(super) fn admit(
        &mut self,
        s: &SimSetup,
        step_no: u64,
        last_issued: u64,
        coord: &mut Coordinator,
        ranks: &mut dyn Ranks,
        report: &mut SimReport,
    ) -> CliResult<()> {
        if coord.is_empty() && self.at_step.is_none() {
            if s.prefix_on_host && self.next == 1 {
                // The first request finished: once every copy batch is durable (its pages
                // published on host), its pages' GPU copies go, and the rest arrive at once.
                if coord.durable_transfer() >= last_issued {
                    report.gpu_copies_dropped +=
                        u64::from(coord.drop_cached_gpu_copies(&prompt(s, self.uids[0])));
                    self.at_step = Some(step_no);
                    self.all_at_once = true;
                }
            } else {
                self.at_step = Some(step_no);
            }
        }
        let ratio = s.kv.sparse_compress_ratio.max(1);
        while self.pending() && self.at_step.is_some_and(|a| a <= step_no) {
            let uid = self.uids[self.next];
            if s.import {
                // The prefill node computed the prompt and sampled the first token: its KV
                // is written into the host blocks the coordinator names, then the request
                // queues with those pages durable.
                let mut tokens = prompt(s, uid);
                tokens.push(s.context);
                let blocks = match coord.reserve_import(uid, &tokens, s.context) {
                    Ok(b) => b,
                    // No host blocks free now: retry next step.
                    Err(CoordError::Import { .. }) => break,
                    Err(e) => return Err(coord_err(e)),
                };
                ranks.import(uid, &blocks, s.context / ratio)?;
                coord.complete_import(uid).map_err(coord_err)?;
                report.imported_requests += 1;
            } else {
                coord.admit(uid, &prompt(s, uid)).map_err(coord_err)?;
            }
            self.next += 1;
            if self.staggered && !self.all_at_once {
                self.at_step = None;
            }
        }
        Ok(())
    }

    /// After step `step_no`: with a shared prefix, the next request arrives two steps after
    /// the previous one's prefill is done (its last copy batch then reported complete).
    pub(super) fn after_step(&mut self, s: &SimSetup, step_no: u64, coord: &Coordinator) {
        if self.staggered && !s.prefix_on_host && self.at_step.is_none() && self.pending() {
            let last = self.uids[self.next - 1];
            if coord.num_computed(last).is_none_or(|c| c >= s.context) {
                self.at_step = Some(step_no + 2);
            }
        }
    }
}
