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
use hisparse_gpu_kernels::plan::{self, GatherWalk, PlanError, Target};
use hisparse_host_memory::available_ram;

use crate::capture::Lasting;
use crate::error::CudaError;
pub use crate::ffi::CaptureMode;
use crate::ffi::{self, Context, DevMem, Event, Stream};
pub use crate::handles::{CudaBuffer, CudaEvent, CudaGraph, CudaHostBuffer, CudaStream};
pub use crate::launch::KernelReport;
use crate::launch::Kernels;
use crate::pinned::{HostPoolSetup, PinnedMem};
use crate::staging::Staging;

pub(crate) type Result<T> = std::result::Result<T, CudaError>;

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
    /// How the swap-in gather walks a miss plan. [`GatherWalk::Auto`] (the default) is the
    /// production rule ([`plan::gather_in_order`]); the others force one walk, so the suite and
    /// the benches can run both on any pool. Results are identical.
    pub gather_walk: GatherWalk,
}

/// The environment variable [`CudaDevice::open`] reads the swap-in gather's walk from
/// ([`CudaOptions::from_env`]): `auto` (the production rule, also when unset), `all-rows` or
/// `in-order`. Results are identical; an engine or a benchmark compares the walks' speed on its
/// own pools without a rebuild.
pub const GATHER_WALK_ENV: &str = "HISPARSE_CUDA_GATHER_WALK";

/// The walks [`GATHER_WALK_ENV`] names, by name.
const GATHER_WALKS: [(&str, GatherWalk); 3] = [
    ("auto", GatherWalk::Auto),
    ("all-rows", GatherWalk::AllRows),
    ("in-order", GatherWalk::InOrder),
];
/// [`GATHER_WALKS`]' names as a refusal lists them (the unit test holds the two together).
const GATHER_WALK_NAMES: &str = "auto, all-rows, in-order";

impl CudaOptions {
    /// The default options, with [`CudaOptions::gather_walk`] from [`GATHER_WALK_ENV`] when it
    /// is set. A value it does not take is a [`CudaError::Environment`].
    pub fn from_env() -> Result<CudaOptions> {
        let gather_walk = match std::env::var(GATHER_WALK_ENV) {
            Err(std::env::VarError::NotPresent) => GatherWalk::Auto,
            Ok(v) => Self::gather_walk_named(&v)?,
            Err(std::env::VarError::NotUnicode(v)) => {
                return Err(Self::bad_walk(v.to_string_lossy().into_owned()));
            }
        };
        Ok(CudaOptions {
            gather_walk,
            ..CudaOptions::default()
        })
    }

    /// The walk [`GATHER_WALK_ENV`] names by `value` (empty: `auto`).
    fn gather_walk_named(value: &str) -> Result<GatherWalk> {
        let name = if value.is_empty() { "auto" } else { value };
        GATHER_WALKS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, walk)| walk)
            .ok_or_else(|| Self::bad_walk(value.to_owned()))
    }

    fn bad_walk(value: String) -> CudaError {
        CudaError::Environment {
            name: GATHER_WALK_ENV,
            value,
            expected: GATHER_WALK_NAMES,
        }
    }
}

/// One CUDA device: a retained primary context, kernels compiled with NVRTC on first use
/// (cached per process and architecture), and the staging rings for host-side lists.
pub struct CudaDevice {
    pub(crate) ctx: Arc<Context>,
    pub(crate) ordinal: usize,
    name: String,
    pub(crate) cc: (i32, i32),
    /// What the launch planners know about the device; the resolver's occupancy is known once
    /// the kernels are loaded ([`CudaDevice::resolve_target`]), 0 here.
    pub(crate) target: Target,
    pub(crate) kernels: OnceLock<Kernels>,
    pub(crate) kernels_init: Mutex<()>,
    pub(crate) staging: Mutex<Staging>,
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl From<PlanError> for CudaError {
    fn from(e: PlanError) -> Self {
        CudaError::Unsupported(e.to_string())
    }
}

impl CudaDevice {
    /// Opens CUDA device `ordinal` with [`CudaOptions::from_env`] (the production defaults
    /// unless [`GATHER_WALK_ENV`] is set). No driver or no such device gives an error of kind
    /// `NotFound`; so does a missing NVRTC ([`CudaError::NoNvrtc`]), since no kernel could run.
    /// Kernels are compiled on first use (or with [`CudaDevice::prepare`]).
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
        Self::open_with(ordinal, CudaOptions::from_env()?)
    }

    /// [`Device::remap`] in the given layout instead of the planner's rule
    /// ([`plan::remap_layout`]), so a benchmark can time both on the same inputs. Errors as
    /// `remap`'s; [`plan::RemapLayout::Wide`] refuses counts and compaction.
    pub fn remap_as(
        &self,
        stream: &CudaStream,
        desc: &RemapDesc,
        args: RemapArgs<'_, CudaBuffer>,
        layout: plan::RemapLayout,
    ) -> Result<()> {
        desc.check(&args)?;
        let addrs = remap_addrs(&args);
        let plan = plan::remap_as(&self.target, desc, &addrs, layout)?;
        self.execute(stream, plan)
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
            resolve_blocks_per_multiprocessor: 0,
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
            &self.resolve_target()?,
            desc,
            &addrs,
            layers,
            host.mem.dev_ptr(),
            device.mem.ptr(),
            self.options.resolve_global_state,
        )?;
        self.execute(stream, plan)
    }

    /// The planners' target with the resolver's occupancy, from the loaded kernels.
    fn resolve_target(&self) -> Result<Target> {
        Ok(Target {
            resolve_blocks_per_multiprocessor: self.kernels()?.resolve_blocks_per_multiprocessor,
            ..self.target
        })
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
        self.remap_as(stream, desc, args, plan::remap_layout(desc))
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
            &self.resolve_target()?,
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
        let plan = plan::gather(&self.target, desc, &addrs, self.options.gather_walk)?;
        self.execute(stream, plan)
    }

    /// From [`plan::FUSED_MIN_ROWS`] token rows one `hs_resolve_gather` launch (the inherent
    /// [`CudaDevice::resolve_and_gather`]: each request's misses are copied while other requests
    /// still resolve); below, and over a host pool whose gather walks rows in order
    /// ([`plan::swap_in_fused`]), `resolve` then `gather_rows`.
    fn resolve_and_gather(
        &self,
        stream: &CudaStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, CudaBuffer>,
        layers: &[hisparse_core::ops::LayerPair],
        host: &CudaHostBuffer,
        device: &mut CudaBuffer,
    ) -> Result<()> {
        if plan::swap_in_fused(desc, layers, self.options.gather_walk) {
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

    /// The gather walk's environment values, and a refusal that names the variable and what it
    /// takes.
    #[test]
    fn gather_walk_env_values() {
        assert_eq!(
            CudaOptions::gather_walk_named("").unwrap(),
            GatherWalk::Auto
        );
        for (name, walk) in GATHER_WALKS {
            assert_eq!(
                CudaOptions::gather_walk_named(name).unwrap(),
                walk,
                "{name}"
            );
        }
        let names: Vec<&str> = GATHER_WALKS.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.join(", "), GATHER_WALK_NAMES);
        let e = CudaOptions::gather_walk_named("inorder").unwrap_err();
        assert_eq!(e.kind(), hisparse_core::ErrorKind::InvalidArgument);
        let text = e.to_string();
        assert!(
            text.contains(GATHER_WALK_ENV) && text.contains("\"inorder\""),
            "{text}"
        );
        assert!(text.contains("auto, all-rows, in-order"), "{text}");
    }
}
