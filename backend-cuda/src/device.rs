//! [`CudaDevice`]: the [`Device`] implementation.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use hisparse_core::ops::copy::{
    check_bulk, check_copy_within, check_host_page_copy, check_read, check_write,
};
use hisparse_core::ops::{
    BlockPair, BufferLen, Direction, GatherArgs, GatherDesc, HotResetDesc, InvalidateArgs,
    InvalidateDesc, PageCopyDesc, PageLayout, RemapArgs, RemapDesc, ResolveArgs, ResolveDesc,
    RowCopyDesc, RowSpan, SlotMappingArgs, SlotMappingDesc, TableWrite, TableWriteDesc,
    check_pinned_budget,
};
use hisparse_core::{Device, MemoryInfo};
use hisparse_gpu_kernels::{self as gk, GatherLayers, Kernel};

use crate::error::CudaError;
use crate::ffi::{self, Arg, Context, DevMem, Event, Function, Launch, Module, PinnedMem, Stream};
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
/// write it directly over the bus (cacheable, not write-combined).
#[derive(Debug)]
pub struct CudaHostBuffer {
    pub(crate) mem: PinnedMem,
}

impl BufferLen for CudaHostBuffer {
    fn byte_len(&self) -> u64 {
        self.mem.len() as u64
    }
}

/// A CUDA stream (a non-blocking one of this backend, or an engine's lent through
/// [`CudaDevice::wrap_stream`]), with the scratch memory its resolver launches use.
#[derive(Debug)]
pub struct CudaStream {
    inner: Stream,
    workspace: Mutex<Workspace>,
}

impl CudaStream {
    /// A stream with empty scratch.
    pub(crate) fn from_inner(inner: Stream) -> CudaStream {
        CudaStream {
            inner,
            workspace: Mutex::new(Workspace::default()),
        }
    }

    /// The driver's handle of the stream, e.g. to order an engine's own work after this
    /// backend's (`torch.cuda.ExternalStream`). It stays owned by this value.
    pub fn raw_handle(&self) -> cudarc::driver::sys::CUstream {
        self.inner.raw()
    }
}

#[derive(Debug, Default)]
struct Workspace {
    current: Option<DevMem>,
    /// Smaller workspaces replaced while launches using them may be in flight; freed with the
    /// stream (after the context synchronised).
    retired: Vec<DevMem>,
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

/// Which remap kernel a [`CudaDevice`] launches. Every variant gives identical results; they
/// differ only in speed, and exist so that one run on a device can measure them side by side.
/// The initial choice comes from the environment variable `HISPARSE_CUDA_REMAP` (see
/// [`RemapKernel::from_name`]), else [`RemapKernel::V2`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RemapKernel {
    /// `hs_remap_v1`: one block per token row, the table row staged with 4-byte loads.
    V1,
    /// `hs_remap`: one block per token row, at most 32 registers (8 blocks per multiprocessor),
    /// top-k loads issued first, the table row staged with asynchronous 16-byte copies.
    V2,
    /// `hs_remap` with table entries read through the read-only cache instead of staged.
    V2Direct,
}

impl RemapKernel {
    /// Every variant.
    pub const ALL: [RemapKernel; 3] = [RemapKernel::V1, RemapKernel::V2, RemapKernel::V2Direct];

    /// The variant's name: `v1`, `v2` or `v2-direct`.
    pub const fn name(self) -> &'static str {
        match self {
            RemapKernel::V1 => "v1",
            RemapKernel::V2 => "v2",
            RemapKernel::V2Direct => "v2-direct",
        }
    }

    /// The variant named `name` (as [`RemapKernel::name`] spells it), if any.
    pub fn from_name(name: &str) -> Option<RemapKernel> {
        Self::ALL.into_iter().find(|k| k.name() == name.trim())
    }
}

/// Which swap-in gather kernel a [`CudaDevice`] launches. Every variant gives identical results.
/// The initial choice comes from the environment variable `HISPARSE_CUDA_GATHER` (see
/// [`GatherKernel::from_name`]), else [`GatherKernel::V2`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GatherKernel {
    /// `hs_gather_rows_v1`: 16 plan entries per block, count read before the plan.
    V1,
    /// `hs_gather_rows`: 16 plan entries per block, plan read together with the count.
    V2,
    /// `hs_gather_rows` with 8 plan entries per block (twice the blocks).
    V2Rows8,
    /// `hs_gather_rows` with 4 plan entries per block (four times the blocks).
    V2Rows4,
}

impl GatherKernel {
    /// Every variant.
    pub const ALL: [GatherKernel; 4] = [
        GatherKernel::V1,
        GatherKernel::V2,
        GatherKernel::V2Rows8,
        GatherKernel::V2Rows4,
    ];

    /// The variant's name: `v1`, `v2`, `v2-r8` or `v2-r4`.
    pub const fn name(self) -> &'static str {
        match self {
            GatherKernel::V1 => "v1",
            GatherKernel::V2 => "v2",
            GatherKernel::V2Rows8 => "v2-r8",
            GatherKernel::V2Rows4 => "v2-r4",
        }
    }

    /// The variant named `name` (as [`GatherKernel::name`] spells it), if any.
    pub fn from_name(name: &str) -> Option<GatherKernel> {
        Self::ALL.into_iter().find(|k| k.name() == name.trim())
    }

    /// Plan entries per block.
    const fn rows_per_block(self) -> u32 {
        match self {
            GatherKernel::V1 | GatherKernel::V2 => gk::GATHER_ROWS,
            GatherKernel::V2Rows8 => 8,
            GatherKernel::V2Rows4 => 4,
        }
    }
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
    /// Threads per block the backend launches it with.
    pub block_threads: u32,
    /// Blocks one multiprocessor holds at once at that block size.
    pub blocks_per_multiprocessor: i32,
}

