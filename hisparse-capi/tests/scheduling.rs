//! Engine-driven scheduling through the C API: an engine's own scheduler (first come first
//! served within a token budget, preempting the newest running request when memory runs out)
//! drives requests to completion with `hs_coordinator_start`, `hs_coordinator_schedule`,
//! `hs_coordinator_preempt` and `hs_coordinator_build_offload_command`; the answers of each call
//! on states built to produce them; rollbacks, imports and worker reports.

// The `c!` macro wraps each C call in `unsafe`: the tests are C callers.
#![allow(clippy::macro_metavars_in_unsafe)]

mod common;

use std::collections::VecDeque;
use std::ptr;

use common::*;
use hisparse_capi::*;

/// What one driven run saw.
#[derive(Debug, Default)]
struct Seen {
    steps: u64,
    preemptions: u64,
    no_space: u64,
    waits: u64,
    resolve_calls: u64,
}

/// An engine's scheduler over the coordinator: running requests first (oldest first), each its
/// remaining tokens within the step's budget; on no space, the newest running request is
/// preempted (possibly the one asking); then waiting requests in arrival order.
struct Engine {
    coord: *mut HsCoordinator,
    budget: u32,
    max_running: usize,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
}

impl Engine {
    fn tokens(&self, id: u64) -> (u32, u32) {
        let (mut n, mut computed) = (0, 0);
        ok!(hs_coordinator_num_tokens(self.coord, id, &mut n));
        ok!(hs_coordinator_num_computed(self.coord, id, &mut computed));
        (n, computed)
    }

    fn preempt_newest(&mut self, seen: &mut Seen) -> u64 {
        let victim = self.running.pop().expect("a running request to preempt");
        ok!(hs_coordinator_preempt(self.coord, victim));
        self.waiting.push_front(victim);
        seen.preemptions += 1;
        victim
    }

    /// Schedules one step and returns its command.
    fn step(&mut self, seen: &mut Seen) -> *mut HsCommand {
        let mut budget = self.budget;
        let mut pressed = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let (n, computed) = self.tokens(id);
            let want = (n - computed).min(budget);
            if want == 0 {
                i += 1;
                continue;
            }
            let mut outcome = HsAlloc::Wait;
            ok!(hs_coordinator_schedule(self.coord, id, want, &mut outcome));
            match outcome {
                HsAlloc::Scheduled => {
                    budget -= want;
                    i += 1;
                }
                HsAlloc::Wait => {
                    seen.waits += 1;
                    pressed = true;
                    i += 1;
                }
                HsAlloc::NoSpaceGpu | HsAlloc::NoSpaceHost => {
                    seen.no_space += 1;
                    pressed = true;
                    // `running[i]` is the next request when the victim was this one.
                    self.preempt_newest(seen);
                }
            }
        }
        while !pressed && budget > 0 && self.running.len() < self.max_running {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let mut outcome = HsAlloc::Wait;
            ok!(hs_coordinator_start(self.coord, id, budget, &mut outcome));
            if outcome != HsAlloc::Scheduled {
                break;
            }
            self.waiting.pop_front();
            self.running.push(id);
            // Without prefix caching a start computes from token 0: the chunk is what is
            // computed now.
            budget -= self.tokens(id).1;
        }
        let mut cmd = ptr::null_mut();
        ok!(hs_coordinator_build_offload_command(self.coord, &mut cmd));
        cmd
    }
}

