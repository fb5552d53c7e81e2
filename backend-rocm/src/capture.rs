//! What work captured into a HIP graph needs from the backend, and the memory that outlives a
//! call: the ROCm twin of the CUDA backend's `capture` module (same rules, same reasons).
//!
//! An engine (PyTorch on ROCm) captures its decode step on a private stream in *global* capture
//! mode and this backend enqueues its per-layer calls on that stream, lent through
//! [`crate::RocmDevice::lend_stream`]:
//!
//! * **Allocations** lending a stream or a launch can make under capture (a stream's resolver counters and
//!   workspace, a chunk of the list arena) run with the thread in relaxed capture mode
//!   ([`Context::relaxed_capture`]); a workspace that grows retires the old one instead of
//!   synchronising the stream and freeing it (a stream being captured cannot be synchronised).
//! * **Clearing.** A stream's resolver counters are cleared on the stream, as its first
//!   operation — or, while it is being captured (the clearing would otherwise run only at
//!   replay), on the device's own side stream, waited for.
//! * **Lifetimes.** A graph's kernels read their scratch and their lists at every replay: the
//!   [`Scratch`] a captured launch used is retained by the device ([`Lasting::retain`]), and the
//!   lists of a captured call are placed in the device's list arena (pinned, mapped memory kept
//!   for the device's life; `hisparse_gpu_kernels::arena`) instead of a staging buffer that is
//!   reused. Graphs captured on one stream share its scratch: replay them one after another.
//!
//! The arena also keeps constant lists (a copy's layer table), which a call then passes by
//! address instead of staging them again.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use hisparse_gpu_kernels::arena::{ArenaStore, ListArena, Retained};
use hisparse_gpu_kernels::{self as gk, plan::PartKind};

use crate::context::Context;
use crate::error::RocmError;
use crate::ffi::{CAPTURE_STATUS_NONE, HOST_MALLOC_MAPPED, HOST_MALLOC_PORTABLE, Handle};

type Result<T> = std::result::Result<T, RocmError>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The resolver scratch of one stream: its counters (zero before the first launch, left zero by
/// every launch) and its workspace (uninitialised; the kernel initialises what it reads).
#[derive(Debug)]
pub(crate) struct Scratch {
    ctx: Arc<Context>,
    /// Device address of the counters.
    counters: usize,
    workspace: Mutex<Workspace>,
}

#[derive(Debug, Default)]
struct Workspace {
    /// `(address, bytes)` of the current workspace.
    current: Option<(usize, usize)>,
    /// Smaller workspaces replaced while launches (or graphs) using them may still run.
    retired: Vec<usize>,
}

// SAFETY: the scratch owns device allocations, which the HIP API uses and frees from any thread.
unsafe impl Send for Scratch {}
// SAFETY: shared references read addresses; the workspace is behind a mutex.
unsafe impl Sync for Scratch {}

impl Scratch {
    /// The scratch of `stream`, its counters zero before any launch enqueued on `stream` after
    /// this returns: cleared on `stream` (its next operation, no waiting), or, while `stream` is
    /// being captured, on the device's `side` stream, waited for.
    pub(crate) fn new(ctx: &Arc<Context>, stream: Handle, side: Handle) -> Result<Arc<Scratch>> {
        let bytes = gk::WORKSPACE_COUNTER_BYTES as usize;
        let p = ctx.relaxed_capture(|| {
            ctx.hip
                .malloc(bytes)
                .map_err(|st| RocmError::hip(&ctx.hip, "hipMalloc", st))
        })?;
        let scratch = Arc::new(Scratch {
            ctx: ctx.clone(),
            counters: p as usize,
            workspace: Mutex::new(Workspace::default()),
        });
        let status = ctx
            .hip
            .stream_capture_status(stream)
            .map_err(|st| RocmError::hip(&ctx.hip, "hipStreamIsCapturing", st))?;
        if status == CAPTURE_STATUS_NONE {
            // SAFETY: `p` is `bytes` of device memory just allocated, freed only with the scratch
            // (after the device finished with it); the memset precedes every launch that
            // follows on the stream.
            let st = unsafe { ctx.hip.memset_async(p, 0, bytes, stream) };
            ctx.check("hipMemsetAsync", st)?;
        } else {
            ctx.relaxed_capture(|| {
                // SAFETY: as above; on the side stream, which no capture records, waited for.
                let st = unsafe { ctx.hip.memset_async(p, 0, bytes, side) };
                ctx.check("hipMemsetAsync", st)?;
                ctx.check("hipStreamSynchronize", ctx.hip.stream_synchronize(side))
            })?;
        }
        Ok(scratch)
    }

    /// Device address of the counters.
    pub(crate) fn counters(&self) -> u64 {
        self.counters as u64
    }

    /// Device address of a workspace of at least `bytes` (allocated now if the current one is
    /// smaller; the old one is kept until the scratch goes: no synchronisation, allowed under
    /// capture). Its contents need no initialisation.
    pub(crate) fn workspace(&self, bytes: usize) -> Result<u64> {
        let mut ws = lock(&self.workspace);
        if let Some((p, cap)) = ws.current
            && cap >= bytes
        {
            return Ok(p as u64);
        }
        let cap = bytes.next_power_of_two();
        let p = self.ctx.relaxed_capture(|| {
            self.ctx
                .hip
                .malloc(cap)
                .map_err(|st| RocmError::hip(&self.ctx.hip, "hipMalloc", st))
        })?;
        if let Some((old, _)) = ws.current.replace((p as usize, cap)) {
            ws.retired.push(old);
        }
        Ok(p as u64)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.ctx.bind_quietly();
        let ws = self.workspace.get_mut().unwrap_or_else(|e| e.into_inner());
        let all = ws
            .current
            .iter()
            .map(|&(p, _)| p)
            .chain(ws.retired.iter().copied())
            .chain([self.counters]);
        for p in all {
            // SAFETY: every address came from `hipMalloc` above and is freed once, here;
            // `hipFree` waits for the device, so the last work using it has finished.
            let _ = unsafe { self.ctx.hip.free(p as *mut c_void) };
        }
    }
}

/// A chunk of the list arena: pinned, mapped host memory kernels read through `device`.
#[derive(Debug)]
pub(crate) struct PinnedChunk {
    host: *mut u8,
    device: u64,
}

/// The arena's memory on a HIP device: pinned, mapped chunks written by the host.
struct PinnedStore<'a> {
    ctx: &'a Context,
}

