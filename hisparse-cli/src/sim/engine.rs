//! The simulation loop: the real [`Coordinator`] plans every step, the
//! [`hisparse_runtime::Runtime`] executes each [`OffloadCommand`] on a [`Device`], the simulated
//! forward pass writes synthetic KV rows, and every decode step's attention reads are verified.
//!
//! Per step:
//! 0. requests are admitted: all at once, or, with a shared prompt prefix, one after another so
//!    later requests find the earlier ones' durable pages in the host prefix cache;
//! 1. `Coordinator::step` schedules prefill chunks and decode tokens and returns the command;
//! 2. [`Runtime::begin_step`]: tables, hot-state resets, invalidation, copy-on-write, restores;
//! 3. the forward pass writes each scheduled request's new rows into its resident pages (every
//!    sparse layer); decode tokens then read their top-k, one
//!    [`Runtime::resolve_index_group`] per index group;
//! 4. [`Runtime::end_step`]: the after-forward copies (row mirrors, page spills) as the step's
//!    transfer batch;
//! 5. [`Runtime::poll`] reports what completed; worker `w` reports a batch complete once it
//!    really is and `w + 1` steps after it was issued (as real copy streams would, out of step
//!    across tensor-parallel ranks), so pages go through `pending` before `clean` and reclaim must
//!    sometimes wait;
//! 6. the reads are verified against the synthetic rows (off the timed path); decoded requests
//!    get their next token or finish.
//!
//! Device time per step is the time of steps 2–4 up to a synchronisation of both streams; the
//! forward pass's writes, the top-k uploads and verification are not counted.

use std::collections::HashMap;
use std::time::Instant;

use hisparse_core::Device;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand, RequestId};
use hisparse_core::layout::KvCacheConfig;
use hisparse_runtime::{Indices, Runtime, RuntimeConfig, TopK};

use super::forward::Forward;
use super::report::{SimReport, StepStats};
use super::verify::{ReadOut, Verifier};
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

fn rt_err(e: impl std::fmt::Display) -> CliError {
    CliError::failed(format!("runtime: {e}"))
}

/// The engine's own per-index-group buffers: the indexer's top-k and attention's row indices.
struct GroupIo<D: Device> {
    topk: D::Buffer,
    rows: D::Buffer,
}

