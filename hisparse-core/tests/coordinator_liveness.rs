//! Liveness of the coordinator on the smallest pools a layout allows: a request whose context
//! fits the layout always finishes, whatever the pool is doing. Each test is named after what it
//! guards; the first two are the stalls found on valid input (no error, no progress, ever).
// These tests drive the planning side (layouts, the coordinator), which needs `alloc`.
#![cfg(feature = "alloc")]

use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, RequestId};
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_core::model::{LayerSpec, ModelSpec};

/// One sparse layer of 16-byte rows (16-byte indexer rows), 4-token blocks, top-k 4: a page
/// costs 2 GPU blocks (indexer + resident) and the default hot region (8 rows) 2 blocks.
const ONE_LAYER: [LayerSpec; 1] = [LayerSpec::sparse_leader(16, 16)];
const MODEL: ModelSpec<'static> = ModelSpec {
    name: "one-layer",
    block_tokens: 4,
    top_k: 4,
    layers: &ONE_LAYER,
};

fn layout(max_model_len: u32, gpu_blocks: u32, eager: bool) -> KvCacheConfig {
    let mut cfg = HiSparseConfig::new(4, 64 * 64);
    cfg.eager_host_mirror = eager;
    let mut input = LayoutInput::new(&MODEL, &cfg, 0, max_model_len);
    input.num_gpu_blocks_override = Some(gpu_blocks);
    plan_layout(&input).expect("layout")
}

fn coordinator(kv: KvCacheConfig, max_batched_tokens: u32, workers: u32) -> Coordinator {
    Coordinator::new(
        kv,
        CoordinatorConfig {
            max_batched_tokens,
            num_workers: workers,
            ..CoordinatorConfig::default()
        },
    )
    .expect("coordinator")
}

/// Drives the coordinator as an engine does — step; worker `w` reports each step's copies `w`
/// steps after they were issued (worker 0 at once), as tensor-parallel ranks running behind
/// one another do; append a sampled token to each request whose tokens are all computed, or
/// finish it at `final_len[id]` — until every request in `final_len` is finished. Returns the
/// steps it took and the preemptions on the way; fails after `max_steps`, naming the requests
/// still unfinished.
fn drive(c: &mut Coordinator, final_len: &[(RequestId, u32)], max_steps: u32) -> (u32, usize) {
    let workers = c.config().num_workers as usize;
    let mut open: Vec<(RequestId, u32)> = final_len.to_vec();
    let mut preempted = 0;
    // Per worker: transfers issued but not yet reported, with the step they were issued in.
    let mut backlog: Vec<Vec<(u64, u32)>> = vec![Vec::new(); workers];
    for step in 1..=max_steps {
        let cmd = c.step().expect("step");
        preempted += cmd.preempted.len();
        for (w, queue) in backlog.iter_mut().enumerate() {
            if let Some(id) = cmd.transfer_id {
                queue.push((id, step));
            }
            let due = queue
                .iter()
                .take_while(|&&(_, at)| at + w as u32 <= step)
                .count();
            let ids: Vec<u64> = queue.drain(..due).map(|(id, _)| id).collect();
            c.report(w as u32, &ids, &ids).expect("report");
        }
        c.check_invariants().expect("invariants");
        let running: Vec<RequestId> = c.running_ids().collect();
        for id in running {
            if c.num_computed(id) != c.num_tokens(id) {
                continue;
            }
            let Some(&(_, want)) = open.iter().find(|&&(r, _)| r == id) else {
                continue;
            };
            if c.num_tokens(id) == Some(want) {
                c.finish(id).expect("finish");
                open.retain(|&(r, _)| r != id);
            } else {
                c.append_tokens(id, &[7]).expect("append");
            }
        }
        if open.is_empty() {
            // Let the last transfers land before checking that every block came back.
            for (w, queue) in backlog.iter_mut().enumerate() {
                let ids: Vec<u64> = queue.drain(..).map(|(id, _)| id).collect();
                c.report(w as u32, &ids, &ids).expect("report");
            }
            c.check_invariants().expect("invariants");
            assert_eq!(c.gpu_pool().num_held(), 0, "GPU blocks leaked");
            assert_eq!(c.host_pool().num_held(), 0, "host blocks leaked");
            return (step, preempted);
        }
    }
    panic!(
        "requests {:?} did not finish within {max_steps} steps ({} waiting, {} running)",
        open,
        c.num_waiting(),
        c.num_running()
    );
}

