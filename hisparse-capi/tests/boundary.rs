//! The C boundary refuses what it cannot use: NULL pointers (a typed status naming the
//! argument), lengths no array can have, output arrays too small (the size and nothing else),
//! sizes beyond memory (refused before anything is allocated), status numbers that are no
//! status — and frees accept NULL.

// The `c!` macro wraps each C call in `unsafe`: the tests are C callers.
#![allow(clippy::macro_metavars_in_unsafe)]

mod common;

use std::ffi::CStr;
use std::ptr;

use common::*;
use hisparse_capi::*;

fn null_refused(status: HsStatus, arg: &str) {
    expect_error(status, HsStatus::NullArgument, &format!("`{arg}` is NULL"));
}

#[test]
fn a_null_handle_or_output_is_a_typed_status_naming_the_argument() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 4);
    let (layout, coord, rt) = (w.layout, w.coord, w.rt);
    let null_c: *mut HsCoordinator = ptr::null_mut();
    let mut outcome = HsAlloc::Wait;
    let (mut n32, mut nsize, mut id) = (0u32, 0usize, 0u64);
    let mut cmd: *mut HsCommand = ptr::null_mut();
    let mut report: *mut HsReport = ptr::null_mut();

    // Layouts.
    null_refused(c!(hs_layout_options_default(ptr::null_mut())), "options");
    null_refused(c!(hs_layout_plan(ptr::null(), ptr::null_mut())), "options");
    null_refused(c!(hs_layout_info(ptr::null(), ptr::null_mut())), "layout");
    null_refused(c!(hs_layout_info(layout, ptr::null_mut())), "out");

    // Coordinators: the handle, then each output.
    null_refused(c!(hs_coordinator_config_default(ptr::null_mut())), "config");
    null_refused(
        c!(hs_coordinator_new(layout, ptr::null(), ptr::null_mut())),
        "config",
    );
    null_refused(
        c!(hs_coordinator_admit(null_c, 1, [1].as_ptr(), 1)),
        "coordinator",
    );
    null_refused(c!(hs_coordinator_admit(coord, 1, ptr::null(), 1)), "prompt");
    null_refused(
        c!(hs_coordinator_start(null_c, 1, 1, &mut outcome)),
        "coordinator",
    );
    null_refused(
        c!(hs_coordinator_start(coord, 1, 1, ptr::null_mut())),
        "outcome",
    );
    null_refused(
        c!(hs_coordinator_schedule(coord, 1, 1, ptr::null_mut())),
        "outcome",
    );
    null_refused(
        c!(hs_coordinator_schedule(null_c, 1, 1, &mut outcome)),
        "coordinator",
    );
    null_refused(
        c!(hs_coordinator_build_offload_command(null_c, &mut cmd)),
        "coordinator",
    );
    null_refused(
        c!(hs_coordinator_build_offload_command(coord, ptr::null_mut())),
        "out",
    );
    null_refused(c!(hs_coordinator_step(coord, ptr::null_mut())), "out");
    null_refused(
        c!(hs_coordinator_schedule_step(null_c, ptr::null_mut())),
        "coordinator",
    );
    null_refused(c!(hs_coordinator_rollback(null_c, 1, 1)), "coordinator");
    null_refused(c!(hs_coordinator_preempt(null_c, 1)), "coordinator");
    null_refused(c!(hs_coordinator_finish(null_c, 1)), "coordinator");
    null_refused(
        c!(hs_coordinator_append_tokens(coord, 1, ptr::null(), 2)),
        "tokens",
    );
    null_refused(
        c!(hs_coordinator_append_token_by_slot(null_c, 0, 1, &mut id)),
        "coordinator",
    );
    null_refused(
        c!(hs_coordinator_reserve_import(coord, 5, ptr::null(), 3, 1)),
        "tokens",
    );
    null_refused(
        c!(hs_coordinator_import_blocks(
            null_c,
            5,
            ptr::null_mut(),
            0,
            &mut nsize
        )),
        "coordinator",
    );
    null_refused(c!(hs_coordinator_complete_import(null_c, 5)), "coordinator");
    null_refused(
        c!(hs_coordinator_report(
            coord,
            0,
            ptr::null(),
            1,
            ptr::null(),
            0
        )),
        "enqueued",
    );
    null_refused(
        c!(hs_coordinator_num_tokens(coord, 1, ptr::null_mut())),
        "out",
    );
    null_refused(
        c!(hs_coordinator_num_computed(null_c, 1, &mut n32)),
        "coordinator",
    );
    null_refused(
        c!(hs_coordinator_slot_of(null_c, 1, &mut n32)),
        "coordinator",
    );
    null_refused(
        c!(hs_coordinator_num_waiting(coord, ptr::null_mut())),
        "out",
    );
    null_refused(
        c!(hs_coordinator_num_running(null_c, &mut nsize)),
        "coordinator",
    );
    null_refused(
        c!(hs_coordinator_running_ids(
            coord,
            ptr::null_mut(),
            0,
            ptr::null_mut()
        )),
        "count",
    );
    null_refused(
        c!(hs_coordinator_running_ids(
            coord,
            ptr::null_mut(),
            4,
            &mut nsize
        )),
        "out",
    );
    null_refused(c!(hs_coordinator_pool_usage(coord, ptr::null_mut())), "out");
    null_refused(c!(hs_coordinator_is_empty(coord, ptr::null_mut())), "out");
    null_refused(
        c!(hs_coordinator_block_table_row(
            coord,
            1,
            0,
            ptr::null_mut(),
            4
        )),
        "out",
    );
    null_refused(
        c!(hs_coordinator_hot_row(null_c, 1, 0, ptr::null_mut(), 0)),
        "coordinator",
    );
    null_refused(c!(hs_coordinator_check_invariants(null_c)), "coordinator");
    null_refused(
        c!(hs_coordinator_apply_report(coord, ptr::null())),
        "report",
    );

    // Commands and reports.
    ok!(hs_coordinator_step(coord, &mut cmd));
    null_refused(c!(hs_command_info(ptr::null(), ptr::null_mut())), "command");
    null_refused(c!(hs_command_info(cmd, ptr::null_mut())), "out");
    null_refused(c!(hs_command_scheduled(cmd, 0, ptr::null_mut())), "out");
    null_refused(
        c!(hs_command_preempted(
            cmd,
            ptr::null_mut(),
            0,
            ptr::null_mut()
        )),
        "count",
    );
    null_refused(c!(hs_runtime_poll(rt, ptr::null_mut())), "out");
    null_refused(c!(hs_runtime_poll(ptr::null_mut(), &mut report)), "runtime");
    null_refused(c!(hs_runtime_drain_report(rt, ptr::null_mut())), "out");
    ok!(hs_runtime_poll(rt, &mut report));
    null_refused(c!(hs_report_info(report, ptr::null_mut())), "out");
    null_refused(
        c!(hs_report_enqueued(
            ptr::null(),
            ptr::null_mut(),
            0,
            &mut nsize
        )),
        "report",
    );
    null_refused(
        c!(hs_report_completed(
            report,
            ptr::null_mut(),
            0,
            ptr::null_mut()
        )),
        "count",
    );

    // Runtimes and buffers.
    null_refused(c!(hs_runtime_config_default(ptr::null_mut())), "config");
    null_refused(
        c!(hs_runtime_begin_step(rt, ptr::null(), ptr::null_mut())),
        "command",
    );
    null_refused(
        c!(hs_runtime_end_step(ptr::null_mut(), cmd, ptr::null_mut())),
        "runtime",
    );
    null_refused(
        c!(hs_runtime_set_batch(rt, ptr::null(), 1, 0, ptr::null_mut())),
        "state_rows",
    );
    null_refused(c!(hs_runtime_counters(rt, ptr::null_mut())), "out");
    null_refused(c!(hs_buffer_alloc(rt, 16, ptr::null_mut())), "out");
    null_refused(
        c!(hs_runtime_read_device_pool(rt, 0, ptr::null_mut(), 16)),
        "out",
    );

    c!(hs_report_free(report));
    c!(hs_command_free(cmd));
}

