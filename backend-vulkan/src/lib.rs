//! HiSparse Vulkan backend: every data-plane operation of [`hisparse_core::Device`] as Vulkan
//! compute shaders or `vkCmdCopyBuffer` copies, for GPUs of any vendor.
//!
//! * [`VulkanDevice::open`] picks a device: `""` = the first suitable one, a number = its index
//!   in the loader's list, anything else = a case-insensitive substring of its name. No loader or
//!   no device gives an error of kind `NotFound`; a device without Vulkan 1.2 timeline
//!   semaphores (or with too small limits) gives `Unsupported`.
//! * Shaders are WGSL in `shaders/`, compiled to SPIR-V by naga in `build.rs` (no system tool
//!   needed to build) and embedded 4-byte aligned; `tests/spirv_val.rs` validates them with
//!   `spirv-val`.
//! * The pinned host pool is a page-aligned host allocation imported with
//!   `VK_EXT_external_memory_host` where available (else host-visible coherent memory): shaders
//!   read and write it directly.
//! * **Streams and events** follow the rules of [`hisparse_core::device`]: a stream is a chain of
//!   submissions on its own timeline semaphore, spread over up to four compute queues and a
//!   dedicated transfer queue where the device has one; an event is a timeline value, and
//!   waiting for it adds a semaphore wait to the waiting stream's next submission. Work is
//!   recorded into one open command buffer per stream and submitted when the device has caught
//!   up with the stream (once 16 commands accumulated, or 50 µs after the stream's last
//!   submission), when 64 commands accumulated, or when something observes it, so a decode step
//!   costs few submissions; inside a command buffer a command waits behind a barrier only when it
//!   depends on an earlier one. Synchronous calls wait for every stream. The
//!   execution model is described in full in the docs of the `vk` module.
//! * **Copies** of many small regions (page backups and restores, row mirrors, host
//!   copy-on-write) and device-to-device copies run as a copy shader on GPUs; large contiguous
//!   copies across the bus and every copy on CPU devices (lavapipe) use `vkCmdCopyBuffer`
//!   ([`CopyEngine`]).
//! * **Large pools** are bound as windows of `maxStorageBufferRange` (a power of two); a shader
//!   variant binds 1, 8, 12 or 32 windows per pool, and pools with more windows than fit the
//!   device's storage buffers per stage are processed in several dispatches, each covering a
//!   group of windows (module `windows`). Shaders address pools up to 64 GiB.
//! * **Kernel choices**: the resolver is one dispatch with its per-request state in workgroup
//!   memory on GPUs that run 1024-invocation workgroups, else a grouping pass and a
//!   256-invocation kernel ([`ResolveKernel`]); its workgroup scans use subgroup arithmetic where
//!   the device has it ([`ResolveScans`]); the gather runs the pipelined kernel on GPUs and the
//!   per-entry kernel on CPU devices ([`GatherKernel`]); [`Queues`] puts the streams on fewer
//!   queues and [`ComputeFamily`] picks a compute family without graphics. All choices give
//!   identical results; they exist for comparisons.
//! * **Host waits** on GPUs spin for 200 µs, then poll while yielding the thread for up to 50 ms,
//!   then block ([`HostWait::Block`] blocks right after the spin, for comparisons).
//! * **Barriers** are placed only where a command depends on an earlier one of its batch; between
//!   two compute dispatches they cover only the compute stage ([`Barriers::All`] makes every
//!   barrier cover all stages, for comparisons).
//! * **Configuration** is a [`VulkanOptions`] given at [`VulkanDevice::open_with`] (every choice
//!   above, strict validation, a profile, resolve dumps); the library reads no environment
//!   variable. Tools parse options from text with [`VulkanOptions::set`].
//! * [`VulkanDevice::timed`] measures enqueued work with timestamp queries (for benches);
//!   [`VulkanOptions::profile`] profiles a whole run per operation (host and device time, printed
//!   to stderr when the device is dropped).
//!
//! Not done here: buffer device addresses (the WGSL compiler used has no pointers to physical
//! storage), which would remove the windows.

