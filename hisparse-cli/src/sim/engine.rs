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
//! Device time per step is the time of steps 2–4 up to a synchronisation of both streams; the
//! forward pass's writes, the top-k uploads and verification are not counted.

use std::time::Instant;

use hisparse_core::Device;
use hisparse_core::coordinator::{
    CoordError, Coordinator, CoordinatorConfig, OffloadCommand, RequestId,
};
use hisparse_core::layout::KvCacheConfig;
use serde::{Deserialize, Serialize};

use super::rank::{DecodeRow, Rank, RankStep};
use super::report::{RankReport, SimReport, StepStats};
use crate::error::{CliError, CliResult};
use crate::progress::Progress;

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
        let mut cfg = hisparse_runtime::RuntimeConfig::new(self.requests, self.max_decode_rows());
        cfg.max_batched_tokens = cfg.max_batched_tokens.max(self.max_batched_tokens);
        cfg
    }
}

/// The drafts a request's last sampled token came with: the first draft's position, how many,
/// and how many of them the (simulated) verifier accepts.
#[derive(Clone, Copy, Debug)]
struct Drafts {
    first: u32,
    count: u32,
    accepted: u32,
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
    let ratio = kv.sparse_compress_ratio.max(1);
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
    let groups = kv.index_groups.len();
    let uids: Vec<RequestId> = (1..=u64::from(s.requests)).collect();
    let prompt = |uid: RequestId| -> Vec<u32> {
        (0..s.context)
            .map(|p| {
                if p < s.shared_prefix {
                    0x5EED_0000 + p
                } else {
                    (uid as u32).wrapping_mul(1_000_003).wrapping_add(p)
                }
            })
            .collect()
    };
    // Without a shared prefix every request is admitted at once; with one, one after another.
    let mut next_admit = 0usize;
    let mut admit_at_step: Option<u64> = Some(0);
    let staggered = s.shared_prefix > 0;
    // With the prefix on host: after the first request, the others arrive together.
    let mut all_at_once = false;
    let mut progress = Progress::new(
        "simulate",
        u64::from(s.requests) * u64::from(final_len),
        s.quiet,
    );
    let (backend, device) = ranks.names();
    let host_pools = if nranks > 1 && !s.shared_host_pool {
        nranks as u64
    } else {
        1
    };
    let mut report = SimReport {
        backend,
        device,
        preset: s.preset.clone(),
        sparse_layers: kv.groups[KvCacheConfig::SOURCE_GROUP].layers.len() as u32,
        index_groups: groups as u32,
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
        host_memory_bytes: kv.host_pool_bytes() * host_pools,
        device_buffer_size: kv.device_buffer_size,
        spec_tokens: s.spec_tokens,
        all_resident_gpu_bytes: (1 + u64::from(s.requests)
            * kv.gpu_blocks_per_request(final_len).all_on_gpu)
            * kv.bytes_per_block,
        ..SimReport::default()
    };
    // Copy batches issued (id, step); per rank, how many of them it saw complete (a FIFO
    // prefix); per worker, how many it has reported complete. Worker `w` reports a batch once its
    // rank saw it complete and `delay(w)` steps after it was issued.
    let rank_of = |w: usize| if nranks > 1 { w } else { 0 };
    let delay = |w: usize| if nranks > 1 { 1 } else { w as u64 + 1 };
    let mut issued: Vec<(u64, u64)> = Vec::new();
    let mut really_done = vec![0usize; nranks];
    let mut completed = vec![0usize; workers as usize];
    let mut enqueued: Vec<Vec<u64>> = vec![Vec::new(); nranks];
    let (mut overlap_sum, mut overlap_n) = (0.0, 0u64);
    let mut idle_steps = 0u32;
    let mut finished_tokens = 0u64;
    let mut cmd = OffloadCommand::default();
    let mut last: Vec<RankStep> = Vec::new();
    let mut rank_device_seconds = vec![0.0f64; nranks];
    let mut verify_seconds = 0.0;

