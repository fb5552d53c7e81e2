//! What the C API tests share: a tiny model planned through `hs_layout_plan`, and calls that
//! turn a status into a test failure carrying `hs_last_error()`.

#![allow(dead_code)] // Each test file uses a part.

use std::ffi::{CStr, c_char};
use std::ptr;

use hisparse_capi::*;

/// Calls the C API: every call here passes live handles and valid pointers (or NULL where the
/// test means to), which is the whole safety contract of the functions called. Wrapping the
/// caller's expression in `unsafe` is the point of the macro: each test is a C caller (the test
/// files allow `clippy::macro_metavars_in_unsafe` for it).
#[macro_export]
macro_rules! c {
    ($call:expr) => {{
        // SAFETY: the tests pass live handles and valid (or deliberately NULL) pointers.
        unsafe { $call }
    }};
}

/// Asserts that a call succeeded, naming the error otherwise.
#[macro_export]
macro_rules! ok {
    ($call:expr) => {{
        let status = $crate::c!($call);
        assert_eq!(
            status,
            hisparse_capi::HsStatus::Ok,
            "{}: {}",
            stringify!($call),
            $crate::common::last_error()
        );
    }};
}

/// The message of the last failed call on this thread.
pub fn last_error() -> String {
    // SAFETY: `hs_last_error` returns a NUL-terminated string that lives until the next
    // failing call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(hs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts that `status` is `want` and that the message names `needle`.
pub fn expect_error(status: HsStatus, want: HsStatus, needle: &str) {
    let message = last_error();
    assert_eq!(status, want, "message: {message}");
    assert!(
        message.contains(needle),
        "the message should name `{needle}`: {message}"
    );
}

/// Rows of the tiny model.
pub const ROW_BYTES: u32 = 64;
/// Tokens (rows) per block.
pub const BLOCK: u32 = 16;
/// Top-k.
pub const TOP_K: u32 = 16;
/// Sparse layers, each its own index group and bucket.
pub const LAYERS: u32 = 3;

/// Three sparse layers of 64-byte rows, 16-token blocks, top-k 16.
pub const TINY_MODEL: &CStr = c"{\"name\": \"tiny\", \"block_tokens\": 16, \"top_k\": 16, \"layers\": [\
{\"sparse\": {\"row_bytes\": 64, \"value_bytes\": 64, \"compress_ratio\": 1, \"indexer_row_bytes\": 16}},\
{\"sparse\": {\"row_bytes\": 64, \"value_bytes\": 64, \"compress_ratio\": 1, \"indexer_row_bytes\": 16}},\
{\"sparse\": {\"row_bytes\": 64, \"value_bytes\": 64, \"compress_ratio\": 1, \"indexer_row_bytes\": 16}}]}";

/// The tiny model planned with `gpu_blocks` GPU blocks (null block included), host room for
/// `host_pages` pages per layer, requests of up to `max_model_len` tokens, and
/// `max_query_len` tokens per request per step.
pub fn tiny_layout(
    gpu_blocks: u32,
    host_pages: u64,
    max_model_len: u32,
    max_query_len: u32,
) -> *mut HsLayout {
    let mut o = std::mem::MaybeUninit::<HsLayoutOptions>::uninit();
    ok!(hs_layout_options_default(o.as_mut_ptr()));
    // SAFETY: `hs_layout_options_default` succeeded, so every field is written.
    let mut o = unsafe { o.assume_init() };
    o.model_json = TINY_MODEL.as_ptr();
    o.gpu_mem = 0;
    o.host_mem = host_pages * u64::from(ROW_BYTES * BLOCK * LAYERS);
    o.max_model_len = max_model_len;
    o.max_query_len = max_query_len;
    o.device_buffer_size = 32 * max_query_len;
    o.num_gpu_blocks = gpu_blocks;
    let mut layout = ptr::null_mut();
    ok!(hs_layout_plan(&o, &mut layout));
    layout
}

/// The layout's figures.
pub fn layout_info(layout: *const HsLayout) -> HsLayoutInfo {
    let mut info = HsLayoutInfo::default();
    ok!(hs_layout_info(layout, &mut info));
    info
}

/// A coordinator for `layout` with `max_running` state rows and no prefix caching.
pub fn coordinator(layout: *const HsLayout, max_running: u32) -> *mut HsCoordinator {
    let mut cfg = std::mem::MaybeUninit::<HsCoordinatorConfig>::uninit();
    ok!(hs_coordinator_config_default(cfg.as_mut_ptr()));
    // SAFETY: `hs_coordinator_config_default` succeeded, so every field is written.
    let mut cfg = unsafe { cfg.assume_init() };
    cfg.max_running = max_running;
    cfg.max_batched_tokens = 4096;
    cfg.enable_prefix_caching = false;
    cfg.reclaim_min_blocks = 0;
    let mut c = ptr::null_mut();
    ok!(hs_coordinator_new(layout, &cfg, &mut c));
    c
}

/// A CPU runtime for `layout` with `state_rows` state rows and `max_step_tokens` token rows.
pub fn cpu_runtime(
    layout: *const HsLayout,
    state_rows: u32,
    max_step_tokens: u32,
) -> *mut HsRuntime {
    let mut rc = std::mem::MaybeUninit::<HsRuntimeConfig>::uninit();
    ok!(hs_runtime_config_default(rc.as_mut_ptr()));
    // SAFETY: `hs_runtime_config_default` succeeded, so every field is written.
    let mut rc = unsafe { rc.assume_init() };
    rc.state_rows = state_rows;
    rc.max_step_tokens = max_step_tokens;
    let mut rt = ptr::null_mut();
    ok!(hs_runtime_new(
        layout,
        c"cpu".as_ptr(),
        ptr::null(),
        &rc,
        &mut rt
    ));
    rt
}

/// The command's summary.
pub fn command_info(cmd: *const HsCommand) -> HsCommandInfo {
    let mut info = HsCommandInfo::default();
    ok!(hs_command_info(cmd, &mut info));
    info
}

/// The command's scheduled requests.
pub fn scheduled(cmd: *const HsCommand) -> Vec<HsScheduledRequest> {
    (0..command_info(cmd).num_scheduled)
        .map(|i| {
            let mut s = HsScheduledRequest::default();
            ok!(hs_command_scheduled(cmd, i, &mut s));
            s
        })
        .collect()
}

/// A C string argument.
pub fn cstr(s: &CStr) -> *const c_char {
    s.as_ptr()
}

/// A layout, a coordinator and a CPU runtime for it, freed together when dropped.
pub struct World {
    /// The layout.
    pub layout: *mut HsLayout,
    /// A coordinator for it (no prefix caching).
    pub coord: *mut HsCoordinator,
    /// A CPU runtime for it.
    pub rt: *mut HsRuntime,
}

impl World {
    /// `layout` with a coordinator of `state_rows` state rows and a runtime of as many, taking
    /// `max_step_tokens` token rows per call.
    pub fn new(layout: *mut HsLayout, state_rows: u32, max_step_tokens: u32) -> Self {
        World {
            layout,
            coord: coordinator(layout, state_rows),
            rt: cpu_runtime(layout, state_rows, max_step_tokens),
        }
    }

    /// Admits request `id` with the prompt `0 .. len`.
    pub fn admit(&self, id: u64, len: u32) {
        let prompt: Vec<u32> = (0..len).collect();
        ok!(hs_coordinator_admit(
            self.coord,
            id,
            prompt.as_ptr(),
            prompt.len()
        ));
    }
}

impl Drop for World {
    fn drop(&mut self) {
        c!(hs_runtime_free(self.rt));
        c!(hs_coordinator_free(self.coord));
        c!(hs_layout_free(self.layout));
    }
}