mod copies;
mod copy;
mod dump;
mod error;
mod gather;
mod index;
mod options;
mod resolve;
mod shaders;
mod vk;
mod windows;

use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hisparse_core::Device;
use hisparse_core::device::MemoryInfo;
use hisparse_core::ops::copy::check_bulk_copy;
use hisparse_core::ops::{
    BlockPair, BufferLen, GatherArgs, GatherDesc, HotResetDesc, IndexerBackupArgs,
    IndexerBackupDesc, InvalidateArgs, InvalidateDesc, PINNED_ALIGNMENT, PageCopyDesc, PageLayout,
    RemapArgs, RemapDesc, ResolveArgs, ResolveDesc, RowCopyDesc, RowSpan, SlotMappingArgs,
    SlotMappingDesc, TableWrite, TableWriteDesc, check_pinned_budget,
};

pub use copies::CopyEngine;
pub use error::VulkanError;
pub use gather::GatherKernel;
pub use options::{
    Barriers, ComputeFamily, HostWait, OPTION_NAMES, Queues, ResolveDumpSpec, ResolveScans,
    VulkanOptions,
};
pub use resolve::ResolveKernel;
pub use vk::validation_message_count;

use shaders::Shader;
use vk::{Binding, Context, Engine, MemKind, RawBuffer};

type Result<T> = core::result::Result<T, VulkanError>;

/// The embedded SPIR-V modules as `(name, bytes)`, for validation with external tools
/// (`tests/spirv_val.rs` runs `spirv-val` on each).
pub fn spirv_modules() -> impl Iterator<Item = (&'static str, &'static [u8])> {
    Shader::ALL.into_iter().map(|s| (s.name(), s.spirv()))
}

/// Largest staging chunk of a synchronous upload or download.
const STAGING_CHUNK: usize = 64 << 20;

/// How [`VulkanDevice::open_shaped`] reshapes a device for tests; `None` keeps the device's own.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TestShape {
    /// Bind pools as if one storage binding covered only this many bytes (a power of two, at
    /// most the device's real window): the windowed shader variants and the
    /// one-dispatch-per-window-group path then run on pools of a few MiB.
    pub window: Option<u64>,
    /// Bind at most this many storage buffers per dispatch (at least the resolver's 21).
    pub storage_buffers: Option<u32>,
    /// `(compute lanes, transfer lane)`: lanes beyond the device's queues share them, so the
    /// multi-queue routing runs on single-queue devices.
    pub lanes: Option<(usize, bool)>,
    /// Run the resolver's scans without subgroup arithmetic, as on devices that lack it.
    pub no_subgroups: bool,
    /// Offer at most this many bytes of workgroup memory (the resolver then takes the variant
    /// that fits, or the portable kernel).
    pub workgroup_memory: Option<u32>,
    /// A deliberate bug: `wait_event` does nothing. Shows that the stream cases catch a backend
    /// that ignores event waits; never for real work.
    pub ignore_event_waits: bool,
}

/// A Vulkan device executing HiSparse operations. Cheap to share by reference across threads.
pub struct VulkanDevice {
    ctx: Arc<Context>,
    /// The staging buffer synchronous uploads and downloads reuse (held for a whole call).
    staging: Mutex<Option<RawBuffer>>,
    /// [`CopyEngine`] as a number (see `copies`).
    copy_engine: AtomicU8,
    /// [`GatherKernel`] as a number (see `gather`).
    gather_kernel: AtomicU8,
    /// [`ResolveKernel`] as a number (see `resolve`).
    resolve_kernel: AtomicU8,
    /// The resolve calls [`VulkanOptions::dump_resolve`] asks to write out (a diagnostic).
    resolve_dump: Option<dump::ResolveDump>,
}