    // Speculative decoding: the drafts in flight per request, and what became of them.
    let mut drafts: std::collections::HashMap<RequestId, Drafts> = Default::default();
    let mut accept_rng = super::workload::Rng::new(s.seed, 0x5BEC_D0DE);
    let mut step_no = 0u64;
    while !coord.is_empty() || next_admit < uids.len() {
        step_no += 1;
        // 0. Admission.
        if coord.is_empty() && admit_at_step.is_none() {
            if s.prefix_on_host && next_admit == 1 {
                // The first request finished: once every copy batch is durable (its pages
                // published on host), its pages' GPU copies go, and the rest arrive at once.
                let last = issued.last().map_or(0, |&(id, _)| id);
                if coord.durable_transfer() >= last {
                    report.gpu_copies_dropped +=
                        u64::from(coord.drop_cached_gpu_copies(&prompt(uids[0])));
                    admit_at_step = Some(step_no);
                    all_at_once = true;
                }
            } else {
                admit_at_step = Some(step_no);
            }
        }
        while next_admit < uids.len() && admit_at_step.is_some_and(|a| a <= step_no) {
            let uid = uids[next_admit];
            if s.import {
                // The prefill node computed the prompt and sampled the first token: its KV
                // is written into the host blocks the coordinator names, then the request
                // queues with those pages durable.
                let mut tokens = prompt(uid);
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
                coord.admit(uid, &prompt(uid)).map_err(coord_err)?;
            }
            next_admit += 1;
            if staggered && !all_at_once {
                admit_at_step = None;
            }
        }
        // 1. Plan.
        let t = Instant::now();
        let sum = coord.schedule_step().map_err(coord_err)?;
        coord.build_offload_command_into(&mut cmd);
        let mut planning = t.elapsed().as_secs_f64();
        // The workload is sized to fit the layout: a request the coordinator refused could
        // never finish, and the run would not mean what was asked.
        if let Some(r) = cmd.refused.first() {
            return Err(coord_err(CoordError::Refused {
                id: r.id,
                reason: r.reason,
            }));
        }
        report.waits += u64::from(sum.waiting_on_reclaim.min(1));
        report.preemptions += cmd.preempted.len() as u64;
        report.hot_regions_allocated +=
            cmd.hot_assign.len() as u64 / u64::from(kv.num_buckets.max(1));
        if cmd.scheduled.is_empty() {
            idle_steps += 1;
            if idle_steps > 1000 {
                return Err(CliError::failed(
                    "simulation stalled: 1000 steps scheduled nothing; give it more --gpu-mem",
                ));
            }
        } else {
            idle_steps = 0;
        }
        for sr in &cmd.scheduled {
            if cmd.started.contains(&sr.slot) {
                report.prefix_hit_tokens += u64::from(sr.first_token);
            }
        }
        let before = last.first().map(|r| r.counters).unwrap_or_default();
        // 2-4. Every rank: before the forward pass, the forward pass and the decode rows'
        //      reads, after the forward pass.
        // Decode rows: one per token computed after the prompt (the sampled token and its
        // drafts, each reading the rows that exist up to it). A longer chunk past the prompt
        // (a preempted request recomputing its decoded tokens) is prefill and reads nothing.
        let decoding = |sr: &&hisparse_core::coordinator::ScheduledRequest| {
            sr.first_token >= s.context && sr.num_tokens <= 1 + s.spec_tokens
        };
        let decode: Vec<DecodeRow> = cmd
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
        let decode_fully_resident = cmd
            .scheduled
            .iter()
            .filter(decoding)
            .all(|sr| sr.fully_resident);
        ranks.begin(&cmd)?;
        let steps = ranks.finish(&cmd, &decode)?;
        if !decode.is_empty() && decode_fully_resident {
            report.fully_resident_steps += 1;
        }
        // 5. Reports: worker `w` reports what its rank enqueued, and a batch complete once its
        //    rank saw it complete and `delay(w)` steps after it was issued.
        let t = Instant::now();
        if let Some(id) = cmd.transfer_id {
            issued.push((id, step_no));
        }
        for (r, st) in steps.iter().enumerate() {
            really_done[r] += st.report.completed.len();
            enqueued[r].clone_from(&st.report.enqueued);
            if !decode.is_empty() {
                rank_device_seconds[r] += st.device_seconds;
            }
        }
        for (w, done) in completed.iter_mut().enumerate() {
            let r = rank_of(w);
            let upto = issued[..really_done[r]]
                .iter()
                .take_while(|&&(_, at)| at + delay(w) <= step_no)
                .count();
            let comp: Vec<u64> = issued[*done..upto.max(*done)]
                .iter()
                .map(|&(id, _)| id)
                .collect();
            coord
                .report(w as u32, &enqueued[r], &comp)
                .map_err(coord_err)?;
            *done = upto.max(*done);
        }
        planning += t.elapsed().as_secs_f64();
        // 6. Sample or finish.
        let t = Instant::now();
        let running: Vec<RequestId> = coord.running_ids().collect();
        for id in running {
            let (n, c) = (
                coord.num_tokens(id).unwrap_or(0),
                coord.num_computed(id).unwrap_or(0),
            );
            if n == c {
                // The verifier's verdict on the drafts: the rejected ones go back.
                let mut n = n;
                if let Some(d) = drafts.remove(&id) {
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
                    finished_tokens += u64::from(final_len);
                } else {
                    // The sampled token, then drafts that fit the request; each is accepted
                    // with the accept rate until the first rejection. Accepted drafts are the
                    // tokens decoding would have produced; rejected ones differ.
                    let count = s.spec_tokens.min(final_len - n - 1);
                    let mut accepted = 0;
                    while accepted < count && accept_rng.unit() < s.accept_rate {
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
                        drafts.insert(
                            id,
                            Drafts {
                                first: n + 1,
                                count,
                                accepted,
                            },
                        );
                    }
                }
            }
        }
        planning += t.elapsed().as_secs_f64();
        if staggered && !s.prefix_on_host && admit_at_step.is_none() && next_admit < uids.len() {
            let last = uids[next_admit - 1];
            let prefilled = coord.num_computed(last).is_none_or(|c| c >= s.context);
            if prefilled {
                // Two more steps: the prefill's last copy batch is reported complete.
                admit_at_step = Some(step_no + 2);
            }
        }
        let r0 = &steps[0];
        overlap_sum += r0.overlap_sum;
        overlap_n += r0.overlap_n;
        verify_seconds += steps.iter().map(|s| s.verify_seconds).sum::<f64>();
        if !decode.is_empty() {
            let c = r0.counters;
            let (hits, misses) = (
                c.hot_hits - before.hot_hits,
                c.hot_misses - before.hot_misses,
            );
            let device = steps.iter().map(|s| s.device_seconds).fold(0.0, f64::max);
            report.steps.push(StepStats {
                hit_rate: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
                h2d_bytes: c.h2d_bytes - before.h2d_bytes,
                hot_hits: hits,
                misses,
                fully_resident: decode_fully_resident,
                planning_us: planning * 1e6,
                device_us: device * 1e6,
            });
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
    for (r, st) in drained.iter().enumerate() {
        really_done[r] += st.report.completed.len();
        enqueued[r].clone_from(&st.report.enqueued);
        if really_done[r] != issued.len() {
            return Err(CliError::failed(format!(
                "rank {r}: {} of {} copy batches never completed",
                issued.len() - really_done[r],
                issued.len()
            )));
        }
    }
    for (w, &done) in completed.iter().enumerate() {
        let comp: Vec<u64> = issued[done..].iter().map(|&(id, _)| id).collect();
        coord
            .report(w as u32, &enqueued[rank_of(w)], &comp)
            .map_err(coord_err)?;
    }
    // Every request finished and every copy batch completed: the coordinator must be empty
    // again (blocks the prefix cache keeps are free).
    coord.check_drained().map_err(|v| {
        CliError::failed(format!(
            "simulation did not end empty after every request finished and every copy batch completed ({} GPU and {} host blocks held): {v}",
            coord.gpu_pool().num_held(),
            coord.host_pool().num_held()
        ))
    })?;

    let decode = report.steps.len().max(1) as f64;
    let c = drained[0].counters;
    report.hot_hits = c.hot_hits;
    report.misses = c.hot_misses;
    report.resident_reads = c.resident_reads;
    report.hit_rate = c.hit_rate().unwrap_or(0.0);
    report.h2d_bytes = report.steps.iter().map(|s| s.h2d_bytes).sum();
    report.h2d_bytes_per_step = report.h2d_bytes as f64 / decode;
    report.d2h_bytes = drained.iter().map(|s| s.counters.d2h_bytes).sum();
    report.resolve_calls = c.resolve_calls;
    report.remap_calls = c.remap_calls;
    report.reclaimed_pages = c.reclaimed_pages;
    report.spilled_pages = c.spilled_pages;
    report.mirror_spans = c.mirror_spans;
    report.host_cow_pages = c.host_cow_pages;
    report.restored_pages = c.restored_pages;
    report.gpu_cow_blocks = c.gpu_cow_blocks;
    report.planning_us_per_step = report.steps.iter().map(|s| s.planning_us).sum::<f64>() / decode;
    report.device_us_per_step = report.steps.iter().map(|s| s.device_us).sum::<f64>() / decode;
    report.verify_us_per_step = verify_seconds * 1e6 / decode;
    report.pages_staged = coord.pages_staged();
    report.prefill_rows_checked = drained.iter().map(|s| s.prefill_rows).sum();
    report.prefill_mismatched_rows = drained.iter().map(|s| s.prefill_mismatched).sum();
    report.verified_rows = drained.iter().map(|s| s.verified.rows).sum();
    report.mismatched_rows = drained.iter().map(|s| s.verified.mismatched).sum();
    report.indexer_rows_backed_up = drained
        .iter()
        .map(|s| s.counters.indexer_rows_backed_up)
        .sum();
    report.indexer_pages_restored = c.indexer_pages_restored;
    report.indexer_d2h_bytes = drained.iter().map(|s| s.counters.indexer_d2h_bytes).sum();
    report.indexer_h2d_bytes = drained.iter().map(|s| s.counters.indexer_h2d_bytes).sum();
    report.indexer_rows_verified = drained.iter().map(|s| s.indexer.rows).sum();
    report.indexer_mismatched_rows = drained.iter().map(|s| s.indexer.mismatched).sum();
    report.first_mismatch = drained.iter().enumerate().find_map(|(r, s)| {
        let first = s.verified.first_mismatch.as_ref();
        first.or(s.indexer.first_mismatch.as_ref()).map(|m| {
            if nranks > 1 {
                format!("rank {r}: {m}")
            } else {
                m.clone()
            }
        })
    });
    if nranks > 1 {
        report.ranks = drained
            .iter()
            .zip(&rank_device_seconds)
            .map(|(s, &dev)| RankReport {
                verified_rows: s.verified.rows,
                mismatched_rows: s.verified.mismatched,
                device_us_per_step: dev * 1e6 / decode,
                d2h_bytes: s.counters.d2h_bytes,
            })
            .collect();
    }
    report.overlap_measured = if overlap_n == 0 {
        0.0
    } else {
        overlap_sum / overlap_n as f64
    };
    report.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(report)
}
