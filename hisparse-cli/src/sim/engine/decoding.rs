//! Which rows a step decodes (step 2–4's input) and what becomes of a request after its step
//! (step 6): its next token and speculative drafts, the verifier's verdict on the drafts it
//! computed (the rejected ones rolled back), or its end.

use std::collections::HashMap;

use hisparse_core::coordinator::{Coordinator, OffloadCommand, RequestId, ScheduledRequest};

use super::{SimSetup, coord_err};
use crate::error::CliResult;
use crate::sim::rank::DecodeRow;
use crate::sim::report::SimReport;
use crate::sim::workload::Rng;

/// The drafts a request's last sampled token came with: the first draft's position, how many,
/// and how many of them the (simulated) verifier accepts.
#[derive(Clone, Copy, Debug)]
struct Drafts {
    first: u32,
    count: u32,
    accepted: u32,
}

/// A step's decode rows and what they are.
pub(super) struct StepDecode {
    /// One row per token computed after the prompt.
    pub(super) rows: Vec<DecodeRow>,
    /// The decode step each decoding request is at (1 = its first), one per request.
    pub(super) decode_steps: Vec<u32>,
    /// Whether every decoding request took the fully-resident path.
    pub(super) fully_resident: bool,
}

/// The drafts in flight per request and each request's decode steps so far.
pub(super) struct Decoding {
    drafts: HashMap<RequestId, Drafts>,
    accept_rng: Rng,
    decoded: HashMap<RequestId, u32>,
}

impl Decoding {
    pub(super) fn new(s: &SimSetup) -> Self {
        Decoding {
            drafts: HashMap::new(),
            accept_rng: Rng::with_stream(s.seed, 0x5BEC_D0DE),
            decoded: HashMap::new(),
        }
    }

    /// The decode rows of `cmd`: one per token computed after the prompt (the sampled token
    /// and its drafts, each reading the rows that exist up to it). A longer chunk past the
    /// prompt (a preempted request recomputing its decoded tokens) is prefill and reads
    /// nothing.
    pub(super) fn rows(&mut self, s: &SimSetup, cmd: &OffloadCommand) -> StepDecode {
        let ratio = s.kv.sparse_compress_ratio.max(1);
        let decoding = |sr: &&ScheduledRequest| {
            sr.first_token >= s.context && sr.num_tokens <= 1 + s.spec_tokens
        };
        let drafts = &self.drafts;
        let rows = cmd
            .scheduled
            .iter()
            .filter(decoding)
            .flat_map(|sr| {
                let rejected = drafts.get(&sr.id).map_or((0, 0), |d| {
                    ((d.first + d.accepted) / ratio, (d.first + d.count) / ratio)
                });
                (0..sr.num_tokens).map(move |j| DecodeRow {
                    slot: sr.slot,
                    uid: sr.id,
                    seq_len: (sr.first_token + j + 1) / ratio,
                    rejected,
                })
            })
            .collect();
        let decode_steps = cmd
            .scheduled
            .iter()
            .filter(decoding)
            .map(|sr| {
                let k = self.decoded.entry(sr.id).or_default();
                *k += 1;
                *k
            })
            .collect();
        StepDecode {
            rows,
            decode_steps,
            fully_resident: cmd
                .scheduled
                .iter()
                .filter(decoding)
                .all(|sr| sr.fully_resident),
        }
    }

    /// After a step, every running request whose tokens are all computed: the verifier's
    /// verdict on its drafts (the rejected ones go back), then its end at `final_len` tokens,
    /// or its next token and drafts. Returns the tokens of the requests that finished.
    pub(super) fn sample_or_finish(
        &mut self,
        s: &SimSetup,
        coord: &mut Coordinator,
        report: &mut SimReport,
    ) -> CliResult<u64> {
        let final_len = s.context + s.decode_steps;
        let mut finished_tokens = 0;
        let running: Vec<RequestId> = coord.running_ids().collect();
        for id in running {
            let (mut n, c) = (
                coord.num_tokens(id).unwrap_or(0),
                coord.num_computed(id).unwrap_or(0),
            );
            if n != c {
                continue;
            }
            if let Some(d) = self.drafts.remove(&id) {
                let rejected = d.count - d.accepted;
                if rejected > 0 {
                    coord.rollback(id, rejected).map_err(coord_err)?;
                    n -= rejected;
                }
                report.draft_tokens += u64::from(d.count);
                report.accepted_tokens += u64::from(d.accepted);
                report.rolled_back_tokens += u64::from(rejected);
            }
            if n >= final_len {
                coord.finish(id).map_err(coord_err)?;
                self.decoded.remove(&id);
                finished_tokens += u64::from(final_len);
                continue;
            }
            // The sampled token, then drafts that fit the request; each is accepted with the
            // accept rate until the first rejection. Accepted drafts are the tokens decoding
            // would have produced; rejected ones differ.
            let count = s.spec_tokens.min(final_len - n - 1);
            let mut accepted = 0;
            while accepted < count && self.accept_rng.unit() < s.accept_rate {
                accepted += 1;
            }
            let tokens: Vec<u32> = (0..=count)
                .map(|i| {
                    if i <= accepted {
                        n + i
                    } else {
                        (n + i) | 1 << 30
                    }
                })
                .collect();
            coord.append_tokens(id, &tokens).map_err(coord_err)?;
            if count > 0 {
                self.drafts.insert(
                    id,
                    Drafts {
                        first: n + 1,
                        count,
                        accepted,
                    },
                );
            }
        }
        Ok(finished_tokens)
    }
}
