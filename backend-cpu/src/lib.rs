#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod aligned;
mod error;
mod gather;
mod lent;
mod remap;
mod resolve;

use hisparse_core::Device;
use hisparse_core::ops::copy::{self, bulk_copy};
use hisparse_core::ops::{
    BlockPair, BufferLen, CallStats, GatherArgs, GatherDesc, HotResetDesc, IndexerBackupArgs,
    IndexerBackupDesc, InvalidateArgs, InvalidateDesc, PageCopyDesc, PageLayout, RemapArgs,
    RemapDesc, RemapModesArgs, RemapModesDesc, ResolveArgs, ResolveDesc, RowCopyDesc, RowSpan,
    SlotMappingArgs, SlotMappingDesc, TableWrite, TableWriteDesc, invalidate, slot_mapping, table,
};
use hisparse_core::{MemoryInfo, OpError, OpName};

use aligned::AlignedBytes;
pub use error::CpuError;
pub use hisparse_host_memory::available_ram;
use hisparse_host_memory::{HostPoolConfig, HostRegion, NoPin};
use lent::LentBytes;

/// A block of host memory: the CPU backend's device buffer and its pinned host buffer alike.
/// Either a zeroed, page-aligned allocation of the backend's own ([`Device::alloc`],
/// [`Device::alloc_pinned`]), or memory an engine lends ([`CpuBuffer::from_raw_parts`]).
pub struct CpuBuffer {
    bytes: Storage,
}

/// Where a [`CpuBuffer`]'s bytes live.
enum Storage {
    /// Allocated, and freed on drop, by the backend.
    Owned(AlignedBytes),
    /// A host pool ([`Device::alloc_pinned`]): touched in parallel when allocated, unmapped on a
    /// thread of its own when dropped.
    Pool {
        bytes: LentBytes,
        region: HostRegion,
    },
    /// Lent by the engine; never freed here.
    Lent(LentBytes),
    /// A shared-memory segment other processes map too (a host pool shared by the ranks of a
    /// node); the buffer keeps the mapping alive.
    Shared {
        bytes: LentBytes,
        _segment: hisparse_host_memory::SharedSegment,
    },
}

impl CpuBuffer {
    /// A device buffer of `bytes` zeroed bytes.
    fn zeroed(bytes: usize) -> Result<Self, CpuError> {
        AlignedBytes::zeroed(bytes)
            .map(|bytes| CpuBuffer {
                bytes: Storage::Owned(bytes),
            })
            .ok_or(CpuError::Alloc {
                bytes,
                pinned: false,
            })
    }

    /// Uses `len` bytes of host memory at `ptr`, allocated by someone else (a numpy array's
    /// data, a tensor's storage), as a buffer of this backend — device or pinned alike. The
    /// buffer never frees the memory; dropping it only ends the loan.
    ///
    /// Refused with [`CpuError::Lent`] when the pointer is null, the length zero, the pointer
    /// not 16-byte aligned or the range runs past the end of the address space. A buffer used
    /// as a runtime's host pool must also be page-aligned
    /// ([`hisparse_core::ops::PINNED_ALIGNMENT`]); the runtime checks that.
    ///
    /// # Safety
    ///
    /// * **Lifetime:** `[ptr, ptr + len)` is one live allocation of initialised, readable and
    ///   writable memory that stays allocated for as long as the returned buffer lives.
    /// * **Exclusive use:** while the buffer lives, nothing else reads or writes the range —
    ///   no other thread, no other `CpuBuffer` over overlapping memory that is passed to the
    ///   same call, no Rust reference to it — except between this backend's calls on the same
    ///   thread (the CPU backend's work is complete when its call returns, so the engine may
    ///   read and write the memory between calls).
    pub unsafe fn from_raw_parts(ptr: *mut u8, len: usize) -> Result<Self, CpuError> {
        let start = lent::check_lent(ptr, len).map_err(|problem| CpuError::Lent {
            what: "host memory",
            problem,
        })?;
        // SAFETY: the range passed `check_lent`; the caller guarantees the rest of the contract.
        let bytes = unsafe { LentBytes::new(start, len) };
        Ok(CpuBuffer {
            bytes: Storage::Lent(bytes),
        })
    }