/// Runs `requests` prompts of `prompt` tokens, each decoding to `total` tokens, through the
/// engine and a CPU runtime; every step's command executed, every report applied.
fn drive(gpu_blocks: u32, requests: u64, prompt: u32, total: u32, budget: u32) -> Seen {
    let layout = tiny_layout(gpu_blocks, 4 * 64, 256, 1);
    let info = layout_info(layout);
    let max_running = requests as u32;
    let coord = coordinator(layout, max_running);
    let rt = cpu_runtime(layout, max_running, budget);
    let mut engine = Engine {
        coord,
        budget,
        max_running: max_running as usize,
        waiting: VecDeque::new(),
        running: Vec::new(),
    };
    for id in 1..=requests {
        let tokens: Vec<u32> = (0..prompt).map(|t| t + 1000 * id as u32).collect();
        ok!(hs_coordinator_admit(
            coord,
            id,
            tokens.as_ptr(),
            tokens.len()
        ));
        engine.waiting.push_back(id);
    }
    let mut topk_buf = ptr::null_mut();
    let mut rows_buf = ptr::null_mut();
    let entries = (budget * TOP_K) as usize;
    ok!(hs_buffer_alloc(rt, entries * 4, &mut topk_buf));
    ok!(hs_buffer_alloc(rt, entries * 4, &mut rows_buf));
    let mut seen = Seen::default();
    let mut finished = 0;
    while finished < requests {
        seen.steps += 1;
        assert!(seen.steps < 2000, "no progress: {seen:?}");
        let cmd = engine.step(&mut seen);
        ok!(hs_runtime_begin_step(rt, cmd, ptr::null_mut()));
        // One token row per scheduled request (its last token): the decode query.
        let sched = scheduled(cmd);
        let slots: Vec<i32> = sched.iter().map(|s| s.slot as i32).collect();
        ok!(hs_runtime_set_batch(
            rt,
            slots.as_ptr(),
            slots.len(),
            0,
            ptr::null_mut()
        ));
        let topk: Vec<i32> = sched
            .iter()
            .flat_map(|s| {
                let end = s.first_token + s.num_tokens;
                (0..TOP_K).map(move |j| ((j * 7 + end) % end) as i32)
            })
            .collect();
        ok!(hs_buffer_upload_i32(
            rt,
            topk_buf,
            0,
            topk.as_ptr(),
            topk.len()
        ));
        for g in 0..info.num_index_groups as usize {
            ok!(hs_runtime_resolve_index_group(
                rt,
                g,
                topk_buf,
                sched.len() as u32,
                rows_buf,
                ptr::null_mut(),
                ptr::null_mut()
            ));
            seen.resolve_calls += 1;
        }
        ok!(hs_runtime_end_step(rt, cmd, ptr::null_mut()));
        let mut report = ptr::null_mut();
        ok!(hs_runtime_poll(rt, &mut report));
        ok!(hs_coordinator_apply_report(coord, report));
        c!(hs_report_free(report));
        c!(hs_command_free(cmd));
        let mut done = Vec::new();
        for &id in &engine.running {
            let (n, computed) = engine.tokens(id);
            if computed < n {
                continue;
            }
            if n >= total {
                ok!(hs_coordinator_finish(coord, id));
                done.push(id);
            } else {
                ok!(hs_coordinator_append_tokens(coord, id, &7, 1));
            }
        }
        engine.running.retain(|id| !done.contains(id));
        finished += done.len() as u64;
        ok!(hs_coordinator_check_invariants(coord));
    }
    let mut report = ptr::null_mut();
    ok!(hs_runtime_drain_report(rt, &mut report));
    ok!(hs_coordinator_apply_report(coord, report));
    c!(hs_report_free(report));
    let mut empty = false;
    ok!(hs_coordinator_is_empty(coord, &mut empty));
    assert!(empty);
    let mut usage = HsPoolUsage::default();
    ok!(hs_coordinator_pool_usage(coord, &mut usage));
    assert_eq!(
        (usage.gpu_used, usage.host_used),
        (0, 0),
        "every block back once every request finished and the transfers drained: {usage:?}"
    );
    ok!(hs_coordinator_check_drained(coord));
    c!(hs_buffer_free(topk_buf));
    c!(hs_buffer_free(rows_buf));
    c!(hs_runtime_free(rt));
    c!(hs_coordinator_free(coord));
    c!(hs_layout_free(layout));
    seen
}

#[test]
fn an_engine_with_its_own_scheduler_runs_every_request_to_the_end() {
    let seen = drive(200, 3, 40, 56, 64);
    assert_eq!(seen.preemptions, 0, "{seen:?}");
    assert!(seen.resolve_calls > 0);
}

#[test]
fn an_engine_preempts_a_request_of_its_choice_when_the_pool_is_short() {
    // Two requests of 8 pages (4 GPU blocks each: an indexer page and three resident ones)
    // cannot both hold their pages in 40 usable blocks while nothing is durable yet.
    let seen = drive(41, 2, 100, 120, 256);
    assert!(seen.no_space > 0 && seen.preemptions > 0, "{seen:?}");
}

