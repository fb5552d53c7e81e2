//! The admission queries answer what the operations then do: random coordinator states on
//! small pools (prefix hits with adopted GPU copies and copy-on-write tails, imports, sliding
//! windows, lagging workers, spills, preemption, rollback, an engine's own `start` and
//! `schedule` calls), and in each state, for every request:
//!
//! * [`Coordinator::can_schedule`] / [`Coordinator::can_start`] equal what
//!   [`Coordinator::schedule`] / [`Coordinator::start`] then return on a copy of the
//!   coordinator — the same error, or the same outcome (scheduled, wait, no space and which
//!   pool) and, when scheduled, the same number of tokens;
//! * when the answer is "scheduled without reclaiming", [`Coordinator::needs`] is exactly the
//!   GPU and host blocks the operation takes out of the free pools ([`Coordinator::free`]);
//! * a query changes nothing: the coordinator's state (its `Debug` form, every table, queue,
//!   pool and scratch) is the same before and after, and its invariants hold.
// These tests drive the planning side (layouts, the coordinator), which needs `alloc`.
#![cfg(feature = "alloc")]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use hisparse_core::coordinator::{Admission, Alloc, CoordError, Coordinator, PoolKind, RequestId};
use proptest::prelude::*;

mod common;
use common::{MAX_LEN, Params, params, setup, tokens_for};