/// Environment variable turning on programmatic dependent launch of the v2 remap and gather
/// kernels (`1`; default `0`): see [`CudaDevice::set_programmatic_launch`].
pub const PROGRAMMATIC_LAUNCH_ENV: &str = "HISPARSE_CUDA_PDL";

/// Environment variable that, set to `1`, makes `resolve` keep each request's LRU copy, partition
/// and bitmap in the global workspace even when they fit shared memory (global-state mode of
/// `hs_resolve`, used by default only when shared memory is too small; for testing).
pub const RESOLVE_GLOBAL_ENV: &str = "HISPARSE_CUDA_RESOLVE_GLOBAL";

/// Whether [`RESOLVE_GLOBAL_ENV`] forces global-state resolves (read once per process).
fn resolve_global_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        std::env::var(RESOLVE_GLOBAL_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
    })
}

/// Environment variable choosing the initial [`RemapKernel`].
pub const REMAP_KERNEL_ENV: &str = "HISPARSE_CUDA_REMAP";
/// Environment variable choosing the initial [`GatherKernel`].
pub const GATHER_KERNEL_ENV: &str = "HISPARSE_CUDA_GATHER";

/// The variant the environment variable `var` names, `default` when it is unset or empty, or an
/// error naming the accepted values.
fn variant_from_env<K: Copy>(
    var: &str,
    default: K,
    all: &[K],
    name: impl Fn(K) -> &'static str,
) -> Result<K> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => all
            .iter()
            .copied()
            .find(|k| name(*k) == v.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = all.iter().map(|k| name(*k)).collect();
                CudaError::Unsupported(format!("{var}={v}: expected one of {}", names.join(", ")))
            }),
        _ => Ok(default),
    }
}

/// `hs_remap` flag (not in the ABI table): look table entries up in global memory.
const REMAP_DIRECT: u32 = 8;

struct Kernels {
    _module: Module,
    f: [Function; Kernel::ALL.len()],
    /// `hs_remap_v1` (same parameters as [`Kernel::Remap`]).
    remap_v1: Function,
    /// `hs_gather_rows_v1` (same parameters as [`Kernel::GatherRows`]).
    gather_v1: Function,
}

impl Kernels {
    fn get(&self, k: Kernel) -> Function {
        self.f[Kernel::ALL.iter().position(|x| *x == k).unwrap_or(0)]
    }
}

/// One CUDA device: a retained primary context, kernels compiled with NVRTC on first use
/// (cached per process and architecture), and the staging rings for host-side lists.
pub struct CudaDevice {
    pub(crate) ctx: Arc<Context>,
    pub(crate) ordinal: usize,
    name: String,
    cc: (i32, i32),
    sm_count: u32,
    max_shared_optin: u32,
    kernels: OnceLock<Kernels>,
    kernels_init: Mutex<()>,
    staging: Mutex<Staging>,
    remap_kernel: AtomicU8,
    gather_kernel: AtomicU8,
    programmatic: AtomicBool,
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

/// Bytes of RAM available for pinning (`MemAvailable`), if the system reports it.
fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl CudaDevice {
    /// Opens CUDA device `ordinal`. No driver or no such device gives an error of kind
    /// `NotFound`; so does a missing NVRTC ([`CudaError::NoNvrtc`]), since no kernel could run.
    /// Kernels are compiled on first use (or with [`CudaDevice::prepare`]).
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
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
        let sm_count = attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        let max_shared_optin =
            attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as u32;
        let remap = variant_from_env(
            REMAP_KERNEL_ENV,
            RemapKernel::V2,
            &RemapKernel::ALL,
            RemapKernel::name,
        )?;
        let gather = variant_from_env(
            GATHER_KERNEL_ENV,
            GatherKernel::V2,
            &GatherKernel::ALL,
            GatherKernel::name,
        )?;
        let programmatic = variant_from_env(PROGRAMMATIC_LAUNCH_ENV, false, &[false, true], |b| {
            if b { "1" } else { "0" }
        })?;
        let ctx = Context::retain(dev)?;
        let name = format!(
            "{} (sm_{}{}, device {ordinal})",
            ffi::device_name(dev)?,
            cc.0,
            cc.1
        );
        Ok(CudaDevice {
            staging: Mutex::new(Staging::new(ctx.clone())),
            ctx,
            ordinal,
            name,
            cc,
            sm_count,
            max_shared_optin,
            kernels: OnceLock::new(),
            kernels_init: Mutex::new(()),
            remap_kernel: AtomicU8::new(remap as u8),
            gather_kernel: AtomicU8::new(gather as u8),
            programmatic: AtomicBool::new(programmatic && cc.0 >= 9),
        })
    }

    /// Compiles and loads the kernels now (otherwise the first operation does).
    pub fn prepare(&self) -> Result<()> {
        self.kernels().map(|_| ())
    }

    /// The remap kernel launched from now on.
    pub fn remap_kernel(&self) -> RemapKernel {
        let v = self.remap_kernel.load(Ordering::Relaxed);
        RemapKernel::ALL
            .into_iter()
            .find(|k| *k as u8 == v)
            .unwrap_or(RemapKernel::V2)
    }

