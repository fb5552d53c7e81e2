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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use hisparse_core::Device;
use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, RequestId};
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_core::model::{LayerSpec, ModelSpec, RegularLayer, SparseLayer};
use hisparse_runtime::{Indices, Runtime, RuntimeConfig, TopK};
use lag::{LagBuffer, LagDevice};
use proptest::prelude::*;

const BT: u32 = 4;
const TOP_K: u32 = 4;
const HOT: u32 = 8;
const MAX_LEN: u32 = 40;
const ROWS: usize = 4;

static READS: AtomicU64 = AtomicU64::new(0);
static HOST_READS: AtomicU64 = AtomicU64::new(0);
static COW: AtomicU64 = AtomicU64::new(0);
static RECLAIMS: AtomicU64 = AtomicU64::new(0);
static LATE_COPIES: AtomicU64 = AtomicU64::new(0);
static FOLLOWER_PLANS: AtomicU64 = AtomicU64::new(0);

const fn sparse(indexer: Option<u32>) -> LayerSpec {
    LayerSpec::Sparse(SparseLayer {
        row_bytes: 32,
        value_bytes: 16,
        compress_ratio: 1,
        indexer_row_bytes: indexer,
        indexer_value_bytes: None,
        page_alignment: 1,
    })
}

static LAYERS: [LayerSpec; 4] = [
    sparse(Some(16)),
    sparse(None),
    sparse(Some(16)),
    LayerSpec::Regular(RegularLayer {
        row_bytes: 16,
        compress_ratio: 1,
        sliding_window: None,
        block_tokens: None,
        page_alignment: 1,
        kind: hisparse_core::model::RegularKind::Attention,
    }),
];

static MODEL: ModelSpec<'static> = ModelSpec {
    name: "e2e",
    block_tokens: BT,
    top_k: TOP_K,
    layers: &LAYERS,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 31)
}

/// The KV row the forward pass writes for `layer` at a token whose prefix hashes to `prefix`
/// (a shared prefix therefore has the same rows in every request).
fn row_bytes_for(layer: u32, prefix: u64, len: usize) -> Vec<u8> {
    let mut h = mix(prefix, u64::from(layer) + 1);
    (0..len)
        .map(|i| {
            if i % 8 == 0 {
                h = mix(h, i as u64);
            }
            (h >> ((i % 8) * 8)) as u8
        })
        .collect()
}

struct Req {
    tokens: Vec<u32>,
    /// Prefix hash after each token.
    prefix: Vec<u64>,
}

impl Req {
    fn new(tokens: Vec<u32>) -> Self {
        let mut r = Req {
            tokens: Vec::new(),
            prefix: Vec::new(),
        };
        for t in tokens {
            r.push(t);
        }
        r
    }
    fn push(&mut self, t: u32) {
        let p = self.prefix.last().copied().unwrap_or(1);
        self.tokens.push(t);
        self.prefix.push(mix(p, u64::from(t)));
    }
}

fn i32s(b: &LagBuffer, n: usize) -> Vec<i32> {
    let g = b.bytes();
    g.as_slice()[..n * 4]
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn set_i32s(b: &LagBuffer, v: &[i32]) {
    let mut g = b.bytes();
    for (c, x) in g.as_mut_slice().chunks_exact_mut(4).zip(v) {
        c.copy_from_slice(&x.to_ne_bytes());
    }
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// The forward pass: writes the KV row of every token a scheduled request computes into its
/// resident pages, straight into the device pool (the engine's kernels).
fn forward(
    rt: &mut Runtime<LagDevice>,
    kv: &KvCacheConfig,
    slot: u32,
    id: RequestId,
    positions: std::ops::Range<u32>,
    req: &Req,
) -> Result<(), TestCaseError> {
    for pos in positions {
        let page = (pos / kv.block_size) as usize;
        for b in 0..kv.num_buckets {
            let blk = rt.resident_row(b, slot).unwrap()[page];
            prop_assert!(
                blk > 0,
                "token {} of request {} written to a null page",
                pos,
                id
            );
            for gl in &kv.groups[kv.resident_group(b)].layers {
                let l = kv.device_layout(gl.layer).unwrap();
                let bytes = row_bytes_for(gl.layer, req.prefix[pos as usize], 32);
                let [(vo, vl), (so, sl)] = l.row_parts(blk as u32, pos % kv.block_size);
                let (_, pools) = rt.device_and_pools_mut();
                let mut d = pools.device.bytes();
                let d = d.as_mut_slice();
                d[vo as usize..(vo + vl) as usize].copy_from_slice(&bytes[..vl as usize]);
                d[so as usize..(so + sl) as usize].copy_from_slice(&bytes[vl as usize..]);
            }
        }
    }
    Ok(())
}

/// Checks that every top-k entry of index group `g` reads the forward pass's bytes in every
/// layer of the group; returns the rows checked.
#[allow(clippy::too_many_arguments)]
fn check_reads(
    rt: &Runtime<LagDevice>,
    kv: &KvCacheConfig,
    g: usize,
    sched: &[(u32, RequestId)],
    topk: &[i32],
    rows: &[i32],
    counts: Option<&[i32]>,
    reqs: &HashMap<RequestId, Req>,
) -> Result<u64, TestCaseError> {
    let k = TOP_K as usize;
    let mut checked = 0;
    let pool = rt.pools().device.bytes();
    let pool = pool.as_slice();
    for (i, &(slot, id)) in sched.iter().enumerate() {
        let r = &reqs[&id];
        if let Some(c) = counts {
            prop_assert_eq!(c[i], TOP_K as i32, "valid count of request {}", id);
        }
        for j in 0..k {
            let tok = topk[i * k + j] as usize;
            let phys = rows[i * k + j];
            prop_assert!(
                phys >= 0,
                "valid top-k entry {} of request {} resolved to -1",
                tok,
                id
            );
            for &layer in &kv.index_groups[g].layers {
                let l = kv.device_layout(layer).unwrap();
                let (blk, off) = l.locate(phys.into()).unwrap();
                let [(vo, vl), (so, sl)] = l.row_parts(blk, off);
                let mut got = pool[vo as usize..(vo + vl) as usize].to_vec();
                got.extend_from_slice(&pool[so as usize..(so + sl) as usize]);
                let want = row_bytes_for(layer, r.prefix[tok], 32);
                prop_assert_eq!(
                    got,
                    want,
                    "request {} (state row {}) token {} layer {} read wrong bytes from row {}",
                    id,
                    slot,
                    tok,
                    layer,
                    phys
                );
                checked += 1;
            }
        }
    }
    Ok(checked)
}

fn run(
    seed: u64,
    gpu_blocks: u32,
    eager: bool,
    prefix: bool,
    steps: u32,
) -> Result<(), TestCaseError> {
    let mut rng = Rng(seed | 1);
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
