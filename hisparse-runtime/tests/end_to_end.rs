//! End to end through the runtime: the coordinator's commands are executed by a [`Runtime`] on a
//! CPU device whose copy stream lags (after-forward copies run steps later, reading the device
//! pool *then*), the test's forward pass writes every computed token's KV row into its resident
//! pages, every scheduled token row reads its top-k through the runtime (whole index groups, or
//! leader first and followers through `apply_plan`), and every row attention reads is compared
//! with the KV the forward pass wrote for that token.
//!
//! Two workers report: worker 0 is the runtime's own polling, worker 1 reports at random times,
//! so a batch becomes durable only once both have — out of order with the copies themselves.
//! Prefix sharing with copy-on-write, split value/scale rows, leaders with followers, two
//! buckets, reclaim, spills (eager mirroring off) and row mirrors are all exercised.

mod lag;
mod rows;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use hisparse_core::Device;
use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, RequestId};
use hisparse_core::layout::{LayoutInput, plan_layout};
use hisparse_runtime::{Indices, Runtime, RuntimeConfig, TopK};
use lag::LagDevice;
use proptest::prelude::*;
use rows::{MODEL, Req, Rng, TOP_K, check_reads, fail, forward, i32s, set_i32s};

const HOT: u32 = 8;
const MAX_LEN: u32 = 40;
const ROWS: usize = 4;

static READS: AtomicU64 = AtomicU64::new(0);
static HOST_READS: AtomicU64 = AtomicU64::new(0);
static COW: AtomicU64 = AtomicU64::new(0);
static RECLAIMS: AtomicU64 = AtomicU64::new(0);
static LATE_COPIES: AtomicU64 = AtomicU64::new(0);
static FOLLOWER_PLANS: AtomicU64 = AtomicU64::new(0);

