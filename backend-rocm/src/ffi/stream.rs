//! Streams, stream capture and events.

use std::ffi::c_int;

use super::{
    CAPTURE_STATUS_NONE, EVENT_DISABLE_TIMING, HIP_SUCCESS, Handle, Hip, HipStatus,
    STREAM_NON_BLOCKING,
};

impl Hip {
    /// `hipStreamGetDevice`: the device a stream belongs to.
    ///
    /// # Safety
    /// `stream` is a live stream handle or the null stream (the runtime dereferences it).
    pub unsafe fn stream_device(&self, stream: Handle) -> Result<c_int, HipStatus> {
        let mut d: c_int = -1;
        // SAFETY: `d` is a valid out-pointer; `stream` per the caller's contract.
        let s = unsafe { (self.fns.hipStreamGetDevice)(stream, &mut d) };
        if s == HIP_SUCCESS { Ok(d) } else { Err(s) }
    }

    /// `hipStreamIsCapturing`: the stream's capture status (`hipStreamCaptureStatus`;
    /// [`CAPTURE_STATUS_NONE`] when it is not being captured).
    pub fn stream_capture_status(&self, stream: Handle) -> Result<c_int, HipStatus> {
        let mut status: c_int = CAPTURE_STATUS_NONE;
        // SAFETY: `status` is a valid out-pointer; the runtime reports an invalid stream as a
        // status.
        let s = unsafe { (self.fns.hipStreamIsCapturing)(stream, &mut status) };
        if s == HIP_SUCCESS { Ok(status) } else { Err(s) }
    }

    /// `hipThreadExchangeStreamCaptureMode`: sets the calling thread's capture mode to `*mode`
    /// and leaves its previous mode there.
    pub fn exchange_capture_mode(&self, mode: &mut c_int) -> HipStatus {
        // SAFETY: `mode` is a valid in/out pointer to a mode value.
        unsafe { (self.fns.hipThreadExchangeStreamCaptureMode)(mode) }
    }

    /// `hipStreamCreateWithFlags(hipStreamNonBlocking)`.
    pub fn stream_create(&self) -> Result<Handle, HipStatus> {
        let mut h = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer.
        let s = unsafe { (self.fns.hipStreamCreateWithFlags)(&mut h, STREAM_NON_BLOCKING) };
        if s == HIP_SUCCESS { Ok(h) } else { Err(s) }
    }

    /// `hipStreamDestroy`.
    ///
    /// # Safety
    /// `stream` came from [`Hip::stream_create`] and is not used afterwards.
    pub unsafe fn stream_destroy(&self, stream: Handle) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipStreamDestroy)(stream) }
    }

    /// `hipStreamSynchronize`.
    pub fn stream_synchronize(&self, stream: Handle) -> HipStatus {
        // SAFETY: the handle is owned by a live `RocmStream`; an invalid one is reported as a
        // status by the runtime.
        unsafe { (self.fns.hipStreamSynchronize)(stream) }
    }

    /// `hipStreamWaitEvent(stream, event, 0)`.
    pub fn stream_wait_event(&self, stream: Handle, event: Handle) -> HipStatus {
        // SAFETY: both handles are owned by live backend objects.
        unsafe { (self.fns.hipStreamWaitEvent)(stream, event, 0) }
    }

    /// `hipEventCreateWithFlags(hipEventDisableTiming)`.
    pub fn event_create(&self) -> Result<Handle, HipStatus> {
        let mut h = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer.
        let s = unsafe { (self.fns.hipEventCreateWithFlags)(&mut h, EVENT_DISABLE_TIMING) };
        if s == HIP_SUCCESS { Ok(h) } else { Err(s) }
    }

    /// `hipEventRecord`.
    pub fn event_record(&self, event: Handle, stream: Handle) -> HipStatus {
        // SAFETY: both handles are owned by live backend objects.
        unsafe { (self.fns.hipEventRecord)(event, stream) }
    }

    /// `hipEventQuery`: `hipSuccess` once the recorded work completed, `hipErrorNotReady` before.
    pub fn event_query(&self, event: Handle) -> HipStatus {
        // SAFETY: the handle is owned by a live backend object.
        unsafe { (self.fns.hipEventQuery)(event) }
    }

    /// `hipEventDestroy`.
    ///
    /// # Safety
    /// `event` came from [`Hip::event_create`] and is not used afterwards.
    pub unsafe fn event_destroy(&self, event: Handle) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipEventDestroy)(event) }
    }
}