#[test]
fn frees_accept_null() {
    c!(hs_layout_free(ptr::null_mut()));
    c!(hs_coordinator_free(ptr::null_mut()));
    c!(hs_command_free(ptr::null_mut()));
    c!(hs_report_free(ptr::null_mut()));
    c!(hs_runtime_free(ptr::null_mut()));
    c!(hs_buffer_free(ptr::null_mut()));
}

#[test]
fn an_output_array_gets_the_size_first_and_a_small_one_only_the_size() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 4, 1);
    let coord = w.coord;
    let prompt = [1u32, 2, 3];
    for id in [10, 11, 12] {
        ok!(hs_coordinator_admit(
            coord,
            id,
            prompt.as_ptr(),
            prompt.len()
        ));
    }
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_step(coord, &mut cmd));
    c!(hs_command_free(cmd));
    let mut count = 0;
    ok!(hs_coordinator_running_ids(
        coord,
        ptr::null_mut(),
        0,
        &mut count
    ));
    assert_eq!(count, 3);
    let mut ids = [0u64; 3];
    count = 0;
    expect_error(
        c!(hs_coordinator_running_ids(
            coord,
            ids.as_mut_ptr(),
            2,
            &mut count
        )),
        HsStatus::BufferTooSmall,
        "at least 3",
    );
    assert_eq!((count, ids), (3, [0; 3]));
    ok!(hs_coordinator_running_ids(
        coord,
        ids.as_mut_ptr(),
        3,
        &mut count
    ));
    assert_eq!(ids, [10, 11, 12]);
}

