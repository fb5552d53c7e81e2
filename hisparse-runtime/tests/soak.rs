//! A soak of the engine loop on the CPU backend (its copy stream lagging): requests arrive at
//! random, most of them sharing prompt prefixes (prefix hits, copy-on-write tails), decode
//! with speculative drafts that the verifier partly rejects (rollbacks), are preempted now and
//! then and finish; one request grows past what a prefill can hold on the GPU and, preempted,
//! can never restart: the step refuses it and goes on for the others. Every step runs through
//! [`Coordinator::step`] and the [`Runtime`] (`begin_step`, the per-layer resolves, `end_step`,
//! `poll_and_report`); the forward pass writes rows deterministic from (layer, the token's
//! prefix) into the resident pages, and every row attention reads is checked byte for byte.
//!
//! At the end every request is finished, every transfer drained, and every pool back to empty:
//! no GPU or host block held, no hot region. Blocks the prefix cache keeps (pages of finished
//! requests a later prompt could hit) are free blocks that still carry their key: they count
//! as free, and the test says how many there are.
//!
//! CI-sized by default; `HISPARSE_SOAK_STEPS=<n>` (arrival steps per run) and
//! `HISPARSE_SOAK_SEEDS=<n>` (runs) make it longer.

mod lag;
mod rows;

use std::collections::HashMap;

use hisparse_core::Device;
use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{
    CoordError, Coordinator, CoordinatorConfig, RefusalReason, RequestId,
};
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_runtime::{Indices, Runtime, RuntimeConfig, TopK};
use lag::LagDevice;
use proptest::test_runner::TestCaseError;
use rows::{MODEL, Req, Rng, TOP_K, check_reads, fail, forward, i32s, set_i32s};

/// Requests running at once (state rows).
const ROWS: u32 = 4;
/// Longest request.
const MAX_LEN: u32 = 128;
/// Speculative tokens per decode step: the sampled token and up to two drafts.
const MAX_QUERY_LEN: u32 = 3;
/// GPU blocks: a `MAX_LEN` request decodes (HiSparse needs 76 blocks), but a prefill holds at
/// most 100 tokens of context (4 blocks a page).
const GPU_BLOCKS: u32 = 101;
/// The long request decodes to this many tokens, then is preempted: its restart's prefill
/// could never be held on the GPU.
const LONG_LEN: u32 = 112;
const LONG: RequestId = 1;

/// What a run saw (the test fails if one of them never happened).
#[derive(Debug, Default)]
struct Seen {
    rows_checked: u64,
    host_reads: u64,
    steps: u64,
    finished: u64,
    preempted: u64,
    rolled_back: u64,
    prefix_hits: u64,
    copy_on_write: u64,
    reclaimed: u64,
    refused: u64,
    refused_at_admission: u64,
    gpu_cached_at_end: u64,
    host_cached_at_end: u64,
}

fn layout() -> KvCacheConfig {
    let mut cfg = HiSparseConfig::new(TOP_K, 400 * 3 * 128);
    cfg.max_query_len = MAX_QUERY_LEN;
    let mut input = LayoutInput::new(&MODEL, &cfg, 0, MAX_LEN);
    input.num_gpu_blocks_override = Some(GPU_BLOCKS);
    plan_layout(&input).unwrap()
}

/// What the engine plans for a request beside its tokens.
struct Plan {
    /// Drafts appended with the last sampled token (rolled back or kept once computed).
    drafts: u32,
    /// Tokens at which it finishes.
    final_len: u32,
}

