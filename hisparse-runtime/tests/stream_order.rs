//! Per-layer resolves on a stream of their own (an engine's micro-batches on a side stream) are
//! ordered by the runtime where it runs them outside a graph: a later resolve on another stream
//! waits for the last one (they share the miss-plan scratch and each group's counters), and
//! `end_step` waits for the last one, so the step's copies and the next step's table updates
//! come after it. And a step cut into micro-batches, each with its own state rows, on either
//! stream, reads and leaves what the whole-batch step does. Checked on a device whose side
//! streams lag: work enqueued there runs only when something waits for it, and the test reads
//! the row buffers directly, without waiting.

mod lag;
mod scenario;

use hisparse_conformance::SplitMix64;
use hisparse_core::Device;
use hisparse_runtime::{Indices, LayerCall, Runtime, StreamId, Swap, TopK};
use lag::{LagBuffer, LagDevice};
use proptest::prelude::*;
use scenario::{Run, SMALL};

/// The `i32`s of a buffer as they are now (queued work not run).
fn now(buf: &LagBuffer, n: usize) -> Vec<i32> {
    buf.bytes().as_slice()[..n * 4]
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A runtime of `shape` on a lagging device.
fn lag_runtime(shape: &scenario::Shape) -> Runtime<LagDevice> {
    Runtime::new(
        LagDevice::default(),
        scenario::layout(shape),
        scenario::runtime_config(shape.requests),
    )
    .unwrap()
}

/// A lagging stream of `rt`'s device, lent to it.
fn side_stream(rt: &mut Runtime<LagDevice>) -> StreamId {
    let stream = rt.device().create_stream().unwrap();
    rt.adopt_stream(stream).unwrap()
}

/// Group `g`'s call over `t` token rows of `topk`, out to `rows`, on `on`.
fn call(
    rt: &mut Runtime<LagDevice>,
    g: usize,
    topk: &LagBuffer,
    t: u32,
    rows: &mut LagBuffer,
    on: Option<StreamId>,
) {
    rt.decode(LayerCall {
        group: g,
        swap: Swap::IndexGroup,
        topk: TopK {
            positions: topk,
            num_tokens: t,
            state_rows: None,
        },
        out: Indices { rows, counts: None },
        on,
    })
    .unwrap();
}

#[test]
fn resolves_on_a_side_stream_are_ordered_before_the_next_resolve_and_the_end_of_the_step() {
    let shape = SMALL;
    let mut rt = lag_runtime(&shape);
    let side = side_stream(&mut rt);
    // The same steps on the compute stream alone: what every call must read.
    let mut reference = lag_runtime(&shape);
    let mut run = Run::new(shape, rt.device());
    let mut twin = Run::new(shape, reference.device());
    let groups = run.kv.index_groups.len();
    assert!(groups >= 2, "the scenario needs two index groups");
    let n = shape.requests as usize * shape.top_k as usize;
    let alloc = |rt: &Runtime<LagDevice>| rt.device().alloc(n * 4).unwrap();
    let (mut topk, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..groups {
        topk.push(alloc(&rt));
        rows.push(alloc(&rt));
    }
    let (mut side_calls, mut waited_for) = (0, 0);
    while !run.done() {
        let (cmd, batch) = run.begin(&mut rt);
        let (twin_cmd, _) = twin.begin(&mut reference);
        let t = batch.len() as u32;
        let mut want = Vec::new();
        for g in 0..groups {
            let sel = run.topk_of(&cmd, g);
            assert_eq!(sel, twin.topk_of(&twin_cmd, g));
            twin.resolve(&mut reference, &twin_cmd, g, t);
            want.push(twin.outputs.last().unwrap().clone());
            rt.device().upload_i32(&mut topk[g], 0, &sel).unwrap();
            rt.device()
                .upload_i32(&mut rows[g], 0, &vec![-7; n])
                .unwrap();
        }
        // Group 0 on the side stream: queued, not run yet.
        call(&mut rt, 0, &topk[0], t, &mut rows[0], Some(side));
        side_calls += 1;
        let queued = now(&rows[0], n) == vec![-7; n];
        // Group 1 on the compute stream: it waits for group 0's resolve first.
        call(&mut rt, 1, &topk[1], t, &mut rows[1], None);
        assert_eq!(
            now(&rows[0], want[0].len()),
            want[0],
            "step {}: group 0",
            run.step
        );
        waited_for += usize::from(queued);
        // The rest on the side stream again; end_step (on the compute stream) waits for them.
        for g in 2..groups {
            call(&mut rt, g, &topk[g], t, &mut rows[g], Some(side));
        }
        run.end(&mut rt, &cmd);
        twin.end(&mut reference, &twin_cmd);
        for g in 1..groups {
            assert_eq!(
                now(&rows[g], want[g].len()),
                want[g],
                "step {}: group {g}",
                run.step
            );
        }
    }
    assert!(side_calls > 0, "no step resolved");
    assert!(
        waited_for > 0,
        "the side stream never lagged: the ordering was not exercised"
    );
}

/// One whole run of `shape` whose decode calls are cut, step by step, into micro-batches at the
/// cuts drawn from `seed` (every request's row in one micro-batch), each micro-batch's call of each
/// group with its own state rows on the lagging side stream or the compute stream as drawn;
/// every call's rows, reassembled in batch order, recorded once the step ended.
fn drive_in_micro_batches(shape: scenario::Shape, seed: u64) -> scenario::Outcome {
    let mut rng = SplitMix64::new(seed);
    let mut coin = move || rng.percent(50);
    let mut rt = lag_runtime(&shape);
    let side = side_stream(&mut rt);
    let mut run = Run::new(shape, rt.device());
    let groups = run.kv.index_groups.len();
    let k = shape.top_k as usize;
    let rows_max = shape.requests as usize;
    // Per possible micro-batch (at most one per request): per group a top-k and a rows buffer,
    // and its state rows.
    let alloc = |rt: &Runtime<LagDevice>, n: usize| rt.device().alloc(n * 4).unwrap();
    let mut parts: Vec<(Vec<LagBuffer>, Vec<LagBuffer>, LagBuffer)> = (0..rows_max)
        .map(|_| {
            (
                (0..groups).map(|_| alloc(&rt, rows_max * k)).collect(),
                (0..groups).map(|_| alloc(&rt, rows_max * k)).collect(),
                alloc(&rt, rows_max),
            )
        })
        .collect();
    while !run.done() {
        let (cmd, batch) = run.begin(&mut rt);
        // Cuts between rows (one row per request here), drawn each step.
        let mut bounds = vec![0];
        for i in 1..batch.len() {
            if coin() {
                bounds.push(i);
            }
        }
        bounds.push(batch.len());
        let ranges: Vec<_> = bounds.windows(2).map(|w| w[0]..w[1]).collect();
        let sels: Vec<Vec<i32>> = (0..groups).map(|g| run.topk_of(&cmd, g)).collect();
        for (p, r) in ranges.iter().enumerate() {
            let (topk, _, state) = &mut parts[p];
            rt.device().upload_i32(state, 0, &batch[r.clone()]).unwrap();
            for g in 0..groups {
                rt.device()
                    .upload_i32(&mut topk[g], 0, &sels[g][r.start * k..r.end * k])
                    .unwrap();
            }
        }
        for g in 0..groups {
            for (p, r) in ranges.iter().enumerate() {
                let on = if coin() { Some(side) } else { None };
                let (topk, rows, state) = &mut parts[p];
                rt.decode(LayerCall {
                    group: g,
                    swap: Swap::IndexGroup,
                    topk: TopK {
                        positions: &topk[g],
                        num_tokens: r.len() as u32,
                        state_rows: Some(state),
                    },
                    out: Indices {
                        rows: &mut rows[g],
                        counts: None,
                    },
                    on,
                })
                .unwrap();
            }
        }
        run.end(&mut rt, &cmd);
        for g in 0..groups {
            let mut out = Vec::with_capacity(batch.len() * k);
            for (p, r) in ranges.iter().enumerate() {
                out.extend(now(&parts[p].1[g], r.len() * k));
            }
            run.outputs.push(out);
        }
    }
    scenario::finish(run, rt)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Micro-batch steps, their calls on two streams, read and leave exactly what whole-batch
    /// steps on one stream do: every call's rows, both pools' bytes and every counter but the
    /// call counts.
    #[test]
    fn micro_batch_steps_match_whole_batch_steps(seed in any::<u64>(), together in any::<bool>()) {
        let shape = scenario::tight(scenario::Shape { requests: 4, together, ..SMALL });
        let whole = scenario::drive(shape, lag_runtime(&shape));
        let mut micro = drive_in_micro_batches(shape, seed);
        prop_assert!(micro.counters.resolve_calls + micro.counters.remap_calls
            >= whole.counters.resolve_calls + whole.counters.remap_calls);
        micro.counters.resolve_calls = whole.counters.resolve_calls;
        micro.counters.remap_calls = whole.counters.remap_calls;
        prop_assert!(whole.counters.hot_misses > 0, "the scenario swapped nothing in");
        if let Err(e) = scenario::same(&micro, &whole) {
            return Err(TestCaseError::fail(e));
        }
    }
}
