//! HiSparse Vulkan backend: every data-plane operation of [`hisparse_core::Device`] as Vulkan
//! compute shaders (or `vkCmdCopyBuffer` for page, row and bulk copies), for GPUs of any vendor.
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
//!   read it directly. Pools larger than `maxStorageBufferRange` are bound as 8 or 32 windows of
//!   a power-of-two size each (pools up to 1 GiB on lavapipe, whose stages take 32 storage
//!   buffers; up to 64 GiB on drivers with a 4 GiB range and enough bindings).
//! * Execution: one queue, every command behind a full barrier, so all streams run in
//!   submission order (events are trivially satisfied). Buffers dropped while work may use them
//!   are destroyed once a timeline semaphore passes that work.
//! * [`VulkanDevice::timed`] measures enqueued work with timestamp queries (for benches).
//!
//! Not done here: multi-queue overlap of copies and compute, buffer device addresses.

mod copy;
mod error;
mod shaders;
mod vk;

use std::sync::Arc;
use std::time::Duration;

use hisparse_core::Device;
use hisparse_core::ops::copy::{check_bulk_copy, check_host_page_copy};
use hisparse_core::ops::{
    BlockPair, BufferLen, Direction, GatherArgs, GatherDesc, InvalidateArgs, InvalidateDesc,
    PINNED_ALIGNMENT, PageCopyDesc, PageLayout, RemapArgs, RemapDesc, ResolveArgs, ResolveDesc,
    RowCopyDesc, RowSpan, SlotMappingArgs, SlotMappingDesc, check_pinned_budget,
};

pub use error::VulkanError;
pub use vk::validation_message_count;

use copy::CopyPlan;
use shaders::Shader;
use vk::{Binding, Context, MemKind, RawBuffer, Rec};

type Result<T> = core::result::Result<T, VulkanError>;

/// The embedded SPIR-V modules as `(name, bytes)`, for validation with external tools
/// (`tests/spirv_val.rs` runs `spirv-val` on each).
pub fn spirv_modules() -> impl Iterator<Item = (&'static str, &'static [u8])> {
    Shader::ALL.into_iter().map(|s| (s.name(), s.spirv()))
}

/// Environment variable: `1` opens every device in strict validation mode
/// ([`VulkanDevice::open_strict`]).
pub const STRICT_VALIDATION_ENV: &str = "HISPARSE_VULKAN_STRICT_VALIDATION";

/// A Vulkan device executing HiSparse operations. Cheap to share by reference across threads.
pub struct VulkanDevice {
    ctx: Arc<Context>,
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

/// A stream: all streams of a device share its queue, in submission order.
#[derive(Debug)]
pub struct VulkanStream {
    _private: (),
}

/// A point in the device's submission order.
#[derive(Clone, Copy, Debug)]
pub struct VulkanEvent {
    value: u64,
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

impl std::fmt::Debug for VulkanDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanDevice")
            .field("name", &self.ctx.name)
            .finish()
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

fn u32_of(v: u64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| VulkanError::Unsupported(format!("{what} ({v}) exceeds 32 bits")))
}

impl VulkanDevice {
    /// Opens a device: `""` = the first suitable device, a number = the device at that index of
    /// the loader's list, anything else = the first device whose name contains it
    /// (case-insensitive).
    pub fn open(selector: &str) -> Result<VulkanDevice> {
        let strict = std::env::var(STRICT_VALIDATION_ENV).is_ok_and(|v| v.trim() == "1");
        Ok(VulkanDevice {
            ctx: Arc::new(Context::open(selector, strict)?),
        })
    }

    /// Like [`VulkanDevice::open`], but any validation warning or error (reported through
    /// `VK_EXT_debug_utils`, e.g. with `VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation`) makes
    /// the call during which it appeared fail with [`VulkanError::Validation`]. Tests use this.
    pub fn open_strict(selector: &str) -> Result<VulkanDevice> {
        Ok(VulkanDevice {
            ctx: Arc::new(Context::open(selector, true)?),
        })
    }

    /// Whether timestamp queries work on this device ([`VulkanDevice::timed`]).
    pub fn has_timestamps(&self) -> bool {
        self.ctx.limits.timestamp_period.is_some()
    }

