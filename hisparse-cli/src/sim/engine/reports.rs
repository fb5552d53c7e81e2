//! Step 5 of the loop: the workers' reports of the copy batches. Worker `w` reports what its
//! rank enqueued, and a batch complete once its rank saw it complete and `delay(w)` steps after
//! it was issued — as real copy streams would, out of step across tensor-parallel ranks — so
//! pages go through `pending` before `clean` and reclaim must sometimes wait.

use hisparse_core::coordinator::Coordinator;

use super::coord_err;
use crate::error::{CliError, CliResult};
use crate::sim::rank::RankStep;

/// The copy batches issued and what each worker reported of them.
pub(super) struct CopyBatches {
    nranks: usize,
    /// Batches issued: (transfer id, step).
    issued: Vec<(u64, u64)>,
    /// Per rank, how many issued batches it saw complete (a FIFO prefix).
    really_done: Vec<usize>,
    /// Per worker, how many it has reported complete.
    completed: Vec<usize>,
    /// Per rank, what it enqueued last.
    enqueued: Vec<Vec<u64>>,
}

impl CopyBatches {
    /// `workers` workers over `nranks` ranks (one worker per rank, or, in one process, `W`
    /// simulated workers of the one rank).
    pub(super) fn new(nranks: usize, workers: u32) -> Self {
        CopyBatches {
            nranks,
            issued: Vec::new(),
            really_done: vec![0; nranks],
            completed: vec![0; workers as usize],
            enqueued: vec![Vec::new(); nranks],
        }
    }

    fn rank_of(&self, w: usize) -> usize {
        if self.nranks > 1 { w } else { 0 }
    }

    fn delay(&self, w: usize) -> u64 {
        if self.nranks > 1 { 1 } else { w as u64 + 1 }
    }

    /// The newest batch issued (0: none).
    pub(super) fn last_issued(&self) -> u64 {
        self.issued.last().map_or(0, |&(id, _)| id)
    }

    /// Step `step_no`'s command issued batch `id` (if any), and its ranks answered `steps`.
    pub(super) fn record(&mut self, id: Option<u64>, step_no: u64, steps: &[RankStep]) {
        if let Some(id) = id {
            self.issued.push((id, step_no));
        }
        self.saw(steps);
    }

    fn saw(&mut self, steps: &[RankStep]) {
        for (r, st) in steps.iter().enumerate() {
            self.really_done[r] += st.report.completed.len();
            self.enqueued[r].clone_from(&st.report.enqueued);
        }
    }

    /// Every worker's report after step `step_no`.
    pub(super) fn report(&mut self, coord: &mut Coordinator, step_no: u64) -> CliResult<()> {
        for w in 0..self.completed.len() {
            let r = self.rank_of(w);
            let done = self.completed[w];
            let upto = self.issued[..self.really_done[r]]
                .iter()
                .take_while(|&&(_, at)| at + self.delay(w) <= step_no)
                .count();
            let comp: Vec<u64> = self.issued[done..upto.max(done)]
                .iter()
                .map(|&(id, _)| id)
                .collect();
            coord
                .report(w as u32, &self.enqueued[r], &comp)
                .map_err(coord_err)?;
            self.completed[w] = upto.max(done);
        }
        Ok(())
    }

    /// The ranks drained (`drained`): every batch must have completed on every rank, and
    /// every worker reports the rest.
    pub(super) fn drain(&mut self, coord: &mut Coordinator, drained: &[RankStep]) -> CliResult<()> {
        self.saw(drained);
        for (r, &done) in self.really_done.iter().enumerate() {
            if done != self.issued.len() {
                return Err(CliError::failed(format!(
                    "rank {r}: {} of {} copy batches never completed",
                    self.issued.len() - done,
                    self.issued.len()
                )));
            }
        }
        for w in 0..self.completed.len() {
            let comp: Vec<u64> = self.issued[self.completed[w]..]
                .iter()
                .map(|&(id, _)| id)
                .collect();
            coord
                .report(w as u32, &self.enqueued[self.rank_of(w)], &comp)
                .map_err(coord_err)?;
            self.completed[w] = self.issued.len();
        }
        Ok(())
    }
}
