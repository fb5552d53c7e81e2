//! The simulation loop: the real [`Coordinator`] plans every step, the
//! [`hisparse_runtime::Runtime`] executes each [`OffloadCommand`] on a [`Device`], the simulated
//! forward pass writes synthetic KV rows, and every decode step's attention reads are verified.
//!
//! Per step:
//! 0. requests are admitted: all at once, or, with a shared prompt prefix, one after another so
//!    later requests find the earlier ones' durable pages in the host prefix cache;
//! 1. `Coordinator::step` schedules prefill chunks and decode tokens and returns the command;
//! 2. [`Runtime::begin_step`](hisparse_runtime::Runtime::begin_step): tables, hot-state resets, invalidation, copy-on-write, restores;
//! 3. the forward pass writes each scheduled request's new rows into its resident pages (every
//!    sparse layer); decode tokens then read their top-k, one
//!    [`Runtime::resolve_index_group`](hisparse_runtime::Runtime::resolve_index_group) per index group;
//! 4. [`Runtime::end_step`](hisparse_runtime::Runtime::end_step): the after-forward copies (row mirrors, page spills) as the step's
//!    transfer batch;
//! 5. [`Runtime::poll`](hisparse_runtime::Runtime::poll) reports what completed; worker `w` reports a batch complete once it
//!    really is and `w + 1` steps after it was issued (as real copy streams would, out of step
//!    across tensor-parallel ranks), so pages go through `pending` before `clean` and reclaim must
//!    sometimes wait;
//! 6. the reads are verified against the synthetic rows (off the timed path); decoded requests
//!    get their next token or finish.
//!
//! Step 0 is [`admission`]'s, step 5 [`reports`]', the decode rows and step 6 [`decoding`]'s; the
//! totals come from [`totals`] once every transfer drained.
//!
//! Device time per step is the time of steps 2–4 up to a synchronisation of both streams; the
//! forward pass's writes, the top-k uploads and verification are not counted.

use std::time::Instant;

mod admission;
mod decoding;
mod reports;
mod totals;

use hisparse_core::Device;
use hisparse_core::coordinator::{
    CoordError, Coordinator, CoordinatorConfig, OffloadCommand, RequestId,
};
use hisparse_core::layout::{KvCacheConfig, NodeHostMemory};
use serde::{Deserialize, Serialize};

use super::rank::{DecodeRow, Rank, RankStep};
use super::report::{SimReport, StepStats};
use crate::error::{CliError, CliResult};
use crate::progress::Progress;
use admission::Admission;
use decoding::Decoding;
use reports::CopyBatches;
use totals::Measured;

/// What to simulate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SimSetup {
    /// Preset name (for the report).
    pub preset: String,
    /// The planned layout.
    pub kv: KvCacheConfig,
    /// Concurrent requests.
    pub requests: u32,
    /// Prompt tokens per request.
    pub context: u32,
    /// Decode tokens per request.
    pub decode_steps: u32,
    /// Workload seed.
    pub seed: u64,
    /// Target adjacent-step top-k overlap.
    pub overlap: f64,
    /// Tokens per step (prefill chunks + decode tokens).
    pub max_batched_tokens: u32,
    /// Tensor-parallel workers that report every copy batch (worker `w` completes a batch `w + 1`
    /// steps after it was issued).
    pub workers: u32,
    /// Prompt tokens every request shares (0 = none). With a shared prefix, prefix caching is on
    /// and requests are admitted one after another, each once the previous one's prefill is
    /// durable on host, so later requests find the prefix in the host prefix cache.
    pub shared_prefix: u32,
    /// Tensor-parallel ranks, each a worker process with its own runtime (1 = this process).
    pub tp: u32,
    /// With `tp > 1`: one host pool in shared memory for every rank (else one per rank).
    pub shared_host_pool: bool,
    /// Requests arrive with their prompt's KV imported into the host pool
    /// ([`Coordinator::reserve_import`]) instead of prefilling it.
    #[serde(default)]
    pub import: bool,
    /// The shared prefix lives on host only when the requests hitting it start: the first
    /// request prefills it and finishes, every transfer completes, the GPU copies of its pages
    /// are dropped ([`Coordinator::drop_cached_gpu_copies`]), then the others are admitted at
    /// once; their prefill chunks read the prefix staged back on the GPU.
    #[serde(default)]
    pub prefix_on_host: bool,
    /// Speculative tokens per decode step (0 = none): drafts computed with each sampled token,
    /// the rejected ones rolled back.
    pub spec_tokens: u32,
    /// Chance that a draft is accepted (the first rejected one rejects the rest).
    pub accept_rate: f64,
    /// Micro-batch calls per index group per decode step (0 or 1: one call over the batch).
    #[serde(default)]
    pub micro_batches: u32,
    /// Suppress the progress bar.
    pub quiet: bool,
}

