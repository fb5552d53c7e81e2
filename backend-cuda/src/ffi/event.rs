//! Events.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};

use super::{Context, Result, Stream, check};
use crate::error::CudaError;

/// An event.
#[derive(Debug)]
pub(crate) struct Event {
    pub(super) raw: sys::CUevent,
    ctx: Arc<Context>,
}

// SAFETY: event handles may be used from any thread (driver API is thread-safe).
unsafe impl Send for Event {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event; `timing` enables elapsed-time queries.
    pub(crate) fn new(ctx: &Arc<Context>, timing: bool) -> Result<Event> {
        ctx.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags as u32)
        })?;
        Ok(Event {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// Records the event at the current end of `stream`.
    pub(crate) fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live objects of this context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream.raw)
        })
    }

    /// Whether the work before the event completed.
    pub(crate) fn is_complete(&self) -> Result<bool> {
        // SAFETY: `raw` is a live event.
        match unsafe { sys::cuEventQuery(self.raw) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(CudaError::driver("cuEventQuery", code)),
        }
    }

    /// Milliseconds between `start` and `self` (waits for `self`).
    pub(crate) fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live event.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
        })?;
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; both events are live timing events.
        check("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: destroys the event created in `new` once.
        unsafe {
            sys::cuEventDestroy_v2(self.raw);
        }
    }
}
