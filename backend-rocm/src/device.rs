//! [`RocmDevice`]: the [`Device`] implementation on the HIP runtime.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

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
use hisparse_gpu_kernels::{self as gk, GatherLayers, Kernel, LayerPairAbi, PageJob, Pair, Span};

use crate::context::Context;
use crate::error::RocmError;
use crate::ffi::{self, HOST_MALLOC_MAPPED, HOST_MALLOC_PORTABLE, Handle, MemcpyKind};
use crate::kernels::{self, KernelSource};
use crate::launch::{self, Args};
use crate::memory::{Pinning, RocmBuffer, RocmEvent, RocmHostBuffer, RocmStream, available_ram};

/// A HIP device with the HiSparse kernels loaded.
///
/// Opening loads `libamdhip64` at run time (see the crate docs for the search path), picks the
/// embedded code object for the device's processor, or compiles the kernels with hiprtc when none
/// fits, and loads them. Every operation of [`Device`] is enqueued on a caller's stream.
#[derive(Debug)]
pub struct RocmDevice {
    pub(crate) ctx: Arc<Context>,
    display: String,
}

/// Grid of a grid-stride kernel: enough blocks for `work` items of `per_block`, at most a few
/// per compute unit.
fn stride_grid(work: u64, per_block: u64, multiprocessors: u32) -> u32 {
    let cap = u64::from(multiprocessors.max(1)) * 4;
    work.div_ceil(per_block).clamp(1, cap) as u32
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
        Ok(RocmDevice {
            ctx: Arc::new(ctx),
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
    /// (15,840 with the 64 KiB of current AMD GPUs); larger `hot_slots` resolve with the state in
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

    fn launch(
        &self,
        stream: Handle,
        kernel: Kernel,
        grid: [u32; 3],
        shared_bytes: u32,
        mut args: Args,
    ) -> Result<(), RocmError> {
        let abi = kernel.abi();
        args.matches(&abi)
            .map_err(|message| RocmError::Module { message })?;
        let mut params = args.pointers();
        // SAFETY: `params` points into `args`, which outlives the call and holds one value per
        // parameter with exactly the type the ABI table declares (checked just above); HIP copies
        // the values at launch. Every device address among them belongs to a buffer the caller
        // keeps alive until the work completes (the `Device` contract).
        let status = unsafe {
            self.ctx.hip.launch(
                self.ctx.function(kernels::index(kernel)),
                grid,
                [abi.block_threads, 1, 1],
                shared_bytes,
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

    /// Launches `hs_copy_pages` over `jobs × pairs`, or tile by tile in reference order when
    /// destination ranges overlap each other or (`same_buffer`) any source range.
    fn page_copies(
        &self,
        stream: &RocmStream,
        jobs: &[PageJob],
        pairs: &[BlockPair],
        same_buffer: bool,
        src: u64,
        dst: u64,
    ) -> Result<(), RocmError> {
        if jobs.is_empty() || pairs.is_empty() {
            return Ok(());
        }
        let mut dsts = Vec::with_capacity(jobs.len() * pairs.len());
        let mut srcs = Vec::new();
        for j in jobs {
            for p in pairs {
                dsts.push((j.dst_base + u64::from(p.dst) * j.dst_stride, j.page_bytes));
                if same_buffer {
                    srcs.push((j.src_base + u64::from(p.src) * j.src_stride, j.page_bytes));
                }
            }
        }
        let together = !launch::overlaps_within(&dsts) && !launch::overlaps_between(&dsts, &srcs);
        let mut bytes = Vec::with_capacity(jobs.len() * 40 + pairs.len() * 8 + 16);
        for j in jobs {
            launch::page_job_bytes(j, &mut bytes);
        }
        launch::pad16(&mut bytes);
        let pairs_at = bytes.len() as u64;
        for p in pairs {
            launch::pair_bytes(
                &Pair {
                    src: p.src,
                    dst: p.dst,
                },
                &mut bytes,
            );
        }
        let mps = self.ctx.multiprocessors;
        self.ctx.bind()?;
        self.ctx.with_staging(stream.raw, &bytes, |list| {
            let one = |job: usize, pair: usize, nj: usize, np: usize| {
                let mut a = Args::default();
                a.ptr(list + 40 * job as u64)
                    .u32(nj as u32)
                    .ptr(list + pairs_at + 8 * pair as u64)
                    .u32(np as u32)
                    .ptr(src)
                    .ptr(dst);
                let grid = stride_grid((nj * np) as u64, 1, mps);
                self.launch(stream.raw, Kernel::CopyPages, [grid, 1, 1], 0, a)
            };
            if together {
                return one(0, 0, jobs.len(), pairs.len());
            }
            for j in 0..jobs.len() {
                for p in 0..pairs.len() {
                    one(j, p, 1, 1)?;
                }
            }
            Ok(())
        })
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
        check_pinned_budget(bytes as u64, available_ram().unwrap_or(u64::MAX))?;
        self.ctx.bind()?;
        let host = self
            .ctx
            .hip
            .host_malloc(bytes, HOST_MALLOC_MAPPED | HOST_MALLOC_PORTABLE)
            .map_err(|s| RocmError::hip(&self.ctx.hip, "hipHostMalloc", s))?;
        let mut buf = RocmHostBuffer {
            host: host.cast(),
            device: std::ptr::null_mut(),
            len: bytes,
            ctx: self.ctx.clone(),
            pinning: Pinning::Allocated,
        };
        if !(host as usize).is_multiple_of(hisparse_core::ops::PINNED_ALIGNMENT) {
            return Err(RocmError::Unsupported(format!(
                "hipHostMalloc returned {host:p}, not aligned to {} bytes",
                hisparse_core::ops::PINNED_ALIGNMENT
            )));
        }
        buf.device = self
            .ctx
            .hip
            .host_device_pointer(host)
            .map_err(|s| RocmError::hip(&self.ctx.hip, "hipHostGetDevicePointer", s))?;
        // SAFETY: `host` is a fresh pinned allocation of `bytes` bytes that no work uses yet.
        unsafe { std::ptr::write_bytes(buf.host, 0, bytes) };
        Ok(buf)
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
        Ok(RocmStream {
            raw,
            ctx: self.ctx.clone(),
            scratch: Mutex::new(None),
            owned: true,
        })
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
        if writes.is_empty() {
            return Ok(());
        }
        let n = u32::try_from(writes.len()).map_err(|_| {
            RocmError::Unsupported(format!(
                "{} table writes in one call exceed the kernel's u32 count",
                writes.len()
            ))
        })?;
        let list: Vec<gk::TableWriteAbi> = writes.iter().map(gk::TableWriteAbi::from).collect();
        let grid = stride_grid(
            u64::from(n),
            u64::from(gk::TABLE_THREADS),
            self.ctx.multiprocessors,
        );
        self.ctx.bind()?;
        self.ctx
            .with_staging(stream.raw, bytemuck::cast_slice(&list), |staged| {
                let mut a = Args::default();
                a.ptr(staged).u32(n).ptr(table.addr()).u32(desc.table_len);
                self.launch(stream.raw, Kernel::WriteTable, [grid, 1, 1], 0, a)
            })
    }

    fn reset_hot_state(
        &self,
        stream: &RocmStream,
        desc: &HotResetDesc,
        rows: &[u32],
        dgi: &mut RocmBuffer,
        lru: &mut RocmBuffer,
    ) -> Result<(), RocmError> {
        desc.check(rows, dgi, lru)?;
        if rows.is_empty() {
            return Ok(());
        }
        let n = u32::try_from(rows.len()).map_err(|_| {
            RocmError::Unsupported(format!(
                "{} hot-state rows in one call exceed the kernel's u32 count",
                rows.len()
            ))
        })?;
        let work = u64::from(n) * u64::from(desc.hot_slots);
        let grid = stride_grid(work, u64::from(gk::TABLE_THREADS), self.ctx.multiprocessors);
        self.ctx.bind()?;
        self.ctx
            .with_staging(stream.raw, bytemuck::cast_slice(rows), |staged| {
                let mut a = Args::default();
                a.ptr(staged)
                    .u32(n)
                    .ptr(dgi.addr())
                    .ptr(lru.addr())
                    .u32(desc.num_requests)
                    .u32(desc.hot_slots);
                self.launch(stream.raw, Kernel::ResetHotState, [grid, 1, 1], 0, a)
            })
    }

    fn synchronize(&self, stream: &RocmStream) -> Result<(), RocmError> {
        self.ctx.bind()?;
        self.ctx.check(
            "hipStreamSynchronize",
            self.ctx.hip.stream_synchronize(stream.raw),
        )
    }

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
        self.memcpy_async(
            stream,
            dst.at(dst_offset),
            src.host_at(src_offset),
            bytes,
            MemcpyKind::HostToDevice,
        )
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
        self.memcpy_async(
            stream,
            dst.host_at(dst_offset),
            src.at(src_offset),
            bytes,
            MemcpyKind::DeviceToHost,
        )
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
        if desc.num_tokens == 0 {
            return Ok(());
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
        let mut a = Args::default();
        a.ptr(args.req_id.addr())
            .ptr(args.block_table.addr())
            .ptr(args.topk.addr())
            .ptr(args.idx_mapping.map_or(0, |b| b.addr()))
            .ptr(args.out.addr())
            .ptr(args.counts.as_ref().map_or(0, |b| b.addr()))
            .u32(desc.num_tokens)
            .u32(desc.top_k)
            .u32(desc.table_rows)
            .u32(desc.max_blocks)
            .u32(desc.block_size)
            .u32(desc.block_stride_rows)
            .u32(desc.idx_mapping_len.unwrap_or(0))
            .u32(flags);
        self.ctx.bind()?;
        self.launch(stream.raw, Kernel::Remap, [desc.num_tokens, 1, 1], 0, a)
    }

    fn resolve(
        &self,
        stream: &RocmStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, RocmBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args.sizes())?;
        if desc.num_tokens == 0 {
            return Ok(());
        }
        // The LRU copy, the partition and the bitmap stay in shared memory when they fit it
        // (shared mode); otherwise every resolving block takes them from the workspace
        // (global-state mode) and shared memory holds only the wanted-row table. Either way the
        // largest power-of-two table that fits the rest of shared memory is shared; bigger tables
        // go to the workspace too.
        let limit = self.resolve_shared_limit();
        let global = gk::resolve_shared_bytes(desc.hot_slots, 0) > limit;
        let shared_bytes = |table: u64| {
            if global {
                gk::resolve_global_shared_bytes(table as u32)
            } else {
                gk::resolve_shared_bytes(desc.hot_slots, table as u32)
            }
        };
        // Largest power of two (at least 16) whose table fits, else 0 (every table in the workspace).
        let mut smem_table = 0u64;
        while smem_table < u64::from(u32::MAX / 4) {
            let next = if smem_table == 0 { 16 } else { smem_table * 2 };
            if shared_bytes(next) > limit {
                break;
            }
            smem_table = next;
        }
        let shared = shared_bytes(smem_table);
        let biggest = gk::resolve_table_entries(u64::from(desc.num_tokens) * u64::from(desc.top_k));
        let tables_in_workspace = biggest > smem_table;
        let entries = if global {
            gk::resolve_global_workspace_entries(
                desc.num_tokens,
                desc.top_k,
                desc.num_requests,
                desc.hot_slots,
                tables_in_workspace,
            )
        } else if tables_in_workspace {
            gk::resolve_workspace_entries(desc.num_tokens, desc.top_k)
        } else {
            0
        };
        let (workspace, counter, entries) = if entries == 0 {
            (0, 0, 0)
        } else {
            let entries32 = u32::try_from(entries).map_err(|_| {
                RocmError::Op(hisparse_core::OpError::Overflow {
                    op: hisparse_core::OpName::Resolve,
                    field: "workspace",
                })
            })?;
            let bytes = usize::try_from(entries)
                .ok()
                .and_then(|e| e.checked_mul(16))
                .and_then(|b| b.checked_add(16))
                .ok_or(RocmError::Op(hisparse_core::OpError::Overflow {
                    op: hisparse_core::OpName::Resolve,
                    field: "workspace",
                }))?;
            let (ws, counter) = stream.scratch(bytes)?;
            // SAFETY: the counter is the first 4 bytes of the stream's scratch allocation, which
            // lives as long as the stream; the memset is ordered before the launch on `stream`.
            let s = unsafe {
                self.ctx
                    .hip
                    .memset_async(counter as *mut c_void, 0, 4, stream.raw)
            };
            self.ctx.check("hipMemsetAsync", s)?;
            (ws, counter, entries32)
        };
        let table_arg = if global {
            smem_table as u32 | gk::RESOLVE_GLOBAL_STATE
        } else {
            smem_table as u32
        };
        let mut a = Args::default();
        a.ptr(args.req_id.addr())
            .ptr(args.topk.addr())
            .ptr(args.resident_table.addr())
            .ptr(args.host_table.addr())
            .ptr(args.hot_table.addr())
            .ptr(args.dgi.addr())
            .ptr(args.lru.addr())
            .ptr(args.indices.addr())
            .ptr(args.valid_counts.addr())
            .ptr(args.hit_counts.addr())
            .ptr(args.miss_counts.addr())
            .ptr(args.miss_src.addr())
            .ptr(args.miss_dst.addr())
            .ptr(workspace)
            .ptr(counter)
            .u32(entries)
            .u32(table_arg)
            .u32(desc.num_tokens)
            .u32(desc.top_k)
            .u32(desc.num_requests)
            .u32(desc.max_pages)
            .u32(desc.block_size)
            .u32(desc.hot_slots)
            .u32(desc.attention_block_stride)
            .u32(desc.host_num_blocks);
        self.ctx.bind()?;
        self.launch(
            stream.raw,
            Kernel::Resolve,
            [desc.num_tokens, 1, 1],
            shared as u32,
            a,
        )
    }

    fn gather_rows(
        &self,
        stream: &RocmStream,
        desc: &GatherDesc<'_>,
        args: GatherArgs<'_, RocmBuffer, RocmHostBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args)?;
        if desc.num_tokens == 0 {
            return Ok(());
        }
        if desc.num_tokens > 65_535 {
            return Err(RocmError::Unsupported(format!(
                "gather of {} token rows exceeds the grid's y dimension (65535)",
                desc.num_tokens
            )));
        }
        self.ctx.bind()?;
        let gx = desc.top_k.div_ceil(gk::GATHER_ROWS);
        for chunk in desc.layers.chunks(gk::GATHER_MAX_LAYERS) {
            let layers = GatherLayers::new(chunk);
            let mut a = Args::default();
            a.ptr(args.plan_src.addr())
                .ptr(args.plan_dst.addr())
                .ptr(args.plan_counts.addr())
                .ptr(args.host.device_addr())
                .ptr(args.device.addr())
                .u32(desc.num_tokens)
                .u32(desc.top_k)
                .gather_layers(&layers);
            self.launch(
                stream.raw,
                Kernel::GatherRows,
                [gx, desc.num_tokens, chunk.len() as u32],
                0,
                a,
            )?;
        }
        Ok(())
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
        let jobs: Vec<PageJob> = desc
            .layers
            .iter()
            .map(|l| {
                let (s, d) = match desc.direction {
                    Direction::DeviceToHost => (&l.device, &l.host),
                    Direction::HostToDevice => (&l.host, &l.device),
                };
                PageJob {
                    src_base: s.base,
                    src_stride: s.block_stride,
                    dst_base: d.base,
                    dst_stride: d.block_stride,
                    page_bytes: l.host.page_bytes(),
                }
            })
            .collect();
        let (src, dst) = match desc.direction {
            Direction::DeviceToHost => (device.addr(), host.device_addr()),
            Direction::HostToDevice => (host.device_addr(), device.addr()),
        };
        self.page_copies(stream, &jobs, pairs, false, src, dst)
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
        if spans.is_empty() {
            return Ok(());
        }
        let direction = match desc.direction {
            Direction::DeviceToHost => gk::DIRECTION_DEVICE_TO_HOST,
            Direction::HostToDevice => gk::DIRECTION_HOST_TO_DEVICE,
        };
        // Destination byte ranges of every (layer, span) tile: the value part and the scale part.
        let mut dsts = Vec::with_capacity(desc.layers.len() * spans.len() * 2);
        for l in desc.layers {
            let d = match desc.direction {
                Direction::DeviceToHost => &l.host,
                Direction::HostToDevice => &l.device,
            };
            for s in spans.iter().filter(|s| s.num_rows > 0) {
                let block = match desc.direction {
                    Direction::DeviceToHost => s.host_block,
                    Direction::HostToDevice => s.device_block,
                };
                let [(v, vl), (sc, sl)] = d.row_parts(block, s.first_row);
                let n = u64::from(s.num_rows);
                dsts.push((v, vl * n));
                dsts.push((sc, sl * n));
            }
        }
        let together = !launch::overlaps_within(&dsts);
        let mut bytes = Vec::with_capacity(desc.layers.len() * 80 + spans.len() * 16);
        for l in desc.layers {
            launch::layer_pair_bytes(&LayerPairAbi::from(l), &mut bytes);
        }
        let spans_at = bytes.len() as u64;
        for s in spans {
            launch::span_bytes(
                &Span {
                    device_block: s.device_block,
                    host_block: s.host_block,
                    first_row: s.first_row,
                    num_rows: s.num_rows,
                },
                &mut bytes,
            );
        }
        let (h, d) = (host.device_addr(), device.addr());
        let mps = self.ctx.multiprocessors;
        self.ctx.bind()?;
        self.ctx.with_staging(stream.raw, &bytes, |list| {
            let one = |layer: usize, span: usize, nl: usize, ns: usize| {
                let mut a = Args::default();
                a.ptr(list + 80 * layer as u64)
                    .u32(nl as u32)
                    .ptr(list + spans_at + 16 * span as u64)
                    .u32(ns as u32)
                    .u32(direction)
                    .ptr(h)
                    .ptr(d);
                let grid = stride_grid((nl * ns) as u64, 1, mps);
                self.launch(stream.raw, Kernel::CopyRows, [grid, 1, 1], 0, a)
            };
            if together {
                return one(0, 0, desc.layers.len(), spans.len());
            }
            for l in 0..desc.layers.len() {
                for s in 0..spans.len() {
                    one(l, s, 1, 1)?;
                }
            }
            Ok(())
        })
    }

    fn copy_host_pages(
        &self,
        stream: &RocmStream,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &mut RocmHostBuffer,
    ) -> Result<(), RocmError> {
        check_host_page_copy(layers, pairs, host.byte_len())?;
        let jobs: Vec<PageJob> = layers
            .iter()
            .map(|l| PageJob {
                src_base: l.base,
                src_stride: l.block_stride,
                dst_base: l.base,
                dst_stride: l.block_stride,
                page_bytes: l.page_bytes(),
            })
            .collect();
        let h = host.device_addr();
        self.page_copies(stream, &jobs, pairs, true, h, h)
    }

    fn invalidate(
        &self,
        stream: &RocmStream,
        desc: &InvalidateDesc,
        args: InvalidateArgs<'_, RocmBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args)?;
        if desc.num_ranges == 0 {
            return Ok(());
        }
        let total = u64::from(desc.num_requests) * u64::from(desc.hot_slots);
        let mut a = Args::default();
        a.ptr(args.ranges.addr())
            .u32(desc.num_ranges)
            .ptr(args.dgi.addr())
            .u64(total);
        let grid = stride_grid(
            total,
            u64::from(gk::INVALIDATE_THREADS),
            self.ctx.multiprocessors,
        );
        self.ctx.bind()?;
        self.launch(stream.raw, Kernel::Invalidate, [grid, 1, 1], 0, a)
    }

    fn compressed_slot_mapping(
        &self,
        stream: &RocmStream,
        desc: &SlotMappingDesc,
        args: SlotMappingArgs<'_, RocmBuffer>,
    ) -> Result<(), RocmError> {
        desc.check(&args)?;
        if desc.num_tokens == 0 {
            return Ok(());
        }
        let mut a = Args::default();
        a.ptr(args.positions.addr())
            .ptr(args.slot_mapping.addr())
            .ptr(args.table_row.addr())
            .ptr(args.block_table.addr())
            .ptr(args.out.addr())
            .u32(desc.num_tokens)
            .u32(desc.ratio)
            .u32(desc.block_size)
            .u32(desc.table_rows)
            .u32(desc.max_blocks);
        self.ctx.bind()?;
        self.launch(
            stream.raw,
            Kernel::CompressedSlotMapping,
            [desc.num_tokens.div_ceil(gk::SLOT_THREADS), 1, 1],
            0,
            a,
        )
    }
}