    /// Chooses the remap kernel for later [`Device::remap`] calls (results are identical).
    pub fn set_remap_kernel(&self, k: RemapKernel) {
        self.remap_kernel.store(k as u8, Ordering::Relaxed);
    }

    /// Whether the v2 remap and gather kernels are launched with programmatic stream
    /// serialisation (programmatic dependent launch).
    pub fn programmatic_launch(&self) -> bool {
        self.programmatic.load(Ordering::Relaxed)
    }

    /// Launches the v2 remap and gather kernels with programmatic stream serialisation (`on`,
    /// and a device of compute capability 9.0 or newer; otherwise normally): each may be
    /// scheduled while the previous kernel of its stream finishes, and waits for it on the
    /// device (`griddepcontrol.wait`) before touching memory, which hides the launch gap.
    /// Results are identical. Returns whether it is on.
    pub fn set_programmatic_launch(&self, on: bool) -> bool {
        let on = on && self.cc.0 >= 9;
        self.programmatic.store(on, Ordering::Relaxed);
        on
    }

    /// The swap-in gather kernel launched from now on.
    pub fn gather_kernel(&self) -> GatherKernel {
        let v = self.gather_kernel.load(Ordering::Relaxed);
        GatherKernel::ALL
            .into_iter()
            .find(|k| *k as u8 == v)
            .unwrap_or(GatherKernel::V2)
    }

    /// Chooses the gather kernel for later [`Device::gather_rows`] calls (results are identical).
    pub fn set_gather_kernel(&self, k: GatherKernel) {
        self.gather_kernel.store(k as u8, Ordering::Relaxed);
    }

    /// What the driver made of the remap and gather kernels (every variant): registers per
    /// thread, local (spill) bytes per thread, static shared bytes per block, and blocks one
    /// multiprocessor holds at the block size the backend launches.
    pub fn kernel_report(&self) -> Result<Vec<KernelReport>> {
        use cudarc::driver::sys::CUfunction_attribute as A;
        let k = self.kernels()?;
        let list = [
            ("hs_remap", k.get(Kernel::Remap), gk::REMAP_THREADS),
            ("hs_remap_v1", k.remap_v1, gk::REMAP_THREADS),
            (
                "hs_gather_rows",
                k.get(Kernel::GatherRows),
                gk::GATHER_THREADS,
            ),
            ("hs_gather_rows_v1", k.gather_v1, gk::GATHER_THREADS),
        ];
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
        self.sm_count
    }