impl SimSetup {
    /// Most token rows a step's decode reads: every request's sampled token and drafts.
    pub fn max_decode_rows(&self) -> u32 {
        self.requests.saturating_mul(1 + self.spec_tokens)
    }

    /// A rank's runtime settings: a state row per request, the decode rows per call, a slot
    /// mapping for the coordinator's token budget.
    pub fn runtime_config(&self) -> hisparse_runtime::RuntimeConfig {
        self.runtime_config_with(self.requests, self.max_decode_rows())
    }

    /// The prefill side's runtime settings (`--pd`): one request at a time, its prefill chunks
    /// as large as the coordinator's token budget.
    #[cfg(feature = "nixl")]
    pub fn prefill_runtime_config(&self) -> hisparse_runtime::RuntimeConfig {
        self.runtime_config_with(1, 1)
    }

    /// `state_rows` and `step_rows` as given, and a slot mapping that holds every token the
    /// coordinator may schedule in one step.
    fn runtime_config_with(
        &self,
        state_rows: u32,
        step_rows: u32,
    ) -> hisparse_runtime::RuntimeConfig {
        let mut cfg = hisparse_runtime::RuntimeConfig::new(state_rows, step_rows);
        cfg.max_batched_tokens = cfg.max_batched_tokens.max(self.max_batched_tokens);
        cfg
    }
}

/// The ranks that execute every command: this process's one ([`Local`]), or worker processes
/// ([`super::tp::Processes`]).
pub trait Ranks {
    /// The backend's name and the device's (of rank 0).
    fn names(&self) -> (String, String);
    /// How many ranks.
    fn count(&self) -> usize;
    /// Before the forward pass, on every rank (the writer of a shared host pool first, when
    /// the command has host copy-on-write).
    fn begin(&mut self, cmd: &OffloadCommand) -> CliResult<()>;
    /// The rest of the step on every rank; one result per rank, in rank order.
    fn finish(&mut self, cmd: &OffloadCommand, decode: &[DecodeRow]) -> CliResult<Vec<RankStep>>;
    /// Everything in flight, completed; one result per rank.
    fn drain(&mut self) -> CliResult<Vec<RankStep>>;
    /// A prefill node's writes: the KV rows of the first `rows` rows of request `uid` into
    /// `host_blocks` (one per page) of the host pool every rank reads.
    fn import(&mut self, uid: RequestId, host_blocks: &[u32], rows: u32) -> CliResult<()> {
        let _ = (uid, host_blocks, rows);
        Err(CliError::usage(
            "--import runs in one process: leave out --tp",
        ))
    }
}

/// This process's one rank.
pub struct Local<D: Device>(pub Rank<D>);

impl<D: Device> Ranks for Local<D> {
    fn names(&self) -> (String, String) {
        self.0.names()
    }
    fn count(&self) -> usize {
        1
    }
    fn begin(&mut self, cmd: &OffloadCommand) -> CliResult<()> {
        self.0.begin(cmd)
    }
    fn finish(&mut self, cmd: &OffloadCommand, decode: &[DecodeRow]) -> CliResult<Vec<RankStep>> {
        Ok(vec![self.0.finish(cmd, decode)?])
    }
    fn drain(&mut self) -> CliResult<Vec<RankStep>> {
        Ok(vec![self.0.drain()?])
    }
    fn import(&mut self, uid: RequestId, host_blocks: &[u32], rows: u32) -> CliResult<()> {
        self.0.import_rows(uid, host_blocks, rows)
    }
}

/// A coordinator error (its message already names the coordinator).
fn coord_err(e: impl std::fmt::Display) -> CliError {
    CliError::failed(e.to_string())
}

/// Runs the simulation on `dev`, in this process.
pub fn run<D: Device>(dev: D, s: &SimSetup) -> CliResult<SimReport> {
    run_on(&mut Local(Rank::new(dev, s)?), s)
}

