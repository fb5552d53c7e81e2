//! [`RocmDevice`]: the [`Device`] implementation on the HIP runtime.

use std::ffi::c_void;
use std::sync::Arc;

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
use hisparse_gpu_kernels as gk;
use hisparse_gpu_kernels::plan::{self, GatherWalk, Launch, Plan, PlanError, Target};

use crate::capture::Lasting;
use crate::context::Context;
use crate::error::RocmError;
use crate::ffi::{self, Handle, MemcpyKind};
use crate::kernels::{self, KernelSource};
use crate::memory::{RocmBuffer, RocmEvent, RocmHostBuffer, RocmStream};
use hisparse_host_memory::available_ram;

/// A HIP device with the HiSparse kernels loaded.
///
/// Opening loads `libamdhip64` at run time (see the crate docs for the search path), picks the
/// embedded code object for the device's processor, or compiles the kernels with hiprtc when none
/// fits, and loads them. Every operation of [`Device`] is enqueued on a caller's stream.
#[derive(Debug)]
pub struct RocmDevice {
    pub(crate) ctx: Arc<Context>,
    /// The side stream, the list arena and the scratch of captured launches.
    pub(crate) lasting: Lasting,
    display: String,
    /// How host pools are set up ([`RocmDevice::with_host_pool_config`]).
    pub(crate) host_pool: crate::pinned::HostPoolSetup,
}

impl RocmDevice {
    /// Opens HIP device `ordinal`. A missing runtime, no device, or an ordinal beyond the devices
    /// gives an error of kind [`hisparse_core::ErrorKind::NotFound`].
    pub fn open(ordinal: usize) -> Result<RocmDevice, RocmError> {
        let ctx = Context::open(ordinal)?;
        let version = if ctx.runtime_version > 0 {
            let v = ctx.runtime_version;
            format!(
                ", HIP {}.{}.{}",
                v / 10_000_000,
                v / 100_000 % 100,
                v % 100_000
            )
        } else {
            String::new()
        };
        let display = format!("{} ({}, {}{version})", ctx.name, ctx.arch, ctx.source);
        let ctx = Arc::new(ctx);
        Ok(RocmDevice {
            host_pool: crate::pinned::HostPoolSetup::probe(&ctx),
            lasting: Lasting::new(&ctx)?,
            ctx,
            display,
        })
    }

