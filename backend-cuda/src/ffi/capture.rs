//! The calling thread's stream-capture mode, and what a capture is doing.

use cudarc::driver::sys;

use super::{Result, check};

/// Runs `f` with the calling thread in relaxed stream-capture mode, then restores the thread's
/// mode. While another thread's stream (or this thread's) is being captured in global mode,
/// "potentially unsafe" calls — `cuMemAlloc`, a synchronisation of an unrelated stream — are
/// refused (and may invalidate the capture) unless the calling thread is relaxed: the PyTorch
/// allocator allocates the same way. `f` must not touch a stream being captured.
pub(crate) fn relaxed_capture<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `mode` is a valid in/out pointer to a mode value; the call only swaps the
    // calling thread's mode.
    check("cuThreadExchangeStreamCaptureMode", unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut mode)
    })?;
    let result = f();
    // `mode` now holds the thread's previous mode: put it back.
    // SAFETY: as above.
    let restored = check("cuThreadExchangeStreamCaptureMode", unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut mode)
    });
    let value = result?;
    restored.map(|()| value)
}

/// Whether a stream is being captured into a graph (`cuStreamIsCapturing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CaptureStatus {
    /// Not capturing: work runs when enqueued.
    None,
    /// Capturing: work becomes nodes of the graph.
    Active,
    /// A capture whose sequence was invalidated (an operation it cannot record ran); ending it
    /// fails.
    Invalidated,
}

/// How a capture treats potentially unsafe calls of other threads (`CUstreamCaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    /// Unsafe calls anywhere in the process are refused while the capture runs (what
    /// `torch.cuda.graph` uses).
    Global,
    /// Unsafe calls are refused on the capturing thread only.
    ThreadLocal,
    /// Nothing is refused.
    Relaxed,
}