    /// Largest shared memory one block may use, in bytes.
    pub fn max_shared_per_block(&self) -> u32 {
        self.max_shared_optin
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

    /// Captures the work `f` enqueues on `stream` into a graph instead of running it. Decode-path
    /// operations ([`Device::remap`], [`Device::resolve`], [`Device::gather_rows`],
    /// [`Device::invalidate`], [`Device::compressed_slot_mapping`]) can be captured; anything
    /// that synchronises with the host cannot.
    pub fn capture(
        &self,
        stream: &CudaStream,
        f: impl FnOnce(&Self) -> Result<()>,
    ) -> Result<CudaGraph> {
        stream.inner.begin_capture()?;
        let body = f(self);
        let graph = stream.inner.end_capture();
        body?;
        Ok(CudaGraph { inner: graph? })
    }

    /// Enqueues one replay of `graph` on `stream`.
    pub fn launch_graph(&self, graph: &CudaGraph, stream: &CudaStream) -> Result<()> {
        self.ctx.bind()?;
        stream.inner.launch_graph(&graph.inner)
    }

    fn kernels(&self) -> Result<&Kernels> {
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let _guard = lock(&self.kernels_init);
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let ptx = crate::nvrtc::cached_ptx(self.cc.0, self.cc.1)?;
        let module = Module::load_ptx(&self.ctx, &ptx)?;
        let mut f = Vec::with_capacity(Kernel::ALL.len());
        for k in Kernel::ALL {
            f.push(module.function(k.name())?);
        }
        let f: [Function; Kernel::ALL.len()] = f.try_into().map_err(|_| CudaError::Compile {
            log: "kernel table".into(),
        })?;
        let resolve = f[Kernel::ALL
            .iter()
            .position(|k| *k == Kernel::Resolve)
            .unwrap_or(0)];
        let dynamic = self
            .max_shared_optin
            .saturating_sub(gk::RESOLVE_STATIC_SHARED_BYTES as u32);
        resolve.set_max_dynamic_shared(dynamic)?;
        // The largest shared-memory carveout, so that 8 blocks of hs_remap (16.5 KB each) fit
        // whatever carveout the driver would pick. Only a hint: a device without a configurable
        // carveout may refuse it, and the kernel runs correctly either way.
        let _ = f[Kernel::ALL
            .iter()
            .position(|k| *k == Kernel::Remap)
            .unwrap_or(0)]
        .set_preferred_carveout(100);
        let remap_v1 = module.function("hs_remap_v1")?;
        let gather_v1 = module.function("hs_gather_rows_v1")?;
        let _ = self.kernels.set(Kernels {
            _module: module,
            f,
            remap_v1,
            gather_v1,
        });
        self.kernels.get().ok_or_else(|| CudaError::Compile {
            log: "kernel table".into(),
        })
    }

    /// Blocks for a grid-stride kernel over `items` units of work.
    fn grid_for(&self, items: u64, per_block: u64) -> u32 {
        items
            .div_ceil(per_block.max(1))
            .clamp(1, u64::from(self.sm_count) * 8) as u32
    }

    fn launch(&self, k: Kernel, l: Launch, stream: &CudaStream, args: &[Arg<'_>]) -> Result<()> {
        let f = self.kernels()?.get(k);
        self.launch_fn(f, k, l, stream, args)
    }

    /// Launches `f`, a kernel with the parameters of `k` (`k` itself or a variant of it).
    fn launch_fn(
        &self,
        f: Function,
        k: Kernel,
        l: Launch,
        stream: &CudaStream,
        args: &[Arg<'_>],
    ) -> Result<()> {
        self.launch_fn_as(f, k, l, stream, args, false)
    }

    /// [`Self::launch_fn`], with programmatic stream serialisation when `programmatic` (only
    /// for kernels that run `HS_GRID_DEP_WAIT` first: `hs_remap`, `hs_gather_rows`).
    fn launch_fn_as(
        &self,
        f: Function,
        k: Kernel,
        l: Launch,
        stream: &CudaStream,
        args: &[Arg<'_>],
        programmatic: bool,
    ) -> Result<()> {
        self.ctx.bind()?;
        if programmatic {
            debug_assert!(matches!(k, Kernel::Remap | Kernel::GatherRows));
            debug_assert_eq!(args.len(), k.abi().params.len());
            // SAFETY: as below; in addition `hs_remap` and `hs_gather_rows` (the only kernels
            // launched this way, with `programmatic` false for their v1 variants) execute
            // `griddepcontrol.wait` before any global memory access (HS_GRID_DEP_WAIT, compiled
            // in for sm_90+, and this path is only taken on compute capability 9.0+).
            return unsafe { ffi::launch_programmatic(f, l, &stream.inner, args) };
        }
        debug_assert_eq!(args.len(), k.abi().params.len());
        // SAFETY: every caller passes arguments in the order and types of `k`'s ABI table (the
        // debug assertion checks the count), after the descriptor's `check` proved every buffer
        // large enough for what the kernel touches; the buffers are borrowed by the caller and
        // freed only after the context synchronised.
        unsafe { ffi::launch(f, l, &stream.inner, args) }
    }

    /// Stages `parts` (host lists) for kernels on `stream`, runs `enqueue` with their device
    /// addresses, and keeps the staged region reserved until the work enqueued so far completes.
    fn staged_launch(
        &self,
        stream: &CudaStream,
        parts: &[&[u8]],
        enqueue: impl FnOnce(&[u64]) -> Result<()>,
    ) -> Result<()> {
        self.ctx.bind()?;
        let mut staging = lock(&self.staging);
        let lease = staging.stage(&stream.inner, parts)?;
        let result = enqueue(&lease.ptrs);
        staging.finish(lease, &stream.inner)?;
        result
    }

    fn ensure_workspace(&self, stream: &CudaStream, bytes: usize) -> Result<(u64, u64)> {
        let mut ws = lock(&stream.workspace);
        if ws.current.as_ref().is_none_or(|m| m.len() < bytes) {
            // Uninitialised, and no host synchronisation: the kernel initialises every entry it
            // reads, the counter is cleared below on the stream, and a first resolve of a larger
            // shape may then happen while the stream is being captured.
            let mem = DevMem::alloc_uninit(&self.ctx, bytes.next_power_of_two())?;
            if let Some(old) = ws.current.replace(mem) {
                ws.retired.push(old);
            }
        }
        let mem = ws.current.as_ref().expect("allocated above");
        stream.inner.fill_u32(mem, 0, 0, 4)?;
        Ok((mem.ptr() + 16, mem.ptr()))
    }
}

/// Byte ranges `[start, end)` of one buffer; whether any two overlap, and whether any of
/// `others` overlaps one of them.
fn overlapping(mut ranges: Vec<(u64, u64)>, others: &[(u64, u64)]) -> bool {
    ranges.retain(|r| r.0 < r.1);
    ranges.sort_unstable();
    if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
        return true;
    }
    others.iter().filter(|o| o.0 < o.1).any(|o| {
        let i = ranges.partition_point(|r| r.1 <= o.0);
        ranges.get(i).is_some_and(|r| r.0 < o.1)
    })
}

fn push_u32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_ne_bytes());
}

fn push_u64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_ne_bytes());
}

fn push_layout(v: &mut Vec<u8>, l: &PageLayout) {
    push_u64(v, l.base);
    push_u64(v, l.block_stride);
    for x in [
        l.num_blocks,
        l.block_size,
        l.row_bytes,
        l.value_bytes,
        l.index_stride_rows,
        0,
    ] {
        push_u32(v, x);
    }
}

fn page_job(v: &mut Vec<u8>, src: &PageLayout, dst: &PageLayout) {
    for x in [
        src.base,
        src.block_stride,
        dst.base,
        dst.block_stride,
        src.page_bytes(),
    ] {
        push_u64(v, x);
    }
}

const PAGE_JOB_BYTES: u64 = core::mem::size_of::<gk::PageJob>() as u64;
const PAIR_BYTES: u64 = core::mem::size_of::<gk::Pair>() as u64;
const LAYER_PAIR_BYTES: u64 = core::mem::size_of::<gk::LayerPairAbi>() as u64;
const SPAN_BYTES: u64 = core::mem::size_of::<gk::Span>() as u64;

fn too_large(what: &str) -> CudaError {
    CudaError::Unsupported(format!(
        "{what} exceeds what one CUDA launch of this backend handles"
    ))
}