/// A layout that holds one request entirely on the GPU, prefix caching on: prompt P runs to the
/// end and finishes; another request then takes the blocks of P's GPU copies, so P again hits
/// the host prefix cache with its hit page only on host. Its first chunk is a prefill chunk,
/// which reads its whole context on the GPU: the hit page is staged (restored host → device,
/// no hot region), and the hit fits the pool that way where a hot region would not — so it is
/// used; the request queued behind it finishes too.
#[test]
fn a_prefix_hit_on_host_pages_is_staged_for_the_prefill_that_reads_it() {
    // 5 GPU blocks: 4 usable, exactly one 8-token request all on the GPU (2 pages × 2 blocks).
    let mut c = coordinator(layout(8, 5, true), 512, 1);
    let p: Vec<u32> = (0..5).collect();
    c.admit(1, &p).unwrap();
    drive(&mut c, &[(1, 8)], 20);
    // P's resident blocks were freed first (a request frees in reverse order), so they are at
    // the head of the free queue: this request takes them.
    c.admit(3, &[50, 51, 52]).unwrap();
    drive(&mut c, &[(3, 3)], 20);
    c.admit(2, &p).unwrap();
    c.admit(4, &[60, 61, 62]).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled.len(), 1, "P starts again");
    assert_eq!(
        (cmd.scheduled[0].id, cmd.scheduled[0].first_token),
        (2, 4),
        "the prefix hit is used: only the token after it is computed"
    );
    assert_eq!(cmd.restores.len(), 1, "the hit page is restored to the GPU");
    assert!(cmd.hot_assign.is_empty(), "nothing reads from host");
    assert!(cmd.scheduled[0].fully_resident);
    assert_eq!(c.pages_staged(), 1);
    if let Some(id) = cmd.transfer_id {
        c.report(0, &[id], &[id]).unwrap();
    }
    drive(&mut c, &[(2, 8), (4, 8)], 60);
}

/// The same layout when P's GPU copies are still in the free queue: the hit adopts them (no hot
/// region, nothing read from host), so it fits and only the last token is computed.
#[test]
fn a_prefix_hit_on_gpu_copies_fits_where_reading_from_host_would_not() {
    let mut c = coordinator(layout(8, 5, true), 512, 1);
    let p: Vec<u32> = (0..5).collect();
    c.admit(1, &p).unwrap();
    drive(&mut c, &[(1, 8)], 20);
    c.admit(2, &p).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled.len(), 1);
    let s = cmd.scheduled[0];
    assert_eq!((s.id, s.first_token, s.fully_resident), (2, 4, true));
    assert!(cmd.hot_assign.is_empty());
    if let Some(id) = cmd.transfer_id {
        c.report(0, &[id], &[id]).unwrap();
    }
    drive(&mut c, &[(2, 8)], 60);
}

/// The same prompt with room for the hit: the hit is used (only the last token is computed),
/// so the fallback above is not taken when it is not needed.
#[test]
fn a_prefix_hit_that_fits_the_pool_is_used() {
    let mut c = coordinator(layout(8, 9, true), 512, 1);
    let p: Vec<u32> = (0..8).collect();
    c.admit(1, &p).unwrap();
    let cmd = c.step().unwrap();
    c.report(0, &[1], &[1]).unwrap();
    assert_eq!(cmd.scheduled[0].num_tokens, 8);
    c.finish(1).unwrap();
    c.admit(2, &p).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(
        (cmd.scheduled[0].first_token, cmd.scheduled[0].num_tokens),
        (7, 1)
    );
    assert_eq!(cmd.host_cow.len(), 1);
    if let Some(id) = cmd.transfer_id {
        c.report(0, &[id], &[id]).unwrap();
    }
    c.finish(2).unwrap();
    c.check_invariants().unwrap();
}