#[test]
fn start_and_schedule_answer_what_they_did() {
    // 25 usable GPU blocks: a 96-token prompt (6 pages) takes 24 of them.
    let w = World::new(tiny_layout(26, 4 * 64, 128, 1), 4, 1);
    let coord = w.coord;
    let prompt: Vec<u32> = (0..96).collect();
    for id in [1, 2] {
        ok!(hs_coordinator_admit(
            coord,
            id,
            prompt.as_ptr(),
            prompt.len()
        ));
    }
    let mut outcome = HsAlloc::Wait;
    ok!(hs_coordinator_start(coord, 1, 96, &mut outcome));
    assert_eq!(outcome, HsAlloc::Scheduled);
    // One block left and nothing in flight: no space, and the request stays waiting.
    ok!(hs_coordinator_start(coord, 2, 96, &mut outcome));
    assert_eq!(outcome, HsAlloc::NoSpaceGpu);
    let (mut waiting, mut running) = (0, 0);
    ok!(hs_coordinator_num_waiting(coord, &mut waiting));
    ok!(hs_coordinator_num_running(coord, &mut running));
    assert_eq!((waiting, running), (1, 1));
    // A running request with no tokens left to compute: a typed refusal naming the counts.
    expect_error(
        c!(hs_coordinator_schedule(coord, 1, 1, &mut outcome)),
        HsStatus::InvalidArgument,
        "1",
    );
    // Starting a running request, scheduling a waiting one: refused.
    expect_error(
        c!(hs_coordinator_start(coord, 1, 8, &mut outcome)),
        HsStatus::InvalidArgument,
        "not running",
    );
    expect_error(
        c!(hs_coordinator_schedule(coord, 2, 8, &mut outcome)),
        HsStatus::InvalidArgument,
        "not running",
    );
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_build_offload_command(coord, &mut cmd));
    let sched = scheduled(cmd);
    assert_eq!(sched.len(), 1);
    assert_eq!(
        (sched[0].id, sched[0].first_token, sched[0].num_tokens),
        (1, 0, 96)
    );
    let mut slot = u32::MAX;
    ok!(hs_coordinator_slot_of(coord, 1, &mut slot));
    assert_eq!(slot, sched[0].slot);
    expect_error(
        c!(hs_coordinator_slot_of(coord, 2, &mut slot)),
        HsStatus::InvalidArgument,
        "request 2",
    );
    // The engine's choice: preempt 1 so that 2 can start. Its blocks come back once the copy
    // of its rows to host (this step's transfer batch) is complete: until then, wait.
    let transfer = command_info(cmd).transfer_id;
    assert!(command_info(cmd).has_transfer);
    c!(hs_command_free(cmd));
    ok!(hs_coordinator_append_tokens(coord, 1, &5, 1));
    ok!(hs_coordinator_preempt(coord, 1));
    ok!(hs_coordinator_start(coord, 2, 96, &mut outcome));
    assert_eq!(outcome, HsAlloc::Wait);
    ok!(hs_coordinator_build_offload_command(coord, &mut cmd));
    let mut preempted = [0u64; 1];
    let mut count = 0;
    ok!(hs_command_preempted(
        cmd,
        preempted.as_mut_ptr(),
        1,
        &mut count
    ));
    assert_eq!((count, preempted[0]), (1, 1));
    assert_eq!(command_info(cmd).num_scheduled, 0);
    c!(hs_command_free(cmd));
    ok!(hs_coordinator_report(coord, 0, &transfer, 1, &transfer, 1));
    ok!(hs_coordinator_start(coord, 2, 96, &mut outcome));
    assert_eq!(outcome, HsAlloc::Scheduled);
    ok!(hs_coordinator_build_offload_command(coord, &mut cmd));
    assert_eq!(scheduled(cmd)[0].id, 2);
    let mut ids = [0u64; 4];
    ok!(hs_coordinator_running_ids(
        coord,
        ids.as_mut_ptr(),
        ids.len(),
        &mut count
    ));
    assert_eq!(&ids[..count], &[2]);
    c!(hs_command_free(cmd));
    ok!(hs_coordinator_check_invariants(coord));
    // Requests still known: not drained, and the check says what it found first.
    expect_error(
        c!(hs_coordinator_check_drained(coord)),
        HsStatus::Internal,
        "not finished",
    );
}