    /// A buffer over a shared-memory segment (a host pool that the tensor-parallel ranks of a
    /// node map together); the buffer owns the mapping.
    ///
    /// Other processes write the same memory. What keeps that sound is the host pool's
    /// protocol, as for a pinned buffer a GPU writes while the host runs: one process writes a
    /// page's bytes, and another reads them only after the writer's completion was reported to
    /// it (through a pipe or socket, a synchronisation point). Every slice this buffer hands out
    /// is borrowed for one backend call or one engine read, never across such a point.
    pub fn from_shared(segment: hisparse_host_memory::SharedSegment) -> Result<Self, CpuError> {
        let bytes = lent::of_segment(&segment).map_err(|problem| CpuError::Lent {
            what: "shared host memory",
            problem,
        })?;
        Ok(CpuBuffer {
            bytes: Storage::Shared {
                bytes,
                _segment: segment,
            },
        })
    }

    /// A host pool of `bytes` zeroed bytes, set up as `cfg` says.
    fn pool(bytes: usize, cfg: &HostPoolConfig) -> Result<Self, CpuError> {
        let region = HostRegion::allocate(bytes, cfg, None, NoPin)
            .map_err(|e| CpuError::host_pool(bytes, e.into()))?;
        Ok(CpuBuffer {
            bytes: Storage::Pool {
                bytes: lent::of_region(&region),
                region,
            },
        })
    }

    /// How the memory was set up (threads, NUMA node, pages), for a host pool
    /// ([`Device::alloc_pinned`]); `None` for device buffers, lent memory and shared segments.
    pub fn setup(&self) -> Option<&hisparse_host_memory::Setup> {
        match &self.bytes {
            Storage::Pool { region, .. } => Some(region.setup()),
            _ => None,
        }
    }

    /// Whether the memory is lent by someone else ([`CpuBuffer::from_raw_parts`]).
    pub fn is_lent(&self) -> bool {
        matches!(self.bytes, Storage::Lent(_))
    }

    /// Whether the memory is a shared-memory segment ([`CpuBuffer::from_shared`]).
    pub fn is_shared(&self) -> bool {
        matches!(self.bytes, Storage::Shared { .. })
    }

    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.bytes {
            Storage::Owned(b) => b.as_slice(),
            Storage::Lent(b)
            | Storage::Shared { bytes: b, .. }
            | Storage::Pool { bytes: b, .. } => b.as_slice(),
        }
    }

    /// The buffer's bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.bytes {
            Storage::Owned(b) => b.as_mut_slice(),
            Storage::Lent(b)
            | Storage::Shared { bytes: b, .. }
            | Storage::Pool { bytes: b, .. } => b.as_mut_slice(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address of the first byte (page-aligned for the backend's own buffers, 16-byte aligned
    /// at least for lent ones).
    pub fn address(&self) -> usize {
        match &self.bytes {
            Storage::Owned(b) => b.address(),
            Storage::Lent(b)
            | Storage::Shared { bytes: b, .. }
            | Storage::Pool { bytes: b, .. } => b.address(),
        }
    }

    /// The whole 4-byte elements of the buffer as `i32`s (buffers are at least 16-byte aligned,
    /// so the cast always succeeds).
    fn i32s(&self) -> &[i32] {
        let b = self.as_slice();
        bytemuck::cast_slice(&b[..b.len() & !3])
    }

    fn i32s_mut(&mut self) -> &mut [i32] {
        let b = self.as_mut_slice();
        let n = b.len() & !3;
        bytemuck::cast_slice_mut(&mut b[..n])
    }

    fn u16s_mut(&mut self) -> &mut [u16] {
        let b = self.as_mut_slice();
        let n = b.len() & !1;
        bytemuck::cast_slice_mut(&mut b[..n])
    }
}

impl core::fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("len", &self.len())
            .field("lent", &self.is_lent())
            .field("address", &format_args!("{:#x}", self.address()))
            .finish()
    }
}

impl BufferLen for CpuBuffer {
    fn byte_len(&self) -> u64 {
        self.len() as u64
    }
}

/// An in-order queue of work. CPU work runs eagerly on the calling thread, so a stream carries
/// no state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuStream;

/// A point in a stream. CPU work is complete when the call returns, so every event has already
/// happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuEvent;

/// The CPU backend: HiSparse data-plane operations over host memory.
#[derive(Debug, Clone)]
pub struct CpuDevice {
    name: String,
    host_pool: HostPoolConfig,
}