/// Runs the simulation on `ranks`: the coordinator plans every step here, every rank executes it.
pub fn run_on(ranks: &mut dyn Ranks, s: &SimSetup) -> CliResult<SimReport> {
    let wall = Instant::now();
    let kv = &s.kv;
    let final_len = s.context + s.decode_steps;
    let nranks = ranks.count();
    // One worker per rank; in one process, `--workers` simulates W ranks' late reports.
    let workers = if nranks > 1 { nranks as u32 } else { s.workers };
    let mut coord = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: s.requests,
            max_batched_tokens: s.max_batched_tokens,
            max_spill_pages_per_step: 64,
            num_workers: workers,
            enable_prefix_caching: s.shared_prefix > 0,
            ..CoordinatorConfig::default()
        },
    )
    .map_err(coord_err)?;
    let mut admission = Admission::new(s);
    let mut progress = Progress::new(
        "simulate",
        u64::from(s.requests) * u64::from(final_len),
        s.quiet,
    );
    let mut report = initial_report(ranks, s, workers);
    let mut batches = CopyBatches::new(nranks, workers);
    let mut decoding = Decoding::new(s);
    let mut measured = Measured {
        rank_device_seconds: vec![0.0; nranks],
        verify_seconds: 0.0,
        overlap: (0.0, 0),
    };
    let mut idle_steps = 0u32;
    let mut finished_tokens = 0u64;
    let mut cmd = OffloadCommand::default();
    let mut last: Vec<RankStep> = Vec::new();
    let mut step_no = 0u64;
    while !coord.is_empty() || admission.pending() {
        step_no += 1;
        // 0. Admission.
        admission.admit(
            s,
            step_no,
            batches.last_issued(),
            &mut coord,
            ranks,
            &mut report,
        )?;
        // 1. Plan.
        let mut planning = plan_step(&mut coord, &mut cmd, &mut report, &mut idle_steps)?;
        let before = last.first().map(|r| r.counters).unwrap_or_default();
        // 2-4. Every rank: before the forward pass, the forward pass and the decode rows'
        //      reads, after the forward pass.
        let decode = decoding.rows(s, &cmd);
        ranks.begin(&cmd)?;
        let steps = ranks.finish(&cmd, &decode.rows)?;
        let decoded = !decode.rows.is_empty();
        if decoded && decode.fully_resident {
            report.fully_resident_steps += 1;
        }
        // 5. Reports.
        let t = Instant::now();
        batches.record(cmd.transfer_id, step_no, &steps);
        if decoded {
            for (r, st) in steps.iter().enumerate() {
                measured.rank_device_seconds[r] += st.device_seconds;
            }
        }
        batches.report(&mut coord, step_no)?;
        planning += t.elapsed().as_secs_f64();
        // 6. Sample or finish.
        let t = Instant::now();
        finished_tokens += decoding.sample_or_finish(s, &mut coord, &mut report)?;
        planning += t.elapsed().as_secs_f64();
        admission.after_step(s, step_no, &coord);
        let r0 = &steps[0];
        measured.overlap.0 += r0.overlap_sum;
        measured.overlap.1 += r0.overlap_n;
        measured.verify_seconds += steps.iter().map(|s| s.verify_seconds).sum::<f64>();
        if decoded {
            report
                .steps
                .push(step_stats(&steps, &before, decode, planning));
        }
        last = steps;
        // Progress: tokens of finished requests plus those computed by running ones (a preempted
        // request starts over, so this can go back).
        let running: u64 = coord
            .running_ids()
            .map(|id| u64::from(coord.num_computed(id).unwrap_or(0)))
            .sum();
        let (verified, mismatched) = last.iter().fold((0, 0), |(v, m), s| {
            (v + s.verified.rows, m + s.verified.mismatched)
        });
        progress.set(
            finished_tokens + running,
            &format!(
                "step {} · {verified} rows verified, {mismatched} mismatched",
                cmd.step
            ),
        );
    }
    progress.finish();
    // Drain: every worker completes what is left; every block must be back in its pool.
    let drained = ranks.drain()?;
    batches.drain(&mut coord, &drained)?;
    // Every request finished and every copy batch completed: the coordinator must be empty
    // again (blocks the prefix cache keeps are free).
    coord.check_drained().map_err(|v| {
        CliError::failed(format!(
            "simulation did not end empty after every request finished and every copy batch completed ({} GPU and {} host blocks held): {v}",
            coord.gpu_pool().num_held(),
            coord.host_pool().num_held()
        ))
    })?;
    totals::fill(&mut report, &drained, &coord, &measured);
    report.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(report)
}