impl CudaDevice {
    /// Launches `hs_copy_pages` over `layers × pairs` (jobs and pairs staged), or one tile at a
    /// time in reference order when destination ranges overlap.
    #[allow(clippy::too_many_arguments)]
    fn page_copies(
        &self,
        stream: &CudaStream,
        jobs: &[(PageLayout, PageLayout)],
        pairs: &[BlockPair],
        src_ptr: u64,
        dst_ptr: u64,
        same_buffer: bool,
    ) -> Result<()> {
        if pairs.is_empty() || jobs.is_empty() {
            return Ok(());
        }
        let mut job_bytes = Vec::with_capacity(jobs.len() * PAGE_JOB_BYTES as usize);
        let mut dst_ranges = Vec::with_capacity(jobs.len() * pairs.len());
        let mut src_ranges = Vec::new();
        for (s, d) in jobs {
            page_job(&mut job_bytes, s, d);
            for p in pairs {
                let len = s.page_bytes();
                let at = d.page_offset(p.dst);
                dst_ranges.push((at, at + len));
                if same_buffer {
                    let at = s.page_offset(p.src);
                    src_ranges.push((at, at + len));
                }
            }
        }
        let mut pair_bytes = Vec::with_capacity(pairs.len() * PAIR_BYTES as usize);
        for p in pairs {
            push_u32(&mut pair_bytes, p.src);
            push_u32(&mut pair_bytes, p.dst);
        }
        let serial = overlapping(dst_ranges, &src_ranges);
        let (nl, np) = (jobs.len() as u32, pairs.len() as u32);
        let mut staging = lock(&self.staging);
        let lease = staging.stage(&stream.inner, &[&job_bytes, &pair_bytes])?;
        let (jobs_ptr, pairs_ptr) = (lease.ptrs[0], lease.ptrs[1]);
        let result = (|| {
            if !serial {
                let tiles = u64::from(nl) * u64::from(np);
                let l = Launch {
                    grid: (self.grid_for(tiles, 1), 1, 1),
                    block: gk::COPY_THREADS,
                    shared: 0,
                };
                return self.launch(
                    Kernel::CopyPages,
                    l,
                    stream,
                    &[
                        Arg::Ptr(jobs_ptr),
                        Arg::U32(nl),
                        Arg::Ptr(pairs_ptr),
                        Arg::U32(np),
                        Arg::Ptr(src_ptr),
                        Arg::Ptr(dst_ptr),
                    ],
                );
            }
            for li in 0..u64::from(nl) {
                for pi in 0..u64::from(np) {
                    let l = Launch {
                        grid: (1, 1, 1),
                        block: gk::COPY_THREADS,
                        shared: 0,
                    };
                    self.launch(
                        Kernel::CopyPages,
                        l,
                        stream,
                        &[
                            Arg::Ptr(jobs_ptr + li * PAGE_JOB_BYTES),
                            Arg::U32(1),
                            Arg::Ptr(pairs_ptr + pi * PAIR_BYTES),
                            Arg::U32(1),
                            Arg::Ptr(src_ptr),
                            Arg::Ptr(dst_ptr),
                        ],
                    )?;
                }
            }
            Ok(())
        })();
        staging.finish(lease, &stream.inner)?;
        result
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
        let available = available_ram().unwrap_or(u64::MAX);
        check_pinned_budget(bytes as u64, available)?;
        let mem = PinnedMem::alloc_zeroed(&self.ctx, bytes)?;
        if mem.host_addr() % hisparse_core::ops::PINNED_ALIGNMENT != 0 {
            return Err(CudaError::Unsupported(
                "the driver returned pinned memory that is not page-aligned".into(),
            ));
        }
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
        Ok(CudaStream::from_inner(Stream::new(&self.ctx)?))
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
        stream
            .inner
            .copy_within(&buf.mem, src_offset, dst_offset, bytes)
    }

    fn write_table(
        &self,
        stream: &CudaStream,
        desc: &TableWriteDesc,
        writes: &[TableWrite],
        table: &mut CudaBuffer,
    ) -> Result<()> {
        desc.check(writes, table)?;
        if writes.is_empty() {
            return Ok(());
        }
        let n = u32::try_from(writes.len()).map_err(|_| too_large("write_table writes"))?;
        let list: Vec<gk::TableWriteAbi> = writes.iter().map(gk::TableWriteAbi::from).collect();
        self.staged_launch(stream, &[bytemuck::cast_slice(&list)], |lease| {
            let l = Launch {
                grid: (
                    self.grid_for(u64::from(n), u64::from(gk::TABLE_THREADS)),
                    1,
                    1,
                ),
                block: gk::TABLE_THREADS,
                shared: 0,
            };
            self.launch(
                Kernel::WriteTable,
                l,
                stream,
                &[
                    Arg::Ptr(lease[0]),
                    Arg::U32(n),
                    Arg::Ptr(table.mem.ptr()),
                    Arg::U32(desc.table_len),
                ],
            )
        })
    }