impl Default for CpuDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuDevice {
    /// The host CPU as a device. Always available.
    pub fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
        CpuDevice {
            name: format!("{model} ({threads} threads, host memory)"),
            host_pool: HostPoolConfig::default(),
        }
    }

    /// The same device, setting up host pools ([`Device::alloc_pinned`]) as `cfg` says (page
    /// size, threads, NUMA node; the default spreads the pages over every CPU this process may
    /// use, since this device has no PCI root to be near).
    pub fn with_host_pool_config(mut self, cfg: HostPoolConfig) -> Self {
        self.host_pool = cfg;
        self
    }

    /// How host pools are set up.
    pub fn host_pool_config(&self) -> &HostPoolConfig {
        &self.host_pool
    }

    /// Same as [`CpuDevice::new`], in the `open` shape of the GPU backends (never fails).
    pub fn open() -> Result<Self, CpuError> {
        Ok(Self::new())
    }
}

/// Checks a synchronous host copy of `len` bytes at `offset` of a buffer of `buffer_len` bytes.
fn check_range(
    buffer: &'static str,
    buffer_len: usize,
    offset: usize,
    len: usize,
) -> Result<(), CpuError> {
    let needed = offset.checked_add(len).ok_or(OpError::Overflow {
        op: OpName::Buffer,
        field: buffer,
    })?;
    if needed > buffer_len {
        return Err(OpError::BufferTooSmall {
            op: OpName::Buffer,
            buffer,
            needed: needed as u64,
            actual: buffer_len as u64,
        }
        .into());
    }
    Ok(())
}

fn bulk(
    src: &CpuBuffer,
    src_offset: usize,
    dst: &mut CpuBuffer,
    dst_offset: usize,
    bytes: usize,
) -> Result<(), CpuError> {
    bulk_copy(
        src.as_slice(),
        src_offset,
        dst.as_mut_slice(),
        dst_offset,
        bytes,
    )?;
    Ok(())
}

impl Device for CpuDevice {
    type Error = CpuError;
    type Buffer = CpuBuffer;
    type HostBuffer = CpuBuffer;
    type Stream = CpuStream;
    type Event = CpuEvent;

