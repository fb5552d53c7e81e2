//! The admission queries through the C API answer what the operations then do, change nothing,
//! and a request refused while a step is scheduled is reported (in the command and by the
//! coordinator) while the step goes on for the others.

// The `c!` macro wraps each C call in `unsafe`: the tests are C callers.
#![allow(clippy::macro_metavars_in_unsafe)]

mod common;

use std::ptr;

use common::*;
use hisparse_capi::*;

fn tier_free(c: *const HsCoordinator) -> HsTierFree {
    let mut f = HsTierFree::default();
    ok!(hs_coordinator_tier_free(c, &mut f));
    f
}

fn admission(
    query: unsafe extern "C" fn(*const HsCoordinator, u64, u32, *mut HsAdmission) -> HsStatus,
    c: *const HsCoordinator,
    id: u64,
    n: u32,
) -> HsAdmission {
    let mut a = HsAdmission {
        outcome: HsAlloc::Wait,
        tokens: u32::MAX,
        reclaims: true,
    };
    ok!(query(c, id, n, &mut a));
    a
}

#[test]
fn the_queries_answer_what_start_and_schedule_then_do() {
    // 25 usable GPU blocks; 4 per page; prompts of 6 pages: the second start finds no space.
    let w = World::new(tiny_layout(26, 4 * 64, 128, 1), 4, 1);
    let coord = w.coord;
    let prompt: Vec<u32> = (0..90).collect();
    for id in [1, 2] {
        ok!(hs_coordinator_admit(
            coord,
            id,
            prompt.as_ptr(),
            prompt.len()
        ));
    }
    let before = tier_free(coord);
    assert_eq!(
        (before.rows, before.gpu_blocks, before.gpu_capacity),
        (4, 25, 25)
    );
    let mut needs = HsNeeds::default();
    ok!(hs_coordinator_needs(coord, 1, 64, &mut needs));
    // A start takes host blocks for its whole prompt, GPU blocks for its first chunk.
    assert_eq!(
        (needs.tokens, needs.gpu_blocks, needs.host_blocks),
        (64, 16, 6)
    );
    assert_eq!((needs.context_tokens, needs.context_host_blocks), (90, 6));

    let asked = admission(hs_coordinator_can_start, coord, 1, 64);
    assert_eq!(
        (asked.outcome, asked.tokens, asked.reclaims),
        (HsAlloc::Scheduled, 64, false)
    );
    assert_eq!(tier_free(coord).gpu_blocks, 25, "a query changes nothing");
    let mut outcome = HsAlloc::Wait;
    ok!(hs_coordinator_start(coord, 1, 64, &mut outcome));
    assert_eq!(outcome, asked.outcome);
    let after = tier_free(coord);
    assert_eq!(
        (after.rows, u64::from(after.gpu_blocks)),
        (3, 25 - needs.gpu_blocks),
        "the blocks the query said it needs, no more"
    );
    // The rest of the prompt (2 more pages): whatever the answer, the operation gives it.
    let asked = admission(hs_coordinator_can_schedule, coord, 1, 26);
    ok!(hs_coordinator_schedule(coord, 1, 26, &mut outcome));
    assert_eq!(outcome, asked.outcome);
    assert_eq!(
        asked.tokens,
        if outcome == HsAlloc::Scheduled { 26 } else { 0 }
    );
    // Request 2 finds no space, and says so before the start does.
    let asked = admission(hs_coordinator_can_start, coord, 2, 64);
    assert_eq!((asked.outcome, asked.tokens), (HsAlloc::NoSpaceGpu, 0));
    ok!(hs_coordinator_start(coord, 2, 64, &mut outcome));
    assert_eq!(outcome, HsAlloc::NoSpaceGpu);
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_build_offload_command(coord, &mut cmd));
    let sched = scheduled(cmd);
    assert_eq!(sched.iter().map(|s| s.num_tokens).sum::<u32>(), 64 + 26);
    c!(hs_command_free(cmd));
    // Queries refuse what the operations refuse.
    let mut a = admission(hs_coordinator_can_start, coord, 2, 1);
    expect_error(
        c!(hs_coordinator_can_schedule(coord, 2, 1, &mut a)),
        HsStatus::InvalidArgument,
        "not running",
    );
    expect_error(
        c!(hs_coordinator_needs(coord, 99, 1, &mut needs)),
        HsStatus::InvalidArgument,
        "99",
    );
    ok!(hs_coordinator_check_invariants(coord));
}