/// Runs the simulation on `dev`.
pub fn run<D: Device>(dev: D, s: &SimSetup) -> CliResult<SimReport> {
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
    let shared_rows = s.shared_prefix.min(s.context) / ratio;
    let mut forward = Forward::new(kv, shared_rows)?;
    let mut verifier = Verifier::new(kv, shared_rows)?;
    let backend = dev.backend().to_string();
    let device = dev.device_name().to_string();
    let mut rt = Runtime::new(dev, kv.clone(), RuntimeConfig::new(s.requests, s.requests))
        .map_err(|e| CliError::device("setting up the runtime", e))?;
    let groups = kv.index_groups.len();
    let (t_max, k) = (s.requests as usize, kv.config.top_k as usize);
    let mut io: Vec<GroupIo<D>> = Vec::with_capacity(groups);
    for _ in 0..groups {
        let a = || {
            rt.device()
                .alloc((t_max * k * 4).max(4))
                .map_err(|e| CliError::device("allocating top-k buffers", e))
        };
        io.push(GroupIo {
            topk: a()?,
            rows: a()?,
        });
    }
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
    let mut streams: HashMap<(RequestId, usize), (TopKStream, Vec<i32>)> = HashMap::new();
    let mut progress = Progress::new(
        "simulate",
        u64::from(s.requests) * u64::from(final_len),
        s.quiet,
    );
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
    let nb = kv.num_buckets;
    // Copy batches issued (id, step), how many of them the runtime saw complete (a FIFO
    // prefix), and per worker how many it has reported complete.
    let mut issued: Vec<(u64, u64)> = Vec::new();
    let mut really_done = 0usize;
    let mut completed = vec![0usize; s.workers as usize];
    let mut overlap_sum = 0.0;
    let mut overlap_n = 0u64;
    let mut idle_steps = 0u32;
    let mut finished_tokens = 0u64;
    let mut verify_seconds = 0.0;
    let mut cmd = OffloadCommand::default();
    let mut reads: Vec<ReadOut> = Vec::new();

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
        for sr in &cmd.scheduled {
            if cmd.started.contains(&sr.slot) {
                report.prefix_hit_tokens += u64::from(sr.first_token);
            }
        }
        let before = *rt.counters();

        // 2. Before the forward pass.
        let t = Instant::now();
        rt.begin_step(&cmd).map_err(rt_err)?;
        rt.device()
            .synchronize(rt.compute_stream())
            .map_err(|e| CliError::device("synchronising", e))?;
        let mut device_seconds = t.elapsed().as_secs_f64();

        // 3. Forward: write the new rows, then the decode tokens read their top-k.
        let mut batch: Vec<i32> = Vec::new();
        let mut rows: Vec<(u64, u32)> = Vec::new();
        let mut decode_fully_resident = true;
        for sr in &cmd.scheduled {
            let end = sr.first_token + sr.num_tokens;
            let positions = sr.first_token / ratio..end / ratio;
            let resident: Vec<Vec<i32>> = (0..nb)
                .map(|b| {
                    rt.resident_row(b, sr.slot)
                        .map(<[i32]>::to_vec)
                        .unwrap_or_default()
                })
                .collect();
            let (dev, pools) = rt.device_and_pools_mut();
            forward.write(dev, &mut pools.device, sr.id, positions, |b, p| {
                resident
                    .get(b as usize)
                    .and_then(|r| r.get(p as usize).copied())
            })?;
            if sr.first_token >= s.context && sr.num_tokens == 1 {
                decode_fully_resident &= sr.fully_resident;
                batch.push(sr.slot as i32);
                rows.push((sr.id, end / ratio));
            }
        }
        reads.clear();
        if !batch.is_empty() {
            // Workload generation and the top-k uploads are the model's, not device time.
            let mut topk: Vec<Vec<i32>> = vec![Vec::new(); groups];
            for &(uid, seq_len) in &rows {
                for (g, out) in topk.iter_mut().enumerate() {
                    let (stream, prev) = streams.entry((uid, g)).or_insert_with(|| {
                        (
                            TopKStream::new(pattern, s.seed, uid * 1_000 + g as u64),
                            Vec::new(),
                        )
                    });
                    let sel = stream.step(seq_len);
                    if !prev.is_empty() {
                        overlap_sum += overlap(prev, sel);
                        overlap_n += 1;
                    }
                    prev.clear();
                    prev.extend_from_slice(sel);
                    out.extend_from_slice(sel);
                }
            }
            for (g, sel) in topk.iter().enumerate() {
                rt.device()
                    .upload_i32(&mut io[g].topk, 0, sel)
                    .map_err(|e| CliError::device("uploading top-k", e))?;
            }
            let t = Instant::now();
            rt.set_batch(&batch).map_err(rt_err)?;
            for (g, gio) in io.iter_mut().enumerate() {
                let input = TopK {
                    positions: &gio.topk,
                    num_tokens: batch.len() as u32,
                    state_rows: None,
                };
                rt.resolve_index_group(
                    g,
                    &input,
                    Indices {
                        rows: &mut gio.rows,
                        counts: None,
                    },
                )
                .map_err(rt_err)?;
            }
            device_seconds += t.elapsed().as_secs_f64();
            for (g, sel) in topk.into_iter().enumerate() {
                reads.push(ReadOut {
                    group: g,
                    rows: rows.clone(),
                    topk: sel,
                    indices: Vec::new(),
                });
            }
            if decode_fully_resident {
                report.fully_resident_steps += 1;
            }
        }

        // 4. After the forward pass, then wait for the step's work (the simulation checks it).
        let t = Instant::now();
        rt.end_step(&cmd).map_err(rt_err)?;
        for stream in [rt.compute_stream(), rt.copy_stream()] {
            rt.device()
                .synchronize(stream)
                .map_err(|e| CliError::device("synchronising", e))?;
        }
        device_seconds += t.elapsed().as_secs_f64();

        // 5. Reports: every worker enqueues this step's batch now; worker `w` reports a batch
        //    complete once the runtime saw it complete and `w + 1` steps after it was issued.
        let t = Instant::now();
        let polled = rt.poll().map_err(rt_err)?;
        if let Some(id) = cmd.transfer_id {
            issued.push((id, step_no));
        }
        really_done += polled.completed.len();
        for (w, done) in completed.iter_mut().enumerate() {
            let upto = issued[..really_done]
                .iter()
                .take_while(|&&(_, at)| at + 1 + w as u64 <= step_no)
                .count();
            let comp: Vec<u64> = issued[*done..upto.max(*done)]
                .iter()
                .map(|&(id, _)| id)
                .collect();
            coord
                .report(w as u32, &polled.enqueued, &comp)
                .map_err(coord_err)?;
            *done = upto.max(*done);
        }
        planning += t.elapsed().as_secs_f64();

        // 6. Verify (the step's work has completed), then sample or finish.
        let t = Instant::now();
        for r in &mut reads {
            r.indices.resize(r.topk.len(), 0);
            rt.device()
                .download_i32(&io[r.group].rows, 0, &mut r.indices)
                .map_err(|e| CliError::device("downloading row indices", e))?;
        }
        verifier.check(rt.device(), &rt.pools().device, &reads)?;
        verify_seconds += t.elapsed().as_secs_f64();
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
        if !batch.is_empty() {
            let c = rt.counters();
            let (hits, misses) = (
                c.hot_hits - before.hot_hits,
                c.hot_misses - before.hot_misses,
            );
            report.steps.push(StepStats {
                hit_rate: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
                h2d_bytes: c.h2d_bytes - before.h2d_bytes,
                hot_hits: hits,
                misses,
                fully_resident: decode_fully_resident,
                planning_us: planning * 1e6,
                device_us: device_seconds * 1e6,
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
                cmd.step, verifier.verified.rows, verifier.verified.mismatched
            ),
        );
    }
    progress.finish();
    // Drain: every worker completes what is left; every block must be back in its pool.
    let last = rt.drain().map_err(rt_err)?;
    really_done += last.completed.len();
    if really_done != issued.len() {
        return Err(CliError::failed(format!(
            "runtime: {} of {} copy batches never completed",
            issued.len() - really_done,
            issued.len()
        )));
    }
    for (w, &done) in completed.iter().enumerate() {
        let comp: Vec<u64> = issued[done..].iter().map(|&(id, _)| id).collect();
        coord
            .report(w as u32, &last.enqueued, &comp)
            .map_err(coord_err)?;
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

    let c = *rt.counters();
    let decode = report.steps.len().max(1) as f64;
    report.hot_hits = c.hot_hits;
    report.misses = c.hot_misses;
    report.resident_reads = c.resident_reads;
    report.hit_rate = c.hit_rate().unwrap_or(0.0);
    report.h2d_bytes = report.steps.iter().map(|s| s.h2d_bytes).sum();
    report.h2d_bytes_per_step = report.h2d_bytes as f64 / decode;
    report.d2h_bytes = c.d2h_bytes;
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
    report.verified_rows = verifier.verified.rows;
    report.mismatched_rows = verifier.verified.mismatched;
    report.first_mismatch = verifier.verified.first_mismatch.clone();
    report.overlap_measured = if overlap_n == 0 {
        0.0
    } else {
        overlap_sum / overlap_n as f64
    };
    report.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(report)
}