/// Answers seen, by kind: the test fails if one never came up (it would have lost its teeth).
static SCHEDULED: AtomicU64 = AtomicU64::new(0);
static SCHEDULED_AFTER_RECLAIM: AtomicU64 = AtomicU64::new(0);
static WAIT: AtomicU64 = AtomicU64::new(0);
static NO_GPU: AtomicU64 = AtomicU64::new(0);
static NO_HOST: AtomicU64 = AtomicU64::new(0);
static START_SHRUNK: AtomicU64 = AtomicU64::new(0);
static START_HIT: AtomicU64 = AtomicU64::new(0);
static ERRORS: AtomicU64 = AtomicU64::new(0);
static NEEDS_CHECKED: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug)]
enum Op {
    Admit {
        len: u8,
        family: u8,
    },
    Import {
        len: u8,
        family: u8,
    },
    /// The built-in policy's step.
    Step,
    /// An engine's own step: `schedule` each running request (`k` tokens of what it has
    /// left), `start` the waiting head with a budget of `k`, then build the command.
    EngineStep {
        k: u8,
    },
    Sample {
        finish_len: u8,
    },
    Report {
        worker: u8,
        enq: u8,
        comp: u8,
    },
    Finish {
        pick: u8,
    },
    Preempt {
        pick: u8,
    },
    Rollback {
        pick: u8,
        n: u8,
    },
    Reclaim {
        blocks: u8,
    },
    Query {
        n: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..=36, 0u8..3).prop_map(|(len, family)| Op::Admit { len, family }),
        1 => (1u8..=36, 0u8..3).prop_map(|(len, family)| Op::Import { len, family }),
        4 => Just(Op::Step),
        2 => (1u8..=16).prop_map(|k| Op::EngineStep { k }),
        3 => (8u8..=MAX_LEN as u8).prop_map(|finish_len| Op::Sample { finish_len }),
        4 => (0u8..2, 0u8..4, 0u8..4).prop_map(|(worker, enq, comp)| Op::Report { worker, enq, comp }),
        1 => any::<u8>().prop_map(|pick| Op::Finish { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Preempt { pick }),
        1 => (any::<u8>(), 1u8..3).prop_map(|(pick, n)| Op::Rollback { pick, n }),
        1 => (1u8..16).prop_map(|blocks| Op::Reclaim { blocks }),
        3 => (1u8..=40).prop_map(|n| Op::Query { n }),
    ]
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// The tokens of request `id` the command `c` builds next schedules, and the first of them
/// (a copy is built).
fn scheduled_tokens(c: &Coordinator, id: RequestId) -> (u32, u32) {
    let mut c = c.clone();
    let cmd = c.build_offload_command();
    let mine = cmd.scheduled.iter().filter(|s| s.id == id);
    let first = mine.clone().map(|s| s.first_token).min().unwrap_or(0);
    (mine.map(|s| s.num_tokens).sum(), first)
}

fn count(answer: &Result<Admission, CoordError>) {
    let counter = match answer {
        Err(_) => &ERRORS,
        Ok(a) => match a.outcome {
            Alloc::Scheduled if a.reclaims => &SCHEDULED_AFTER_RECLAIM,
            Alloc::Scheduled => &SCHEDULED,
            Alloc::Wait => &WAIT,
            Alloc::NoSpace(PoolKind::Gpu) => &NO_GPU,
            Alloc::NoSpace(PoolKind::Host) => &NO_HOST,
        },
    };
    counter.fetch_add(1, Relaxed);
}

/// Every query about every request in `c`'s state, against the operation on a copy.
fn check_queries(c: &Coordinator, n: u32) -> Result<(), TestCaseError> {
    let before = format!("{c:?}");
    let ids: Vec<RequestId> = (1..200).filter(|&id| c.num_tokens(id).is_some()).collect();
    let free = c.free();
    for id in ids {
        let running = c.slot_of(id).is_some();
        let left = c.num_tokens(id).unwrap() - c.num_computed(id).unwrap();
        let sizes = if running {
            vec![1, n.min(left.max(1)), left, left + 1]
        } else {
            vec![1, n, 1 << 20]
        };
        for k in sizes {
            let asked = if running {
                c.can_schedule(id, k)
            } else {
                c.can_start(id, k)
            };
            let needs = c.needs(id, k);
            prop_assert_eq!(&format!("{c:?}"), &before, "a query changed the state");
            count(&asked);
            let mut op = c.clone();
            let done = if running {
                op.schedule(id, k)
            } else {
                op.start(id, k)
            };
            match (&asked, &done) {
                (Err(a), Err(d)) => prop_assert_eq!(a, d),
                (Ok(a), Ok(d)) => {
                    prop_assert_eq!(a.outcome, *d, "request {} ({} tokens): {:?}", id, k, a);
                    let got = if *d == Alloc::Scheduled {
                        scheduled_tokens(&op, id).0 - scheduled_tokens(c, id).0
                    } else {
                        0
                    };
                    prop_assert_eq!(a.tokens, got, "request {} ({} tokens)", id, k);
                    if !running && a.outcome == Alloc::Scheduled {
                        if scheduled_tokens(&op, id).1 > 0 {
                            START_HIT.fetch_add(1, Relaxed);
                        }
                        if a.tokens < k.min(left) {
                            START_SHRUNK.fetch_add(1, Relaxed);
                        }
                    }
                    if a.outcome == Alloc::Scheduled && !a.reclaims && a.tokens == k.min(left) {
                        // Nothing reclaimed, nothing shrunk: the needs are what it took.
                        let needs = needs.map_err(fail)?;
                        let after = op.free();
                        let windows = c.layout().groups.iter().any(|g| g.sliding_window.is_some());
                        if !windows {
                            prop_assert_eq!(
                                u64::from(free.gpu_blocks - after.gpu_blocks),
                                needs.gpu_blocks,
                                "request {} ({} tokens): GPU blocks taken vs needs {:?}",
                                id,
                                k,
                                needs
                            );
                        }
                        prop_assert_eq!(
                            u64::from(free.host_blocks - after.host_blocks),
                            needs.host_blocks,
                            "request {} ({} tokens): host blocks taken vs needs {:?}",
                            id,
                            k,
                            needs
                        );
                        NEEDS_CHECKED.fetch_add(1, Relaxed);
                    }
                }
                _ => prop_assert!(
                    false,
                    "request {} ({} tokens): query {:?}, operation {:?}",
                    id,
                    k,
                    asked,
                    done
                ),
            }
            op.check_invariants().map_err(fail)?;
        }
    }
    c.check_invariants().map_err(fail)?;
    prop_assert_eq!(&format!("{c:?}"), &before);
    Ok(())
}

struct Engine {
    /// Transfer ids issued, in order.
    issued: Vec<u64>,
    /// Per worker: ids enqueued / completed (counts into `issued`).
    enq: Vec<usize>,
    comp: Vec<usize>,
}

impl Engine {
    fn built(&mut self, cmd: &hisparse_core::coordinator::OffloadCommand, c: &mut Coordinator) {
        self.issued.extend(cmd.transfer_id);
        for r in &cmd.refused {
            let _ = c.finish(r.id);
        }
    }
}

fn run(p: Params, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut c = setup(&p);
    let mut e = Engine {
        issued: Vec::new(),
        enq: vec![0; p.workers as usize],
        comp: vec![0; p.workers as usize],
    };
    let mut next_id: RequestId = 1;
    let pick = |c: &Coordinator, k: u8| -> Option<RequestId> {
        let ids: Vec<RequestId> = (1..200).filter(|&id| c.num_tokens(id).is_some()).collect();
        (!ids.is_empty()).then(|| ids[k as usize % ids.len()])
    };
    for op in ops {
        match op {
            Op::Admit { len, family } => {
                let t = tokens_for(family, u32::from(len));
                if c.admit(next_id, &t).is_ok() {
                    next_id += 1;
                }
            }
            Op::Import { len, family } => {
                let len = u32::from(len);
                let mut t = tokens_for(family, len);
                t.push(7);
                if c.reserve_import(next_id, &t, len).is_ok() {
                    // A query about an import whose writes are not complete is refused like the
                    // start.
                    prop_assert_eq!(
                        c.can_start(next_id, 4).unwrap_err(),
                        c.clone().start(next_id, 4).unwrap_err()
                    );
                    c.complete_import(next_id).map_err(fail)?;
                    next_id += 1;
                }
            }
            Op::Step => {
                c.schedule_step().map_err(fail)?;
                let cmd = c.build_offload_command();
                e.built(&cmd, &mut c);
            }
            Op::EngineStep { k } => {
                let k = u32::from(k);
                let running: Vec<RequestId> = c.running_ids().collect();
                for id in running {
                    let left = c.num_tokens(id).unwrap() - c.num_computed(id).unwrap();
                    if left > 0 {
                        let _ = c.schedule(id, left.min(k));
                    }
                }
                if let Some(id) = (1..next_id).find(|&id| {
                    c.num_tokens(id).is_some() && c.slot_of(id).is_none() && c.refusal(id).is_none()
                }) {
                    let _ = c.start(id, k);
                }
                let cmd = c.build_offload_command();
                e.built(&cmd, &mut c);
            }
            Op::Sample { finish_len } => {
                let running: Vec<RequestId> = c.running_ids().collect();
                for id in running {
                    let (n, done) = (c.num_tokens(id).unwrap(), c.num_computed(id).unwrap());
                    if n == done {
                        if n >= u32::from(finish_len) || n >= MAX_LEN - p.mql {
                            c.finish(id).map_err(fail)?;
                        } else {
                            let drafts: Vec<u32> = (0..p.mql).map(|j| 5000 + n + j).collect();
                            c.append_tokens(id, &drafts).map_err(fail)?;
                        }
                    }
                }
            }
            Op::Report { worker, enq, comp } => {
                let w = worker as usize % e.enq.len();
                let ne = (e.enq[w] + enq as usize).min(e.issued.len());
                let nc = (e.comp[w] + comp as usize).min(ne);
                let enq_ids = e.issued[e.enq[w]..ne].to_vec();
                let comp_ids = e.issued[e.comp[w]..nc].to_vec();
                c.report(w as u32, &enq_ids, &comp_ids).map_err(fail)?;
                (e.enq[w], e.comp[w]) = (ne, nc);
            }
            Op::Finish { pick: k } => {
                if let Some(id) = pick(&c, k) {
                    c.finish(id).map_err(fail)?;
                }
            }
            Op::Preempt { pick: k } => {
                if let Some(id) = pick(&c, k) {
                    let _ = c.preempt(id);
                }
            }
            Op::Rollback { pick: k, n } => {
                if let Some(id) = pick(&c, k) {
                    let _ = c.rollback(id, u32::from(n));
                }
            }
            Op::Reclaim { blocks } => {
                c.reclaim_resident_blocks(u32::from(blocks));
            }
            Op::Query { n } => check_queries(&c, u32::from(n))?,
        }
        c.check_invariants().map_err(fail)?;
    }
    check_queries(&c, 3)
}

#[test]
fn admission_queries_answer_what_the_operations_do() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000u32);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    });
    runner
        .run(
            &(params(), prop::collection::vec(op(), 1..80)),
            |(p, ops)| run(p, ops),
        )
        .unwrap();
    let counts = [
        ("scheduled", &SCHEDULED),
        ("scheduled after a reclaim", &SCHEDULED_AFTER_RECLAIM),
        ("wait", &WAIT),
        ("no GPU space", &NO_GPU),
        ("no host space", &NO_HOST),
        ("a start's first chunk shrunk", &START_SHRUNK),
        ("a start after a prefix hit (or an import)", &START_HIT),
        ("an error", &ERRORS),
        ("needs checked against what was taken", &NEEDS_CHECKED),
    ];
    let seen: Vec<(&str, u64)> = counts.iter().map(|(w, c)| (*w, c.load(Relaxed))).collect();
    println!("answers over {cases} sequences: {seen:?}");
    if cases >= 500 {
        for (what, n) in seen {
            assert!(
                n > 0,
                "no {what} in {cases} sequences: the test lost its teeth"
            );
        }
    }
}