    fn reset_hot_state(
        &self,
        stream: &CudaStream,
        desc: &HotResetDesc,
        rows: &[u32],
        dgi: &mut CudaBuffer,
        lru: &mut CudaBuffer,
    ) -> Result<()> {
        desc.check(rows, dgi, lru)?;
        if rows.is_empty() {
            return Ok(());
        }
        let n = u32::try_from(rows.len()).map_err(|_| too_large("reset_hot_state rows"))?;
        let work = u64::from(n) * u64::from(desc.hot_slots);
        self.staged_launch(stream, &[bytemuck::cast_slice(rows)], |lease| {
            let l = Launch {
                grid: (self.grid_for(work, u64::from(gk::TABLE_THREADS)), 1, 1),
                block: gk::TABLE_THREADS,
                shared: 0,
            };
            self.launch(
                Kernel::ResetHotState,
                l,
                stream,
                &[
                    Arg::Ptr(lease[0]),
                    Arg::U32(n),
                    Arg::Ptr(dgi.mem.ptr()),
                    Arg::Ptr(lru.mem.ptr()),
                    Arg::U32(desc.num_requests),
                    Arg::U32(desc.hot_slots),
                ],
            )
        })
    }

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
        if desc.num_tokens == 0 {
            return Ok(());
        }
        if desc.num_tokens > i32::MAX as u32 {
            return Err(too_large("remap num_tokens"));
        }
        let mut flags = 0;
        if desc.idx_mapping_len.is_some() {
            flags |= gk::REMAP_HAS_MAP;
        }
        if desc.write_counts {
            flags |= gk::REMAP_COUNTS;
        }
        if desc.compact {
            flags |= gk::REMAP_COMPACT;
        }
        let variant = self.remap_kernel();
        let kernels = self.kernels()?;
        let f = match variant {
            RemapKernel::V1 => kernels.remap_v1,
            RemapKernel::V2 => kernels.get(Kernel::Remap),
            RemapKernel::V2Direct => {
                flags |= REMAP_DIRECT;
                kernels.get(Kernel::Remap)
            }
        };
        let l = Launch {
            grid: (desc.num_tokens, 1, 1),
            block: gk::REMAP_THREADS,
            shared: 0,
        };
        let programmatic = variant != RemapKernel::V1 && self.programmatic_launch();
        self.launch_fn_as(
            f,
            Kernel::Remap,
            l,
            stream,
            &[
                Arg::Ptr(args.req_id.mem.ptr()),
                Arg::Ptr(args.block_table.mem.ptr()),
                Arg::Ptr(args.topk.mem.ptr()),
                Arg::Ptr(args.idx_mapping.map_or(0, |b| b.mem.ptr())),
                Arg::Ptr(args.out.mem.ptr()),
                Arg::Ptr(args.counts.as_ref().map_or(0, |b| b.mem.ptr())),
                Arg::U32(desc.num_tokens),
                Arg::U32(desc.top_k),
                Arg::U32(desc.table_rows),
                Arg::U32(desc.max_blocks),
                Arg::U32(desc.block_size),
                Arg::U32(desc.block_stride_rows),
                Arg::U32(desc.idx_mapping_len.unwrap_or(0)),
                Arg::U32(flags),
            ],
            programmatic,
        )
    }

    fn resolve(
        &self,
        stream: &CudaStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, CudaBuffer>,
    ) -> Result<()> {
        desc.check(&args.sizes())?;
        if desc.num_tokens == 0 {
            return Ok(());
        }
        let (t, k, n) = (desc.num_tokens, desc.top_k, desc.hot_slots);
        let entries = u64::from(t) * u64::from(k);
        if entries >= 1 << 28 || t > i32::MAX as u32 {
            return Err(too_large("resolve num_tokens * top_k"));
        }
        let available =
            u64::from(self.max_shared_optin).saturating_sub(gk::RESOLVE_STATIC_SHARED_BYTES);
        // The LRU copy, partition and bitmap stay in shared memory whenever they fit (always on
        // sm_80+ for every hot_slots the specification allows); otherwise, or when
        // HISPARSE_CUDA_RESOLVE_GLOBAL=1 forces it (for testing), they live in the workspace
        // (global-state mode) and shared memory holds only the wanted-row table.
        let global = gk::resolve_shared_bytes(n, 0) > available || resolve_global_forced();
        let shared_bytes = |table: u64| {
            if global {
                gk::resolve_global_shared_bytes(table as u32)
            } else {
                gk::resolve_shared_bytes(n, table as u32)
            }
        };
        // Shared table sized for requests of up to two rows (one when there are more rows than
        // multiprocessors, to keep two blocks per multiprocessor), shrunk to what fits; larger
        // requests use the stream's global workspace.
        let rows = if t > self.sm_count { 1 } else { t.min(2) };
        let mut table = gk::resolve_table_entries(u64::from(k) * u64::from(rows));
        while table >= 16 && shared_bytes(table) > available {
            table /= 2;
        }
        if table < 16 {
            table = 0;
        }
        let tables_in_workspace = gk::resolve_table_entries(entries) > table;
        let ws_entries = if global {
            gk::resolve_global_workspace_entries(t, k, desc.num_requests, n, tables_in_workspace)
        } else if tables_in_workspace {
            gk::resolve_workspace_entries(t, k)
        } else {
            0
        };
        if ws_entries > u64::from(u32::MAX) {
            return Err(too_large("resolve workspace"));
        }
        let (ws_ptr, counter_ptr) = if ws_entries > 0 {
            self.ensure_workspace(stream, 16 + 16 * ws_entries as usize)?
        } else {
            (0, 0)
        };
        let table_arg = if global {
            table as u32 | gk::RESOLVE_GLOBAL_STATE
        } else {
            table as u32
        };
        let l = Launch {
            grid: (t, 1, 1),
            block: gk::RESOLVE_THREADS,
            shared: shared_bytes(table) as u32,
        };
        self.launch(
            Kernel::Resolve,
            l,
            stream,
            &[
                Arg::Ptr(args.req_id.mem.ptr()),
                Arg::Ptr(args.topk.mem.ptr()),
                Arg::Ptr(args.resident_table.mem.ptr()),
                Arg::Ptr(args.host_table.mem.ptr()),
                Arg::Ptr(args.hot_table.mem.ptr()),
                Arg::Ptr(args.dgi.mem.ptr()),
                Arg::Ptr(args.lru.mem.ptr()),
                Arg::Ptr(args.indices.mem.ptr()),
                Arg::Ptr(args.valid_counts.mem.ptr()),
                Arg::Ptr(args.hit_counts.mem.ptr()),
                Arg::Ptr(args.miss_counts.mem.ptr()),
                Arg::Ptr(args.miss_src.mem.ptr()),
                Arg::Ptr(args.miss_dst.mem.ptr()),
                Arg::Ptr(ws_ptr),
                Arg::Ptr(counter_ptr),
                Arg::U32(ws_entries as u32),
                Arg::U32(table_arg),
                Arg::U32(t),
                Arg::U32(k),
                Arg::U32(desc.num_requests),
                Arg::U32(desc.max_pages),
                Arg::U32(desc.block_size),
                Arg::U32(n),
                Arg::U32(desc.attention_block_stride),
                Arg::U32(desc.host_num_blocks),
            ],
        )
    }

    fn gather_rows(
        &self,
        stream: &CudaStream,
        desc: &GatherDesc<'_>,
        args: GatherArgs<'_, CudaBuffer, CudaHostBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        if desc.num_tokens == 0 {
            return Ok(());
        }
        let k = desc.top_k;
        const MAX_Y: u32 = 65535;
        let variant = self.gather_kernel();
        let f = match variant {
            GatherKernel::V1 => self.kernels()?.gather_v1,
            _ => self.kernels()?.get(Kernel::GatherRows),
        };
        let programmatic = variant != GatherKernel::V1 && self.programmatic_launch();
        for layers in desc.layers.chunks(gk::GATHER_MAX_LAYERS) {
            let table = GatherLayers::new(layers);
            let mut t0 = 0u32;
            while t0 < desc.num_tokens {
                let tn = (desc.num_tokens - t0).min(MAX_Y);
                let plan_off = u64::from(t0) * u64::from(k) * 4;
                let l = Launch {
                    grid: (
                        k.div_ceil(variant.rows_per_block()),
                        tn,
                        layers.len() as u32,
                    ),
                    block: gk::GATHER_THREADS,
                    shared: 0,
                };
                self.launch_fn_as(
                    f,
                    Kernel::GatherRows,
                    l,
                    stream,
                    &[
                        Arg::Ptr(args.plan_src.mem.ptr() + plan_off),
                        Arg::Ptr(args.plan_dst.mem.ptr() + plan_off),
                        Arg::Ptr(args.plan_counts.mem.ptr() + u64::from(t0) * 4),
                        Arg::Ptr(args.host.mem.dev_ptr()),
                        Arg::Ptr(args.device.mem.ptr()),
                        Arg::U32(tn),
                        Arg::U32(k),
                        Arg::Struct(&table),
                    ],
                    programmatic,
                )?;
                t0 += tn;
            }
        }
        Ok(())
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
        self.page_copies(stream, &jobs, pairs, src, dst, false)
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
        let spans: Vec<&RowSpan> = spans.iter().filter(|s| s.num_rows > 0).collect();
        if spans.is_empty() || desc.layers.is_empty() {
            return Ok(());
        }
        let mut layer_bytes = Vec::with_capacity(desc.layers.len() * LAYER_PAIR_BYTES as usize);
        let mut dst_ranges = Vec::new();
        for l in desc.layers {
            push_layout(&mut layer_bytes, &l.host);
            push_layout(&mut layer_bytes, &l.device);
            let dl: &PageLayout = match desc.direction {
                Direction::DeviceToHost => &l.host,
                Direction::HostToDevice => &l.device,
            };
            for s in &spans {
                let block = match desc.direction {
                    Direction::DeviceToHost => s.host_block,
                    Direction::HostToDevice => s.device_block,
                };
                let [(v0, vl), (s0, sl)] = dl.row_parts(block, s.first_row);
                let n = u64::from(s.num_rows);
                dst_ranges.push((v0, v0 + vl * n));
                dst_ranges.push((s0, s0 + sl * n));
            }
        }
        let mut span_bytes = Vec::with_capacity(spans.len() * SPAN_BYTES as usize);
        for s in &spans {
            for x in [s.device_block, s.host_block, s.first_row, s.num_rows] {
                push_u32(&mut span_bytes, x);
            }
        }
        let serial = overlapping(dst_ranges, &[]);
        let direction = match desc.direction {
            Direction::DeviceToHost => gk::DIRECTION_DEVICE_TO_HOST,
            Direction::HostToDevice => gk::DIRECTION_HOST_TO_DEVICE,
        };
        let (nl, ns) = (desc.layers.len() as u32, spans.len() as u32);
        let (host_ptr, dev_ptr) = (host.mem.dev_ptr(), device.mem.ptr());
        let mut staging = lock(&self.staging);
        let lease = staging.stage(&stream.inner, &[&layer_bytes, &span_bytes])?;
        let (layers_ptr, spans_ptr) = (lease.ptrs[0], lease.ptrs[1]);
        let run = |lp: u64, nl: u32, sp: u64, ns: u32, blocks: u32| {
            self.launch(
                Kernel::CopyRows,
                Launch {
                    grid: (blocks, 1, 1),
                    block: gk::COPY_THREADS,
                    shared: 0,
                },
                stream,
                &[
                    Arg::Ptr(lp),
                    Arg::U32(nl),
                    Arg::Ptr(sp),
                    Arg::U32(ns),
                    Arg::U32(direction),
                    Arg::Ptr(host_ptr),
                    Arg::Ptr(dev_ptr),
                ],
            )
        };
        let result = if !serial {
            let tiles = u64::from(nl) * u64::from(ns);
            run(layers_ptr, nl, spans_ptr, ns, self.grid_for(tiles, 1))
        } else {
            (|| {
                for li in 0..u64::from(nl) {
                    for si in 0..u64::from(ns) {
                        run(
                            layers_ptr + li * LAYER_PAIR_BYTES,
                            1,
                            spans_ptr + si * SPAN_BYTES,
                            1,
                            1,
                        )?;
                    }
                }
                Ok(())
            })()
        };
        staging.finish(lease, &stream.inner)?;
        result
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
        self.page_copies(stream, &jobs, pairs, p, p, true)
    }

    fn invalidate(
        &self,
        stream: &CudaStream,
        desc: &InvalidateDesc,
        args: InvalidateArgs<'_, CudaBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        let total = u64::from(desc.num_requests) * u64::from(desc.hot_slots);
        if total == 0 || desc.num_ranges == 0 {
            return Ok(());
        }
        let l = Launch {
            grid: (
                self.grid_for(total, u64::from(gk::INVALIDATE_THREADS)),
                1,
                1,
            ),
            block: gk::INVALIDATE_THREADS,
            shared: 0,
        };
        self.launch(
            Kernel::Invalidate,
            l,
            stream,
            &[
                Arg::Ptr(args.ranges.mem.ptr()),
                Arg::U32(desc.num_ranges),
                Arg::Ptr(args.dgi.mem.ptr()),
                Arg::U64(total),
            ],
        )
    }

    fn compressed_slot_mapping(
        &self,
        stream: &CudaStream,
        desc: &SlotMappingDesc,
        args: SlotMappingArgs<'_, CudaBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        if desc.num_tokens == 0 {
            return Ok(());
        }
        let l = Launch {
            grid: (desc.num_tokens.div_ceil(gk::SLOT_THREADS), 1, 1),
            block: gk::SLOT_THREADS,
            shared: 0,
        };
        self.launch(
            Kernel::CompressedSlotMapping,
            l,
            stream,
            &[
                Arg::Ptr(args.positions.mem.ptr()),
                Arg::Ptr(args.slot_mapping.mem.ptr()),
                Arg::Ptr(args.table_row.mem.ptr()),
                Arg::Ptr(args.block_table.mem.ptr()),
                Arg::Ptr(args.out.mem.ptr()),
                Arg::U32(desc.num_tokens),
                Arg::U32(desc.ratio),
                Arg::U32(desc.block_size),
                Arg::U32(desc.table_rows),
                Arg::U32(desc.max_blocks),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::Error as _;

    #[test]
    fn overlap_detection() {
        assert!(!overlapping(vec![(0, 10), (10, 20), (30, 40)], &[]));
        assert!(overlapping(vec![(0, 10), (9, 20)], &[]));
        assert!(overlapping(vec![(30, 40), (0, 10), (35, 36)], &[]));
        // Empty ranges never overlap.
        assert!(!overlapping(vec![(5, 5), (0, 10)], &[(3, 3)]));
        // A source range against destination ranges.
        assert!(!overlapping(vec![(0, 10), (20, 30)], &[(10, 20), (30, 31)]));
        assert!(overlapping(vec![(0, 10), (20, 30)], &[(25, 40)]));
        assert!(overlapping(vec![(0, 10), (20, 30)], &[(5, 6)]));
    }

    #[test]
    fn kernel_variants_exist_in_the_source() {
        for sym in ["hs_remap_v1(", "hs_gather_rows_v1("] {
            assert!(gk::COMMON_SOURCE.contains(&format!(" {sym}")), "{sym}");
        }
        let define = format!("#define HS_REMAP_DIRECT {REMAP_DIRECT}u");
        assert!(gk::COMMON_SOURCE.lines().any(|l| l.trim_end() == define));
        for k in RemapKernel::ALL {
            assert_eq!(RemapKernel::from_name(k.name()), Some(k));
        }
        for k in GatherKernel::ALL {
            assert_eq!(GatherKernel::from_name(k.name()), Some(k));
        }
        assert_eq!(RemapKernel::from_name("v3"), None);
        let e = variant_from_env::<RemapKernel>(
            "HISPARSE_TEST_UNSET_VARIABLE_FOR_VARIANTS",
            RemapKernel::V2,
            &RemapKernel::ALL,
            RemapKernel::name,
        );
        assert_eq!(e.ok(), Some(RemapKernel::V2));
    }

    #[test]
    fn list_encodings_match_the_abi_structs() {
        let l = PageLayout {
            base: 1,
            block_stride: 2,
            num_blocks: 3,
            block_size: 4,
            row_bytes: 5,
            value_bytes: 6,
            index_stride_rows: 7,
        };
        let mut v = Vec::new();
        push_layout(&mut v, &l);
        push_layout(&mut v, &l);
        assert_eq!(v.len() as u64, LAYER_PAIR_BYTES);
        assert_eq!(&v[..8], &1u64.to_ne_bytes());
        assert_eq!(&v[32..36], &7u32.to_ne_bytes());
        let mut j = Vec::new();
        page_job(&mut j, &l, &l);
        assert_eq!(j.len() as u64, PAGE_JOB_BYTES);
        assert_eq!(
            &j[32..40],
            &20u64.to_ne_bytes(),
            "page bytes = block_size * row_bytes"
        );
    }

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
}