    fn backend(&self) -> &'static str {
        "cpu"
    }

    fn device_name(&self) -> &str {
        &self.name
    }

    fn alloc(&self, bytes: usize) -> Result<CpuBuffer, CpuError> {
        // "Device" memory is host RAM here: refuse what RAM cannot hold before the allocator
        // commits (and zero-fills) it, instead of driving the machine into swap.
        if let Some(available) = available_ram()
            && bytes as u64 > available
        {
            return Err(CpuError::RamExhausted { bytes, available });
        }
        CpuBuffer::zeroed(bytes)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<CpuBuffer, CpuError> {
        // The region checks the host's limits (available RAM) before it reserves anything.
        CpuBuffer::pool(bytes, &self.host_pool)
    }

    fn pinned_address(&self, buf: &CpuBuffer) -> usize {
        buf.address()
    }

    fn upload(&self, dst: &mut CpuBuffer, offset: usize, src: &[u8]) -> Result<(), CpuError> {
        check_range("dst", dst.len(), offset, src.len())?;
        dst.as_mut_slice()[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: &CpuBuffer, offset: usize, dst: &mut [u8]) -> Result<(), CpuError> {
        check_range("src", src.len(), offset, dst.len())?;
        dst.copy_from_slice(&src.as_slice()[offset..offset + dst.len()]);
        Ok(())
    }

    fn write_pinned(&self, dst: &mut CpuBuffer, offset: usize, src: &[u8]) -> Result<(), CpuError> {
        self.upload(dst, offset, src)
    }

    fn read_pinned(&self, src: &CpuBuffer, offset: usize, dst: &mut [u8]) -> Result<(), CpuError> {
        self.download(src, offset, dst)
    }

    fn create_stream(&self) -> Result<CpuStream, CpuError> {
        Ok(CpuStream)
    }

    fn record_event(&self, _stream: &CpuStream) -> Result<CpuEvent, CpuError> {
        Ok(CpuEvent)
    }

    fn wait_event(&self, _stream: &CpuStream, _event: &CpuEvent) -> Result<(), CpuError> {
        Ok(())
    }

    fn synchronize(&self, _stream: &CpuStream) -> Result<(), CpuError> {
        Ok(())
    }

    fn query_event(&self, _event: &CpuEvent) -> Result<bool, CpuError> {
        // Work runs eagerly: whatever an event captured has completed.
        Ok(true)
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        let available = available_ram()?;
        Some(MemoryInfo {
            device_free: available,
            host_available: available,
            unified: true,
        })
    }

    fn copy_within_device(
        &self,
        _stream: &CpuStream,
        buf: &mut CpuBuffer,
        src_offset: usize,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), CpuError> {
        copy::copy_within(buf.as_mut_slice(), src_offset, dst_offset, bytes)?;
        Ok(())
    }

    fn write_table(
        &self,
        _stream: &CpuStream,
        desc: &TableWriteDesc,
        writes: &[TableWrite],
        table: &mut CpuBuffer,
    ) -> Result<(), CpuError> {
        desc.check(writes, &*table)?;
        table::write_table(desc, writes, table.i32s_mut())?;
        Ok(())
    }

    fn reset_hot_state(
        &self,
        _stream: &CpuStream,
        desc: &HotResetDesc,
        rows: &[u32],
        slot_host_rows: &mut CpuBuffer,
        lru: &mut CpuBuffer,
    ) -> Result<(), CpuError> {
        desc.check(rows, &*slot_host_rows, &*lru)?;
        table::reset_hot_state(desc, rows, slot_host_rows.i32s_mut(), lru.u16s_mut())?;
        Ok(())
    }

    // Accepted twins (CONTRIBUTING.md, "One rule, one place"): the three bulk copies share the
    // Device trait's signature shape; each moves bytes in its own direction.
    fn copy_to_device(
        &self,
        _stream: &CpuStream,
        src: &CpuBuffer,
        src_offset: usize,
        dst: &mut CpuBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), CpuError> {
        bulk(src, src_offset, dst, dst_offset, bytes)
    }

    fn copy_to_host(
        &self,
        _stream: &CpuStream,
        src: &CpuBuffer,
        src_offset: usize,
        dst: &mut CpuBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), CpuError> {
        bulk(src, src_offset, dst, dst_offset, bytes)
    }

    fn copy_on_device(
        &self,
        _stream: &CpuStream,
        src: &CpuBuffer,
        src_offset: usize,
        dst: &mut CpuBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), CpuError> {
        bulk(src, src_offset, dst, dst_offset, bytes)
    }

    fn remap(
        &self,
        _stream: &CpuStream,
        desc: &RemapDesc,
        args: RemapArgs<'_, CpuBuffer>,
    ) -> Result<(), CpuError> {
        desc.check(&args)?;
        let valid = remap::remap(
            desc,
            args.req_id.i32s(),
            args.block_table.i32s(),
            args.topk.i32s(),
            args.idx_mapping.map(CpuBuffer::i32s),
            args.out.i32s_mut(),
            args.counts.map(CpuBuffer::i32s_mut),
        );
        if let Some(stats) = args.stats {
            CallStats::of_remap(valid).add_to(stats.i32s_mut(), desc.stats_slot);
        }
        Ok(())
    }

    fn resolve(
        &self,
        _stream: &CpuStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, CpuBuffer>,
    ) -> Result<(), CpuError> {
        desc.check(&args.sizes())?;
        resolve::resolve(
            desc,
            resolve::Slices {
                req_id: args.req_id.i32s(),
                topk: args.topk.i32s(),
                resident_table: args.resident_table.i32s(),
                host_table: args.host_table.i32s(),
                hot_table: args.hot_table.i32s(),
                slot_host_rows: args.slot_host_rows.i32s_mut(),
                lru: args.lru.u16s_mut(),
                indices: args.indices.i32s_mut(),
                valid_counts: args.valid_counts.i32s_mut(),
                hit_counts: args.hit_counts.i32s_mut(),
                miss_counts: args.miss_counts.i32s_mut(),
                miss_src: args.miss_src.i32s_mut(),
                miss_dst: args.miss_dst.i32s_mut(),
                idx_mapping: args.idx_mapping.map(CpuBuffer::i32s),
                stats: None,
            },
        );
        if let Some(stats) = args.stats {
            let t = desc.num_tokens as usize;
            CallStats::of_resolve(
                &args.hit_counts.i32s()[..t],
                &args.miss_counts.i32s()[..t],
                &args.valid_counts.i32s()[..t],
            )
            .add_to(stats.i32s_mut(), desc.stats_slot);
        }
        Ok(())
    }

    fn gather_rows(
        &self,
        _stream: &CpuStream,
        desc: &GatherDesc<'_>,
        args: GatherArgs<'_, CpuBuffer, CpuBuffer>,
    ) -> Result<(), CpuError> {
        desc.check(&args)?;
        gather::gather_rows(
            desc,
            args.plan_src.i32s(),
            args.plan_dst.i32s(),
            args.plan_counts.i32s(),
            args.host.as_slice(),
            args.device.as_mut_slice(),
        );
        Ok(())
    }

    fn copy_pages(
        &self,
        _stream: &CpuStream,
        desc: &PageCopyDesc<'_>,
        pairs: &[BlockPair],
        host: &mut CpuBuffer,
        device: &mut CpuBuffer,
    ) -> Result<(), CpuError> {
        copy::copy_pages(desc, pairs, host.as_mut_slice(), device.as_mut_slice())?;
        Ok(())
    }

    fn copy_rows(
        &self,
        _stream: &CpuStream,
        desc: &RowCopyDesc<'_>,
        spans: &[RowSpan],
        host: &mut CpuBuffer,
        device: &mut CpuBuffer,
    ) -> Result<(), CpuError> {
        copy::copy_rows(desc, spans, host.as_mut_slice(), device.as_mut_slice())?;
        Ok(())
    }

    fn copy_host_pages(
        &self,
        _stream: &CpuStream,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &mut CpuBuffer,
    ) -> Result<(), CpuError> {
        copy::copy_host_pages(layers, pairs, host.as_mut_slice())?;
        Ok(())
    }

    fn invalidate(
        &self,
        _stream: &CpuStream,
        desc: &InvalidateDesc,
        args: InvalidateArgs<'_, CpuBuffer>,
    ) -> Result<(), CpuError> {
        desc.check(&args)?;
        invalidate::invalidate(
            desc,
            InvalidateArgs {
                ranges: args.ranges.i32s(),
                slot_host_rows: args.slot_host_rows.i32s_mut(),
            },
        )?;
        Ok(())
    }

    fn remap_modes(
        &self,
        stream: &CpuStream,
        desc: &RemapModesDesc,
        args: RemapModesArgs<'_, CpuBuffer>,
    ) -> Result<(), CpuError> {
        desc.check(&args)?;
        if !desc.has_modes() {
            return self.remap(stream, &desc.remap, args.remap);
        }
        // The modes run the reference: they serve prefill rows and context-parallel decode,
        // not the single-rank decode path the tuned remap serves.
        let a = args.remap;
        hisparse_core::ops::remap::remap_modes(
            desc,
            RemapModesArgs {
                remap: RemapArgs {
                    req_id: a.req_id.i32s(),
                    block_table: a.block_table.i32s(),
                    topk: a.topk.i32s(),
                    idx_mapping: a.idx_mapping.map(CpuBuffer::i32s),
                    out: a.out.i32s_mut(),
                    counts: a.counts.map(CpuBuffer::i32s_mut),
                    stats: a.stats.map(CpuBuffer::i32s_mut),
                },
                prefill_req_id: args.prefill_req_id.map(CpuBuffer::i32s),
                workspace_starts: args.workspace_starts.map(CpuBuffer::i32s),
            },
        )?;
        Ok(())
    }

    fn indexer_backup(
        &self,
        _stream: &CpuStream,
        desc: &IndexerBackupDesc<'_>,
        args: IndexerBackupArgs<'_, CpuBuffer, CpuBuffer>,
    ) -> Result<(), CpuError> {
        desc.check(&args)?;
        hisparse_core::ops::indexer_backup::indexer_backup(
            desc,
            IndexerBackupArgs {
                device_slots: args.device_slots.i32s(),
                host_slots: args.host_slots.i32s(),
                device: args.device.as_slice(),
                host: args.host.as_mut_slice(),
            },
        )?;
        Ok(())
    }

    fn compressed_slot_mapping(
        &self,
        _stream: &CpuStream,
        desc: &SlotMappingDesc,
        args: SlotMappingArgs<'_, CpuBuffer>,
    ) -> Result<(), CpuError> {
        desc.check(&args)?;
        slot_mapping::compressed_slot_mapping(
            desc,
            SlotMappingArgs {
                positions: args.positions.i32s(),
                slot_mapping: args.slot_mapping.i32s(),
                table_row: args.table_row.i32s(),
                block_table: args.block_table.i32s(),
                out: args.out.i32s_mut(),
            },
        )?;
        Ok(())
    }
}