    /// Devices the HIP runtime reports (loads the runtime; `NotFound` when it is missing).
    pub fn device_count() -> Result<usize, RocmError> {
        let hip = crate::ffi::Hip::load().map_err(RocmError::RuntimeNotFound)?;
        let s = hip.init();
        if s != crate::ffi::HIP_SUCCESS {
            return Err(RocmError::hip(&hip, "hipInit", s));
        }
        let n = hip
            .device_count()
            .map_err(|s| RocmError::hip(&hip, "hipGetDeviceCount", s))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The device's full architecture name (`gcnArchName`, e.g. `gfx942:sramecc+:xnack-`).
    pub fn arch(&self) -> &str {
        &self.ctx.arch
    }

    /// Where the loaded kernels came from: an embedded code object or hiprtc.
    pub fn kernel_source(&self) -> &KernelSource {
        &self.ctx.source
    }

    /// The most hot slots per request `resolve` supports on this device: every `hot_slots` the
    /// specification allows (`hisparse_core::ops::MAX_HOT_SLOTS`, 32,768). When a request's LRU
    /// state (`hisparse_gpu_kernels::resolve_shared_bytes(hot_slots, 0)`) fits the shared memory
    /// of one block ([`RocmDevice::max_shared_hot_slots`]) it stays there; above that `resolve`
    /// keeps it in a global-memory workspace (global-state mode of `hs_resolve`).
    pub fn max_hot_slots(&self) -> u32 {
        hisparse_core::ops::MAX_HOT_SLOTS
    }

    /// The most hot slots per request whose `resolve` state fits the shared memory of one block
    /// (9,736 with the 64 KiB of current AMD GPUs); larger `hot_slots` resolve with the state in
    /// global memory.
    pub fn max_shared_hot_slots(&self) -> u32 {
        let limit = self.resolve_shared_limit();
        // resolve_shared_bytes grows with hot_slots: binary search the largest that fits.
        let (mut lo, mut hi) = (0u32, hisparse_core::ops::MAX_HOT_SLOTS);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if gk::resolve_shared_bytes(mid, 0) <= limit {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Dynamic shared memory `hs_resolve` may use: the per-block limit minus its static part.
    fn resolve_shared_limit(&self) -> u64 {
        (self.ctx.shared_mem_per_block as u64).saturating_sub(gk::RESOLVE_STATIC_SHARED_BYTES)
    }

    /// Device memory in bytes, as the runtime reports it.
    pub fn memory_bytes(&self) -> usize {
        self.ctx.total_global_mem
    }

    /// The HIP runtime library file that was loaded.
    pub fn runtime_path(&self) -> &str {
        &self.ctx.hip.path
    }

    /// The swap-in critical path in one launch: [`Device::resolve`] of `desc` with `args`, and
    /// the gather of its miss plan (`args.miss_src`, `args.miss_dst`, `args.miss_counts`) from
    /// `host` into `device` for `layers`, with the results of [`Device::gather_rows`] right after
    /// it, in one `hs_resolve_gather` launch (layers beyond 16 follow as gather launches).
    pub fn resolve_and_gather(
        &self,
        stream: &RocmStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, RocmBuffer>,
        layers: &[hisparse_core::ops::LayerPair],
        host: &RocmHostBuffer,
        device: &mut RocmBuffer,
    ) -> Result<(), RocmError> {
        // The one rule for both halves (the trait's default and the reference use it too).
        hisparse_core::ops::swap_in::check(
            desc,
            &args.sizes(),
            layers,
            host.byte_len(),
            device.byte_len(),
        )?;
        let target = self.target();
        let plan = plan::resolve_gather(
            &target,
            desc,
            &resolve_addrs(&args),
            layers,
            host.device_addr(),
            device.addr(),
            false,
        )?;
        self.execute(stream, plan)
    }

    /// What the launch planners know about this device.
    fn target(&self) -> Target {
        Target {
            multiprocessors: self.ctx.multiprocessors,
            shared_per_block: self.ctx.shared_mem_per_block as u64,
            shared_per_multiprocessor: self.ctx.shared_mem_per_multiprocessor as u64,
            resolve_blocks_per_multiprocessor: self.ctx.resolve_blocks_per_multiprocessor,
        }
    }

    /// Enqueues `plan` on `stream`: stages its lists in one pinned, mapped buffer (reused once an
    /// event says the launches reading it finished), places the symbolic pointers (the stream's
    /// workspace and resolver counters among them) and launches each kernel in order. An empty
    /// plan enqueues nothing.
    fn execute(&self, stream: &RocmStream, mut plan: Plan) -> Result<(), RocmError> {
        if plan.launches.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // Only lists and scratch depend on whether the stream is being captured.
        let capturing = (!plan.staged.is_empty() || plan.workspace_bytes > 0)
            && self.capture_status(stream)? != ffi::CAPTURE_STATUS_NONE;
        let workspace = if plan.workspace_bytes > 0 {
            let bytes = usize::try_from(plan.workspace_bytes).map_err(|_| {
                RocmError::Unsupported("the resolve workspace exceeds the address space".into())
            })?;
            stream.scratch.workspace(bytes)?
        } else {
            0
        };
        if capturing {
            // Every replay of the graph uses this stream's counters and workspace.
            self.lasting.retain(&stream.scratch);
        }
        // Constant lists and every list of captured work from the arena; the others packed into
        // one staging buffer (`Some(offset)` in it).
        let mut bytes = Vec::new();
        let mut places = Vec::with_capacity(plan.staged.len());
        for part in &plan.staged {
            match self
                .lasting
                .lasting_address(&part.bytes, part.kind, capturing)?
            {
                Some(addr) => places.push((addr, false)),
                None => {
                    while !bytes.len().is_multiple_of(16) {
                        bytes.push(0);
                    }
                    places.push((bytes.len() as u64, true));
                    bytes.extend_from_slice(&part.bytes);
                }
            }
        }
        let counters = stream.scratch.counters();
        let mut run = |base: u64| -> Result<(), RocmError> {
            let placed: Vec<u64> = places
                .iter()
                .map(|&(at, staged)| if staged { base + at } else { at })
                .collect();
            for l in &mut plan.launches {
                l.args
                    .resolve(&placed, workspace, counters)
                    .map_err(|message| RocmError::Module { message })?;
                self.launch(stream.raw, l)?;
            }
            Ok(())
        };
        if bytes.is_empty() && !places.iter().any(|&(_, staged)| staged) {
            run(0)
        } else {
            self.ctx.with_staging(stream.raw, &bytes, run)
        }
    }

    /// `hipStreamIsCapturing` of `stream` (`hipStreamCaptureStatus`).
    fn capture_status(&self, stream: &RocmStream) -> Result<std::ffi::c_int, RocmError> {
        self.ctx
            .hip
            .stream_capture_status(stream.raw)
            .map_err(|st| RocmError::hip(&self.ctx.hip, "hipStreamIsCapturing", st))
    }

    /// `(lists, bytes)` the device's list arena holds: every distinct list of captured calls and
    /// the constant lists (layer tables) kept instead of being staged on every call.
    pub fn list_arena_use(&self) -> (usize, u64) {
        self.lasting.arena_use()
    }

    fn launch(&self, stream: Handle, l: &mut Launch) -> Result<(), RocmError> {
        let abi = l.kernel.abi();
        l.args
            .matches(&abi)
            .map_err(|message| RocmError::Module { message })?;
        let mut params = l
            .args
            .pointers()
            .map_err(|message| RocmError::Module { message })?;
        // SAFETY: `params` points into `l.args`, which outlives the call and holds one value per
        // parameter with exactly the type the ABI table declares (checked just above); HIP copies
        // the values at launch. Every device address among them belongs to a buffer the caller
        // keeps alive until the work completes (the `Device` contract), to the staging buffer
        // reserved until then, or to the stream's scratch (freed only with the stream).
        let status = unsafe {
            self.ctx.hip.launch(
                self.ctx.function(kernels::index(l.kernel)),
                l.grid,
                [l.block, 1, 1],
                l.shared,
                stream,
                &mut params,
            )
        };
        self.ctx.check("hipModuleLaunchKernel", status)
    }

    fn memcpy_async(
        &self,
        stream: &RocmStream,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: MemcpyKind,
    ) -> Result<(), RocmError> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: both ranges were bounds-checked against their buffers (device or pinned) by the
        // caller, and the buffers outlive the work (the `Device` contract).
        let s = unsafe { self.ctx.hip.memcpy_async(dst, src, bytes, kind, stream.raw) };
        self.ctx.check("hipMemcpyAsync", s)
    }

    /// Synchronises the whole device (the synchronous host copies wait for all enqueued work).
    fn sync_all(&self) -> Result<(), RocmError> {
        self.ctx.bind()?;
        self.ctx
            .check("hipDeviceSynchronize", self.ctx.hip.device_synchronize())
    }
}

impl Device for RocmDevice {
    type Error = RocmError;
    type Buffer = RocmBuffer;
    type HostBuffer = RocmHostBuffer;
    type Stream = RocmStream;
    type Event = RocmEvent;

    fn backend(&self) -> &'static str {
        "rocm"
    }

    fn device_name(&self) -> &str {
        &self.display
    }

    fn alloc(&self, bytes: usize) -> Result<RocmBuffer, RocmError> {
        let mut buf = RocmBuffer {
            ptr: std::ptr::null_mut(),
            len: bytes,
            ctx: self.ctx.clone(),
            owned: true,
        };
        if bytes == 0 {
            return Ok(buf);
        }
        self.ctx.bind()?;
        buf.ptr = self
            .ctx
            .hip
            .malloc(bytes)
            .map_err(|s| RocmError::hip(&self.ctx.hip, "hipMalloc", s))?;
        // SAFETY: `buf.ptr` is a fresh device allocation of `bytes` bytes.
        let s = unsafe { self.ctx.hip.memset(buf.ptr, 0, bytes) };
        self.ctx.check("hipMemset", s)?;
        // The memset ran on the null stream, which non-blocking streams do not wait for.
        self.sync_all()?;
        Ok(buf)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<RocmHostBuffer, RocmError> {
        // The host's limits are checked before anything is reserved (crate::pinned).
        self.alloc_pool(bytes)
    }

    fn pinned_address(&self, buf: &RocmHostBuffer) -> usize {
        buf.host as usize
    }

    fn upload(&self, dst: &mut RocmBuffer, offset: usize, src: &[u8]) -> Result<(), RocmError> {
        check_write(dst, offset, src)?;
        self.sync_all()?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: `[offset, offset + len)` lies inside `dst` (checked) and `src` is a live slice;
        // hipMemcpy completes before returning.
        let s = unsafe {
            self.ctx.hip.memcpy(
                dst.at(offset),
                src.as_ptr().cast(),
                src.len(),
                MemcpyKind::HostToDevice,
            )
        };
        self.ctx.check("hipMemcpy", s)?;
        // A pageable copy may still be in flight on the null stream when hipMemcpy returns.
        self.sync_all()
    }

    fn download(&self, src: &RocmBuffer, offset: usize, dst: &mut [u8]) -> Result<(), RocmError> {
        check_read(src, offset, dst)?;
        self.sync_all()?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the source range lies inside `src` (checked); `dst` is a live, exclusive slice;
        // device-to-host hipMemcpy is complete when it returns.
        let s = unsafe {
            self.ctx.hip.memcpy(
                dst.as_mut_ptr().cast(),
                src.at(offset),
                dst.len(),
                MemcpyKind::DeviceToHost,
            )
        };
        self.ctx.check("hipMemcpy", s)
    }

    fn write_pinned(
        &self,
        dst: &mut RocmHostBuffer,
        offset: usize,
        src: &[u8],
    ) -> Result<(), RocmError> {
        check_write(dst, offset, src)?;
        self.sync_all()?;
        if !src.is_empty() {
            // SAFETY: the range lies inside the pinned allocation (checked); the device is idle
            // (synchronised above) and `&mut dst` excludes other host access.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), dst.host_at(offset).cast(), src.len())
            };
        }
        Ok(())
    }

    fn read_pinned(
        &self,
        src: &RocmHostBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), RocmError> {
        check_read(src, offset, dst)?;
        self.sync_all()?;
        if !dst.is_empty() {
            // SAFETY: the range lies inside the pinned allocation (checked); the device is idle,
            // so nothing writes it meanwhile.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.host_at(offset).cast::<u8>(),
                    dst.as_mut_ptr(),
                    dst.len(),
                )
            };
        }
        Ok(())
    }

    fn create_stream(&self) -> Result<RocmStream, RocmError> {
        self.ctx.bind()?;
        let raw = self
            .ctx
            .hip
            .stream_create()
            .map_err(|s| RocmError::hip(&self.ctx.hip, "hipStreamCreateWithFlags", s))?;
        RocmStream::new(&self.ctx, raw, true, self.lasting.side)
    }

    /// `hipStreamIsCapturing`: true while a capture sequence is open on the stream (also one
    /// the runtime has invalidated, which then fails when it ends).
    fn is_capturing(&self, stream: &RocmStream) -> Result<bool, RocmError> {
        self.ctx.bind()?;
        Ok(self.capture_status(stream)? != ffi::CAPTURE_STATUS_NONE)
    }

    fn record_event(&self, stream: &RocmStream) -> Result<RocmEvent, RocmError> {
        self.ctx.bind()?;
        let raw = self
            .ctx
            .hip
            .event_create()
            .map_err(|s| RocmError::hip(&self.ctx.hip, "hipEventCreateWithFlags", s))?;
        let event = RocmEvent {
            raw,
            ctx: self.ctx.clone(),
        };
        self.ctx
            .check("hipEventRecord", self.ctx.hip.event_record(raw, stream.raw))?;
        Ok(event)
    }

    fn wait_event(&self, stream: &RocmStream, event: &RocmEvent) -> Result<(), RocmError> {
        self.ctx.bind()?;
        self.ctx.check(
            "hipStreamWaitEvent",
            self.ctx.hip.stream_wait_event(stream.raw, event.raw),
        )
    }

    fn query_event(&self, event: &RocmEvent) -> Result<bool, RocmError> {
        self.ctx.bind()?;
        match self.ctx.hip.event_query(event.raw) {
            ffi::HIP_SUCCESS => Ok(true),
            ffi::HIP_ERROR_NOT_READY => Ok(false),
            s => Err(RocmError::hip(&self.ctx.hip, "hipEventQuery", s)),
        }
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.ctx.bind().ok()?;
        let (free, _) = self.ctx.hip.mem_info().ok()?;
        Some(MemoryInfo {
            device_free: free as u64,
            host_available: available_ram()?,
            unified: false,
        })
    }

    fn copy_within_device(
        &self,
        stream: &RocmStream,
        buf: &mut RocmBuffer,
        src_offset: usize,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), RocmError> {
        check_copy_within(
            buf.byte_len(),
            src_offset as u64,
            dst_offset as u64,
            bytes as u64,
        )?;
        self.memcpy_async(
            stream,
            buf.at(dst_offset),
            buf.at(src_offset),
            bytes,
            MemcpyKind::DeviceToDevice,
        )
    }

    fn write_table(
        &self,
        stream: &RocmStream,
        desc: &TableWriteDesc,
        writes: &[TableWrite],
        table: &mut RocmBuffer,
    ) -> Result<(), RocmError> {
        desc.check(writes, table)?;
        let plan = plan::write_table(&self.target(), desc, writes, table.addr())?;
        self.execute(stream, plan)
    }

    fn reset_hot_state(
        &self,
        stream: &RocmStream,
        desc: &HotResetDesc,
        rows: &[u32],
        slot_host_rows: &mut RocmBuffer,
        lru: &mut RocmBuffer,
    ) -> Result<(), RocmError> {
        desc.check(rows, slot_host_rows, lru)?;
        let plan = plan::reset_hot_state(
            &self.target(),
            desc,
            rows,
            slot_host_rows.addr(),
            lru.addr(),
        )?;
        self.execute(stream, plan)
    }

    fn synchronize(&self, stream: &RocmStream) -> Result<(), RocmError> {
        self.ctx.bind()?;
        self.ctx.check(
            "hipStreamSynchronize",
            self.ctx.hip.stream_synchronize(stream.raw),
        )
    }

    // Accepted twins (CONTRIBUTING.md, "One rule, one place"): the three bulk copies share the
    // Device trait's signature shape; each moves bytes in its own direction.
    fn copy_to_device(
        &self,
        stream: &RocmStream,
        src: &RocmHostBuffer,
        src_offset: usize,
        dst: &mut RocmBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), RocmError> {
        check_bulk(src, src_offset, dst, dst_offset, bytes)?;
        // One copy per separately registered chunk the source range crosses.
        for piece in src.copy_pieces(src_offset, bytes) {
            self.memcpy_async(
                stream,
                dst.at(dst_offset + (piece.start - src_offset)),
                src.host_at(piece.start),
                piece.len(),
                MemcpyKind::HostToDevice,
            )?;
        }
        Ok(())
    }

    fn copy_to_host(
        &self,
        stream: &RocmStream,
        src: &RocmBuffer,
        src_offset: usize,
        dst: &mut RocmHostBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), RocmError> {
        check_bulk(src, src_offset, dst, dst_offset, bytes)?;
        // One copy per separately registered chunk the destination range crosses.
        for piece in dst.copy_pieces(dst_offset, bytes) {
            self.memcpy_async(
                stream,
                dst.host_at(piece.start),
                src.at(src_offset + (piece.start - dst_offset)),
                piece.len(),
                MemcpyKind::DeviceToHost,
            )?;
        }
        Ok(())
    }

    fn copy_on_device(
        &self,
        stream: &RocmStream,
        src: &RocmBuffer,
        src_offset: usize,
        dst: &mut RocmBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), RocmError> {
        check_bulk(src, src_offset, dst, dst_offset, bytes)?;
        self.memcpy_async(
            stream,
            dst.at(dst_offset),
            src.at(src_offset),
            bytes,
            MemcpyKind::DeviceToDevice,
        )
    }

    fn remap(
        &self,
        stream: &RocmStream,
        desc: &RemapDesc,
        args: RemapArgs<'_, RocmBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args)?;
        let addrs = remap_addrs(&args);
        let plan = plan::remap(&self.target(), desc, &addrs)?;
        self.execute(stream, plan)
    }

    /// Both modes (decode-context-parallel de-interleave, prefill workspace) run `hs_remap_modes`;
    /// a call without modes is the plain remap (the same kernel as [`Device::remap`]).
    fn remap_modes(
        &self,
        stream: &RocmStream,
        desc: &RemapModesDesc,
        args: RemapModesArgs<'_, RocmBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args)?;
        if !desc.has_modes() {
            return self.remap(stream, &desc.remap, args.remap);
        }
        let addrs = plan::RemapModesAddrs {
            remap: remap_addrs(&args.remap),
            prefill_req_id: args.prefill_req_id.map_or(0, |b| b.addr()),
            workspace_starts: args.workspace_starts.map_or(0, |b| b.addr()),
        };
        let plan = plan::remap_modes(&self.target(), desc, &addrs)?;
        self.execute(stream, plan)
    }

    fn resolve(
        &self,
        stream: &RocmStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, RocmBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args.sizes())?;
        let plan = plan::resolve(&self.target(), desc, &resolve_addrs(&args), false)?;
        self.execute(stream, plan)
    }

    fn gather_rows(
        &self,
        stream: &RocmStream,
        desc: &GatherDesc<'_>,
        args: GatherArgs<'_, RocmBuffer, RocmHostBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args)?;
        let addrs = plan::GatherAddrs {
            plan_src: args.plan_src.addr(),
            plan_dst: args.plan_dst.addr(),
            plan_counts: args.plan_counts.addr(),
            host: args.host.device_addr(),
            device: args.device.addr(),
        };
        let plan = plan::gather(&self.target(), desc, &addrs, GatherWalk::Auto)?;
        self.execute(stream, plan)
    }

    /// From [`plan::FUSED_MIN_ROWS`] token rows one `hs_resolve_gather` launch (the inherent
    /// [`RocmDevice::resolve_and_gather`]: each request's misses are copied while other requests
    /// still resolve); below, `resolve` then `gather_rows`, which is faster there.
    fn resolve_and_gather(
        &self,
        stream: &RocmStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, RocmBuffer>,
        layers: &[hisparse_core::ops::LayerPair],
        host: &RocmHostBuffer,
        device: &mut RocmBuffer,
    ) -> Result<(), RocmError> {
        if plan::swap_in_fused(desc, layers, GatherWalk::Auto) {
            // The inherent method of the same name (inherent methods take precedence).
            return RocmDevice::resolve_and_gather(self, stream, desc, args, layers, host, device);
        }
        // Few rows: the pair, as the trait's default does it.
        hisparse_core::device::resolve_then_gather(self, stream, desc, args, layers, host, device)
    }

    fn copy_pages(
        &self,
        stream: &RocmStream,
        desc: &PageCopyDesc<'_>,
        pairs: &[BlockPair],
        host: &mut RocmHostBuffer,
        device: &mut RocmBuffer,
    ) -> Result<(), RocmError> {
        desc.check(pairs, host.byte_len(), device.byte_len())?;
        let (jobs, src, dst): (Vec<_>, _, _) = match desc.direction {
            Direction::DeviceToHost => (
                desc.layers.iter().map(|l| (l.device, l.host)).collect(),
                device.addr(),
                host.device_addr(),
            ),
            Direction::HostToDevice => (
                desc.layers.iter().map(|l| (l.host, l.device)).collect(),
                host.device_addr(),
                device.addr(),
            ),
        };
        let plan = plan::copy_pages(&self.target(), &jobs, pairs, src, dst, false)?;
        self.execute(stream, plan)
    }

    fn copy_rows(
        &self,
        stream: &RocmStream,
        desc: &RowCopyDesc<'_>,
        spans: &[RowSpan],
        host: &mut RocmHostBuffer,
        device: &mut RocmBuffer,
    ) -> Result<(), RocmError> {
        desc.check(spans, host.byte_len(), device.byte_len())?;
        let plan = plan::copy_rows(
            &self.target(),
            desc,
            spans,
            host.device_addr(),
            device.addr(),
        )?;
        self.execute(stream, plan)
    }

    fn copy_host_pages(
        &self,
        stream: &RocmStream,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &mut RocmHostBuffer,
    ) -> Result<(), RocmError> {
        check_host_page_copy(layers, pairs, host.byte_len())?;
        let jobs: Vec<(PageLayout, PageLayout)> = layers.iter().map(|l| (*l, *l)).collect();
        let h = host.device_addr();
        let plan = plan::copy_pages(&self.target(), &jobs, pairs, h, h, true)?;
        self.execute(stream, plan)
    }

    fn invalidate(
        &self,
        stream: &RocmStream,
        desc: &InvalidateDesc,
        args: InvalidateArgs<'_, RocmBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args)?;
        let plan = plan::invalidate(
            &self.target(),
            desc,
            args.ranges.addr(),
            args.slot_host_rows.addr(),
        );
        self.execute(stream, plan)
    }

    /// One `hs_indexer_backup` launch for every layer and token (the layer table kept in the
    /// device's list arena); rows whose parts are all 16-byte multiples move in 16-byte chunks,
    /// others (132-byte rows) in 4-byte words. No host synchronisation.
    fn indexer_backup(
        &self,
        stream: &RocmStream,
        desc: &IndexerBackupDesc<'_>,
        args: IndexerBackupArgs<'_, RocmBuffer, RocmHostBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args)?;
        let addrs = plan::IndexerBackupAddrs {
            device_slots: args.device_slots.addr(),
            host_slots: args.host_slots.addr(),
            device: args.device.addr(),
            host: args.host.device_addr(),
        };
        let plan = plan::indexer_backup(&self.target(), desc, &addrs)?;
        self.execute(stream, plan)
    }

    fn compressed_slot_mapping(
        &self,
        stream: &RocmStream,
        desc: &SlotMappingDesc,
        args: SlotMappingArgs<'_, RocmBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args)?;
        let addrs = plan::SlotMappingAddrs {
            positions: args.positions.addr(),
            slot_mapping: args.slot_mapping.addr(),
            table_row: args.table_row.addr(),
            block_table: args.block_table.addr(),
            out: args.out.addr(),
        };
        self.execute(stream, plan::slot_mapping(desc, &addrs))
    }
}

impl From<PlanError> for RocmError {
    fn from(e: PlanError) -> Self {
        RocmError::Unsupported(e.to_string())
    }
}

/// The device addresses of a resolve's buffers, for the planners.
fn resolve_addrs(args: &ResolveArgs<'_, RocmBuffer>) -> plan::ResolveAddrs {
    args.map(RocmBuffer::addr)
}

/// Device addresses of a remap's buffers (the plain remap's and the modes' alike).
fn remap_addrs(args: &RemapArgs<'_, RocmBuffer>) -> plan::RemapAddrs {
    plan::RemapAddrs {
        req_id: args.req_id.addr(),
        block_table: args.block_table.addr(),
        topk: args.topk.addr(),
        idx_mapping: args.idx_mapping.map_or(0, |b| b.addr()),
        out: args.out.addr(),
        counts: args.counts.as_ref().map_or(0, |b| b.addr()),
        stats: args.stats.as_ref().map_or(0, |b| b.addr()),
    }
}
