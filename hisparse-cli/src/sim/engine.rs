//! The simulation loop: the real [`Coordinator`] plans every step, the [`DataPlane`] executes
//! each [`OffloadCommand`] on a [`Device`] in the documented order, synthetic KV rows are written
//! as the forward pass would write them, and every decode step's attention reads are verified.
//!
//! Per step:
//! 0. requests are admitted: all at once, or, with a shared prompt prefix, one after another so
//!    later requests find the earlier ones' durable pages in the host prefix cache;
//! 1. `Coordinator::step` schedules prefill chunks and decode tokens and returns the command;
//! 2. hot regions given out or released reset their hot state; hot entries caching rows of newly
//!    assigned host blocks are invalidated; host copy-on-write, restores and GPU copy-on-write run;
//! 3. the forward pass: each scheduled request's new rows are written into its resident pages
//!    (every sparse layer); decode tokens then read their top-k through remap (fully-resident
//!    path) or resolve + leader/follower gathers;
//! 4. the after-forward copies (row mirrors, page spills) run as the step's transfer batch;
//! 5. every worker reports the batch enqueued now; worker `w` reports it completed `w + 1` steps
//!    later (as real copy streams would, out of step across tensor-parallel ranks), so pages go
//!    through `pending` before `clean` and reclaim must sometimes wait;
//! 6. the reads are verified against the synthetic rows; decoded requests get their next token
//!    or finish.

use std::collections::HashMap;
use std::time::Instant;

use hisparse_core::Device;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand, RequestId};
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::{BlockPair, Direction, RowSpan};

use super::dataplane::{DataPlane, RequestView};
use super::report::{SimReport, StepStats};
use super::workload::{Pattern, TopKStream, overlap};
use crate::error::{CliError, CliResult};
use crate::progress::Progress;

/// What to simulate.
#[derive(Clone, Debug)]
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
    /// Suppress the progress bar.
    pub quiet: bool,
}

fn coord_err(e: impl std::fmt::Display) -> CliError {
    CliError::failed(format!("coordinator: {e}"))
}

