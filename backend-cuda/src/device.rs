//! [`CudaDevice`]: the [`Device`] implementation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use hisparse_core::ops::copy::{
    check_bulk, check_copy_within, check_host_page_copy, check_read, check_write,
};
use hisparse_core::ops::{
    BlockPair, BufferLen, Direction, GatherArgs, GatherDesc, HotResetDesc, IndexerBackupArgs,
    IndexerBackupDesc, InvalidateArgs, InvalidateDesc, PageCopyDesc, PageLayout, RemapArgs,
    RemapDesc, RemapModesArgs, RemapModesDesc, ResolveArgs, ResolveDesc, RowCopyDesc, RowSpan,
    SlotMappingArgs, SlotMappingDesc, TableWrite, TableWriteDesc,
};
use hisparse_core::{Device, MemoryInfo};
use hisparse_gpu_kernels::plan::{self, Plan, PlanError, Target};
use hisparse_gpu_kernels::{self as gk, Kernel};
use hisparse_host_memory::available_ram;

use crate::capture::{Lasting, Scratch};
use crate::error::CudaError;
pub use crate::ffi::CaptureMode;
use crate::ffi::{self, Context, DevMem, Event, Function, LaunchShape, Module, Stream};
use crate::pinned::{HostPoolSetup, PinnedMem};
use crate::staging::Staging;

type Result<T> = std::result::Result<T, CudaError>;

/// Device memory of a [`CudaDevice`] (zeroed at allocation; freed after outstanding work).
#[derive(Debug)]
pub struct CudaBuffer {
    pub(crate) mem: DevMem,
}

impl CudaBuffer {
    /// Device address (for diagnostics).
    pub fn device_address(&self) -> u64 {
        self.mem.ptr()
    }
}

impl BufferLen for CudaBuffer {
    fn byte_len(&self) -> u64 {
        self.mem.len() as u64
    }
}

/// Pinned, page-aligned host memory mapped into the device's address space: kernels read and
/// write it directly over the bus (cacheable, not write-combined). Allocated here
/// ([`Device::alloc_pinned`]), lent by an engine ([`CudaDevice::lend_host_memory`]) or a
/// shared-memory segment every rank of a node maps ([`CudaDevice::host_buffer_from_shared`]).
#[derive(Debug)]
pub struct CudaHostBuffer {
    pub(crate) mem: PinnedMem,
}

impl CudaHostBuffer {
    /// Whether the memory is a shared-memory segment ([`CudaDevice::host_buffer_from_shared`]).
    pub fn is_shared(&self) -> bool {
        self.mem.segment().is_some()
    }

    /// How the memory was set up (threads, NUMA node, pages, registrations), when this backend
    /// registered it; `None` for memory that was pinned already.
    pub fn setup(&self) -> Option<&hisparse_host_memory::Setup> {
        self.mem.setup()
    }
}

impl BufferLen for CudaHostBuffer {
    fn byte_len(&self) -> u64 {
        self.mem.len() as u64
    }
}

/// A CUDA stream (a non-blocking one of this backend, or an engine's lent through
/// [`CudaDevice::lend_stream`]), with the scratch memory its resolver launches use.
#[derive(Debug)]
pub struct CudaStream {
    pub(crate) inner: Stream,
    /// The resolver's counters (`hisparse_gpu_kernels::WORKSPACE_COUNTER_BYTES`: zero before the
    /// first launch, left zero by every launch, so no launch needs a memset first) and workspace;
    /// kept by the device too once a captured launch used them.
    pub(crate) scratch: Arc<Scratch>,
}

impl CudaStream {
    /// `inner` with empty scratch and cleared resolver counters ([`Scratch::new`]: no host
    /// synchronisation unless `inner` is being captured).
    pub(crate) fn from_inner(dev: &CudaDevice, inner: Stream) -> Result<CudaStream> {
        let scratch = Scratch::new(&dev.ctx, &inner, &dev.lasting.side)?;
        Ok(CudaStream { inner, scratch })
    }

    /// The driver's handle of the stream, e.g. to order an engine's own work after this
    /// backend's (`torch.cuda.ExternalStream`). It stays owned by this value.
    pub fn raw_handle(&self) -> cudarc::driver::sys::CUstream {
        self.inner.raw()
    }
}

/// A CUDA event.
#[derive(Debug)]
pub struct CudaEvent {
    inner: Event,
}

/// An instantiated CUDA graph captured with [`CudaDevice::capture`].
#[derive(Debug)]
pub struct CudaGraph {
    inner: ffi::Graph,
}