/// The host pool's set-up report is a NUL-terminated string under the same output-array rules:
/// the size first, a smaller array only the size.
#[test]
fn the_host_pool_setup_is_a_string_sized_first() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 1);
    let mut count = 0;
    ok!(hs_runtime_host_pool_setup(
        w.rt,
        ptr::null_mut(),
        0,
        &mut count
    ));
    assert!(count > 1, "the runtime's own pool is set up and reported");
    let mut small = vec![0 as std::ffi::c_char; count - 1];
    expect_error(
        c!(hs_runtime_host_pool_setup(
            w.rt,
            small.as_mut_ptr(),
            small.len(),
            &mut count
        )),
        HsStatus::BufferTooSmall,
        &format!("at least {count}"),
    );
    let mut text = vec![0 as std::ffi::c_char; count];
    ok!(hs_runtime_host_pool_setup(
        w.rt,
        text.as_mut_ptr(),
        text.len(),
        &mut count
    ));
    // SAFETY: the call wrote a NUL-terminated string into `text`.
    let text = unsafe { CStr::from_ptr(text.as_ptr()) }.to_str().unwrap();
    assert_eq!(text.len() + 1, count);
    assert!(text.contains("thread") && text.contains("pages"), "{text}");
    null_refused(
        c!(hs_runtime_host_pool_setup(
            w.rt,
            ptr::null_mut(),
            0,
            ptr::null_mut()
        )),
        "count",
    );
}

#[test]
fn a_length_no_array_can_have_is_refused_before_it_is_read() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 1);
    let coord = w.coord;
    let prompt = [1u32];
    // The length claims more bytes than any array spans: refused before a slice is built over
    // the one token behind the pointer.
    expect_error(
        c!(hs_coordinator_admit(
            coord,
            1,
            prompt.as_ptr(),
            usize::MAX / 2
        )),
        HsStatus::InvalidArgument,
        "`prompt`",
    );
    let mut empty = false;
    ok!(hs_coordinator_is_empty(coord, &mut empty));
    assert!(empty, "nothing was admitted");
}

#[test]
fn sizes_beyond_memory_are_refused_before_anything_is_allocated() {
    let layout = tiny_layout(200, 4 * 64, 256, 1);
    let rt = cpu_runtime(layout, 2, 4);
    let mut buf = ptr::null_mut();
    let status = c!(hs_buffer_alloc(rt, 1 << 50, &mut buf));
    assert!(
        status != HsStatus::Ok && status != HsStatus::Internal && buf.is_null(),
        "{status:?}: {}",
        last_error()
    );
    // Reads beyond the pools are typed errors, whatever the length.
    let mut bytes = [0u8; 16];
    let info = layout_info(layout);
    for (offset, what) in [
        (info.gpu_pool_bytes as usize, "device"),
        (usize::MAX - 8, "device"),
    ] {
        let s = c!(hs_runtime_read_device_pool(
            rt,
            offset,
            bytes.as_mut_ptr(),
            16
        ));
        assert_eq!(
            s,
            HsStatus::InvalidArgument,
            "{what} at {offset}: {}",
            last_error()
        );
    }
    let s = c!(hs_runtime_read_host_pool(
        rt,
        usize::MAX - 8,
        bytes.as_mut_ptr(),
        16
    ));
    assert_eq!(s, HsStatus::InvalidArgument, "{}", last_error());
    c!(hs_runtime_free(rt));
    c!(hs_layout_free(layout));
}

#[test]
fn every_status_has_a_name_and_other_numbers_are_unknown() {
    let name = |s: i32| {
        // SAFETY: `hs_status_name` returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(hs_status_name(s)) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    let last = HsStatus::ConcurrentUse as i32;
    let names: Vec<String> = (0..=last).map(name).collect();
    assert_eq!(names[0], "ok");
    assert_eq!(names[11], "buffer too small");
    assert_eq!(names[12], "capture");
    for (i, n) in names.iter().enumerate() {
        assert_ne!(n, "unknown status", "status {i}");
        assert!(!names[..i].contains(n), "{n} twice");
    }
    for s in [-1, last + 1, i32::MAX, i32::MIN] {
        assert_eq!(name(s), "unknown status");
    }
    assert_eq!(name(HsStatus::NullArgument as i32), "null argument");
}

#[test]
fn a_layout_refusal_names_the_option_to_change() {
    let mut o = std::mem::MaybeUninit::<HsLayoutOptions>::uninit();
    ok!(hs_layout_options_default(o.as_mut_ptr()));
    // SAFETY: written by the successful call.
    let defaults = unsafe { o.assume_init() };
    let mut layout = ptr::null_mut();
    for (options, needle) in [
        (
            HsLayoutOptions {
                host_mem: 1 << 20,
                ..defaults
            },
            "options.host_mem 1.00 MiB",
        ),
        (
            HsLayoutOptions {
                preset: c"nope".as_ptr(),
                ..defaults
            },
            "use options.preset with one of",
        ),
        (
            HsLayoutOptions {
                model_json: c"{".as_ptr(),
                ..defaults
            },
            "options.model_json is not a model description",
        ),
        (
            HsLayoutOptions {
                layers: 99,
                ..defaults
            },
            "options.layers = 99",
        ),
    ] {
        expect_error(
            c!(hs_layout_plan(&options, &mut layout)),
            HsStatus::InvalidArgument,
            needle,
        );
        assert!(layout.is_null());
    }
    ok!(hs_layout_plan(&defaults, &mut layout));
    assert_eq!(layout_info(layout).num_sparse_layers, 61);
    c!(hs_layout_free(layout));
}