fn soak(seed: u64, eager: bool, arrival_steps: u32, seen: &mut Seen) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(seed);
    let mut kv = layout();
    kv.config.eager_host_mirror = eager;
    assert!(kv.prefill_fits(96) && !kv.prefill_fits(LONG_LEN));
    let mut c = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: ROWS,
            max_batched_tokens: 24,
            max_spill_pages_per_step: 2,
            num_workers: 1,
            enable_prefix_caching: true,
            reclaim_min_blocks: 4,
        },
    )
    .map_err(fail)?;
    let mut rt = Runtime::new(
        LagDevice::default(),
        kv.clone(),
        RuntimeConfig::new(ROWS, ROWS),
    )
    .map_err(fail)?;
    let k = TOP_K as usize;
    let alloc = |n: usize| rt.device().alloc(n * 4).unwrap();
    let rows_max = ROWS as usize;
    let (topk_buf, mut rows_buf, mut counts_buf) =
        (alloc(rows_max * k), alloc(rows_max * k), alloc(rows_max));
    // The engine's requests: their tokens (what the forward pass writes and reads) and plans.
    let mut reqs: HashMap<RequestId, Req> = HashMap::new();
    let mut plans: HashMap<RequestId, Plan> = HashMap::new();
    // A prompt no prefill can hold is refused at admission, with the reason.
    match c.admit(999, &(0..LONG_LEN).collect::<Vec<u32>>()) {
        Err(CoordError::PrefillNeverFits { .. }) => seen.refused_at_admission += 1,
        other => return Err(fail(format!("a {LONG_LEN}-token prompt: {other:?}"))),
    }
    let long: Vec<u32> = (0..16).map(|t| 9000 + t).collect();
    admit(&mut c, &mut reqs, &mut plans, LONG, long, MAX_LEN)?;
    let mut long_preempted = false;
    let mut next_id = LONG + 1;
    let mut step = 0u32;
    loop {
        let arriving = step < arrival_steps;
        if !arriving && reqs.is_empty() {
            break;
        }
        prop_guard(step < arrival_steps + 2000, || {
            format!(
                "{} requests still open after the arrivals stopped",
                reqs.len()
            )
        })?;
        step += 1;
        // Arrivals: prompts of three families (shared prefixes) or of their own.
        while arriving && reqs.len() < 7 && rng.below(4) == 0 {
            let len = 1 + rng.below(32) as u32;
            let family = rng.below(5) as u32;
            let prompt: Vec<u32> = (0..len).map(|i| family * 1000 + i).collect();
            let final_len = (len + 1 + rng.below(40) as u32).min(MAX_LEN);
            admit(&mut c, &mut reqs, &mut plans, next_id, prompt, final_len)?;
            next_id += 1;
        }
        // The long request, once past what a prefill can hold, is preempted: it can never
        // restart.
        if !long_preempted && c.num_computed(LONG).is_some_and(|n| n >= LONG_LEN) {
            c.preempt(LONG).map_err(fail)?;
            long_preempted = true;
        }
        // The engine's own preemptions, now and then.
        if rng.below(25) == 0 {
            let running: Vec<RequestId> = c.running_ids().filter(|&id| id != LONG).collect();
            if !running.is_empty() {
                let id = running[rng.below(running.len() as u64) as usize];
                c.preempt(id).map_err(fail)?;
                seen.preempted += 1;
            }
        }
        let cmd = c.step().map_err(fail)?;
        seen.steps += 1;
        seen.preempted += cmd.preempted.len() as u64;
        seen.copy_on_write += cmd.host_cow.len() as u64;
        seen.reclaimed += cmd.residency.iter().filter(|u| u.block == 0).count() as u64;
        for r in &cmd.refused {
            // Only the long request can be refused, and only for its prefill.
            prop_guard(r.id == LONG, || {
                format!("request {} refused: {:?}", r.id, r.reason)
            })?;
            prop_guard(
                matches!(r.reason, RefusalReason::PrefillNeverFits { .. }),
                || format!("refused for {:?}", r.reason),
            )?;
            prop_guard(c.refusal(LONG) == Some(r.reason), || {
                "refusal not kept".into()
            })?;
            c.finish(r.id).map_err(fail)?;
            reqs.remove(&r.id);
            plans.remove(&r.id);
            seen.refused += 1;
        }
        rt.begin_step(&cmd).map_err(fail)?;
        let misses_before = rt.counters().hot_misses;
        for s in &cmd.scheduled {
            if cmd.started.contains(&s.slot) && s.first_token > 0 {
                seen.prefix_hits += 1;
            }
            forward(
                &mut rt,
                &kv,
                s.slot,
                s.id,
                s.first_token..s.first_token + s.num_tokens,
                &reqs[&s.id],
            )?;
        }
        if !cmd.scheduled.is_empty() {
            // The last token of every scheduled request reads a top-k of its context (some
            // entries empty).
            let sched: Vec<(u32, RequestId)> =
                cmd.scheduled.iter().map(|s| (s.slot, s.id)).collect();
            let batch: Vec<i32> = sched.iter().map(|&(slot, _)| slot as i32).collect();
            rt.set_batch(&batch).map_err(fail)?;
            let t = sched.len();
            for g in 0..kv.index_groups.len() {
                let mut topk = vec![-1i32; t * k];
                for (i, s) in cmd.scheduled.iter().enumerate() {
                    let last = s.first_token + s.num_tokens;
                    for j in 0..k {
                        if rng.below(8) != 0 {
                            topk[i * k + j] = rng.below(u64::from(last)) as i32;
                        }
                    }
                }
                set_i32s(&topk_buf, &topk);
                let input = TopK {
                    positions: &topk_buf,
                    num_tokens: t as u32,
                    state_rows: None,
                };
                let out = Indices {
                    rows: &mut rows_buf,
                    counts: Some(&mut counts_buf),
                };
                let followers = &kv.index_groups[g].layers[1..];
                if !followers.is_empty() && rng.below(2) == 0 {
                    rt.resolve_leader(g, &input, out).map_err(fail)?;
                    for &f in followers {
                        rt.apply_plan(f).map_err(fail)?;
                    }
                } else {
                    rt.resolve_index_group(g, &input, out).map_err(fail)?;
                }
                let counts = i32s(&counts_buf, t);
                seen.rows_checked += check_reads(
                    &rt,
                    &kv,
                    g,
                    &sched,
                    &topk,
                    &i32s(&rows_buf, t * k),
                    Some(&counts),
                    &reqs,
                )?;
            }
        }
        rt.end_step(&cmd).map_err(fail)?;
        // The copy stream runs some of its queued copies now; the rest lag.
        let pending = rt.device().pending();
        rt.device()
            .run_pending(rng.below(pending as u64 + 1) as usize);
        rt.poll_and_report(&mut c).map_err(fail)?;
        seen.host_reads += rt.counters().hot_misses - misses_before;
        // The verifier and the sampler: rejected drafts go back; a request at its length
        // finishes; the others get a sampled token and up to two drafts.
        let ids: Vec<RequestId> = c.running_ids().collect();
        for id in ids {
            if c.num_computed(id) != c.num_tokens(id) {
                continue;
            }
            let (Some(req), Some(plan)) = (reqs.get_mut(&id), plans.get_mut(&id)) else {
                return Err(fail(format!("running request {id} unknown to the engine")));
            };
            if plan.drafts > 0 {
                let rejected = plan.drafts - rng.below(u64::from(plan.drafts) + 1) as u32;
                // Drafts a restart recomputed as prefill stay: only a step's own go back.
                if rejected > 0 && c.rollback(id, rejected).is_ok() {
                    req.rollback(rejected as usize);
                    seen.rolled_back += u64::from(rejected);
                }
                plan.drafts = 0;
            }
            let n = req.tokens.len() as u32;
            if n >= plan.final_len {
                c.finish(id).map_err(fail)?;
                reqs.remove(&id);
                plans.remove(&id);
                seen.finished += 1;
                continue;
            }
            let room = (plan.final_len - n - 1).min(MAX_QUERY_LEN - 1);
            let drafts = rng.below(u64::from(room) + 1) as u32;
            // A draft the verifier rejects differs from the token that replaces it.
            let mut new = vec![5000 + n % 7];
            new.extend((0..drafts).map(|d| 7000 + (n + d) % 5 + rng.below(2) as u32));
            c.append_tokens(id, &new).map_err(fail)?;
            for t in new {
                req.push(t);
            }
            plan.drafts = drafts;
        }
        c.check_invariants().map_err(fail)?;
    }
    // Everything completes; every pool is back to empty.
    let rep = rt.drain().map_err(fail)?;
    c.report(rep.worker, &rep.enqueued, &rep.completed)
        .map_err(fail)?;
    prop_guard(rt.pending_transfers() == 0, || "transfers left".into())?;
    c.check_drained().map_err(fail)?;
    let free = c.free();
    prop_guard(free.hot_regions_held == 0, || "hot regions left".into())?;
    prop_guard(
        free.gpu_blocks == free.gpu_capacity && free.host_blocks == free.host_capacity,
        || format!("pools not empty: {free:?}"),
    )?;
    prop_guard(u64::from(free.rows) == u64::from(ROWS), || {
        "state rows held".into()
    })?;
    seen.gpu_cached_at_end += u64::from(free.gpu_cached);
    seen.host_cached_at_end += u64::from(free.host_cached);
    Ok(())
}