/// Runs the simulation on `dev`.
pub fn run<D: Device>(dev: &D, s: &SimSetup) -> CliResult<SimReport> {
    let wall = Instant::now();
    let kv = &s.kv;
    let ratio = kv.sparse_compress_ratio.max(1);
    let final_len = s.context + s.decode_steps;
    let mut coord = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: s.requests,
            max_batched_tokens: s.max_batched_tokens,
            max_spill_pages_per_step: 64,
            num_workers: s.workers,
            enable_prefix_caching: s.shared_prefix > 0,
            ..CoordinatorConfig::default()
        },
    )
    .map_err(coord_err)?;
    let mut dp = DataPlane::new(dev, kv, s.requests)?;
    dp.set_shared_prefix_rows(s.shared_prefix.min(s.context) / ratio);
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
    let pattern = Pattern::for_top_k(kv.config.top_k, s.overlap);
    let groups = kv.index_groups.len();
    let mut streams: HashMap<(RequestId, usize), (TopKStream, Vec<i32>)> = HashMap::new();
    let mut progress = Progress::new(
        "simulate",
        u64::from(s.requests) * u64::from(final_len),
        s.quiet,
    );
    let mut report = SimReport {
        backend: dev.backend().to_string(),
        device: dev.device_name().to_string(),
        preset: s.preset.clone(),
        sparse_layers: kv.groups[KvCacheConfig::SOURCE_GROUP].layers.len() as u32,
        index_groups: groups as u32,
        requests: s.requests,
        context: s.context,
        decode_steps: s.decode_steps,
        seed: s.seed,
        workers: s.workers,
        overlap_target: s.overlap,
        gpu_pool_bytes: kv.gpu_pool_bytes(),
        host_pool_bytes: kv.host_pool_bytes(),
        device_buffer_size: kv.device_buffer_size,
        all_resident_gpu_bytes: (1 + u64::from(s.requests)
            * kv.gpu_blocks_per_request(final_len).all_on_gpu)
            * kv.bytes_per_block,
        ..SimReport::default()
    };
    let mp = coord.max_pages() as usize;
    let nb = kv.num_buckets;
    let mut row = vec![0i32; mp];
    let mut hot_row = vec![0i32; kv.hot_blocks_per_request as usize];
    // Copy batches issued (id, step) and, per worker, how many of them it has completed.
    let mut issued: Vec<(u64, u64)> = Vec::new();
    let mut completed = vec![0usize; s.workers as usize];
    let mut overlap_sum = 0.0;
    let mut overlap_n = 0u64;
    let mut idle_steps = 0u32;
    let mut finished_tokens = 0u64;
    let mut cmd = OffloadCommand::default();

    let mut step_no = 0u64;
    while !coord.is_empty() || next_admit < uids.len() {
        step_no += 1;
        // 0. Admission.
        if coord.is_empty() && admit_at_step.is_none() {
            admit_at_step = Some(step_no);
        }
        while next_admit < uids.len() && admit_at_step.is_some_and(|a| a <= step_no) {
            coord
                .admit(uids[next_admit], &prompt(uids[next_admit]))
                .map_err(coord_err)?;
            next_admit += 1;
            if staggered {
                admit_at_step = None;
            }
        }
        // 1. Plan.
        let t = Instant::now();
        let sum = coord.schedule_step().map_err(coord_err)?;
        coord.build_offload_command_into(&mut cmd);
        let mut planning = t.elapsed().as_secs_f64();
        report.waits += u64::from(sum.waiting_on_reclaim.min(1));
        report.preemptions += cmd.preempted.len() as u64;
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
        let dev0 = dp.counters.device_seconds;
        let (hits0, miss0, h2d0) = (
            dp.counters.hot_hits,
            dp.counters.misses,
            dp.counters.h2d_bytes,
        );

        // 2. Tables, hot state, invalidation, copy-on-write, restores.
        for a in &cmd.hot_assign {
            dp.forget_hot_state(a.slot);
        }
        for &slot in cmd.hot_release.iter().chain(&cmd.started) {
            dp.forget_hot_state(slot);
        }
        report.reclaimed_pages +=
            cmd.residency.iter().filter(|u| u.block == 0).count() as u64 / u64::from(nb.max(1));
        report.host_cow_pages += cmd.host_cow.len() as u64;
        report.restored_pages += cmd.restores.len() as u64;
        report.gpu_cow_blocks += cmd.gpu_cow.len() as u64;
        for sr in &cmd.scheduled {
            if cmd.started.contains(&sr.slot) {
                report.prefix_hit_tokens += u64::from(sr.first_token);
            }
        }
        dp.invalidate_host_blocks(&cmd.new_host_blocks)?;
        dp.copy_host_pages(&cmd.host_cow)?;
        for b in 0..nb {
            let pairs: Vec<BlockPair> = cmd
                .restores
                .iter()
                .filter(|r| r.bucket == b)
                .map(|r| BlockPair {
                    src: r.host_block,
                    dst: r.device_block,
                })
                .collect();
            dp.copy_pages(b, Direction::HostToDevice, &pairs)?;
        }
        dp.copy_gpu_blocks(&cmd.gpu_cow)?;

        // 3. Forward: write the new rows, then the decode tokens read their top-k.
        let mut views = Vec::new();
        let mut decode_fully_resident = true;
        for sr in &cmd.scheduled {
            let mut resident = Vec::with_capacity(nb as usize);
            let mut hot = Vec::with_capacity(nb as usize);
            for b in 0..nb {
                coord.resident_row(sr.id, b, &mut row).map_err(coord_err)?;
                resident.push(row.clone());
                coord.hot_row(sr.id, b, &mut hot_row).map_err(coord_err)?;
                hot.push(if hot_row.iter().all(|&x| x < 0) {
                    Vec::new()
                } else {
                    hot_row.clone()
                });
            }
            coord.host_row(sr.id, &mut row).map_err(coord_err)?;
            let end = sr.first_token + sr.num_tokens;
            let rows = sr.first_token / ratio..end / ratio;
            dp.write_rows(sr.id, rows, |b, p| {
                resident
                    .get(b as usize)
                    .and_then(|r| r.get(p as usize).copied())
            })?;
            let decode = sr.first_token >= s.context && sr.num_tokens == 1;
            if decode {
                decode_fully_resident &= sr.fully_resident;
                views.push(RequestView {
                    slot: sr.slot,
                    uid: sr.id,
                    seq_len: end / ratio,
                    host_blocks: row.clone(),
                    resident,
                    hot,
                });
            }
        }
        if !views.is_empty() {
            // Workload generation is neither planning nor device time.
            let mut topk: Vec<Vec<i32>> = vec![Vec::new(); groups];
            for v in &views {
                for (g, out) in topk.iter_mut().enumerate() {
                    let (stream, prev) = streams.entry((v.uid, g)).or_insert_with(|| {
                        (
                            TopKStream::new(pattern, s.seed, v.uid * 1_000 + g as u64),
                            Vec::new(),
                        )
                    });
                    let sel = stream.step(v.seq_len);
                    if !prev.is_empty() {
                        overlap_sum += overlap(prev, sel);
                        overlap_n += 1;
                    }
                    prev.clear();
                    prev.extend_from_slice(sel);
                    out.extend_from_slice(sel);
                }
            }
            dp.attend(&views, &topk, decode_fully_resident)?;
            if decode_fully_resident {
                report.fully_resident_steps += 1;
            }
        }

        // 4. After-forward copies.
        for b in 0..nb {
            let spans: Vec<RowSpan> = cmd
                .row_mirrors
                .iter()
                .filter(|m| m.bucket == b)
                .map(|m| m.span)
                .collect();
            report.mirror_spans += spans.len() as u64;
            dp.mirror_rows(b, &spans)?;
            let pairs: Vec<BlockPair> = cmd
                .page_transfers
                .iter()
                .filter(|p| p.bucket == b)
                .map(|p| BlockPair {
                    src: p.device_block,
                    dst: p.host_block,
                })
                .collect();
            report.spilled_pages += pairs.len() as u64;
            dp.copy_pages(b, Direction::DeviceToHost, &pairs)?;
        }
        dp.synchronize()?;

        // 5. Reports: every worker enqueues this step's batch now; worker `w` reports a batch
        //    complete `w + 1` steps after it was issued (the copies themselves are done: the
        //    stream was synchronised), so completions arrive late and out of step across workers.
        let t = Instant::now();
        if let Some(id) = cmd.transfer_id {
            issued.push((id, step_no));
        }
        for (w, done) in completed.iter_mut().enumerate() {
            let enq: Vec<u64> = cmd.transfer_id.into_iter().collect();
            let upto = issued
                .iter()
                .take_while(|&&(_, at)| at + 1 + w as u64 <= step_no)
                .count();
            let comp: Vec<u64> = issued[*done..upto.max(*done)]
                .iter()
                .map(|&(id, _)| id)
                .collect();
            coord.report(w as u32, &enq, &comp).map_err(coord_err)?;
            *done = upto.max(*done);
        }
        planning += t.elapsed().as_secs_f64();

        // 6. Verify, then sample or finish.
        dp.verify()?;
        let t = Instant::now();
        let running: Vec<RequestId> = coord.running_ids().collect();
        for id in running {
            let (n, c) = (
                coord.num_tokens(id).unwrap_or(0),
                coord.num_computed(id).unwrap_or(0),
            );
            if n == c {
                if n >= final_len {
                    coord.finish(id).map_err(coord_err)?;
                    finished_tokens += u64::from(final_len);
                } else {
                    coord.append_tokens(id, &[n]).map_err(coord_err)?;
                }
            }
        }
        planning += t.elapsed().as_secs_f64();
        if staggered && admit_at_step.is_none() && next_admit < uids.len() {
            let last = uids[next_admit - 1];
            let prefilled = coord.num_computed(last).is_none_or(|c| c >= s.context);
            if prefilled {
                // Two more steps: the prefill's last copy batch is reported complete.
                admit_at_step = Some(step_no + 2);
            }
        }
        if !views.is_empty() {
            let c = &dp.counters;
            let (hits, misses) = (c.hot_hits - hits0, c.misses - miss0);
            report.steps.push(StepStats {
                hit_rate: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
                h2d_bytes: c.h2d_bytes - h2d0,
                hot_hits: hits,
                misses,
                fully_resident: decode_fully_resident,
                planning_us: planning * 1e6,
                device_us: (c.device_seconds - dev0) * 1e6,
            });
        }
        // Progress: tokens of finished requests plus those computed by running ones (a preempted
        // request starts over, so this can go back).
        let running: u64 = coord
            .running_ids()
            .map(|id| u64::from(coord.num_computed(id).unwrap_or(0)))
            .sum();
        progress.set(
            finished_tokens + running,
            &format!(
                "step {} · {} rows verified, {} mismatched",
                cmd.step, dp.counters.verified_rows, dp.counters.mismatched_rows
            ),
        );
    }
    progress.finish();
    // Drain: every worker completes what is left; every block must be back in its pool.
    for (w, &done) in completed.iter().enumerate() {
        let comp: Vec<u64> = issued[done..].iter().map(|&(id, _)| id).collect();
        coord.report(w as u32, &[], &comp).map_err(coord_err)?;
    }
    coord
        .check_invariants()
        .map_err(|v| CliError::failed(format!("coordinator invariant violated: {v}")))?;
    if coord.gpu_pool().num_held() != 0 || coord.host_pool().num_held() != 0 {
        return Err(CliError::failed(format!(
            "simulation leaked blocks: {} GPU and {} host blocks still held after every request finished",
            coord.gpu_pool().num_held(),
            coord.host_pool().num_held()
        )));
    }

    let c = &dp.counters;
    let decode = report.steps.len().max(1) as f64;
    report.hot_hits = c.hot_hits;
    report.misses = c.misses;
    report.resident_reads = c.resident_reads;
    report.hit_rate = if c.hot_hits + c.misses == 0 {
        0.0
    } else {
        c.hot_hits as f64 / (c.hot_hits + c.misses) as f64
    };
    report.h2d_bytes = report.steps.iter().map(|s| s.h2d_bytes).sum();
    report.h2d_bytes_per_step = report.h2d_bytes as f64 / decode;
    report.d2h_bytes = c.d2h_bytes;
    report.resolve_calls = c.resolve_calls;
    report.remap_calls = c.remap_calls;
    report.planning_us_per_step = report.steps.iter().map(|s| s.planning_us).sum::<f64>() / decode;
    report.device_us_per_step = report.steps.iter().map(|s| s.device_us).sum::<f64>() / decode;
    report.verified_rows = c.verified_rows;
    report.mismatched_rows = c.mismatched_rows;
    report.first_mismatch = c.first_mismatch.clone();
    report.overlap_measured = if overlap_n == 0 {
        0.0
    } else {
        overlap_sum / overlap_n as f64
    };
    report.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(report)
}