/// Device memory of a [`VulkanDevice`]. Dropping it defers destruction until enqueued work that
/// may use it has completed.
pub struct VulkanBuffer {
    raw: Option<RawBuffer>,
    len: usize,
    ctx: Arc<Context>,
}

/// Pinned host memory of a [`VulkanDevice`] that shaders read and write directly.
pub struct VulkanHostBuffer {
    raw: Option<RawBuffer>,
    len: usize,
    ctx: Arc<Context>,
}

/// A stream: a chain of submissions on its own timeline semaphore (see the crate docs).
/// Dropping it submits what it recorded; its timeline is reused by a later stream.
pub struct VulkanStream {
    id: usize,
    ctx: Arc<Context>,
}

/// A point on a stream's timeline: the value that marks the work recorded before it complete.
#[derive(Clone, Copy, Debug)]
pub struct VulkanEvent {
    sem: ash::vk::Semaphore,
    value: u64,
    /// Identity of the device (its context's address) the event belongs to.
    device: usize,
}

macro_rules! buffer_common {
    ($t:ty) => {
        impl BufferLen for $t {
            fn byte_len(&self) -> u64 {
                self.len as u64
            }
        }

        impl Drop for $t {
            fn drop(&mut self) {
                if let Some(raw) = self.raw.take() {
                    self.ctx.retire(raw);
                }
            }
        }

        impl $t {
            fn raw(&self) -> &RawBuffer {
                // `raw` is only taken in `Drop`.
                self.raw.as_ref().expect("live buffer")
            }

            /// Length in bytes.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the buffer holds no bytes.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }
        }

        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("len", &self.len)
                    .finish()
            }
        }
    };
}

buffer_common!(VulkanBuffer);
buffer_common!(VulkanHostBuffer);

impl VulkanHostBuffer {
    /// Whether the memory is a host allocation imported with `VK_EXT_external_memory_host`
    /// (otherwise it is host-visible driver memory).
    pub fn is_imported(&self) -> bool {
        self.raw().imported
    }
}

impl Drop for VulkanStream {
    fn drop(&mut self) {
        self.ctx.drop_stream(self.id);
    }
}

impl std::fmt::Debug for VulkanStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanStream")
            .field("id", &self.id)
            .finish()
    }
}

impl std::fmt::Debug for VulkanDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanDevice")
            .field("name", &self.ctx.name)
            .finish()
    }
}

impl Drop for VulkanDevice {
    fn drop(&mut self) {
        let staging = self
            .staging
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(b) = staging {
            self.ctx.retire(b);
        }
    }
}

fn bulk(src_len: usize, so: usize, dst_len: usize, d: usize, bytes: usize) -> Result<()> {
    check_bulk_copy(
        src_len as u64,
        so as u64,
        dst_len as u64,
        d as u64,
        bytes as u64,
    )?;
    Ok(())
}

/// `v` as a `u32`, or an `Unsupported` error naming `what`.
fn u32_of(v: u64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| VulkanError::Unsupported(format!("{what} ({v}) exceeds 32 bits")))
}

impl VulkanDevice {
    /// Opens a device with the default [`VulkanOptions`]: `""` = the first suitable device, a
    /// number = the device at that index of the loader's list, anything else = the first device
    /// whose name contains it (case-insensitive).
    pub fn open(selector: &str) -> Result<VulkanDevice> {
        Self::open_with(selector, &VulkanOptions::default())
    }

    /// Like [`VulkanDevice::open`], but any validation warning or error (reported through
    /// `VK_EXT_debug_utils`, e.g. with `VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation`) makes
    /// the call during which it appeared fail with [`VulkanError::Validation`]
    /// ([`VulkanOptions::strict_validation`]). Tests use this.
    pub fn open_strict(selector: &str) -> Result<VulkanDevice> {
        let options = VulkanOptions {
            strict_validation: true,
            ..VulkanOptions::default()
        };
        Self::open_with(selector, &options)
    }

    /// Opens the device `selector` chooses (see [`VulkanDevice::open`]) configured by `options`.
    pub fn open_with(selector: &str, options: &VulkanOptions) -> Result<VulkanDevice> {
        Self::with_context(Self::context(selector, options)?, options)
    }