/// A 32-token prompt in a 13-block pool (12 usable: 8 indexer blocks + a 2-page resident tail +
/// a 2-block hot region, the HiSparse cost of 32 tokens) can never be prefilled exactly: its
/// last chunk reads all 8 pages on the GPU (16 blocks). Admission refuses it with a typed error
/// naming the context, the need and the pool, instead of admitting a request that would stall
/// or read -1. In a pool that holds the prompt (17 blocks) the lone request finishes, whatever
/// the chunk size, mirroring and workers, and is never preempted.
#[test]
fn a_prompt_whose_prefill_could_never_hold_its_context_is_refused() {
    let mut c = coordinator(layout(32, 13, true), 512, 1);
    let p: Vec<u32> = (0..32).collect();
    let e = c.admit(1, &p).unwrap_err();
    assert_eq!(
        e,
        hisparse_core::coordinator::CoordError::PrefillNeverFits {
            id: 1,
            context_tokens: 32,
            needed: 16,
            capacity: 12
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("--gpu-mem") && msg.contains("32 tokens"),
        "{msg}"
    );
    for max_batched_tokens in [512, 16, 5] {
        for eager in [true, false] {
            for workers in [1, 3] {
                let mut c = coordinator(layout(32, 17, eager), max_batched_tokens, workers);
                c.admit(1, &p).unwrap();
                let (steps, preempted) = drive(&mut c, &[(1, 32)], 40);
                assert!(steps < 40);
                assert_eq!(preempted, 0, "a lone request that fits is never preempted");
                assert_eq!(
                    c.num_computed(1),
                    None,
                    "finished (max_batched_tokens {max_batched_tokens}, eager {eager})"
                );
            }
        }
    }
}

/// Every prompt length up to `max_model_len`, in every pool from the smallest that holds one
/// `max_model_len` request's context (a prefill reads its whole context on the GPU) upwards, with and without prefix caching and eager mirroring, whole-prompt and small
/// chunks, workers reporting at once or lagging: one or two requests of the same prompt each
/// finish within a bound of steps (no stall, no endless preemption), and a request alone is
/// never preempted — while its pages' host copies are in flight it waits for them.
#[test]
fn a_request_whose_context_fits_the_layout_always_finishes() {
    let max_len = 24;
    let min_blocks = {
        let kv = layout(max_len, 1 << 10, true);
        1 + kv.gpu_blocks_per_request(max_len).all_on_gpu as u32
    };
    let mut runs = 0;
    for gpu_blocks in min_blocks..min_blocks + 6 {
        for eager in [true, false] {
            for caching in [true, false] {
                for (workers, chunk) in [(1, 8), (3, 8), (3, 512)] {
                    for len in 1..=max_len {
                        for copies in 1..=2u64 {
                            let kv = layout(max_len, gpu_blocks, eager);
                            let mut c = Coordinator::new(
                                kv,
                                CoordinatorConfig {
                                    max_batched_tokens: chunk,
                                    enable_prefix_caching: caching,
                                    num_workers: workers,
                                    reclaim_min_blocks: 0,
                                    ..CoordinatorConfig::default()
                                },
                            )
                            .unwrap();
                            let p: Vec<u32> = (0..len).collect();
                            let finals: Vec<(RequestId, u32)> =
                                (0..copies).map(|id| (id, max_len)).collect();
                            for &(id, _) in &finals {
                                c.admit(id, &p).unwrap();
                            }
                            let (_, preempted) = drive(&mut c, &finals, 40 * max_len);
                            if copies == 1 {
                                assert_eq!(preempted, 0, "a lone request that fits is preempted");
                            }
                            // The same prompt again after the others finished: a prefix hit.
                            c.admit(9, &p).unwrap();
                            let (_, preempted) = drive(&mut c, &[(9, max_len)], 40 * max_len);
                            assert_eq!(preempted, 0, "a lone request that fits is preempted");
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(runs, 6 * 2 * 2 * 3 * 24 * 2);
}

/// One request the pool can no longer serve does not stop the others: request 1 decodes past
/// the longest context a prefill can hold on the GPU (32 tokens in a 17-block pool), is
/// preempted, and its restart — a prefill over its whole 40-token context — could never fit.
/// The step that finds this refuses request 1 (reported in the command with the reason, its
/// blocks given back, out of every queue), schedules request 2 as usual, and every later step
/// runs; request 2 finishes and, once the engine finishes request 1, every block is back.
#[test]
fn a_request_refused_while_scheduling_does_not_stop_the_step() {
    use hisparse_core::coordinator::{CoordError, RefusalReason};
    let mut c = coordinator(layout(48, 17, true), 512, 1);
    c.admit(1, &(0..8).collect::<Vec<u32>>()).unwrap();
    let mut xfers = Vec::new();
    while c.num_tokens(1) != Some(40) {
        let cmd = c.step().expect("step");
        xfers.extend(cmd.transfer_id);
        c.report(0, &xfers, &xfers).unwrap();
        xfers.clear();
        if c.num_computed(1) == c.num_tokens(1) {
            c.append_tokens(1, &[7]).unwrap();
        }
    }
    assert!(!c.layout().prefill_fits(40) && c.layout().prefill_fits(32));
    c.preempt(1).unwrap();
    c.admit(2, &(100..104).collect::<Vec<u32>>()).unwrap();
    let mut refused = None;
    for _ in 0..20 {
        let cmd = c
            .step()
            .expect("a request the pool cannot serve must not fail the step");
        xfers.extend(cmd.transfer_id);
        c.report(0, &xfers, &xfers).unwrap();
        xfers.clear();
        c.check_invariants().unwrap();
        if let Some(r) = cmd.refused.first() {
            assert_eq!(cmd.refused.len(), 1);
            assert!(cmd.scheduled.iter().all(|s| s.id != 1));
            refused = Some(*r);
            break;
        }
        if c.num_computed(2) == c.num_tokens(2) {
            c.append_tokens(2, &[7]).unwrap();
        }
    }
    let r = refused.expect("request 1 was never refused");
    assert_eq!(r.id, 1);
    let RefusalReason::PrefillNeverFits {
        context_tokens,
        needed,
        capacity,
    } = r.reason
    else {
        panic!("refused for {:?}", r.reason);
    };
    assert!(
        (32..40).contains(&context_tokens) && needed > capacity && capacity == 16,
        "{:?}",
        r.reason
    );
    assert_eq!(c.refusal(1), Some(r.reason));
    assert_eq!(c.slot_of(1), None);
    assert!(c.running_ids().all(|id| id != 1));
    // Calls that need it running (or waiting) say it was refused, and why.
    let e = c.schedule(1, 1).unwrap_err();
    assert_eq!(
        e,
        CoordError::Refused {
            id: 1,
            reason: r.reason
        }
    );
    assert!(e.to_string().contains("finish it"), "{e}");
    assert_eq!(c.start(1, 8).unwrap_err(), e);
    assert_eq!(c.preempt(1).unwrap_err(), e);
    c.finish(1).unwrap();
    assert_eq!(c.refusal(1), None);
    drive(&mut c, &[(2, 12)], 40);
}