/// Resource use of one compiled kernel ([`CudaDevice::kernel_report`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelReport {
    /// The kernel's symbol.
    pub name: &'static str,
    /// Registers per thread.
    pub registers: i32,
    /// Local memory (register spills, stack) per thread, in bytes.
    pub local_bytes: i32,
    /// Static shared memory per block, in bytes.
    pub shared_bytes: i32,
    /// Threads per block the report assumes (the largest the backend launches it with).
    pub block_threads: u32,
    /// Blocks one multiprocessor holds at once at that block size.
    pub blocks_per_multiprocessor: i32,
}

/// The loaded module and its kernels.
pub(crate) struct Kernels {
    _module: Module,
    /// One function per entry of [`Kernel::ALL`], in that order.
    f: [Function; Kernel::ALL.len()],
    /// Dynamic shared memory the resolver functions accept (their attribute is raised to it);
    /// every other function accepts [`DEFAULT_DYNAMIC_SHARED`].
    large_dynamic_shared: u32,
}

/// Dynamic shared memory a CUDA function accepts without opting in.
const DEFAULT_DYNAMIC_SHARED: u32 = 48 * 1024;

impl Kernels {
    pub(crate) fn get(&self, k: Kernel) -> Function {
        self.f[Kernel::ALL.iter().position(|x| *x == k).unwrap_or(0)]
    }

    /// Dynamic shared memory a launch of `k` may ask for.
    fn dynamic_shared_limit(&self, k: Kernel) -> u32 {
        if k.large_dynamic_shared() {
            self.large_dynamic_shared
        } else {
            DEFAULT_DYNAMIC_SHARED
        }
    }
}

/// Configuration of a [`CudaDevice`], given at [`CudaDevice::open_with`]. The default is what
/// production runs: [`CudaDevice::open`] uses it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaOptions {
    /// Keep each resolving request's LRU copy, partition and bitmap in the global workspace even
    /// when they fit shared memory. The resolver's planner takes this global-state mode by itself
    /// only for hot-slot counts whose state exceeds the device's shared memory; forcing it lets
    /// the conformance suite check that mode on a GPU large enough never to need it. Results are
    /// identical; it is slower. Off by default.
    pub resolve_global_state: bool,
}

/// One CUDA device: a retained primary context, kernels compiled with NVRTC on first use
/// (cached per process and architecture), and the staging rings for host-side lists.
pub struct CudaDevice {
    pub(crate) ctx: Arc<Context>,
    pub(crate) ordinal: usize,
    name: String,
    cc: (i32, i32),
    /// What the launch planners know about the device.
    pub(crate) target: Target,
    kernels: OnceLock<Kernels>,
    kernels_init: Mutex<()>,
    staging: Mutex<Staging>,
    /// The side stream, the list arena and the scratch of captured launches.
    pub(crate) lasting: Lasting,
    programmatic: AtomicBool,
    /// How host pools are set up ([`CudaDevice::with_host_pool_config`]).
    pub(crate) host_pool: HostPoolSetup,
    /// What [`CudaDevice::open_with`] was given.
    options: CudaOptions,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl From<PlanError> for CudaError {
    fn from(e: PlanError) -> Self {
        CudaError::Unsupported(e.to_string())
    }
}

/// Kernels that run `HS_GRID_DEP_WAIT` before touching memory, so they may be launched with
/// programmatic stream serialisation: the decode path (remap, resolve, gather).
const fn waits_for_grid_dependency(k: Kernel) -> bool {
    matches!(
        k,
        Kernel::Remap
            | Kernel::RemapModes
            | Kernel::Resolve
            | Kernel::GatherRows
            | Kernel::ResolveGather
    )
}

impl CudaDevice {
    /// Opens CUDA device `ordinal`. No driver or no such device gives an error of kind
    /// `NotFound`; so does a missing NVRTC ([`CudaError::NoNvrtc`]), since no kernel could run.
    /// Kernels are compiled on first use (or with [`CudaDevice::prepare`]).
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
        Self::open_with(ordinal, CudaOptions::default())
    }