    /// Opens the context and applies the options that shape it.
    fn context(selector: &str, options: &VulkanOptions) -> Result<Context> {
        let dedicated = options.compute_family == ComputeFamily::Dedicated;
        let mut ctx = Context::open(selector, options.strict_validation, dedicated)?;
        if options.profile {
            ctx.enable_profile();
        }
        match options.queues {
            Queues::All => {}
            Queues::Single => ctx.reshape_lanes(1, false),
            Queues::OneCompute => {
                let transfer = ctx.has_transfer_lane();
                ctx.reshape_lanes(1, transfer)
            }
        }
        if options.host_wait == HostWait::Block {
            ctx.wait_poll = Duration::ZERO;
        }
        if options.barriers == Barriers::All {
            ctx.compute_barriers = false;
        }
        if options.resolve_scans == ResolveScans::WorkgroupMemory {
            ctx.limits.subgroup_arithmetic = false;
        }
        Ok(ctx)
    }

    /// Opens like [`VulkanDevice::open_with`] (strict validation forced on), then reshapes the
    /// device as `shape` says, to run code paths this device would not take otherwise. For
    /// tests.
    #[doc(hidden)]
    pub fn open_shaped(
        selector: &str,
        options: &VulkanOptions,
        shape: TestShape,
    ) -> Result<VulkanDevice> {
        let options = VulkanOptions {
            strict_validation: true,
            ..options.clone()
        };
        let mut ctx = Self::context(selector, &options)?;
        let real = ctx.limits;
        if let Some(window) = shape.window {
            if !window.is_power_of_two() || window < 256 || window > real.window {
                return Err(VulkanError::InvalidArgument(format!(
                    "TestShape::window {window}: a power of two in 256..={}",
                    real.window
                )));
            }
            ctx.limits.window = window;
        }
        if let Some(n) = shape.storage_buffers {
            if n < Shader::Resolve.bindings() || n > real.max_storage_per_stage {
                return Err(VulkanError::InvalidArgument(format!(
                    "TestShape::storage_buffers {n}: in {}..={}",
                    Shader::Resolve.bindings(),
                    real.max_storage_per_stage
                )));
            }
            ctx.limits.max_storage_per_stage = n;
        }
        if let Some((compute, transfer)) = shape.lanes {
            ctx.reshape_lanes(compute, transfer);
        }
        if shape.no_subgroups {
            ctx.limits.subgroup_arithmetic = false;
        }
        if let Some(bytes) = shape.workgroup_memory {
            let l = &mut ctx.limits;
            l.workgroup_resolver &= bytes >= vk::RESOLVE_WG_SHARED_BYTES;
            l.workgroup_resolver_large &= bytes >= vk::RESOLVE_WG_LARGE_SHARED_BYTES;
        }
        ctx.ignore_event_waits = shape.ignore_event_waits;
        Self::with_context(ctx, &options)
    }

    fn with_context(ctx: Context, options: &VulkanOptions) -> Result<VulkanDevice> {
        let dev = VulkanDevice {
            ctx: Arc::new(ctx),
            staging: Mutex::new(None),
            copy_engine: AtomicU8::new(options.copy_engine as u8),
            gather_kernel: AtomicU8::new(options.gather_kernel as u8),
            resolve_kernel: AtomicU8::new(ResolveKernel::Auto as u8),
            resolve_dump: options.dump_resolve.as_ref().map(dump::ResolveDump::new),
        };
        dev.set_resolve_kernel(options.resolve_kernel)?;
        Ok(dev)
    }

    /// Whether timestamp queries work on this device ([`VulkanDevice::timed`]).
    pub fn has_timestamps(&self) -> bool {
        self.ctx.limits.timestamp_period.is_some()
    }