/// Admits request `id` with `prompt`, to finish at `final_len` tokens.
fn admit(
    c: &mut Coordinator,
    reqs: &mut HashMap<RequestId, Req>,
    plans: &mut HashMap<RequestId, Plan>,
    id: RequestId,
    prompt: Vec<u32>,
    final_len: u32,
) -> Result<(), TestCaseError> {
    c.admit(id, &prompt).map_err(fail)?;
    reqs.insert(id, Req::new(prompt));
    plans.insert(
        id,
        Plan {
            drafts: 0,
            final_len,
        },
    );
    Ok(())
}

/// Fails with `what` unless `ok`.
fn prop_guard(ok: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if ok {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

fn env(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn a_soak_of_the_engine_loop_serves_everyone_and_leaks_nothing() {
    let steps = env("HISPARSE_SOAK_STEPS", 600);
    let seeds = env("HISPARSE_SOAK_SEEDS", 8);
    let mut seen = Seen::default();
    for seed in 0..u64::from(seeds) {
        let eager = seed % 2 == 0;
        if let Err(e) = soak(0x50A4 + seed, eager, steps, &mut seen) {
            panic!("seed {seed} (eager mirroring {eager}): {e}");
        }
    }
    println!("soak over {seeds} runs of {steps} arrival steps: {seen:?}");
    println!(
        "free at the end, prefix-cached: {} GPU and {} host blocks over all runs (free blocks that keep their prefix keys)",
        seen.gpu_cached_at_end, seen.host_cached_at_end
    );
    assert_eq!(
        seen.refused,
        u64::from(seeds),
        "the long request is refused once a run"
    );
    assert_eq!(seen.refused_at_admission, u64::from(seeds));
    for (what, n) in [
        ("rows checked", seen.rows_checked),
        ("rows gathered from host", seen.host_reads),
        ("requests finished", seen.finished),
        ("preemptions", seen.preempted),
        ("drafts rolled back", seen.rolled_back),
        ("prefix hits", seen.prefix_hits),
        ("copy-on-write tails", seen.copy_on_write),
        ("pages reclaimed", seen.reclaimed),
    ] {
        assert!(n > 0, "no {what} in the soak: it lost its teeth ({seen:?})");
    }
}