    /// Whether pinned buffers are imported host allocations (`VK_EXT_external_memory_host`).
    pub fn imports_host_memory(&self) -> bool {
        self.ctx.limits.import_alignment.is_some()
    }

    /// Bytes of one pool window (`maxStorageBufferRange` rounded down to a power of two).
    pub fn binding_window(&self) -> u64 {
        self.ctx.limits.window
    }

    /// Runs `f`, which should only enqueue work, recording everything it enqueues into one
    /// command buffer between two timestamp queries; returns the device time between them.
    /// Synchronous calls inside `f` (uploads, `synchronize`, …) submit early; the result then
    /// also includes host round trips.
    pub fn timed(&self, f: impl FnOnce(&Self) -> Result<()>) -> Result<Duration> {
        if !self.has_timestamps() {
            return Err(VulkanError::Unsupported(
                "the compute queue has no timestamp support".into(),
            ));
        }
        self.ctx.begin_batch(true)?;
        let r = f(self);
        let ns = self.ctx.end_batch(true)?;
        r?;
        let ns = ns.unwrap_or(0.0);
        Ok(Duration::from_nanos(ns.max(0.0) as u64))
    }

    fn bind_index(&self, b: &RawBuffer, need: u64, what: &str) -> Result<Binding> {
        let window = self.ctx.limits.window;
        if need > window {
            return Err(VulkanError::Unsupported(format!(
                "{what}: {need} bytes exceed one storage binding ({window} bytes)"
            )));
        }
        Ok(Binding {
            buffer: b.buffer,
            offset: 0,
            range: b.size.min(window),
        })
    }

    /// `windows` bindings covering a pool buffer (unused ones repeat window 0).
    fn pool_windows(&self, b: &RawBuffer, windows: u64) -> Vec<Binding> {
        let window = self.ctx.limits.window;
        let n = b.size.div_ceil(window);
        (0..windows)
            .map(|c| {
                let c = if c < n { c } else { 0 };
                Binding {
                    buffer: b.buffer,
                    offset: c * window,
                    range: (b.size - c * window).min(window),
                }
            })
            .collect()
    }