    /// Whether the device is a GPU (integrated, discrete or virtual), not a CPU implementation
    /// such as lavapipe: kernel and wait choices differ.
    pub fn is_gpu(&self) -> bool {
        self.ctx.limits.gpu
    }

    /// Whether pinned buffers are imported host allocations (`VK_EXT_external_memory_host`).
    pub fn imports_host_memory(&self) -> bool {
        self.ctx.limits.import_alignment.is_some()
    }

    /// Bytes of one pool window (`maxStorageBufferRange` rounded down to a power of two).
    pub fn binding_window(&self) -> u64 {
        self.ctx.limits.window
    }

    /// Compute queues streams are spread over.
    pub fn compute_queues(&self) -> usize {
        self.ctx.compute_lanes()
    }

    /// The profile so far when [`VulkanOptions::profile`] was set at open (it is also printed to stderr
    /// when the device is dropped): per operation calls, commands, host and device time.
    pub fn profile_report(&self) -> Option<String> {
        self.ctx.profile_report()
    }

    /// Queue submissions this device has made so far (batches of recorded work; a diagnostic:
    /// benches divide it by the calls they made).
    pub fn submissions(&self) -> u64 {
        self.ctx
            .submissions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the device has a dedicated transfer queue (copy-only batches run there).
    pub fn has_transfer_queue(&self) -> bool {
        self.ctx.has_transfer_lane()
    }

    /// Runs `f`, which should only enqueue work, recording everything it enqueues (on any
    /// stream) into one chain of command buffers on one queue between two timestamp queries;
    /// returns the device time between them. Event waits inside `f` become full barriers.
    /// Synchronous calls inside `f` (uploads, `synchronize`, …) submit early; the result then
    /// also includes host round trips.
    pub fn timed(&self, f: impl FnOnce(&Self) -> Result<()>) -> Result<Duration> {
        if !self.has_timestamps() {
            return Err(VulkanError::Unsupported(
                "the compute queue has no timestamp support".into(),
            ));
        }
        self.ctx.begin_capture()?;
        let r = f(self);
        let ns = self.ctx.end_capture()?;
        r?;
        let ns = ns.unwrap_or(0.0);
        Ok(Duration::from_nanos(ns.max(0.0) as u64))
    }

    /// The id of `stream` on this device's context, or an error for another device's stream.
    fn sid(&self, stream: &VulkanStream) -> Result<usize> {
        if !Arc::ptr_eq(&stream.ctx, &self.ctx) {
            return Err(VulkanError::InvalidArgument(
                "the stream belongs to another Vulkan device; create streams with the device \
                 that runs the work"
                    .into(),
            ));
        }
        Ok(stream.id)
    }

    fn event_of(&self, e: &VulkanEvent) -> Result<(ash::vk::Semaphore, u64)> {
        if e.device != Arc::as_ptr(&self.ctx) as usize {
            return Err(VulkanError::InvalidArgument(
                "the event belongs to another Vulkan device".into(),
            ));
        }
        Ok((e.sem, e.value))
    }

    /// The binding of the first `need` bytes of an index buffer (one binding at most).
    fn bind_index(&self, b: &RawBuffer, need: u64, what: &str) -> Result<Binding> {
        let max = self.ctx.limits.max_storage_range;
        if need > max {
            return Err(VulkanError::Unsupported(format!(
                "{what}: {need} bytes exceed one storage binding (maxStorageBufferRange = \
                 {max} bytes on this device); split the batch (fewer tokens or requests per \
                 call)"
            )));
        }
        Ok(Binding {
            buffer: b.buffer,
            offset: 0,
            range: b.size.min(max),
        })
    }

    /// Runs `f` with the staging buffer grown to at least `bytes` (held for the whole call).
    fn with_staging<R>(
        &self,
        bytes: usize,
        f: impl FnOnce(&mut RawBuffer) -> Result<R>,
    ) -> Result<R> {
        let mut slot = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(|s| (s.size as usize) < bytes) {
            let fresh = self
                .ctx
                .create_buffer(bytes.next_power_of_two() as u64, MemKind::Staging)?;
            if let Some(old) = slot.replace(fresh) {
                self.ctx.retire(old);
            }
        }
        match slot.as_mut() {
            Some(s) => f(s),
            None => Err(VulkanError::Unsupported("no staging buffer".into())),
        }
    }
}

impl Device for VulkanDevice {
    type Error = VulkanError;
    type Buffer = VulkanBuffer;
    type HostBuffer = VulkanHostBuffer;
    type Stream = VulkanStream;
    type Event = VulkanEvent;