/// A step that decoded, for the report: rank 0's counters since `before` (every rank reads
/// alike), the slowest rank's device time.
fn step_stats(
    steps: &[RankStep],
    before: &hisparse_runtime::Counters,
    decode: decoding::StepDecode,
    planning_seconds: f64,
) -> StepStats {
    let c = steps[0].counters;
    let (hits, misses) = (
        c.hot_hits - before.hot_hits,
        c.hot_misses - before.hot_misses,
    );
    let device = steps.iter().map(|s| s.device_seconds).fold(0.0, f64::max);
    StepStats {
        hit_rate: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
        h2d_bytes: c.h2d_bytes - before.h2d_bytes,
        hot_hits: hits,
        misses,
        fully_resident: decode.fully_resident,
        planning_us: planning_seconds * 1e6,
        device_us: device * 1e6,
        decode_steps: decode.decode_steps,
    }
}

/// Step 1: the coordinator's plan of the step into `cmd`, and what the report counts of it.
/// A request the coordinator refused fails the run: the workload is sized to fit the layout, so
/// such a request could never finish and the run would not mean what was asked. So does a run
/// that scheduled nothing for 1000 steps. Returns the seconds the coordinator planned.
fn plan_step(
    coord: &mut Coordinator,
    cmd: &mut OffloadCommand,
    report: &mut SimReport,
    idle_steps: &mut u32,
) -> CliResult<f64> {
    let t = Instant::now();
    let sum = coord.schedule_step().map_err(coord_err)?;
    coord.build_offload_command_into(cmd);
    let planning = t.elapsed().as_secs_f64();
    if let Some(r) = cmd.refused.first() {
        return Err(coord_err(CoordError::Refused {
            id: r.id,
            reason: r.reason,
        }));
    }
    report.waits += u64::from(sum.waiting_on_reclaim.min(1));
    report.preemptions += cmd.preempted.len() as u64;
    report.hot_regions_allocated +=
        cmd.hot_assign.len() as u64 / u64::from(coord.layout().num_buckets.max(1));
    *idle_steps = if cmd.scheduled.is_empty() {
        *idle_steps + 1
    } else {
        0
    };
    if *idle_steps > 1000 {
        return Err(CliError::failed(
            "simulation stalled: 1000 steps scheduled nothing; give it more --gpu-mem",
        ));
    }
    for sr in &cmd.scheduled {
        if cmd.started.contains(&sr.slot) {
            report.prefix_hit_tokens += u64::from(sr.first_token);
        }
    }
    Ok(planning)
}

/// The report's description of the run, before any step.
fn initial_report(ranks: &dyn Ranks, s: &SimSetup, workers: u32) -> SimReport {
    let kv = &s.kv;
    let nranks = ranks.count();
    let (backend, device) = ranks.names();
    let final_len = s.context + s.decode_steps;
    SimReport {
        backend,
        device,
        preset: s.preset.clone(),
        sparse_layers: kv.groups[KvCacheConfig::SOURCE_GROUP].layers.len() as u32,
        index_groups: kv.index_groups.len() as u32,
        requests: s.requests,
        context: s.context,
        decode_steps: s.decode_steps,
        seed: s.seed,
        workers,
        tp: nranks as u32,
        shared_host_pool: nranks > 1 && s.shared_host_pool,
        overlap_target: s.overlap,
        gpu_pool_bytes: kv.gpu_pool_bytes(),
        host_pool_bytes: kv.host_pool_bytes(),
        indexer_host_cache_bytes: kv.indexer_host_pool_bytes(),
        // The ranks' pools (one when shared: the layout is planned for it) and caches.
        host_memory_bytes: NodeHostMemory::of(kv, nranks as u32).per_node,
        device_buffer_size: kv.device_buffer_size,
        spec_tokens: s.spec_tokens,
        micro_batches: s.micro_batches.max(1),
        all_resident_gpu_bytes: (1 + u64::from(s.requests)
            * kv.gpu_blocks_per_request(final_len).all_on_gpu)
            * kv.bytes_per_block,
        ..SimReport::default()
    }
}
