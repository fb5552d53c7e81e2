//! What work captured into a CUDA graph needs from the backend, and the memory that outlives a
//! call.
//!
//! An engine captures its decode step with PyTorch's usual recipe (`with torch.cuda.graph(g):`):
//! on a private stream, in *global* capture mode, and this backend's per-layer calls are enqueued
//! on that stream (lent through [`crate::CudaDevice::lend_stream`]). Three things then differ from
//! eager work, and this module handles them:
//!
//! * **Allocations.** In global mode the driver refuses `cuMemAlloc` (a potentially unsafe call)
//!   anywhere in the process, and may invalidate the capture. Every allocation lending a stream or a
//!   launch can make under capture — a stream's resolver counters and workspace, a chunk of the list
//!   arena — runs with the thread in relaxed capture mode ([`ffi::relaxed_capture`]), as the
//!   PyTorch allocator does.
//! * **Clearing.** A stream's resolver counters must be zero before its first resolver launch.
//!   Cleared on the stream itself, under capture the clearing would become a node of the graph and
//!   run only at replay — leaving them garbage for eager use of the same stream. On a stream being
//!   captured they are therefore cleared on the device's own side stream (never captured), and
//!   lending the stream waits for it; otherwise on the stream, as its first operation, without waiting.
//! * **Lifetimes.** A graph's kernels read their scratch and their host-side lists at every
//!   replay, long after the call returned: the stream's [`Scratch`] used by a captured launch is
//!   retained by the device ([`Lasting::retain`]) even if the lent stream is dropped, and
//!   the lists of a captured call are placed in the device's list arena
//!   (`hisparse_gpu_kernels::arena`: content-addressed, append-only, kept for the device's life)
//!   instead of the staging ring, whose regions are reused. Graphs captured on one stream share
//!   its scratch: replay them one after another, not concurrently.
//!
//! The arena also keeps constant lists (a copy's layer table, the same on every call), so a call
//! passes their address instead of staging them again (see `CudaDevice::execute`).

use std::sync::{Arc, Mutex};

use hisparse_gpu_kernels::arena::{ArenaStore, ListArena, Retained};
use hisparse_gpu_kernels::{self as gk, plan::PartKind};

use crate::error::CudaError;
use crate::ffi::{self, CaptureStatus, Context, DevMem, Stream};

type Result<T> = std::result::Result<T, CudaError>;

/// The resolver scratch of one stream: its counters (zero before the first launch, left zero by
/// every launch) and its workspace (uninitialised; the kernel initialises what it reads).
#[derive(Debug)]
pub(crate) struct Scratch {
    counters: DevMem,
    workspace: Mutex<Workspace>,
}

#[derive(Debug, Default)]
struct Workspace {
    current: Option<DevMem>,
    /// Smaller workspaces replaced while launches (or graphs) using them may still run; freed
    /// with the scratch.
    retired: Vec<DevMem>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Scratch {
    /// The scratch of `stream`, its counters zero before any launch enqueued on `stream` after
    /// this returns: cleared on `stream` (its next operation, no waiting), or, while `stream` is
    /// being captured, on the device's `side` stream, waited for.
    pub(crate) fn new(ctx: &Arc<Context>, stream: &Stream, side: &Stream) -> Result<Arc<Scratch>> {
        let words = (gk::WORKSPACE_COUNTER_BYTES / 4) as usize;
        let counters = ffi::relaxed_capture(|| DevMem::alloc_uninit(ctx, words * 4))?;
        if stream.capture_status()? == CaptureStatus::None {
            stream.fill_u32(&counters, 0, 0, words)?;
        } else {
            ffi::relaxed_capture(|| {
                side.fill_u32(&counters, 0, 0, words)?;
                side.synchronize()
            })?;
        }
        Ok(Arc::new(Scratch {
            counters,
            workspace: Mutex::new(Workspace::default()),
        }))
    }

    /// Device address of the counters.
    pub(crate) fn counters(&self) -> u64 {
        self.counters.ptr()
    }

    /// Device address of a workspace of at least `bytes` (allocated now if the current one is
    /// smaller: no synchronisation, allowed under capture).
    pub(crate) fn workspace(&self, ctx: &Arc<Context>, bytes: usize) -> Result<u64> {
        let mut ws = lock(&self.workspace);
        if ws.current.as_ref().is_none_or(|m| m.len() < bytes) {
            let mem =
                ffi::relaxed_capture(|| DevMem::alloc_uninit(ctx, bytes.next_power_of_two()))?;
            if let Some(old) = ws.current.replace(mem) {
                ws.retired.push(old);
            }
        }
        Ok(ws.current.as_ref().expect("allocated above").ptr())
    }
}

/// Memory and a stream that live as long as the device: the side stream, the list arena and
/// the scratch of captured launches.
pub(crate) struct Lasting {
    ctx: Arc<Context>,
    /// A non-blocking stream of the device's own, never captured: eager clearing and uploads
    /// while another stream is being captured.
    pub(crate) side: Stream,
    arena: Mutex<ListArena<DevMem>>,
    /// Scratch a captured launch used (graphs read it at every replay), deduplicated.
    retained: Retained<Scratch>,
}

/// The arena's memory on a CUDA device: device chunks, filled through the side stream.
struct DeviceStore<'a> {
    ctx: &'a Arc<Context>,
    side: &'a Stream,
}

impl ArenaStore for DeviceStore<'_> {
    type Chunk = DevMem;
    type Error = CudaError;

    fn alloc(&mut self, bytes: usize) -> Result<(DevMem, u64)> {
        let mem = ffi::relaxed_capture(|| DevMem::alloc_uninit(self.ctx, bytes))?;
        let addr = mem.ptr();
        Ok((mem, addr))
    }

    fn write(&mut self, chunk: &DevMem, addr: u64, bytes: &[u8]) -> Result<()> {
        let offset = (addr - chunk.ptr()) as usize;
        ffi::relaxed_capture(|| self.side.upload_now(chunk, offset, bytes))
    }
}

impl Lasting {
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Lasting> {
        Ok(Lasting {
            ctx: ctx.clone(),
            side: Stream::new(ctx)?,
            arena: Mutex::new(ListArena::new()),
            retained: Retained::default(),
        })
    }

    /// The arena's address of a staged list of `kind`, or `None`: stage it
    /// ([`ListArena::lasting_address`]: every list of captured work, constant lists up to a cap).
    pub(crate) fn lasting_address(
        &self,
        bytes: &[u8],
        kind: PartKind,
        capturing: bool,
    ) -> Result<Option<u64>> {
        let mut store = DeviceStore {
            ctx: &self.ctx,
            side: &self.side,
        };
        lock(&self.arena).lasting_address(bytes, kind, capturing, &mut store)
    }

    /// Keeps `scratch` for the device's life (a captured launch uses it).
    pub(crate) fn retain(&self, scratch: &Arc<Scratch>) {
        self.retained.retain(scratch);
    }

    /// `(lists, bytes)` the arena holds: what captured calls and constant lists have placed.
    pub(crate) fn arena_use(&self) -> (usize, u64) {
        let arena = lock(&self.arena);
        (arena.lists(), arena.chunk_bytes())
    }
}

impl std::fmt::Debug for Lasting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lasting").finish_non_exhaustive()
    }
}