    fn backend(&self) -> &'static str {
        "vulkan"
    }

    fn device_name(&self) -> &str {
        &self.ctx.name
    }

    fn alloc(&self, bytes: usize) -> Result<VulkanBuffer> {
        let raw = self.ctx.create_buffer(bytes as u64, MemKind::Device)?;
        let (handle, size) = (raw.buffer, raw.size);
        let buf = VulkanBuffer {
            raw: Some(raw),
            len: bytes,
            ctx: self.ctx.clone(),
        };
        // On the internal stream, which every stream's next submission waits for.
        self.ctx.record(0, Engine::Copy, "alloc", |rec| {
            rec.zero(handle, 0, size);
            Ok(())
        })?;
        Ok(buf)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<VulkanHostBuffer> {
        check_pinned_budget(
            bytes as u64,
            hisparse_host_memory::available_ram().unwrap_or(u64::MAX),
        )?;
        let raw = self.ctx.create_buffer(bytes as u64, MemKind::Pinned)?;
        let buf = VulkanHostBuffer {
            raw: Some(raw),
            len: bytes,
            ctx: self.ctx.clone(),
        };
        if !(buf.raw().ptr as usize).is_multiple_of(PINNED_ALIGNMENT) {
            return Err(VulkanError::Unsupported(format!(
                "host-visible memory mapped at {:p}, not {PINNED_ALIGNMENT}-byte aligned",
                buf.raw().ptr
            )));
        }
        Ok(buf)
    }

    fn pinned_address(&self, buf: &VulkanHostBuffer) -> usize {
        buf.raw().ptr as usize
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        let host_available = hisparse_host_memory::available_ram()?;
        let (free, _) = self.ctx.device_memory();
        let unified = self.ctx.limits.unified;
        Some(MemoryInfo {
            device_free: if unified {
                free.min(host_available)
            } else {
                free
            },
            host_available,
            unified,
        })
    }

    fn upload(&self, dst: &mut VulkanBuffer, offset: usize, src: &[u8]) -> Result<()> {
        bulk(src.len(), 0, dst.len, offset, src.len())?;
        self.ctx.wait_all()?;
        if src.is_empty() {
            return Ok(());
        }
        let dst_handle = dst.raw().buffer;
        let chunk = src.len().min(STAGING_CHUNK);
        self.with_staging(chunk, |staging| {
            for (i, piece) in src.chunks(chunk).enumerate() {
                vk::write_host(staging, 0, piece);
                let region = ash::vk::BufferCopy {
                    src_offset: 0,
                    dst_offset: (offset + i * chunk) as u64,
                    size: piece.len() as u64,
                };
                let sb = staging.buffer;
                self.ctx.record(0, Engine::Copy, "upload", |rec| {
                    rec.copy(sb, dst_handle, &[region]);
                    Ok(())
                })?;
                // The staging buffer is reused by the next piece.
                self.ctx.synchronize(0)?;
            }
            Ok(())
        })
    }

    fn download(&self, src: &VulkanBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        bulk(src.len, offset, dst.len(), 0, dst.len())?;
        self.ctx.wait_all()?;
        if dst.is_empty() {
            return Ok(());
        }
        let src_handle = src.raw().buffer;
        let chunk = dst.len().min(STAGING_CHUNK);
        self.with_staging(chunk, |staging| {
            let sb = staging.buffer;
            for (i, piece) in dst.chunks_mut(chunk).enumerate() {
                let region = ash::vk::BufferCopy {
                    src_offset: (offset + i * chunk) as u64,
                    dst_offset: 0,
                    size: piece.len() as u64,
                };
                self.ctx.record(0, Engine::Copy, "download", |rec| {
                    rec.copy(src_handle, sb, &[region]);
                    Ok(())
                })?;
                self.ctx.synchronize(0)?;
                vk::read_host(staging, 0, piece);
            }
            Ok(())
        })
    }

    fn write_pinned(&self, dst: &mut VulkanHostBuffer, offset: usize, src: &[u8]) -> Result<()> {
        bulk(src.len(), 0, dst.len, offset, src.len())?;
        self.ctx.wait_all()?;
        if let Some(raw) = dst.raw.as_mut() {
            vk::write_host(raw, offset, src);
        }
        Ok(())
    }

    fn read_pinned(&self, src: &VulkanHostBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        bulk(src.len, offset, dst.len(), 0, dst.len())?;
        self.ctx.wait_all()?;
        vk::read_host(src.raw(), offset, dst);
        Ok(())
    }

    fn read_pinned_after(
        &self,
        event: &VulkanEvent,
        src: &VulkanHostBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        bulk(src.len, offset, dst.len(), 0, dst.len())?;
        // Every submission ends with a barrier that makes its writes visible to the host.
        self.ctx.wait_event_host(self.event_of(event)?)?;
        vk::read_host(src.raw(), offset, dst);
        Ok(())
    }

    fn create_stream(&self) -> Result<VulkanStream> {
        Ok(VulkanStream {
            id: self.ctx.create_stream()?,
            ctx: self.ctx.clone(),
        })
    }

    fn record_event(&self, stream: &VulkanStream) -> Result<VulkanEvent> {
        let (sem, value) = self.ctx.record_event(self.sid(stream)?);
        Ok(VulkanEvent {
            sem,
            value,
            device: Arc::as_ptr(&self.ctx) as usize,
        })
    }

    fn wait_event(&self, stream: &VulkanStream, event: &VulkanEvent) -> Result<()> {
        let e = self.event_of(event)?;
        self.ctx.wait_event(self.sid(stream)?, e)
    }

    fn synchronize(&self, stream: &VulkanStream) -> Result<()> {
        self.ctx.synchronize(self.sid(stream)?)
    }

    fn query_event(&self, event: &VulkanEvent) -> Result<bool> {
        let e = self.event_of(event)?;
        self.ctx.query_event(e)
    }

    // Accepted twins (CONTRIBUTING.md, "One rule, one place"): the three bulk copies share the
    // Device trait's signature shape; each moves bytes in its own direction.
    fn copy_to_device(
        &self,
        stream: &VulkanStream,
        src: &VulkanHostBuffer,
        src_offset: usize,
        dst: &mut VulkanBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        bulk(src.len, src_offset, dst.len, dst_offset, bytes)?;
        self.bulk_copy(
            self.sid(stream)?,
            "copy_to_device",
            src.raw(),
            src_offset,
            dst.raw(),
            dst_offset,
            bytes,
            true,
        )
    }

    fn copy_to_host(
        &self,
        stream: &VulkanStream,
        src: &VulkanBuffer,
        src_offset: usize,
        dst: &mut VulkanHostBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        bulk(src.len, src_offset, dst.len, dst_offset, bytes)?;
        self.bulk_copy(
            self.sid(stream)?,
            "copy_to_host",
            src.raw(),
            src_offset,
            dst.raw(),
            dst_offset,
            bytes,
            true,
        )
    }

    fn copy_on_device(
        &self,
        stream: &VulkanStream,
        src: &VulkanBuffer,
        src_offset: usize,
        dst: &mut VulkanBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        bulk(src.len, src_offset, dst.len, dst_offset, bytes)?;
        self.bulk_copy(
            self.sid(stream)?,
            "copy_on_device",
            src.raw(),
            src_offset,
            dst.raw(),
            dst_offset,
            bytes,
            false,
        )
    }

    fn copy_within_device(
        &self,
        stream: &VulkanStream,
        buf: &mut VulkanBuffer,
        src_offset: usize,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        hisparse_core::ops::copy::check_copy_within(
            buf.len as u64,
            src_offset as u64,
            dst_offset as u64,
            bytes as u64,
        )?;
        self.copy_within(
            self.sid(stream)?,
            buf.raw(),
            src_offset as u64,
            dst_offset as u64,
            bytes as u64,
        )
    }

    fn write_table(
        &self,
        stream: &VulkanStream,
        desc: &TableWriteDesc,
        writes: &[TableWrite],
        table: &mut VulkanBuffer,
    ) -> Result<()> {
        desc.check(writes, table)?;
        self.table_writes(self.sid(stream)?, writes, table.raw())
    }

    fn reset_hot_state(
        &self,
        stream: &VulkanStream,
        desc: &HotResetDesc,
        rows: &[u32],
        slot_host_rows: &mut VulkanBuffer,
        lru: &mut VulkanBuffer,
    ) -> Result<()> {
        desc.check(rows, slot_host_rows, lru)?;
        self.hot_reset(
            self.sid(stream)?,
            desc,
            rows,
            slot_host_rows.raw(),
            lru.raw(),
        )
    }

    fn remap(
        &self,
        stream: &VulkanStream,
        desc: &RemapDesc,
        args: RemapArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        self.remap_rows(self.sid(stream)?, desc, args)
    }

    fn resolve(
        &self,
        stream: &VulkanStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        desc.check(&args.sizes())?;
        if let Some(d) = &self.resolve_dump {
            d.on_resolve(self, stream, desc, &args)?;
        }
        self.resolve_rows(self.sid(stream)?, desc, args)
    }

    fn indexer_backup(
        &self,
        stream: &VulkanStream,
        desc: &IndexerBackupDesc<'_>,
        args: IndexerBackupArgs<'_, VulkanBuffer, VulkanHostBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        self.indexer_rows(self.sid(stream)?, desc, args)
    }

    fn gather_rows(
        &self,
        stream: &VulkanStream,
        desc: &GatherDesc<'_>,
        args: GatherArgs<'_, VulkanBuffer, VulkanHostBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        self.gather(self.sid(stream)?, desc, args)
    }

    fn copy_pages(
        &self,
        stream: &VulkanStream,
        desc: &PageCopyDesc<'_>,
        pairs: &[BlockPair],
        host: &mut VulkanHostBuffer,
        device: &mut VulkanBuffer,
    ) -> Result<()> {
        desc.check(pairs, host.len as u64, device.len as u64)?;
        self.pages(self.sid(stream)?, desc, pairs, host.raw(), device.raw())
    }

    fn copy_rows(
        &self,
        stream: &VulkanStream,
        desc: &RowCopyDesc<'_>,
        spans: &[RowSpan],
        host: &mut VulkanHostBuffer,
        device: &mut VulkanBuffer,
    ) -> Result<()> {
        desc.check(spans, host.len as u64, device.len as u64)?;
        self.rows(self.sid(stream)?, desc, spans, host.raw(), device.raw())
    }

    fn copy_host_pages(
        &self,
        stream: &VulkanStream,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &mut VulkanHostBuffer,
    ) -> Result<()> {
        hisparse_core::ops::copy::check_host_page_copy(layers, pairs, host.len as u64)?;
        self.host_pages(self.sid(stream)?, layers, pairs, host.raw())
    }

    fn invalidate(
        &self,
        stream: &VulkanStream,
        desc: &InvalidateDesc,
        args: InvalidateArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        self.invalidate_rows(self.sid(stream)?, desc, args)
    }

    fn compressed_slot_mapping(
        &self,
        stream: &VulkanStream,
        desc: &SlotMappingDesc,
        args: SlotMappingArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        self.slot_mapping(self.sid(stream)?, desc, args)
    }
}