    /// Opens CUDA device `ordinal` configured by `options` (otherwise as [`CudaDevice::open`]).
    pub fn open_with(ordinal: usize, options: CudaOptions) -> Result<CudaDevice> {
        if !ffi::driver_present() {
            return Err(CudaError::NoDriver);
        }
        ffi::init()?;
        let count = ffi::device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        crate::nvrtc::ensure()?;
        let dev = ffi::device_get(ordinal)?;
        let attr = |a| ffi::device_attr(dev, a);
        if attr(Attr::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? == 0
            || attr(Attr::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? == 0
        {
            return Err(CudaError::Unsupported(
                "device cannot map pinned host memory (needed for the swap-in gather)".into(),
            ));
        }
        let cc = (
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let target = Target {
            multiprocessors: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32,
            shared_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                .max(0) as u64,
            shared_per_multiprocessor: attr(
                Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            )?
            .max(0) as u64,
        };
        let ctx = Context::retain(dev)?;
        let name = format!(
            "{} (sm_{}{}, device {ordinal})",
            ffi::device_name(dev)?,
            cc.0,
            cc.1
        );
        Ok(CudaDevice {
            staging: Mutex::new(Staging::new(ctx.clone())),
            lasting: Lasting::new(&ctx)?,
            ctx,
            ordinal,
            name,
            cc,
            target,
            kernels: OnceLock::new(),
            kernels_init: Mutex::new(()),
            programmatic: AtomicBool::new(false),
            host_pool: HostPoolSetup::probe(dev)?,
            options,
        })
    }

    /// The configuration the device was opened with.
    pub fn options(&self) -> CudaOptions {
        self.options
    }

    /// Compiles and loads the kernels now (otherwise the first operation does).
    pub fn prepare(&self) -> Result<()> {
        self.kernels().map(|_| ())
    }

    /// Whether the decode-path kernels (remap, resolve, gather) are launched with programmatic
    /// stream serialisation (programmatic dependent launch).
    pub fn programmatic_launch(&self) -> bool {
        self.programmatic.load(Ordering::Relaxed)
    }

    /// Launches the decode-path kernels (remap, resolve, gather) with programmatic stream
    /// serialisation (`on`, and a device of compute capability 9.0 or newer; otherwise normally):
    /// each may be scheduled while the previous kernel of its stream finishes, and waits for it on
    /// the device (`griddepcontrol.wait`) before touching memory, which hides the launch gap (a
    /// resolve's gather is scheduled while the resolve runs). Results are identical. Off by
    /// default. Returns whether it is on.
    pub fn set_programmatic_launch(&self, on: bool) -> bool {
        let on = on && self.cc.0 >= 9;
        self.programmatic.store(on, Ordering::Relaxed);
        on
    }

    /// What the driver made of the decode-path kernels: registers per thread, local (spill)
    /// bytes per thread, static shared bytes per block, and blocks one multiprocessor holds at
    /// the largest block size the backend launches.
    pub fn kernel_report(&self) -> Result<Vec<KernelReport>> {
        use cudarc::driver::sys::CUfunction_attribute as A;
        let k = self.kernels()?;
        let list: Vec<(&'static str, Function, u32)> = [
            Kernel::Remap,
            Kernel::Resolve,
            Kernel::GatherRows,
            Kernel::ResolveGather,
        ]
        .into_iter()
        .map(|x| (x.name(), k.get(x), x.abi().block_threads))
        .collect();
        let mut out = Vec::new();
        for (name, f, block) in list {
            out.push(KernelReport {
                name,
                registers: f.attribute(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
                local_bytes: f.attribute(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
                shared_bytes: f.attribute(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
                block_threads: block,
                blocks_per_multiprocessor: f.max_active_blocks(block, 0)?,
            });
        }
        Ok(out)
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// Number of multiprocessors.
    pub fn multiprocessor_count(&self) -> u32 {
        self.target.multiprocessors
    }

    /// Largest shared memory one block may use, in bytes.
    pub fn max_shared_per_block(&self) -> u32 {
        self.target.shared_per_block as u32
    }

    /// `(free, total)` bytes of device memory (`cuMemGetInfo`; [`Device::memory_info`] adds the
    /// host's available RAM).
    pub fn device_memory(&self) -> Result<(usize, usize)> {
        self.ctx.bind()?;
        ffi::mem_info()
    }

    /// Records an event with timing enabled at the end of `stream`.
    pub fn timing_event(&self, stream: &CudaStream) -> Result<CudaEvent> {
        let inner = Event::new(&self.ctx, true)?;
        inner.record(&stream.inner)?;
        Ok(CudaEvent { inner })
    }

    /// Milliseconds between two timing events (waits for `end`).
    pub fn elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        end.inner.elapsed_ms_since(&start.inner)
    }

    /// Captures the work `f` enqueues on `stream` into a graph instead of running it, in relaxed
    /// capture mode ([`CudaDevice::capture_in`]).
    pub fn capture(
        &self,
        stream: &CudaStream,
        f: impl FnOnce(&Self) -> Result<()>,
    ) -> Result<CudaGraph> {
        self.capture_in(stream, CaptureMode::Relaxed, f)
    }

    /// Captures the work `f` enqueues on `stream` into a graph instead of running it, in `mode`
    /// (global is what `torch.cuda.graph` uses). Decode-path operations ([`Device::remap`],
    /// [`Device::resolve`], `resolve_and_gather`, [`Device::gather_rows`],
    /// [`Device::invalidate`], [`Device::compressed_slot_mapping`]) can be captured, and so can
    /// the table maintenance and copies (their lists go to the device's list arena, kept for the
    /// device's life: see the `capture` module); anything that synchronises with the host cannot.
    /// `f` may lend `stream`'s handle ([`CudaDevice::lend_stream`]) and enqueue on the lent stream.
    /// Allocations the calls need (a larger resolver workspace, arena memory) are made with the
    /// thread in relaxed mode, as PyTorch's allocator does.
    pub fn capture_in(
        &self,
        stream: &CudaStream,
        mode: CaptureMode,
        f: impl FnOnce(&Self) -> Result<()>,
    ) -> Result<CudaGraph> {
        self.prepare()?;
        stream.inner.begin_capture(mode)?;
        let body = f(self);
        let graph = stream.inner.end_capture();
        body?;
        Ok(CudaGraph { inner: graph? })
    }

    /// `(lists, bytes)` the device's list arena holds: every distinct list of captured calls and
    /// the constant lists (layer tables) kept instead of being staged on every call.
    pub fn list_arena_use(&self) -> (usize, u64) {
        self.lasting.arena_use()
    }

    /// Enqueues one replay of `graph` on `stream`.
    pub fn launch_graph(&self, graph: &CudaGraph, stream: &CudaStream) -> Result<()> {
        self.ctx.bind()?;
        stream.inner.launch_graph(&graph.inner)
    }

    pub(crate) fn kernels(&self) -> Result<&Kernels> {
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let _guard = lock(&self.kernels_init);
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let ptx = crate::nvrtc::cached_ptx(self.cc.0, self.cc.1)?;
        // A first call may come while a stream is being captured: loading is no stream work.
        let module = ffi::relaxed_capture(|| Module::load_ptx(&self.ctx, &ptx))?;
        let mut f = Vec::with_capacity(Kernel::ALL.len());
        for k in Kernel::ALL {
            f.push(module.function(k.name())?);
        }
        let f: [Function; Kernel::ALL.len()] = f.try_into().map_err(|_| CudaError::Compile {
            log: "kernel table".into(),
        })?;
        // The resolvers' shared state and table are sized by the planner up to the device's
        // per-block maximum: raise their limit (so no planned launch is refused by the driver).
        let dynamic = self
            .target
            .shared_per_block
            .saturating_sub(gk::RESOLVE_STATIC_SHARED_BYTES) as u32;
        for (k, func) in Kernel::ALL.iter().zip(&f) {
            if k.large_dynamic_shared() {
                func.set_max_dynamic_shared(dynamic)?;
            }
        }
        let _ = self.kernels.set(Kernels {
            _module: module,
            f,
            large_dynamic_shared: dynamic,
        });
        self.kernels.get().ok_or_else(|| CudaError::Compile {
            log: "kernel table".into(),
        })
    }

    /// Enqueues `plan` on `stream`: places its lists (constant ones, and every list of work being
    /// captured, in the device's list arena; the others through one asynchronous copy into the
    /// staging ring, reserved until the launches completed), places the symbolic pointers (the
    /// stream's workspace and resolver counters among them) and launches each kernel in order.
    /// An empty plan enqueues nothing; a plan without lists or workspace (the decode path) costs
    /// its launches and nothing else. A launch asking for more dynamic shared memory than its
    /// function accepts is refused before anything of the plan is enqueued.
    pub(crate) fn execute(&self, stream: &CudaStream, mut plan: Plan) -> Result<()> {
        if plan.launches.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // Only lists and scratch depend on whether the stream is being captured.
        let capturing = (!plan.staged.is_empty() || plan.workspace_bytes > 0)
            && stream.inner.capture_status()? != ffi::CaptureStatus::None;
        let workspace = if plan.workspace_bytes > 0 {
            let bytes = usize::try_from(plan.workspace_bytes)
                .map_err(|_| CudaError::Unsupported("resolve workspace exceeds memory".into()))?;
            stream.scratch.workspace(&self.ctx, bytes)?
        } else {
            0
        };
        if capturing {
            // Every replay of the graph uses this stream's counters and workspace.
            self.lasting.retain(&stream.scratch);
        }
        let kernels = self.kernels()?;
        for l in &plan.launches {
            let limit = kernels.dynamic_shared_limit(l.kernel);
            if l.shared > limit {
                return Err(CudaError::Unsupported(format!(
                    "{} asks for {} bytes of dynamic shared memory; the function accepts {limit}",
                    l.kernel.name(),
                    l.shared
                )));
            }
        }
        // Each part's address in the arena, or `None`: staged through the ring.
        let kept = plan
            .staged
            .iter()
            .map(|p| self.lasting.lasting_address(&p.bytes, p.kind, capturing))
            .collect::<Result<Vec<Option<u64>>>>()?;
        let ringed: Vec<&[u8]> = plan
            .staged
            .iter()
            .zip(&kept)
            .filter(|(_, k)| k.is_none())
            .map(|(p, _)| p.bytes.as_slice())
            .collect();
        let mut staging = lock(&self.staging);
        let lease = if ringed.is_empty() {
            None
        } else {
            Some(staging.stage(&stream.inner, &ringed)?)
        };
        let mut from_ring = lease.iter().flat_map(|l| l.ptrs.iter().copied());
        let placed: Vec<u64> = kept
            .iter()
            .map(|k| k.or_else(|| from_ring.next()).unwrap_or(0))
            .collect();
        let result = (|| {
            for l in &mut plan.launches {
                l.args
                    .resolve(&placed, workspace, stream.scratch.counters())
                    .map_err(|log| CudaError::Compile { log })?;
                let abi = l.kernel.abi();
                debug_assert!(l.args.matches(&abi).is_ok(), "{:?}", l.args.matches(&abi));
                let f = kernels.get(l.kernel);
                let programmatic =
                    self.programmatic_launch() && waits_for_grid_dependency(l.kernel);
                let shape = LaunchShape {
                    grid: (l.grid[0], l.grid[1], l.grid[2]),
                    block: l.block,
                    shared: l.shared,
                };
                let mut params = l
                    .args
                    .pointers()
                    .map_err(|log| CudaError::Compile { log })?;
                // SAFETY: `params` holds one pointer per parameter of the kernel `f`, each to a value of the ABI type (packed
                // by the planner through `Args`, checked against the ABI table above in debug
                // builds), alive until the call returns. Every device address among them belongs
                // to a buffer the caller checked with the core's `check` and keeps alive until the
                // work completes (the `Device` contract), to the staging region reserved until
                // then, or to the stream's workspace (freed only with the stream, after the
                // context synchronised). With `programmatic`, the kernel waits for the previous
                // grid (`griddepcontrol.wait`) before touching memory (`waits_for_grid_dependency`,
                // compute capability 9.0+).
                unsafe { ffi::launch(f, shape, &stream.inner, &mut params, programmatic) }?;
            }
            Ok(())
        })();
        if let Some(lease) = lease {
            staging.finish(lease, &stream.inner)?;
        }
        result
    }

    /// The swap-in critical path in one launch: [`Device::resolve`] of `desc` with `args`, and
    /// the gather of its miss plan (`args.miss_src`, `args.miss_dst`, `args.miss_counts`) from
    /// `host` into `device` for `layers`, as [`Device::gather_rows`] would do right after it —
    /// identical results — but in one `hs_resolve_gather` launch: each request's missed rows
    /// start crossing the bus as soon as that request is resolved, while the others still
    /// resolve, and no second launch waits for the slowest request (`layers` beyond 16 follow as
    /// gather launches). No host synchronisation; capturable in a graph.
    pub fn resolve_and_gather(
        &self,
        stream: &CudaStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, CudaBuffer>,
        layers: &[hisparse_core::ops::LayerPair],
        host: &CudaHostBuffer,
        device: &mut CudaBuffer,
    ) -> Result<()> {
        // The one rule for both halves (the trait's default and the reference use it too).
        hisparse_core::ops::swap_in::check(
            desc,
            &args.sizes(),
            layers,
            host.byte_len(),
            device.byte_len(),
        )?;
        let addrs = self.resolve_addrs(&args);
        let plan = plan::resolve_gather(
            &self.target,
            desc,
            &addrs,
            layers,
            host.mem.dev_ptr(),
            device.mem.ptr(),
            self.options.resolve_global_state,
        )?;
        self.execute(stream, plan)
    }

    fn resolve_addrs(&self, args: &ResolveArgs<'_, CudaBuffer>) -> plan::ResolveAddrs {
        args.map(|b| b.mem.ptr())
    }
}

impl Device for CudaDevice {
    type Error = CudaError;
    type Buffer = CudaBuffer;
    type HostBuffer = CudaHostBuffer;
    type Stream = CudaStream;
    type Event = CudaEvent;

    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn device_name(&self) -> &str {
        &self.name
    }

    fn alloc(&self, bytes: usize) -> Result<CudaBuffer> {
        Ok(CudaBuffer {
            mem: DevMem::alloc_zeroed(&self.ctx, bytes)?,
        })
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<CudaHostBuffer> {
        // The host's limits are checked before anything is reserved (crate::pinned).
        let mem = PinnedMem::alloc_pool(&self.ctx, bytes, &self.host_pool)?;
        Ok(CudaHostBuffer { mem })
    }

    fn pinned_address(&self, buf: &CudaHostBuffer) -> usize {
        buf.mem.host_addr()
    }

    fn upload(&self, dst: &mut CudaBuffer, offset: usize, src: &[u8]) -> Result<()> {
        check_write(dst, offset, src)?;
        dst.mem.write(offset, src)
    }

    fn download(&self, src: &CudaBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_read(src, offset, dst)?;
        src.mem.read(offset, dst)
    }

    fn write_pinned(&self, dst: &mut CudaHostBuffer, offset: usize, src: &[u8]) -> Result<()> {
        check_write(dst, offset, src)?;
        self.ctx.synchronize()?;
        dst.mem.as_mut_slice()[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read_pinned(&self, src: &CudaHostBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_read(src, offset, dst)?;
        self.ctx.synchronize()?;
        dst.copy_from_slice(&src.mem.as_slice()[offset..offset + dst.len()]);
        Ok(())
    }

    fn create_stream(&self) -> Result<CudaStream> {
        CudaStream::from_inner(self, Stream::new(&self.ctx)?)
    }

    fn record_event(&self, stream: &CudaStream) -> Result<CudaEvent> {
        let inner = Event::new(&self.ctx, false)?;
        inner.record(&stream.inner)?;
        Ok(CudaEvent { inner })
    }

    fn wait_event(&self, stream: &CudaStream, event: &CudaEvent) -> Result<()> {
        self.ctx.bind()?;
        stream.inner.wait(&event.inner)
    }

    fn synchronize(&self, stream: &CudaStream) -> Result<()> {
        stream.inner.synchronize()
    }

    fn query_event(&self, event: &CudaEvent) -> Result<bool> {
        self.ctx.bind()?;
        event.inner.is_complete()
    }

    /// `cuStreamIsCapturing`: true while a capture sequence is open on the stream (also one
    /// the driver has invalidated, which then fails when it ends).
    fn is_capturing(&self, stream: &CudaStream) -> Result<bool> {
        self.ctx.bind()?;
        Ok(stream.inner.capture_status()? != ffi::CaptureStatus::None)
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        let (free, _) = self.device_memory().ok()?;
        Some(MemoryInfo {
            device_free: free as u64,
            host_available: available_ram()?,
            unified: false,
        })
    }

    fn copy_within_device(
        &self,
        stream: &CudaStream,
        buf: &mut CudaBuffer,
        src_offset: usize,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        check_copy_within(
            buf.byte_len(),
            src_offset as u64,
            dst_offset as u64,
            bytes as u64,
        )?;
        self.ctx.bind()?;
        // The ranges do not overlap (checked above).
        stream
            .inner
            .copy_dtod(&buf.mem, src_offset, &buf.mem, dst_offset, bytes)
    }

    fn write_table(
        &self,
        stream: &CudaStream,
        desc: &TableWriteDesc,
        writes: &[TableWrite],
        table: &mut CudaBuffer,
    ) -> Result<()> {
        desc.check(writes, table)?;
        let plan = plan::write_table(&self.target, desc, writes, table.mem.ptr())?;
        self.execute(stream, plan)
    }

    fn reset_hot_state(
        &self,
        stream: &CudaStream,
        desc: &HotResetDesc,
        rows: &[u32],
        slot_host_rows: &mut CudaBuffer,
        lru: &mut CudaBuffer,
    ) -> Result<()> {
        desc.check(rows, slot_host_rows, lru)?;
        let plan = plan::reset_hot_state(
            &self.target,
            desc,
            rows,
            slot_host_rows.mem.ptr(),
            lru.mem.ptr(),
        )?;
        self.execute(stream, plan)
    }

    // Accepted twins (CONTRIBUTING.md, "One rule, one place"): the three bulk copies share the
    // Device trait's signature shape; each moves bytes in its own direction.
    fn copy_to_device(
        &self,
        stream: &CudaStream,
        src: &CudaHostBuffer,
        src_offset: usize,
        dst: &mut CudaBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        check_bulk(src, src_offset, dst, dst_offset, bytes)?;
        self.ctx.bind()?;
        stream
            .inner
            .copy_htod(&src.mem, src_offset, &dst.mem, dst_offset, bytes)
    }

    fn copy_to_host(
        &self,
        stream: &CudaStream,
        src: &CudaBuffer,
        src_offset: usize,
        dst: &mut CudaHostBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        check_bulk(src, src_offset, dst, dst_offset, bytes)?;
        self.ctx.bind()?;
        stream
            .inner
            .copy_dtoh(&src.mem, src_offset, &dst.mem, dst_offset, bytes)
    }

    fn copy_on_device(
        &self,
        stream: &CudaStream,
        src: &CudaBuffer,
        src_offset: usize,
        dst: &mut CudaBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        check_bulk(src, src_offset, dst, dst_offset, bytes)?;
        self.ctx.bind()?;
        stream
            .inner
            .copy_dtod(&src.mem, src_offset, &dst.mem, dst_offset, bytes)
    }

    fn remap(
        &self,
        stream: &CudaStream,
        desc: &RemapDesc,
        args: RemapArgs<'_, CudaBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        let addrs = remap_addrs(&args);
        let plan = plan::remap(&self.target, desc, &addrs)?;
        self.execute(stream, plan)
    }

    /// Both modes (decode-context-parallel de-interleave, prefill workspace) run `hs_remap_modes`;
    /// a call without modes is the plain remap (the same kernel as [`Device::remap`]).
    fn remap_modes(
        &self,
        stream: &CudaStream,
        desc: &RemapModesDesc,
        args: RemapModesArgs<'_, CudaBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        if !desc.has_modes() {
            return self.remap(stream, &desc.remap, args.remap);
        }
        let addrs = plan::RemapModesAddrs {
            remap: remap_addrs(&args.remap),
            prefill_req_id: args.prefill_req_id.map_or(0, |b| b.mem.ptr()),
            workspace_starts: args.workspace_starts.map_or(0, |b| b.mem.ptr()),
        };
        let plan = plan::remap_modes(&self.target, desc, &addrs)?;
        self.execute(stream, plan)
    }

    fn resolve(
        &self,
        stream: &CudaStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, CudaBuffer>,
    ) -> Result<()> {
        desc.check(&args.sizes())?;
        let addrs = self.resolve_addrs(&args);
        let plan = plan::resolve(
            &self.target,
            desc,
            &addrs,
            self.options.resolve_global_state,
        )?;
        self.execute(stream, plan)
    }

    fn gather_rows(
        &self,
        stream: &CudaStream,
        desc: &GatherDesc<'_>,
        args: GatherArgs<'_, CudaBuffer, CudaHostBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        let addrs = plan::GatherAddrs {
            plan_src: args.plan_src.mem.ptr(),
            plan_dst: args.plan_dst.mem.ptr(),
            plan_counts: args.plan_counts.mem.ptr(),
            host: args.host.mem.dev_ptr(),
            device: args.device.mem.ptr(),
        };
        let plan = plan::gather(&self.target, desc, &addrs)?;
        self.execute(stream, plan)
    }

    /// From [`plan::FUSED_MIN_ROWS`] token rows one `hs_resolve_gather` launch (the inherent
    /// [`CudaDevice::resolve_and_gather`]: each request's misses are copied while other requests
    /// still resolve); below, `resolve` then `gather_rows`, which is faster there.
    fn resolve_and_gather(
        &self,
        stream: &CudaStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, CudaBuffer>,
        layers: &[hisparse_core::ops::LayerPair],
        host: &CudaHostBuffer,
        device: &mut CudaBuffer,
    ) -> Result<()> {
        if plan::swap_in_fused(desc) {
            // The inherent method of the same name (inherent methods take precedence).
            return CudaDevice::resolve_and_gather(self, stream, desc, args, layers, host, device);
        }
        // Few rows: the pair, as the trait's default does it.
        hisparse_core::device::resolve_then_gather(self, stream, desc, args, layers, host, device)
    }

    fn copy_pages(
        &self,
        stream: &CudaStream,
        desc: &PageCopyDesc<'_>,
        pairs: &[BlockPair],
        host: &mut CudaHostBuffer,
        device: &mut CudaBuffer,
    ) -> Result<()> {
        desc.check(pairs, host.byte_len(), device.byte_len())?;
        let (jobs, src, dst): (Vec<_>, _, _) = match desc.direction {
            Direction::DeviceToHost => (
                desc.layers.iter().map(|l| (l.device, l.host)).collect(),
                device.mem.ptr(),
                host.mem.dev_ptr(),
            ),
            Direction::HostToDevice => (
                desc.layers.iter().map(|l| (l.host, l.device)).collect(),
                host.mem.dev_ptr(),
                device.mem.ptr(),
            ),
        };
        let plan = plan::copy_pages(&self.target, &jobs, pairs, src, dst, false)?;
        self.execute(stream, plan)
    }

    fn copy_rows(
        &self,
        stream: &CudaStream,
        desc: &RowCopyDesc<'_>,
        spans: &[RowSpan],
        host: &mut CudaHostBuffer,
        device: &mut CudaBuffer,
    ) -> Result<()> {
        desc.check(spans, host.byte_len(), device.byte_len())?;
        let plan = plan::copy_rows(
            &self.target,
            desc,
            spans,
            host.mem.dev_ptr(),
            device.mem.ptr(),
        )?;
        self.execute(stream, plan)
    }

    fn copy_host_pages(
        &self,
        stream: &CudaStream,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &mut CudaHostBuffer,
    ) -> Result<()> {
        check_host_page_copy(layers, pairs, host.byte_len())?;
        let jobs: Vec<(PageLayout, PageLayout)> = layers.iter().map(|l| (*l, *l)).collect();
        let p = host.mem.dev_ptr();
        let plan = plan::copy_pages(&self.target, &jobs, pairs, p, p, true)?;
        self.execute(stream, plan)
    }

    fn invalidate(
        &self,
        stream: &CudaStream,
        desc: &InvalidateDesc,
        args: InvalidateArgs<'_, CudaBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        let plan = plan::invalidate(
            &self.target,
            desc,
            args.ranges.mem.ptr(),
            args.slot_host_rows.mem.ptr(),
        );
        self.execute(stream, plan)
    }

    /// One `hs_indexer_backup` launch for every layer and token (the layer table kept in the
    /// device's list arena); rows whose parts are all 16-byte multiples move in 16-byte chunks,
    /// others (132-byte rows) in 4-byte words. No host synchronisation.
    fn indexer_backup(
        &self,
        stream: &CudaStream,
        desc: &IndexerBackupDesc<'_>,
        args: IndexerBackupArgs<'_, CudaBuffer, CudaHostBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        let addrs = plan::IndexerBackupAddrs {
            device_slots: args.device_slots.mem.ptr(),
            host_slots: args.host_slots.mem.ptr(),
            device: args.device.mem.ptr(),
            host: args.host.mem.dev_ptr(),
        };
        let plan = plan::indexer_backup(&self.target, desc, &addrs)?;
        self.execute(stream, plan)
    }

    fn compressed_slot_mapping(
        &self,
        stream: &CudaStream,
        desc: &SlotMappingDesc,
        args: SlotMappingArgs<'_, CudaBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        let addrs = plan::SlotMappingAddrs {
            positions: args.positions.mem.ptr(),
            slot_mapping: args.slot_mapping.mem.ptr(),
            table_row: args.table_row.mem.ptr(),
            block_table: args.block_table.mem.ptr(),
            out: args.out.mem.ptr(),
        };
        self.execute(stream, plan::slot_mapping(desc, &addrs))
    }
}

/// Device addresses of a remap's buffers (the plain remap's and the modes' alike).
fn remap_addrs(args: &RemapArgs<'_, CudaBuffer>) -> plan::RemapAddrs {
    plan::RemapAddrs {
        req_id: args.req_id.mem.ptr(),
        block_table: args.block_table.mem.ptr(),
        topk: args.topk.mem.ptr(),
        idx_mapping: args.idx_mapping.map_or(0, |b| b.mem.ptr()),
        out: args.out.mem.ptr(),
        counts: args.counts.as_ref().map_or(0, |b| b.mem.ptr()),
        stats: args.stats.as_ref().map_or(0, |b| b.mem.ptr()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::Error as _;

    #[test]
    fn open_without_a_usable_device_is_a_typed_error() {
        // On a machine with a GPU this opens it; everywhere else it must be NotFound, not a panic.
        if let Err(e) = CudaDevice::open(0) {
            assert_eq!(e.kind(), hisparse_core::ErrorKind::NotFound, "{e}");
        }
        if let Err(e) = CudaDevice::open(usize::MAX / 2) {
            assert_eq!(e.kind(), hisparse_core::ErrorKind::NotFound, "{e}");
        }
    }

    #[test]
    fn only_kernels_that_wait_for_their_grid_dependency_launch_programmatically() {
        assert!(waits_for_grid_dependency(Kernel::Remap));
        assert!(waits_for_grid_dependency(Kernel::RemapModes));
        assert!(waits_for_grid_dependency(Kernel::Resolve));
        assert!(waits_for_grid_dependency(Kernel::GatherRows));
        assert!(waits_for_grid_dependency(Kernel::ResolveGather));
        for k in Kernel::ALL {
            if waits_for_grid_dependency(k) {
                // The kernel body starts with the wait (HS_GRID_DEP_WAIT) before any access.
                let at = gk::COMMON_SOURCE
                    .find(&format!(" {}(", k.name()))
                    .expect("kernel in source");
                let body = &gk::COMMON_SOURCE[at..];
                let open = body.find('{').expect("body");
                let first = body[open + 1..].trim_start();
                let first = first
                    .lines()
                    .find(|l| {
                        let l = l.trim();
                        !l.starts_with("HS_SHARED") && !l.starts_with("HS_DYN_SHARED")
                    })
                    .unwrap_or_default();
                assert!(
                    first.trim().starts_with("HS_GRID_DEP_WAIT()"),
                    "{}: {first}",
                    k.name()
                );
            }
        }
    }
}