impl ArenaStore for PinnedStore<'_> {
    type Chunk = PinnedChunk;
    type Error = RocmError;

    fn alloc(&mut self, bytes: usize) -> Result<(PinnedChunk, u64)> {
        let ctx = self.ctx;
        let host = ctx.relaxed_capture(|| {
            ctx.hip
                .host_malloc(bytes, HOST_MALLOC_MAPPED | HOST_MALLOC_PORTABLE)
                .map_err(|st| RocmError::hip(&ctx.hip, "hipHostMalloc", st))
        })?;
        let device = match ctx.hip.host_device_pointer(host) {
            Ok(d) => d as u64,
            Err(st) => {
                // SAFETY: `host` was allocated just above and is not used after this.
                let _ = unsafe { ctx.hip.host_free(host) };
                return Err(RocmError::hip(&ctx.hip, "hipHostGetDevicePointer", st));
            }
        };
        Ok((
            PinnedChunk {
                host: host.cast(),
                device,
            },
            device,
        ))
    }

    fn write(&mut self, chunk: &PinnedChunk, addr: u64, bytes: &[u8]) -> Result<()> {
        let offset = (addr - chunk.device) as usize;
        // SAFETY: the arena places `bytes` inside the chunk it allocated (`addr` at or after its
        // device address, the end within its size), at a place no list used before, which no
        // kernel reads yet; the host side of the mapping is `offset` bytes further.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), chunk.host.add(offset), bytes.len())
        };
        Ok(())
    }
}

/// Memory and a stream that live as long as the device: the side stream, the list arena and
/// the scratch of captured launches.
pub(crate) struct Lasting {
    ctx: Arc<Context>,
    /// A non-blocking stream of the device's own, never captured.
    pub(crate) side: Handle,
    arena: Mutex<ListArena<PinnedChunk>>,
    /// Scratch a captured launch used (graphs read it at every replay), deduplicated.
    retained: Retained<Scratch>,
}

// SAFETY: the side stream and the pinned chunks are HIP objects usable from any thread; the
// arena and the retained scratch are behind mutexes.
unsafe impl Send for Lasting {}
// SAFETY: as above.
unsafe impl Sync for Lasting {}

impl Lasting {
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Lasting> {
        ctx.bind()?;
        let side = ctx
            .hip
            .stream_create()
            .map_err(|st| RocmError::hip(&ctx.hip, "hipStreamCreateWithFlags", st))?;
        Ok(Lasting {
            ctx: ctx.clone(),
            side,
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
        let mut store = PinnedStore { ctx: &self.ctx };
        lock(&self.arena).lasting_address(bytes, kind, capturing, &mut store)
    }

    /// Keeps `scratch` for the device's life (a captured launch uses it).
    pub(crate) fn retain(&self, scratch: &Arc<Scratch>) {
        self.retained.retain(scratch);
    }

    /// `(lists, bytes)` the arena holds.
    pub(crate) fn arena_use(&self) -> (usize, u64) {
        let arena = lock(&self.arena);
        (arena.lists(), arena.chunk_bytes())
    }
}

impl Drop for Lasting {
    fn drop(&mut self) {
        self.ctx.bind_quietly();
        let _ = self.ctx.hip.device_synchronize();
        self.retained.clear();
        let arena = std::mem::take(&mut *lock(&self.arena));
        for chunk in arena.into_chunks() {
            // SAFETY: the chunk came from `hipHostMalloc` in `PinnedStore::alloc` and is freed
            // once, here, after the device went idle.
            let _ = unsafe { self.ctx.hip.host_free(chunk.host.cast()) };
        }
        // SAFETY: the side stream was created in `new` and is destroyed once, here.
        let _ = unsafe { self.ctx.hip.stream_destroy(self.side) };
    }
}

impl std::fmt::Debug for Lasting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lasting").finish_non_exhaustive()
    }
}
