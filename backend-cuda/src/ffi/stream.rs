//! Streams: created here or lent by an engine; copies, launches and captures enqueued on them.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};

use super::{CaptureMode, CaptureStatus, Context, DevMem, Event, Graph, Result, check};
use crate::error::CudaError;
use crate::pinned::PinnedMem;

/// A stream: created here (non-blocking, destroyed on drop; pending work still completes), or
/// lent by an engine ([`Stream::lent`], never destroyed here).
#[derive(Debug)]
pub(crate) struct Stream {
    pub(super) raw: sys::CUstream,
    ctx: Arc<Context>,
    /// Whether drop destroys the stream.
    owned: bool,
}

// SAFETY: stream handles may be used from any thread of the process (driver API is thread-safe).
unsafe impl Send for Stream {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream that does not synchronise with the legacy default stream.
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Stream> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream {
            raw,
            ctx: ctx.clone(),
            owned: true,
        })
    }

    /// A stream someone else created, which drop leaves alone.
    ///
    /// # Safety
    ///
    /// `raw` is a stream of `ctx` (checked by the caller with [`stream_context`]) that stays
    /// valid for as long as the value lives.
    pub(crate) unsafe fn lent(ctx: &Arc<Context>, raw: sys::CUstream) -> Stream {
        Stream {
            raw,
            ctx: ctx.clone(),
            owned: false,
        }
    }

    /// The driver's handle.
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Blocks until the stream's work completed.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live stream of the current context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }

    /// Makes later work wait for `event`.
    pub(crate) fn wait(&self, event: &Event) -> Result<()> {
        // SAFETY: both handles are live objects of this context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.raw, event.raw, 0)
        })
    }

    /// Enqueues a copy of `n` bytes from pinned `src[src_off..]` to device `dst[dst_off..]`.
    pub(crate) fn copy_htod(
        &self,
        src: &PinnedMem,
        src_off: usize,
        dst: &DevMem,
        dst_off: usize,
        n: usize,
    ) -> Result<()> {
        assert!(src_off + n <= src.len() && dst_off + n <= dst.len);
        if n == 0 {
            return Ok(());
        }
        // One driver copy per separately registered chunk the range crosses (the driver refuses
        // a pinned range spanning two registrations).
        for piece in src.copy_pieces(src_off, n) {
            let at = piece.start - src_off;
            // SAFETY: both ranges lie inside live allocations (asserted; the piece lies inside
            // the source range); the source is pinned, and both allocations are freed (unpinned)
            // only after the context synchronised.
            check("cuMemcpyHtoDAsync", unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst.ptr + (dst_off + at) as u64,
                    src.host_ptr().add(piece.start).cast(),
                    piece.len(),
                    self.raw,
                )
            })?;
        }
        Ok(())
    }

    /// Enqueues a copy of `n` bytes from device `src[src_off..]` to pinned `dst[dst_off..]`.
    pub(crate) fn copy_dtoh(
        &self,
        src: &DevMem,
        src_off: usize,
        dst: &PinnedMem,
        dst_off: usize,
        n: usize,
    ) -> Result<()> {
        assert!(src_off + n <= src.len && dst_off + n <= dst.len());
        if n == 0 {
            return Ok(());
        }
        // As in `copy_htod`: one driver copy per registered chunk of the destination range.
        for piece in dst.copy_pieces(dst_off, n) {
            let at = piece.start - dst_off;
            // SAFETY: as in `copy_htod`; the destination is pinned memory owned by `dst`.
            check("cuMemcpyDtoHAsync", unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    dst.host_ptr().add(piece.start).cast(),
                    src.ptr + (src_off + at) as u64,
                    piece.len(),
                    self.raw,
                )
            })?;
        }
        Ok(())
    }

    /// Enqueues a copy of `n` bytes between device allocations, or within one (`src` and `dst`
    /// the same allocation) between ranges that do not overlap (the caller checks that, as the
    /// core's `check_copy_within` does).
    pub(crate) fn copy_dtod(
        &self,
        src: &DevMem,
        src_off: usize,
        dst: &DevMem,
        dst_off: usize,
        n: usize,
    ) -> Result<()> {
        assert!(src_off + n <= src.len && dst_off + n <= dst.len);
        if n == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie inside live device allocations (asserted) and, within one
        // allocation, do not overlap (the caller's check).
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                dst.ptr + dst_off as u64,
                src.ptr + src_off as u64,
                n,
                self.raw,
            )
        })
    }

    /// Enqueues filling `words` u32 words at `mem[offset..]` with `value`.
    pub(crate) fn fill_u32(
        &self,
        mem: &DevMem,
        offset: usize,
        value: u32,
        words: usize,
    ) -> Result<()> {
        assert!(offset.is_multiple_of(4) && offset + 4 * words <= mem.len);
        if words == 0 {
            return Ok(());
        }
        // SAFETY: the range lies inside a live device allocation (asserted) and is 4-aligned.
        check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(mem.ptr + offset as u64, value, words, self.raw)
        })
    }

    /// Starts capturing the stream's work into a graph in `mode`.
    pub(crate) fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        self.ctx.bind()?;
        let mode = match mode {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => {
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            }
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // SAFETY: `raw` is a live stream; the mode is a valid enum value.
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(self.raw, mode)
        })
    }

    /// Whether the stream is being captured (`cuStreamIsCapturing`).
    pub(crate) fn capture_status(&self) -> Result<CaptureStatus> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `raw` is a live stream; `status` is a valid out-pointer.
        check("cuStreamIsCapturing", unsafe {
            sys::cuStreamIsCapturing(self.raw, &mut status)
        })?;
        Ok(match status {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
                CaptureStatus::Invalidated
            }
        })
    }

    /// Copies `src` into `dst[offset..]` on this stream and waits for the copy: complete in
    /// device memory when it returns. For the device's own side stream (never captured), under
    /// [`relaxed_capture`] when another stream may be capturing.
    pub(crate) fn upload_now(&self, dst: &DevMem, offset: usize, src: &[u8]) -> Result<()> {
        assert!(offset.checked_add(src.len()).is_some_and(|e| e <= dst.len));
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the destination range lies inside a live allocation (asserted) and `src` is a
        // live slice that stays borrowed until the synchronisation below returns.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.ptr + offset as u64,
                src.as_ptr().cast(),
                src.len(),
                self.raw,
            )
        })?;
        self.synchronize()
    }

    /// Ends a capture and instantiates the graph.
    pub(crate) fn end_capture(&self) -> Result<Graph> {
        let mut graph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; the stream is capturing.
        check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(self.raw, &mut graph)
        })?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` was just produced by the capture; `exec` is an out-pointer.
        let code = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if code != CUresult::CUDA_SUCCESS {
            // SAFETY: the graph is ours and not used after this.
            unsafe {
                sys::cuGraphDestroy(graph);
            }
            return Err(CudaError::driver("cuGraphInstantiate", code));
        }
        Ok(Graph {
            graph,
            exec,
            ctx: self.ctx.clone(),
        })
    }

    /// Enqueues one replay of `graph`.
    pub(crate) fn launch_graph(&self, graph: &Graph) -> Result<()> {
        // SAFETY: both handles are live objects of this context.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(graph.exec, self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let _ = self.ctx.bind();
        // SAFETY: destroys the stream created in `new` once; pending work still completes.
        unsafe {
            sys::cuStreamDestroy_v2(self.raw);
        }
    }
}