#[test]
fn the_built_in_step_is_kept_beside_the_engines_calls() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 4, 1);
    let coord = w.coord;
    let prompt: Vec<u32> = (0..40).collect();
    ok!(hs_coordinator_admit(
        coord,
        1,
        prompt.as_ptr(),
        prompt.len()
    ));
    ok!(hs_coordinator_admit(
        coord,
        2,
        prompt.as_ptr(),
        prompt.len()
    ));
    let mut summary = HsStepSummary::default();
    ok!(hs_coordinator_schedule_step(coord, &mut summary));
    assert_eq!(
        (summary.scheduled, summary.started, summary.tokens),
        (2, 2, 80)
    );
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_build_offload_command(coord, &mut cmd));
    assert_eq!(command_info(cmd).num_scheduled, 2);
    c!(hs_command_free(cmd));
    ok!(hs_coordinator_append_tokens(coord, 1, &9, 1));
    ok!(hs_coordinator_step(coord, &mut cmd));
    let sched = scheduled(cmd);
    assert_eq!(sched.len(), 1);
    assert_eq!(
        (sched[0].id, sched[0].first_token, sched[0].num_tokens),
        (1, 40, 1)
    );
    c!(hs_command_free(cmd));
}

#[test]
fn rollback_gives_back_rejected_speculative_tokens() {
    // One draft token per step: max_query_len 2.
    let w = World::new(tiny_layout(200, 4 * 64, 256, 2), 2, 1);
    let coord = w.coord;
    w.admit(1, 40);
    let mut outcome = HsAlloc::Wait;
    ok!(hs_coordinator_start(coord, 1, 64, &mut outcome));
    assert_eq!(outcome, HsAlloc::Scheduled);
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_build_offload_command(coord, &mut cmd));
    c!(hs_command_free(cmd));
    // The sampled token and one draft, computed together.
    ok!(hs_coordinator_append_tokens(coord, 1, [5, 6].as_ptr(), 2));
    ok!(hs_coordinator_schedule(coord, 1, 2, &mut outcome));
    assert_eq!(outcome, HsAlloc::Scheduled);
    ok!(hs_coordinator_build_offload_command(coord, &mut cmd));
    c!(hs_command_free(cmd));
    // Giving back two computed tokens reaches the step's first token: refused, nothing changed.
    expect_error(
        c!(hs_coordinator_rollback(coord, 1, 2)),
        HsStatus::InvalidArgument,
        "request 1",
    );
    let mut computed = 0;
    ok!(hs_coordinator_num_computed(coord, 1, &mut computed));
    assert_eq!(computed, 42);
    // The draft was rejected.
    ok!(hs_coordinator_rollback(coord, 1, 1));
    ok!(hs_coordinator_num_computed(coord, 1, &mut computed));
    assert_eq!(computed, 41);
    let mut n = 0;
    ok!(hs_coordinator_num_tokens(coord, 1, &mut n));
    assert_eq!(n, 41);
    ok!(hs_coordinator_check_invariants(coord));
}

