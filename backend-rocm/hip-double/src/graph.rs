//! Stream capture and graphs, as HIP documents them, on the double's device: enough to capture
//! a backend's work the way an engine does (`torch.cuda.graph` on ROCm: `hipStreamBeginCapture`
//! in global mode, the engine's calls, `hipStreamEndCapture`, `hipGraphInstantiate`) and replay it
//! with `hipGraphLaunch`.
//!
//! * Work enqueued on a stream being captured is recorded, not queued ([`State::enqueue`]);
//!   `hipGraphLaunch` queues a copy of the recorded work on the launch stream. A replay reads the
//!   memory the recorded work names *at replay*: memory freed since the capture makes the replay
//!   fault (a copy's ranges are checked when the replay is queued, a kernel's when it runs).
//! * While a capture in **global** mode is open, the calls HIP deems unsafe (allocations, frees,
//!   synchronous copies and fills, device and stream synchronisations) are refused with
//!   `hipErrorStreamCaptureUnsupported` on any thread not in relaxed mode
//!   (`hipThreadExchangeStreamCaptureMode`), and the capture is invalidated; synchronising the
//!   stream being captured is refused whatever the mode. Ending an invalidated capture is
//!   `hipErrorStreamCaptureInvalidated`.
//! * An event recorded on a stream being captured belongs to the graph: querying it, or making
//!   a stream wait for it, is `hipErrorCapturedEvent`.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};

use crate::state::{Capture, Kind, Op, State};
use crate::status::*;
use crate::{put, state};

/// `hipStreamCaptureModeRelaxed`.
const MODE_RELAXED: c_int = 2;

thread_local! {
    /// The calling thread's capture mode (`hipStreamCaptureModeGlobal` until exchanged).
    static MODE: Cell<c_int> = const { Cell::new(0) };
}

/// Refuses an unsafe call while a capture in global mode is open and the calling thread is not
/// relaxed, invalidating the capture (HIP's rule).
pub(crate) fn unsafe_call(st: &mut State) -> Result<(), u32> {
    if st.global_capture_open() && MODE.with(Cell::get) != MODE_RELAXED {
        st.invalidate_global_captures();
        return Err(HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// `hipStreamIsCapturing`, as HIP documents it, on the double's device (module docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipStreamIsCapturing(stream: *mut c_void, status: *mut c_int) -> u32 {
    let mut st = state();
    let s = match st.stream(stream as usize) {
        Ok(s) => s,
        Err(e) => return e,
    };
    // hipStreamCaptureStatusNone, Active, Invalidated.
    let value = match &s.capture {
        None => 0,
        Some(c) if c.invalidated => 2,
        Some(_) => 1,
    };
    // SAFETY: HIP contract: valid out-pointer (null is refused by `put`).
    unsafe { put(status, value) }
}

/// `hipThreadExchangeStreamCaptureMode`, as HIP documents it (module docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipThreadExchangeStreamCaptureMode(mode: *mut c_int) -> u32 {
    if mode.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null; HIP contract: valid for reads and writes.
    let wanted = unsafe { mode.read() };
    if !(0..=2).contains(&wanted) {
        return HIP_ERROR_INVALID_VALUE;
    }
    let previous = MODE.with(|m| m.replace(wanted));
    // SAFETY: as above.
    unsafe { mode.write(previous) };
    HIP_SUCCESS
}

/// `hipStreamBeginCapture`, as HIP documents it (module docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipStreamBeginCapture(stream: *mut c_void, mode: c_int) -> u32 {
    if !(0..=2).contains(&mode) {
        return HIP_ERROR_INVALID_VALUE;
    }
    let mut st = state();
    let h = stream as usize;
    if h == 0 {
        // The null stream cannot be captured.
        return HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    let s = match st.stream(h) {
        Ok(s) => s,
        Err(e) => return e,
    };
    if s.capture.is_some() {
        return HIP_ERROR_ILLEGAL_STATE;
    }
    s.capture = Some(Capture {
        mode,
        ..Capture::default()
    });
    HIP_SUCCESS
}

/// `hipStreamEndCapture`, as HIP documents it (module docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> u32 {
    let mut st = state();
    let capture = match st.stream(stream as usize) {
        Ok(s) => s.capture.take(),
        Err(e) => return e,
    };
    let Some(capture) = capture else {
        return HIP_ERROR_ILLEGAL_STATE;
    };
    if capture.invalidated {
        return HIP_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    let h = st.handle();
    st.graphs.insert(h, capture.ops);
    // SAFETY: HIP contract: valid out-pointer (null is refused by `put`).
    unsafe { put(graph, h as *mut c_void) }
}

/// `hipGraphInstantiate`, as HIP documents it (module docs): an executable copy of `graph`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGraphInstantiate(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    _error_node: *mut *mut c_void,
    _log: *mut c_char,
    _log_bytes: usize,
) -> u32 {
    let mut st = state();
    let Some(ops) = st.graphs.get(&(graph as usize)).cloned() else {
        return HIP_ERROR_INVALID_VALUE;
    };
    let h = st.handle();
    st.graphs.insert(h, ops);
    // SAFETY: HIP contract: valid out-pointer (null is refused by `put`).
    unsafe { put(exec, h as *mut c_void) }
}

/// `hipGraphLaunch`, as HIP documents it (module docs): queues the recorded work on `stream`.
#[unsafe(no_mangle)]
pub extern "C" fn hipGraphLaunch(exec: *mut c_void, stream: *mut c_void) -> u32 {
    let mut st = state();
    let Some(ops) = st.graphs.get(&(exec as usize)).cloned() else {
        return HIP_ERROR_INVALID_VALUE;
    };
    let any = [Kind::Device, Kind::Pinned, Kind::Registered];
    for op in ops {
        // A copy's or fill's memory must still be live at the replay.
        let live = match &op {
            Op::Copy { dst, src, len } => st
                .check_range(*dst, *len, &any)
                .and_then(|()| st.check_range(*src, *len, &any)),
            Op::Fill { dst, len, .. } => st.check_range(*dst, *len, &any),
            Op::Wait { .. } | Op::Launch(_) => Ok(()),
        };
        if let Err(e) = live.and_then(|()| st.enqueue(stream as usize, op)) {
            return e;
        }
    }
    HIP_SUCCESS
}

/// Destroys a graph or an executable graph.
fn destroy(handle: *mut c_void) -> u32 {
    match state().graphs.remove(&(handle as usize)) {
        Some(_) => HIP_SUCCESS,
        None => HIP_ERROR_INVALID_VALUE,
    }
}

/// `hipGraphExecDestroy`, as HIP documents it (module docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipGraphExecDestroy(exec: *mut c_void) -> u32 {
    destroy(exec)
}

/// `hipGraphDestroy`, as HIP documents it (module docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipGraphDestroy(graph: *mut c_void) -> u32 {
    destroy(graph)
}