fn run(
    seed: u64,
    gpu_blocks: u32,
    eager: bool,
    prefix: bool,
    steps: u32,
) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(seed);
    let mut cfg = HiSparseConfig::new(TOP_K, 48 * 3 * 128);
    cfg.device_buffer_size = Some(HOT);
    cfg.eager_host_mirror = eager;
    let mut input = LayoutInput::new(&MODEL, &cfg, 0, MAX_LEN);
    input.num_gpu_blocks_override = Some(gpu_blocks);
    let kv = plan_layout(&input).unwrap();
    let mut c = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: ROWS as u32,
            max_batched_tokens: 24,
            max_spill_pages_per_step: 2,
            num_workers: 2,
            enable_prefix_caching: prefix,
            reclaim_min_blocks: 0,
        },
    )
    .unwrap();
    let mut rt = Runtime::new(
        LagDevice::default(),
        kv.clone(),
        RuntimeConfig::new(ROWS as u32, ROWS as u32),
    )
    .map_err(fail)?;
    let k = TOP_K as usize;
    let alloc = |n: usize| rt.device().alloc(n * 4).unwrap();
    let (topk_buf, mut rows_buf, mut counts_buf) = (alloc(ROWS * k), alloc(ROWS * k), alloc(ROWS));
    let mut reqs: HashMap<RequestId, Req> = HashMap::new();
    // Worker 1's view: batches enqueued and how many it has reported complete.
    let mut w1_issued: Vec<u64> = Vec::new();
    let mut w1_done = 0usize;
    let mut next_id = 1;
    let (mut checked, mut host_reads) = (0u64, 0u64);
    for step in 0..steps + 40 {
        let draining = step >= steps;
        while !draining && reqs.len() < 6 && rng.below(3) == 0 {
            let len = 1 + rng.below(u64::from(MAX_LEN) - 8) as u32;
            let family = rng.below(3) as u32;
            let toks: Vec<u32> = (0..len).map(|i| family * 100 + i).collect();
            c.admit(next_id, &toks).unwrap();
            reqs.insert(next_id, Req::new(toks));
            next_id += 1;
        }
        if draining && reqs.is_empty() {
            break;
        }
        let cmd = c.step().map_err(fail)?;
        COW.fetch_add(cmd.host_cow.len() as u64, Relaxed);
        RECLAIMS.fetch_add(
            cmd.residency.iter().filter(|u| u.block == 0).count() as u64,
            Relaxed,
        );
        rt.begin_step(&cmd).map_err(fail)?;
        let misses_before = rt.counters().hot_misses;
        for s in &cmd.scheduled {
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
            // Every scheduled request's last token reads a top-k of its context.
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
                        topk[i * k + j] = rng.below(u64::from(last)) as i32;
                    }
                }
                set_i32s(&topk_buf, &topk);
                let input = TopK {
                    positions: &topk_buf,
                    num_tokens: t as u32,
                    state_rows: None,
                };
                let with_counts = rng.below(2) == 0;
                let out = Indices {
                    rows: &mut rows_buf,
                    counts: with_counts.then_some(&mut counts_buf),
                };
                let followers = &kv.index_groups[g].layers[1..];
                if !followers.is_empty() && rng.below(2) == 0 {
                    rt.resolve_leader(g, &input, out).map_err(fail)?;
                    for &f in followers {
                        rt.apply_plan(f).map_err(fail)?;
                        FOLLOWER_PLANS.fetch_add(1, Relaxed);
                    }
                } else {
                    rt.resolve_index_group(g, &input, out).map_err(fail)?;
                }
                let counts = with_counts.then(|| i32s(&counts_buf, t));
                checked += check_reads(
                    &rt,
                    &kv,
                    g,
                    &sched,
                    &topk,
                    &i32s(&rows_buf, t * k),
                    counts.as_deref(),
                    &reqs,
                )?;
            }
        }
        rt.end_step(&cmd).map_err(fail)?;
        // The copy stream runs a random number of its queued copies now; the rest lag.
        let pending = rt.device().pending();
        rt.device()
            .run_pending(rng.below(pending as u64 + 1) as usize);
        if rt.device().pending() > 0 {
            LATE_COPIES.fetch_add(1, Relaxed);
        }
        let rep = rt.poll().map_err(fail)?;
        host_reads += rt.counters().hot_misses - misses_before;
        c.report(0, &rep.enqueued, &rep.completed).map_err(fail)?;
        // Worker 1 reports a random prefix of what it has not reported yet.
        w1_issued.extend_from_slice(&rep.enqueued);
        let upto = w1_done + rng.below((w1_issued.len() - w1_done) as u64 + 1) as usize;
        c.report(1, &rep.enqueued, &w1_issued[w1_done..upto])
            .map_err(fail)?;
        w1_done = upto;
        // Sample or finish.
        let ids: Vec<RequestId> = c.running_ids().collect();
        for id in ids {
            if c.num_computed(id) == c.num_tokens(id) {
                let r = reqs.get_mut(&id).unwrap();
                if draining || r.tokens.len() as u32 >= MAX_LEN - 1 || rng.below(8) == 0 {
                    c.finish(id).unwrap();
                    reqs.remove(&id);
                } else {
                    let t = 7 + rng.below(2) as u32;
                    c.append_tokens(id, &[t]).unwrap();
                    r.push(t);
                }
            }
        }
        c.check_invariants().map_err(fail)?;
    }
    prop_assert!(reqs.is_empty(), "{} requests never finished", reqs.len());
    // Everything completes; every block returns to its pool.
    let rep = rt.drain().map_err(fail)?;
    c.report(0, &rep.enqueued, &rep.completed).map_err(fail)?;
    w1_issued.extend_from_slice(&rep.enqueued);
    c.report(1, &rep.enqueued, &w1_issued[w1_done..])
        .map_err(fail)?;
    prop_assert_eq!(rt.pending_transfers(), 0);
    prop_assert_eq!(c.gpu_pool().num_held(), 0, "GPU blocks leaked");
    prop_assert_eq!(c.host_pool().num_held(), 0, "host blocks leaked");
    READS.fetch_add(checked, Relaxed);
    HOST_READS.fetch_add(host_reads, Relaxed);
    Ok(())
}

#[test]
fn every_row_read_through_the_runtime_matches_what_the_forward_pass_wrote() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    });
    let strategy = (any::<u64>(), 60u32..140, any::<bool>(), any::<bool>());
    if let Err(e) = runner.run(&strategy, |(seed, gpu, eager, prefix)| {
        run(seed, gpu, eager, prefix, 120)
    }) {
        panic!("{e}");
    }
    let counts = [
        ("rows read back", READS.load(Relaxed)),
        ("rows gathered from host", HOST_READS.load(Relaxed)),
        ("copy-on-write tails", COW.load(Relaxed)),
        ("pages reclaimed", RECLAIMS.load(Relaxed)),
        (
            "steps ending with copies still queued",
            LATE_COPIES.load(Relaxed),
        ),
        ("follower plans applied", FOLLOWER_PLANS.load(Relaxed)),
    ];
    println!("coverage over {cases} runs: {counts:?}");
    if cases >= 100 {
        for (what, n) in counts {
            assert!(n > 0, "no {what} in {cases} runs: the test lost its teeth");
        }
    }
}