    fn record<R>(&self, f: impl FnOnce(&mut Rec<'_>) -> Result<R>) -> Result<R> {
        self.ctx.record(f)
    }

    fn run_plan(&self, plan: &CopyPlan, src: ash::vk::Buffer, dst: ash::vk::Buffer) -> Result<()> {
        self.record(|rec| {
            for batch in plan.batches() {
                rec.copy(src, dst, batch);
            }
            Ok(())
        })
    }
}

/// Layout words for the gather shader (16-byte units).
fn layout_words(l: &PageLayout) -> Result<[u32; 8]> {
    let stride = if l.num_blocks > 1 {
        u32_of(l.block_stride / 16, "layout.block_stride / 16")?
    } else {
        0
    };
    Ok([
        u32_of(l.base / 16, "layout.base / 16")?,
        stride,
        l.num_blocks,
        l.block_size,
        l.row_bytes / 16,
        l.value_bytes / 16,
        l.index_stride_rows,
        0,
    ])
}

/// Byte ranges `(offset, len)` of rows `first..first + n` of `block`: value part, scale part.
fn span_parts(l: &PageLayout, block: u32, first: u32, n: u32) -> [(u64, u64); 2] {
    let [(v, _), (s, _)] = l.row_parts(block, first);
    let vb = u64::from(l.value_bytes);
    let sb = u64::from(l.row_bytes - l.value_bytes);
    [(v, vb * u64::from(n)), (s, sb * u64::from(n))]
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
        self.record(|rec| {
            rec.zero(handle, 0, size);
            Ok(())
        })?;
        Ok(buf)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<VulkanHostBuffer> {
        check_pinned_budget(bytes as u64, vk::available_ram().unwrap_or(u64::MAX))?;
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

    fn upload(&self, dst: &mut VulkanBuffer, offset: usize, src: &[u8]) -> Result<()> {
        bulk(src.len(), 0, dst.len, offset, src.len())?;
        if src.is_empty() {
            return self.ctx.wait_idle();
        }
        let chunk = src.len().min(64 << 20);
        let mut staging = self.ctx.create_buffer(chunk as u64, MemKind::Staging)?;
        let dst_handle = dst.raw().buffer;
        let mut r = Ok(());
        for (i, piece) in src.chunks(chunk).enumerate() {
            r = self.ctx.wait_idle().and_then(|()| {
                vk::write_host(&mut staging, 0, piece);
                let region = ash::vk::BufferCopy {
                    src_offset: 0,
                    dst_offset: (offset + i * chunk) as u64,
                    size: piece.len() as u64,
                };
                self.record(|rec| {
                    rec.copy(staging.buffer, dst_handle, &[region]);
                    Ok(())
                })
            });
            if r.is_err() {
                break;
            }
        }
        let w = self.ctx.wait_idle();
        self.ctx.retire(staging);
        r.and(w)
    }

    fn download(&self, src: &VulkanBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        bulk(src.len, offset, dst.len(), 0, dst.len())?;
        if dst.is_empty() {
            return self.ctx.wait_idle();
        }
        let chunk = dst.len().min(64 << 20);
        let staging = self.ctx.create_buffer(chunk as u64, MemKind::Staging)?;
        let src_handle = src.raw().buffer;
        let mut r = Ok(());
        for (i, piece) in dst.chunks_mut(chunk).enumerate() {
            let region = ash::vk::BufferCopy {
                src_offset: (offset + i * chunk) as u64,
                dst_offset: 0,
                size: piece.len() as u64,
            };
            r = self
                .record(|rec| {
                    rec.copy(src_handle, staging.buffer, &[region]);
                    Ok(())
                })
                .and_then(|()| self.ctx.wait_idle())
                .map(|()| vk::read_host(&staging, 0, piece));
            if r.is_err() {
                break;
            }
        }
        self.ctx.retire(staging);
        r
    }

    fn write_pinned(&self, dst: &mut VulkanHostBuffer, offset: usize, src: &[u8]) -> Result<()> {
        bulk(src.len(), 0, dst.len, offset, src.len())?;
        self.ctx.wait_idle()?;
        if let Some(raw) = dst.raw.as_mut() {
            vk::write_host(raw, offset, src);
        }
        Ok(())
    }

    fn read_pinned(&self, src: &VulkanHostBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        bulk(src.len, offset, dst.len(), 0, dst.len())?;
        self.ctx.wait_idle()?;
        vk::read_host(src.raw(), offset, dst);
        Ok(())
    }

    fn create_stream(&self) -> Result<VulkanStream> {
        Ok(VulkanStream { _private: () })
    }

    fn record_event(&self, _stream: &VulkanStream) -> Result<VulkanEvent> {
        Ok(VulkanEvent {
            value: self.ctx.last_submitted(),
        })
    }

    fn wait_event(&self, _stream: &VulkanStream, _event: &VulkanEvent) -> Result<()> {
        // Every stream shares one queue with a full barrier before each command: work enqueued
        // later already runs after the event's work.
        Ok(())
    }

    fn synchronize(&self, _stream: &VulkanStream) -> Result<()> {
        self.ctx.wait_idle()
    }

    fn query_event(&self, event: &VulkanEvent) -> Result<bool> {
        Ok(self.ctx.reached(event.value))
    }

    fn copy_to_device(
        &self,
        _stream: &VulkanStream,
        src: &VulkanHostBuffer,
        src_offset: usize,
        dst: &mut VulkanBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        bulk(src.len, src_offset, dst.len, dst_offset, bytes)?;
        let mut plan = CopyPlan::new(false);
        plan.push(src_offset as u64, dst_offset as u64, bytes as u64);
        self.run_plan(&plan, src.raw().buffer, dst.raw().buffer)
    }

    fn copy_to_host(
        &self,
        _stream: &VulkanStream,
        src: &VulkanBuffer,
        src_offset: usize,
        dst: &mut VulkanHostBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        bulk(src.len, src_offset, dst.len, dst_offset, bytes)?;
        let mut plan = CopyPlan::new(false);
        plan.push(src_offset as u64, dst_offset as u64, bytes as u64);
        self.run_plan(&plan, src.raw().buffer, dst.raw().buffer)
    }

    fn copy_on_device(
        &self,
        _stream: &VulkanStream,
        src: &VulkanBuffer,
        src_offset: usize,
        dst: &mut VulkanBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        bulk(src.len, src_offset, dst.len, dst_offset, bytes)?;
        let mut plan = CopyPlan::new(false);
        plan.push(src_offset as u64, dst_offset as u64, bytes as u64);
        self.run_plan(&plan, src.raw().buffer, dst.raw().buffer)
    }

    fn remap(
        &self,
        _stream: &VulkanStream,
        desc: &RemapDesc,
        args: RemapArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        if desc.num_tokens == 0 {
            return Ok(());
        }
        let t = u64::from(desc.num_tokens);
        let tk = t * u64::from(desc.top_k);
        let table = u64::from(desc.table_rows) * u64::from(desc.max_blocks);
        let mut b = vec![
            self.bind_index(args.req_id.raw(), 4 * t, "req_id")?,
            self.bind_index(args.block_table.raw(), 4 * table, "block_table")?,
            self.bind_index(args.topk.raw(), 4 * tk, "topk")?,
        ];
        let map = args.idx_mapping.map(|m| {
            let n = u64::from(desc.idx_mapping_len.unwrap_or(0));
            self.bind_index(m.raw(), 4 * n, "idx_mapping")
        });
        let out = self.bind_index(args.out.raw(), 4 * tk, "out")?;
        let counts = match &args.counts {
            Some(c) => Some(self.bind_index(c.raw(), 4 * t, "counts")?),
            None => None,
        };
        let map = map.transpose()?;
        let flags = u32::from(desc.write_counts)
            | u32::from(desc.compact) << 1
            | u32::from(desc.idx_mapping_len.is_some()) << 2;
        let push = [
            desc.num_tokens,
            desc.top_k,
            desc.table_rows,
            desc.max_blocks,
            desc.block_size,
            desc.block_stride_rows,
            desc.idx_mapping_len.unwrap_or(0),
            flags,
        ];
        self.record(|rec| {
            let dummy = Binding {
                buffer: rec.scratch(16)?,
                offset: 0,
                range: 16,
            };
            b.push(map.unwrap_or(b[0]));
            b.push(out);
            b.push(counts.unwrap_or(dummy));
            rec.dispatch(Shader::Remap, &b, &push, t)
        })
    }

    fn resolve(
        &self,
        _stream: &VulkanStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        desc.check(&args.sizes())?;
        if desc.num_tokens == 0 {
            return Ok(());
        }
        let t = u64::from(desc.num_tokens);
        let k = u64::from(desc.top_k);
        let r = u64::from(desc.num_requests);
        let n = u64::from(desc.hot_slots);
        let tk = t * k;
        let pages = r * u64::from(desc.max_pages);
        let slots = r * n;
        let hot = r * u64::from(desc.hot_table_width());
        let mut b = vec![
            self.bind_index(args.req_id.raw(), 4 * t, "req_id")?,
            self.bind_index(args.topk.raw(), 4 * tk, "topk")?,
            self.bind_index(args.resident_table.raw(), 4 * pages, "resident_table")?,
            self.bind_index(args.host_table.raw(), 4 * pages, "host_table")?,
            self.bind_index(args.hot_table.raw(), 4 * hot, "hot_table")?,
            self.bind_index(args.dgi.raw(), 4 * slots, "dgi")?,
            self.bind_index(args.lru.raw(), 2 * slots, "lru")?,
            self.bind_index(args.indices.raw(), 4 * tk, "indices")?,
            self.bind_index(args.valid_counts.raw(), 4 * t, "valid_counts")?,
            self.bind_index(args.hit_counts.raw(), 4 * t, "hit_counts")?,
            self.bind_index(args.miss_counts.raw(), 4 * t, "miss_counts")?,
            self.bind_index(args.miss_src.raw(), 4 * tk, "miss_src")?,
            self.bind_index(args.miss_dst.raw(), 4 * tk, "miss_dst")?,
        ];
        // Scratch regions (words): info 4T, perm T, gval TK, xmiss TK, hash 8TK, rowc 4T,
        // old G*N, evl G*N with G = min(R, T) groups.
        let groups = r.min(t);
        let words = [4 * t, t, tk, tk, 8 * tk, 4 * t, groups * n, groups * n];
        let mut regions = Vec::with_capacity(words.len());
        let mut at = 0u64;
        for w in words {
            let bytes = (4 * w).max(16);
            if bytes > self.ctx.limits.window {
                return Err(VulkanError::Unsupported(format!(
                    "resolve scratch of {bytes} bytes exceeds one storage binding; split the batch"
                )));
            }
            regions.push((at, bytes));
            at = (at + bytes).div_ceil(256) * 256;
        }
        let host_rows = desc.host_rows() as u32;
        let push_prep = [desc.num_tokens, desc.num_requests];
        let push = [
            desc.num_tokens,
            desc.top_k,
            desc.num_requests,
            desc.max_pages,
            desc.block_size,
            desc.hot_slots,
            desc.attention_block_stride,
            host_rows,
            desc.hot_table_width(),
            u32::from(r <= t),
        ];
        self.record(|rec| {
            let scratch = rec.scratch(at)?;
            let sb: Vec<Binding> = regions
                .iter()
                .map(|&(offset, range)| Binding {
                    buffer: scratch,
                    offset,
                    range,
                })
                .collect();
            rec.dispatch(
                Shader::ResolvePrep,
                &[b[0], sb[0], sb[1]],
                &push_prep,
                t.div_ceil(256),
            )?;
            b.extend_from_slice(&sb);
            rec.dispatch(Shader::Resolve, &b, &push, t)
        })
    }

    fn gather_rows(
        &self,
        _stream: &VulkanStream,
        desc: &GatherDesc<'_>,
        args: GatherArgs<'_, VulkanBuffer, VulkanHostBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        let t = u64::from(desc.num_tokens);
        let tk = t * u64::from(desc.top_k);
        let items = tk * desc.layers.len() as u64;
        if items == 0 {
            return Ok(());
        }
        let items = u32_of(items, "gather work items (layers × tokens × top_k)")?;
        let mut layer_words = Vec::with_capacity(desc.layers.len() * 16);
        for l in desc.layers {
            layer_words.extend(layout_words(&l.host)?);
            layer_words.extend(layout_words(&l.device)?);
        }
        let host = args.host.raw();
        let dev = args.device.raw();
        let window = self.ctx.limits.window;
        let need = host.size.max(dev.size).div_ceil(window);
        let limit = self.ctx.limits.max_storage_per_stage;
        let Some(shader) = Shader::GATHERS
            .into_iter()
            .find(|s| s.windows() >= need && s.bindings() <= limit)
        else {
            return Err(VulkanError::Unsupported(format!(
                "a pool of {} bytes needs {need} bindings of {window} bytes; the device allows \
                 {limit} storage buffers per stage",
                host.size.max(dev.size)
            )));
        };
        let mut b = vec![
            self.bind_index(args.plan_src.raw(), 4 * tk, "plan_src")?,
            self.bind_index(args.plan_dst.raw(), 4 * tk, "plan_dst")?,
            self.bind_index(args.plan_counts.raw(), 4 * t, "plan_counts")?,
        ];
        let mut pools = self.pool_windows(host, shader.windows());
        pools.extend(self.pool_windows(dev, shader.windows()));
        let units = window / 16;
        let push = [
            desc.num_tokens,
            desc.top_k,
            desc.layers.len() as u32,
            items,
            units.trailing_zeros(),
            (units - 1) as u32,
        ];
        self.record(|rec| {
            b.push(rec.params(&layer_words)?);
            b.extend(pools);
            rec.dispatch(shader, &b, &push, u64::from(items).div_ceil(4))
        })
    }

    fn copy_pages(
        &self,
        _stream: &VulkanStream,
        desc: &PageCopyDesc<'_>,
        pairs: &[BlockPair],
        host: &mut VulkanHostBuffer,
        device: &mut VulkanBuffer,
    ) -> Result<()> {
        desc.check(pairs, host.len as u64, device.len as u64)?;
        let mut plan = CopyPlan::new(false);
        for l in desc.layers {
            let len = l.host.page_bytes();
            for p in pairs {
                let (s, d) = match desc.direction {
                    Direction::DeviceToHost => {
                        (l.device.page_offset(p.src), l.host.page_offset(p.dst))
                    }
                    Direction::HostToDevice => {
                        (l.host.page_offset(p.src), l.device.page_offset(p.dst))
                    }
                };
                plan.push(s, d, len);
            }
        }
        let (hb, db) = (host.raw().buffer, device.raw().buffer);
        match desc.direction {
            Direction::DeviceToHost => self.run_plan(&plan, db, hb),
            Direction::HostToDevice => self.run_plan(&plan, hb, db),
        }
    }

    fn copy_rows(
        &self,
        _stream: &VulkanStream,
        desc: &RowCopyDesc<'_>,
        spans: &[RowSpan],
        host: &mut VulkanHostBuffer,
        device: &mut VulkanBuffer,
    ) -> Result<()> {
        desc.check(spans, host.len as u64, device.len as u64)?;
        let mut plan = CopyPlan::new(false);
        for l in desc.layers {
            for s in spans {
                let hp = span_parts(&l.host, s.host_block, s.first_row, s.num_rows);
                let dp = span_parts(&l.device, s.device_block, s.first_row, s.num_rows);
                for ((h, len), (d, _)) in hp.into_iter().zip(dp) {
                    match desc.direction {
                        Direction::DeviceToHost => plan.push(d, h, len),
                        Direction::HostToDevice => plan.push(h, d, len),
                    }
                }
            }
        }
        let (hb, db) = (host.raw().buffer, device.raw().buffer);
        match desc.direction {
            Direction::DeviceToHost => self.run_plan(&plan, db, hb),
            Direction::HostToDevice => self.run_plan(&plan, hb, db),
        }
    }

    fn copy_host_pages(
        &self,
        _stream: &VulkanStream,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &mut VulkanHostBuffer,
    ) -> Result<()> {
        check_host_page_copy(layers, pairs, host.len as u64)?;
        let mut plan = CopyPlan::new(true);
        for l in layers {
            for p in pairs {
                plan.push(l.page_offset(p.src), l.page_offset(p.dst), l.page_bytes());
            }
        }
        let hb = host.raw().buffer;
        self.run_plan(&plan, hb, hb)
    }

    fn invalidate(
        &self,
        _stream: &VulkanStream,
        desc: &InvalidateDesc,
        args: InvalidateArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        let entries = u64::from(desc.num_requests) * u64::from(desc.hot_slots);
        if desc.num_ranges == 0 {
            return Ok(());
        }
        let b = [
            self.bind_index(args.ranges.raw(), 8 * u64::from(desc.num_ranges), "ranges")?,
            self.bind_index(args.dgi.raw(), 4 * entries, "dgi")?,
        ];
        let push = [entries as u32, desc.num_ranges];
        self.record(|rec| rec.dispatch(Shader::Invalidate, &b, &push, entries.div_ceil(256)))
    }

    fn compressed_slot_mapping(
        &self,
        _stream: &VulkanStream,
        desc: &SlotMappingDesc,
        args: SlotMappingArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        desc.check(&args)?;
        let t = u64::from(desc.num_tokens);
        if t == 0 {
            return Ok(());
        }
        let table = u64::from(desc.table_rows) * u64::from(desc.max_blocks);
        let b = [
            self.bind_index(args.positions.raw(), 4 * t, "positions")?,
            self.bind_index(args.slot_mapping.raw(), 4 * t, "slot_mapping")?,
            self.bind_index(args.table_row.raw(), 4 * t, "table_row")?,
            self.bind_index(args.block_table.raw(), 4 * table, "block_table")?,
            self.bind_index(args.out.raw(), 4 * t, "out")?,
        ];
        let push = [
            desc.num_tokens,
            desc.ratio,
            desc.block_size,
            desc.table_rows,
            desc.max_blocks,
        ];
        self.record(|rec| rec.dispatch(Shader::SlotMapping, &b, &push, t.div_ceil(256)))
    }
}