/// One sparse layer of 16-byte rows, 4-token blocks, top-k 4: a page costs 2 GPU blocks.
const ONE_LAYER: &std::ffi::CStr = c"{\"name\": \"one-layer\", \"block_tokens\": 4, \"top_k\": 4, \"layers\": [\
{\"sparse\": {\"row_bytes\": 16, \"value_bytes\": 16, \"compress_ratio\": 1, \"indexer_row_bytes\": 16}}]}";

#[test]
fn a_request_refused_while_scheduling_is_reported_and_the_step_goes_on() {
    let mut o = std::mem::MaybeUninit::<HsLayoutOptions>::uninit();
    ok!(hs_layout_options_default(o.as_mut_ptr()));
    // SAFETY: written by the successful call.
    let mut o = unsafe { o.assume_init() };
    o.model_json = ONE_LAYER.as_ptr();
    o.gpu_mem = 0;
    o.host_mem = 64 * 64;
    o.max_model_len = 48;
    o.num_gpu_blocks = 17;
    let mut layout = ptr::null_mut();
    ok!(hs_layout_plan(&o, &mut layout));
    let mut cc = std::mem::MaybeUninit::<HsCoordinatorConfig>::uninit();
    ok!(hs_coordinator_config_default(cc.as_mut_ptr()));
    // SAFETY: written by the successful call.
    let cc = unsafe { cc.assume_init() };
    let mut coord = ptr::null_mut();
    ok!(hs_coordinator_new(layout, &cc, &mut coord));
    let step = |coord: *mut HsCoordinator| {
        let mut cmd = ptr::null_mut();
        ok!(hs_coordinator_step(coord, &mut cmd));
        let info = command_info(cmd);
        if info.has_transfer {
            ok!(hs_coordinator_report(
                coord,
                0,
                &info.transfer_id,
                1,
                &info.transfer_id,
                1
            ));
        }
        cmd
    };
    let grow = |coord: *mut HsCoordinator, id: u64| {
        let (mut n, mut computed) = (0, 0);
        ok!(hs_coordinator_num_tokens(coord, id, &mut n));
        ok!(hs_coordinator_num_computed(coord, id, &mut computed));
        if n == computed {
            ok!(hs_coordinator_append_tokens(coord, id, &7, 1));
        }
        n
    };
    // Request 1 grows past what a prefill could hold on the GPU, then is preempted: its
    // restart recomputes a context the pool can never stage.
    let prompt: Vec<u32> = (0..8).collect();
    ok!(hs_coordinator_admit(
        coord,
        1,
        prompt.as_ptr(),
        prompt.len()
    ));
    while grow(coord, 1) < 40 {
        c!(hs_command_free(step(coord)));
    }
    ok!(hs_coordinator_preempt(coord, 1));
    let short: Vec<u32> = (100..104).collect();
    ok!(hs_coordinator_admit(coord, 2, short.as_ptr(), short.len()));
    let mut refused = None;
    for _ in 0..20 {
        let cmd = step(coord);
        let info = command_info(cmd);
        if info.num_refused > 0 {
            assert_eq!(info.num_refused, 1);
            let mut r = std::mem::MaybeUninit::<HsRefusedRequest>::uninit();
            ok!(hs_command_refused(cmd, 0, r.as_mut_ptr()));
            // SAFETY: written by the successful call.
            refused = Some(unsafe { r.assume_init() });
            assert!(scheduled(cmd).iter().all(|s| s.id != 1));
            c!(hs_command_free(cmd));
            break;
        }
        c!(hs_command_free(cmd));
        grow(coord, 2);
    }
    let r = refused.expect("request 1 was never refused");
    assert_eq!((r.id, r.reason), (1, HsRefusal::PrefillNeverFits));
    assert!(r.needed > r.capacity && r.capacity == 16, "{r:?}");
    let mut again = std::mem::MaybeUninit::<HsRefusedRequest>::uninit();
    let mut was = false;
    ok!(hs_coordinator_refusal(
        coord,
        1,
        again.as_mut_ptr(),
        &mut was
    ));
    // SAFETY: written by the successful call (`was` says so).
    assert!(was && unsafe { again.assume_init() }.needed == r.needed);
    ok!(hs_coordinator_refusal(
        coord,
        2,
        again.as_mut_ptr(),
        &mut was
    ));
    assert!(!was);
    let mut outcome = HsAlloc::Wait;
    expect_error(
        c!(hs_coordinator_schedule(coord, 1, 1, &mut outcome)),
        HsStatus::InvalidArgument,
        "refused",
    );
    ok!(hs_coordinator_finish(coord, 1));
    ok!(hs_coordinator_check_invariants(coord));
    c!(hs_coordinator_free(coord));
    c!(hs_layout_free(layout));
}