#[test]
fn an_import_names_its_host_blocks_and_starts_once_complete() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 1);
    let coord = w.coord;
    let tokens: Vec<u32> = (0..41).collect();
    ok!(hs_coordinator_reserve_import(
        coord,
        9,
        tokens.as_ptr(),
        tokens.len(),
        40
    ));
    // The size first, then the blocks: 40 tokens are 3 pages of 16.
    let mut count = 0;
    ok!(hs_coordinator_import_blocks(
        coord,
        9,
        ptr::null_mut(),
        0,
        &mut count
    ));
    assert_eq!(count, 3);
    let mut blocks = [0u32; 3];
    expect_error(
        c!(hs_coordinator_import_blocks(
            coord,
            9,
            blocks.as_mut_ptr(),
            2,
            &mut count
        )),
        HsStatus::BufferTooSmall,
        "at least 3",
    );
    assert_eq!(
        (count, blocks),
        (3, [0; 3]),
        "a refused copy writes only the size"
    );
    ok!(hs_coordinator_import_blocks(
        coord,
        9,
        blocks.as_mut_ptr(),
        3,
        &mut count
    ));
    assert!(blocks.iter().all(|&b| b > 0), "{blocks:?}");
    // Not queued, and not startable, before its writes are complete.
    let mut waiting = 0;
    ok!(hs_coordinator_num_waiting(coord, &mut waiting));
    assert_eq!(waiting, 0);
    let mut outcome = HsAlloc::Wait;
    expect_error(
        c!(hs_coordinator_start(coord, 9, 8, &mut outcome)),
        HsStatus::InvalidArgument,
        "complete_import",
    );
    ok!(hs_coordinator_complete_import(coord, 9));
    ok!(hs_coordinator_num_waiting(coord, &mut waiting));
    assert_eq!(waiting, 1);
    expect_error(
        c!(hs_coordinator_import_blocks(
            coord,
            9,
            blocks.as_mut_ptr(),
            3,
            &mut count
        )),
        HsStatus::InvalidArgument,
        "no import",
    );
    expect_error(
        c!(hs_coordinator_complete_import(coord, 9)),
        HsStatus::InvalidArgument,
        "request 9",
    );
    ok!(hs_coordinator_start(coord, 9, 8, &mut outcome));
    assert_eq!(outcome, HsAlloc::Scheduled);
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_build_offload_command(coord, &mut cmd));
    let sched = scheduled(cmd);
    assert_eq!(
        (sched[0].id, sched[0].first_token, sched[0].num_tokens),
        (9, 40, 1)
    );
    c!(hs_command_free(cmd));
}

#[test]
fn a_workers_report_reaches_the_coordinator_whole() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 64);
    let (coord, rt) = (w.coord, w.rt);
    w.admit(1, 40);
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_step(coord, &mut cmd));
    let info = command_info(cmd);
    assert!(info.has_transfer, "a prefill mirrors its rows to host");
    ok!(hs_runtime_begin_step(rt, cmd, ptr::null_mut()));
    ok!(hs_runtime_end_step(rt, cmd, ptr::null_mut()));
    let mut report = ptr::null_mut();
    ok!(hs_runtime_drain_report(rt, &mut report));
    let mut r = HsReportInfo::default();
    ok!(hs_report_info(report, &mut r));
    assert_eq!((r.worker, r.num_enqueued, r.num_completed), (0, 1, 1));
    let (mut enqueued, mut completed, mut count) = ([0u64; 1], [0u64; 1], 0);
    ok!(hs_report_enqueued(
        report,
        enqueued.as_mut_ptr(),
        1,
        &mut count
    ));
    ok!(hs_report_completed(
        report,
        completed.as_mut_ptr(),
        1,
        &mut count
    ));
    assert_eq!(
        (enqueued[0], completed[0]),
        (info.transfer_id, info.transfer_id)
    );
    ok!(hs_coordinator_apply_report(coord, report));
    // Applying the same report twice is a transfer-order error, not a silent success.
    assert_eq!(
        c!(hs_coordinator_apply_report(coord, report)),
        HsStatus::InvalidArgument
    );
    c!(hs_report_free(report));
    c!(hs_command_free(cmd));
}

#[test]
fn handles_move_between_threads_one_call_at_a_time() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 64);
    let (coord, rt) = (w.coord, w.rt);
    w.admit(1, 40);
    // Each step on a thread of its own: an engine's worker threads take turns.
    let (coord_addr, rt_addr) = (coord as usize, rt as usize);
    for _ in 0..4 {
        std::thread::spawn(move || {
            let (coord, rt) = (coord_addr as *mut HsCoordinator, rt_addr as *mut HsRuntime);
            let mut cmd = ptr::null_mut();
            ok!(hs_coordinator_step(coord, &mut cmd));
            ok!(hs_runtime_begin_step(rt, cmd, ptr::null_mut()));
            ok!(hs_runtime_end_step(rt, cmd, ptr::null_mut()));
            ok!(hs_runtime_poll_and_report(rt, coord, ptr::null_mut()));
            c!(hs_command_free(cmd));
            ok!(hs_coordinator_append_tokens(coord, 1, &3, 1));
        })
        .join()
        .unwrap();
    }
    let mut computed = 0;
    ok!(hs_coordinator_num_computed(coord, 1, &mut computed));
    assert_eq!(computed, 43);
}
