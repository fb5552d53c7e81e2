//! The [`Device`] trait: the executable contract every backend implements (contract §5).
//!
//! The core plans; a backend executes. A backend owns device memory ([`Device::Buffer`]), pinned
//! host memory the device reads directly ([`Device::HostBuffer`]) and an ordering primitive
//! ([`Device::Stream`], [`Device::Event`]). Every operation:
//!
//! * checks its descriptor and every buffer size with the core's `check` before anything is
//!   enqueued, returning the [`OpError`] (converted into [`Device::Error`]) on failure;
//! * is *enqueued* on a stream and may complete after the call returns;
//! * must produce output bit-identical to the reference function of the same name in
//!   [`crate::ops`], including every `-1`, LRU order and copied byte.
//!
//! # Streams and events
//!
//! Every backend honours these rules; the conformance suite's `streams/*` cases check them.
//!
//! 1. **In order on one stream.** Work enqueued on a stream runs after, and sees every write
//!    of, the work enqueued on the same stream before it.
//! 2. **Nothing is promised across streams** without an event: work on two streams may run
//!    concurrently and in any order.
//! 3. **Events.** [`Device::record_event`] captures the work enqueued on a stream so far;
//!    [`Device::wait_event`] makes work enqueued on another stream *afterwards* start only once
//!    that work has completed (it does not block the host). [`Device::query_event`] asks, without
//!    blocking, whether the captured work has completed; once it answers `true` every write of
//!    that work is visible to the host (pinned memory included).
//! 4. **Synchronous calls.** [`Device::synchronize`] blocks until a stream's work completed.
//!    [`Device::upload`], [`Device::download`], [`Device::write_pinned`] and
//!    [`Device::read_pinned`] wait for all previously enqueued work of the device (every
//!    stream), then copy.
//! 5. **Host lists** (`pairs`, `spans`, `writes`, `rows`) are copied by the backend before the
//!    call returns; the caller may reuse them at once.
//! 6. **Lifetimes.** Buffers passed to an operation must stay alive until the work that uses them
//!    completes; a backend's buffer `Drop` must therefore be stream-ordered or wait for
//!    outstanding work.
//!
//! A backend whose work runs eagerly on the calling thread (the CPU backend) meets these rules
//! trivially: every event has completed when it is recorded.
//!
//! The decode-path operations ([`Device::remap`], `Device::resolve` and
//! `Device::resolve_and_gather` (with `alloc`), [`Device::gather_rows`], [`Device::invalidate`],
//! [`Device::compressed_slot_mapping`]) take only device buffers and must not synchronise with
//! the host, so a GPU backend can capture them in a graph. [`Device::remap`], `Device::resolve`
//! and `Device::resolve_and_gather` count what they did into an optional stats buffer on the
//! device ([`crate::ops::stats`]), so an engine's metrics stay true when it replays them in a
//! graph the host never sees.
//!
//! Bulk copies take byte offsets checked by [`crate::ops::copy::check_bulk_copy`].

use crate::error::{Error, OpError, OpName};
use crate::ops::{
    BlockPair, BufferLen, GatherArgs, GatherDesc, HotResetDesc, IndexerBackupArgs,
    IndexerBackupDesc, InvalidateArgs, InvalidateDesc, PageCopyDesc, PageLayout, RemapArgs,
    RemapDesc, RemapModesArgs, RemapModesDesc, RowCopyDesc, RowSpan, SlotMappingArgs,
    SlotMappingDesc, TableWrite, TableWriteDesc,
};
#[cfg(feature = "alloc")]
use crate::ops::{LayerPair, ResolveArgs, ResolveDesc};

/// Free memory a device reports ([`Device::memory_info`]), so callers can check a budget before
/// any memory is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryInfo {
    /// Device memory free now, in bytes.
    pub device_free: u64,
    /// Host memory available now (what pinned allocations draw from), in bytes.
    pub host_available: u64,
    /// Device allocations come out of the same host memory (the CPU backend): a device pool
    /// and a host pool must fit *together* in `host_available`.
    pub unified: bool,
}

/// Elements per chunk of the provided typed uploads and downloads (a 4 KiB stack buffer).
const TYPED_CHUNK_BYTES: usize = 4096;

/// A backend that executes HiSparse data-plane operations.
pub trait Device {
    /// The backend's error type, classified portably through [`Error::kind`].
    type Error: Error + From<OpError>;
    /// Device memory (zero-initialised on allocation).
    type Buffer: BufferLen;
    /// Pinned, page-aligned host memory that the device reads and writes directly
    /// (zero-initialised on allocation).
    type HostBuffer: BufferLen;
    /// An in-order queue of work.
    type Stream;
    /// A point in a stream that another stream can wait for.
    type Event;

    /// Short backend name, e.g. `"cpu"`, `"cuda"`.
    fn backend(&self) -> &'static str;

    /// Human-readable device name (model, driver), for reports.
    fn device_name(&self) -> &str;

    /// Allocates `bytes` of zeroed device memory.
    fn alloc(&self, bytes: usize) -> Result<Self::Buffer, Self::Error>;

    /// Allocates `bytes` of zeroed pinned host memory, aligned to
    /// [`crate::ops::PINNED_ALIGNMENT`]. Refuses, before anything is reserved, a pool beyond a
    /// limit of the host ([`crate::ops::check_host_pool`]: the safe share of the available RAM,
    /// the locked-memory limit where the pinning counts against it) with an `OutOfPinnedMemory`
    /// error.
    fn alloc_pinned(&self, bytes: usize) -> Result<Self::HostBuffer, Self::Error>;

    /// Host address of a pinned buffer (for alignment checks and diagnostics).
    fn pinned_address(&self, buf: &Self::HostBuffer) -> usize;

    /// Copies `src` into `dst` at byte `offset`, after all enqueued work. Synchronous.
    fn upload(&self, dst: &mut Self::Buffer, offset: usize, src: &[u8]) -> Result<(), Self::Error>;

    /// Copies `dst.len()` bytes from `src` at byte `offset` into `dst`, after all enqueued work.
    /// Synchronous.
    fn download(
        &self,
        src: &Self::Buffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), Self::Error>;

    /// Writes host bytes into a pinned buffer, after all enqueued work. Synchronous.
    fn write_pinned(
        &self,
        dst: &mut Self::HostBuffer,
        offset: usize,
        src: &[u8],
    ) -> Result<(), Self::Error>;

    /// Reads bytes of a pinned buffer, after all enqueued work. Synchronous.
    fn read_pinned(
        &self,
        src: &Self::HostBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), Self::Error>;

    /// Creates a new stream.
    fn create_stream(&self) -> Result<Self::Stream, Self::Error>;

    /// Records an event at the current end of `stream`.
    fn record_event(&self, stream: &Self::Stream) -> Result<Self::Event, Self::Error>;

    /// Makes later work on `stream` wait for `event`. Does not block the host.
    fn wait_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<(), Self::Error>;

    /// Blocks the host until all work enqueued on `stream` has completed.
    fn synchronize(&self, stream: &Self::Stream) -> Result<(), Self::Error>;

    /// Whether the work `event` captured has completed, without blocking (rule 3 of the module
    /// docs). Completion polling in an engine's step loop uses this instead of
    /// [`Device::synchronize`].
    fn query_event(&self, event: &Self::Event) -> Result<bool, Self::Error>;

    /// Whether `stream` is being captured into a graph now (CUDA stream capture, HIP graph
    /// capture): work enqueued on it then runs only when the graph is replayed.
    ///
    /// Provided: `Ok(false)` (backends without graphs); the CUDA and ROCm backends override it.
    fn is_capturing(&self, stream: &Self::Stream) -> Result<bool, Self::Error> {
        let _ = stream;
        Ok(false)
    }

    /// Reads bytes of a pinned buffer that `event`'s work wrote, waiting for that event only —
    /// not for the device's other work, so completion polling can read results (counters,
    /// copied rows) while later work runs. The caller must not read a range that work enqueued
    /// after `event` may still be writing.
    ///
    /// The provided implementation is [`Device::read_pinned`] (which waits for all work):
    /// correct, but it blocks; backends override it.
    fn read_pinned_after(
        &self,
        event: &Self::Event,
        src: &Self::HostBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), Self::Error> {
        let _ = event;
        self.read_pinned(src, offset, dst)
    }

    /// Free device and host memory now, or `None` when the backend cannot tell (allocations
    /// then fail with [`crate::ErrorKind::OutOfDeviceMemory`] when they do not fit).
    fn memory_info(&self) -> Option<MemoryInfo> {
        None
    }

    /// Writes `src` as native-endian `i32`s into `dst` at byte `offset`. Synchronous, like
    /// [`Device::upload`].
    // Accepted twins (CONTRIBUTING.md, "One rule, one place"): the typed uploads and downloads
    // share one signature shape; each is one call into upload_typed or download_typed.
    fn upload_i32(
        &self,
        dst: &mut Self::Buffer,
        offset: usize,
        src: &[i32],
    ) -> Result<(), Self::Error> {
        upload_typed(self, dst, offset, src)
    }

    /// Reads `dst.len()` native-endian `i32`s of `src` from byte `offset`. Synchronous, like
    /// [`Device::download`].
    fn download_i32(
        &self,
        src: &Self::Buffer,
        offset: usize,
        dst: &mut [i32],
    ) -> Result<(), Self::Error> {
        download_typed(self, src, offset, dst)
    }

    /// Writes `src` as native-endian `u16`s (LRU orders) into `dst` at byte `offset`.
    /// Synchronous, like [`Device::upload`].
    fn upload_u16(
        &self,
        dst: &mut Self::Buffer,
        offset: usize,
        src: &[u16],
    ) -> Result<(), Self::Error> {
        upload_typed(self, dst, offset, src)
    }

    /// Reads `dst.len()` native-endian `u16`s of `src` from byte `offset`. Synchronous, like
    /// [`Device::download`].
    fn download_u16(
        &self,
        src: &Self::Buffer,
        offset: usize,
        dst: &mut [u16],
    ) -> Result<(), Self::Error> {
        download_typed(self, src, offset, dst)
    }

    /// Enqueues a contiguous copy of `bytes` from pinned `src` to device `dst`. This is the bulk
    /// host→device path (and the bandwidth ceiling the benches compare against).
    // Accepted twins (CONTRIBUTING.md, "One rule, one place"): the three bulk copies share the
    // Device trait's signature shape; each moves bytes in its own direction.
    fn copy_to_device(
        &self,
        stream: &Self::Stream,
        src: &Self::HostBuffer,
        src_offset: usize,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), Self::Error>;

    /// Enqueues a contiguous copy of `bytes` from device `src` to pinned `dst`.
    fn copy_to_host(
        &self,
        stream: &Self::Stream,
        src: &Self::Buffer,
        src_offset: usize,
        dst: &mut Self::HostBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), Self::Error>;

    /// Enqueues a contiguous copy of `bytes` between two device buffers.
    fn copy_on_device(
        &self,
        stream: &Self::Stream,
        src: &Self::Buffer,
        src_offset: usize,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), Self::Error>;

    /// Enqueues a copy of `bytes` from `src_offset` to `dst_offset` inside one device buffer
    /// (GPU copy-on-write of whole blocks of a pool). The ranges must be disjoint
    /// ([`crate::ops::copy::check_copy_within`]).
    ///
    /// The provided implementation stages through a temporary buffer with two
    /// [`Device::copy_on_device`] calls (correct on every backend; the temporary's drop is
    /// stream-ordered by rule 6). Backends override it with a direct copy.
    fn copy_within_device(
        &self,
        stream: &Self::Stream,
        buf: &mut Self::Buffer,
        src_offset: usize,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), Self::Error> {
        crate::ops::copy::check_copy_within(
            buf.byte_len(),
            src_offset as u64,
            dst_offset as u64,
            bytes as u64,
        )?;
        if bytes == 0 {
            return Ok(());
        }
        let mut tmp = self.alloc(bytes)?;
        self.copy_on_device(stream, buf, src_offset, &mut tmp, 0, bytes)?;
        self.copy_on_device(stream, &tmp, 0, buf, dst_offset, bytes)
    }

    /// Sparse writes into an `i32` table ([`crate::ops::table::write_table`]), ordered on
    /// `stream`.
    ///
    /// The provided implementation uploads each run of consecutive indices with
    /// [`Device::upload_i32`]: correct (an upload waits for all enqueued work, and later work
    /// is enqueued after it) but synchronous. Backends override it with a staged scatter that
    /// does not block the host.
    fn write_table(
        &self,
        stream: &Self::Stream,
        desc: &TableWriteDesc,
        writes: &[TableWrite],
        table: &mut Self::Buffer,
    ) -> Result<(), Self::Error> {
        let _ = stream;
        desc.check(writes, table)?;
        let mut run = [0i32; TYPED_CHUNK_BYTES / 4];
        let mut i = 0;
        while i < writes.len() {
            let first = writes[i].index;
            let mut n = 0;
            while i < writes.len() && n < run.len() && writes[i].index == first + n as u32 {
                run[n] = writes[i].value;
                n += 1;
                i += 1;
            }
            self.upload_i32(table, first as usize * 4, &run[..n])?;
        }
        Ok(())
    }

    /// Resets the hot state of the listed state rows ([`crate::ops::table::reset_hot_state`]):
    /// `slot_host_rows` rows to `-1`, LRU rows to the identity, ordered on `stream`.
    ///
    /// The provided implementation uploads each row (synchronous, like [`Device::write_table`]'s);
    /// backends override it with a kernel.
    fn reset_hot_state(
        &self,
        stream: &Self::Stream,
        desc: &HotResetDesc,
        rows: &[u32],
        slot_host_rows: &mut Self::Buffer,
        lru: &mut Self::Buffer,
    ) -> Result<(), Self::Error> {
        let _ = stream;
        desc.check(rows, slot_host_rows, lru)?;
        let n = desc.hot_slots as usize;
        let empty = [-1i32; TYPED_CHUNK_BYTES / 4];
        let mut order = [0u16; TYPED_CHUNK_BYTES / 2];
        for &r in rows {
            let r = r as usize;
            let mut s = 0;
            while s < n {
                let m = (n - s).min(empty.len());
                self.upload_i32(slot_host_rows, (r * n + s) * 4, &empty[..m])?;
                s += m;
            }
            let mut s = 0;
            while s < n {
                let m = (n - s).min(order.len());
                for (j, v) in order[..m].iter_mut().enumerate() {
                    *v = (s + j) as u16;
                }
                self.upload_u16(lru, (r * n + s) * 2, &order[..m])?;
                s += m;
            }
        }
        Ok(())
    }

    /// Index remap for the fully-resident path ([`crate::ops::remap`]).
    fn remap(
        &self,
        stream: &Self::Stream,
        desc: &RemapDesc,
        args: RemapArgs<'_, Self::Buffer>,
    ) -> Result<(), Self::Error>;

    /// Index remap with its optional modes — decode context parallelism and a prefill
    /// workspace ([`crate::ops::remap::remap_modes`]). Without a mode it is [`Device::remap`].
    ///
    /// Provided: checks the descriptor, runs a call without modes as [`Device::remap`], and
    /// refuses one with a mode with [`OpError::Unsupported`] naming it (kind `Unsupported`), so
    /// a backend without these kernels says so instead of computing something else. A backend
    /// that has them overrides this.
    fn remap_modes(
        &self,
        stream: &Self::Stream,
        desc: &RemapModesDesc,
        args: RemapModesArgs<'_, Self::Buffer>,
    ) -> Result<(), Self::Error> {
        desc.check(&args)?;
        if desc.has_modes() {
            return Err(OpError::Unsupported {
                op: OpName::Remap,
                feature: desc.feature(),
                backend: self.backend(),
            }
            .into());
        }
        self.remap(stream, &desc.remap, args.remap)
    }

    /// Indexer backup: the rows at `device_slots` of every indexer layer, copied into the
    /// indexer host cache at `host_slots` ([`crate::ops::indexer_backup`]). No host
    /// synchronisation.
    ///
    /// Provided: checks the descriptor and refuses the call with [`OpError::Unsupported`] (kind
    /// `Unsupported`); a backend that has the copy overrides this.
    fn indexer_backup(
        &self,
        stream: &Self::Stream,
        desc: &IndexerBackupDesc<'_>,
        args: IndexerBackupArgs<'_, Self::Buffer, Self::HostBuffer>,
    ) -> Result<(), Self::Error> {
        let _ = stream;
        desc.check(&args)?;
        Err(OpError::Unsupported {
            op: OpName::IndexerBackup,
            feature: "indexer_backup",
            backend: self.backend(),
        }
        .into())
    }

    /// Residency resolve and swap-in planning ([`crate::ops::resolve`]), in either table row
    /// order: state rows (`idx_mapping` `None`) or batch rows through `idx_mapping`
    /// ([`ResolveDesc::num_state_rows`]); every backend implements both, bit for bit.
    #[cfg(feature = "alloc")]
    fn resolve(
        &self,
        stream: &Self::Stream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, Self::Buffer>,
    ) -> Result<(), Self::Error>;

    /// The swap-in critical path in one call ([`crate::ops::swap_in::resolve_and_gather`]):
    /// [`Device::resolve`] of `desc` with `args`, then [`Device::gather_rows`] of the miss plan
    /// it wrote (`args.miss_src`, `args.miss_dst`, `args.miss_counts`; the call's token rows and
    /// top-k, [`crate::ops::swap_in::plan_gather`]) from `host` into `device` for every layer of
    /// `layers`.
    ///
    /// * **Results.** Byte for byte those of that pair of calls enqueued one after the other on
    ///   `stream`: every output (indices, valid, hit and miss counts, the miss plan — the plan
    ///   buffers hold the plan afterwards, so a follower can still apply it with
    ///   [`Device::gather_rows`]), the `slot_host_rows` and LRU rows, and every byte of `device` (rows the
    ///   plan does not name are not touched).
    /// * **`layers`.** The layer pairs the plan is applied to: the index group's leader alone,
    ///   or the leader and its followers (every layer that reads the leader's hot slots). Not
    ///   empty; each layer must lie inside `host` and `device`.
    /// * **Checks.** Both halves are checked ([`crate::ops::swap_in::check`]) before anything is
    ///   enqueued: a refused call leaves the hot state, the outputs and the pools as they were.
    /// * **Ordering.** One decode-path operation on `stream` under the module's stream and event
    ///   rules: it sees all work enqueued on `stream` before it, work enqueued after it sees all
    ///   its writes (the resolve's and the gather's), an event recorded after it captures both;
    ///   no host synchronisation, so it can be captured in a graph.
    ///
    /// The provided implementation is exactly that pair on `stream`. Backends override it to
    /// overlap the two (a request's missed rows copied while others still resolve).
    #[cfg(feature = "alloc")]
    fn resolve_and_gather(
        &self,
        stream: &Self::Stream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, Self::Buffer>,
        layers: &[LayerPair],
        host: &Self::HostBuffer,
        device: &mut Self::Buffer,
    ) -> Result<(), Self::Error> {
        resolve_then_gather(self, stream, desc, args, layers, host, device)
    }

    /// Executes a miss plan: host rows → hot rows, for every layer of `desc`
    /// ([`crate::ops::copy::gather_rows`]).
    fn gather_rows(
        &self,
        stream: &Self::Stream,
        desc: &GatherDesc<'_>,
        args: GatherArgs<'_, Self::Buffer, Self::HostBuffer>,
    ) -> Result<(), Self::Error>;

    /// Whole-page copies between the pools, all layers of `desc` in one call
    /// ([`crate::ops::copy::copy_pages`]).
    fn copy_pages(
        &self,
        stream: &Self::Stream,
        desc: &PageCopyDesc<'_>,
        pairs: &[BlockPair],
        host: &mut Self::HostBuffer,
        device: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// Row-span copies between the pools ([`crate::ops::copy::copy_rows`]).
    fn copy_rows(
        &self,
        stream: &Self::Stream,
        desc: &RowCopyDesc<'_>,
        spans: &[RowSpan],
        host: &mut Self::HostBuffer,
        device: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// Host → host page copies, copy-on-write ([`crate::ops::copy::copy_host_pages`]).
    fn copy_host_pages(
        &self,
        stream: &Self::Stream,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &mut Self::HostBuffer,
    ) -> Result<(), Self::Error>;

    /// Drops hot entries caching the given host rows ([`crate::ops::invalidate::invalidate`]).
    fn invalidate(
        &self,
        stream: &Self::Stream,
        desc: &InvalidateDesc,
        args: InvalidateArgs<'_, Self::Buffer>,
    ) -> Result<(), Self::Error>;

    /// Compressed slot mapping ([`crate::ops::slot_mapping::compressed_slot_mapping`]).
    fn compressed_slot_mapping(
        &self,
        stream: &Self::Stream,
        desc: &SlotMappingDesc,
        args: SlotMappingArgs<'_, Self::Buffer>,
    ) -> Result<(), Self::Error>;
}

/// The element types of device buffers, in native byte order: `i32` indices and block ids, `u16`
/// LRU slots.
trait Element: Copy + Default {
    /// Bytes per element.
    const BYTES: usize;
    /// Writes the element's native-endian bytes into `out` (`BYTES` long).
    fn put(self, out: &mut [u8]);
    /// The element of native-endian `bytes` (`BYTES` long).
    fn get(bytes: &[u8]) -> Self;
}

impl Element for i32 {
    const BYTES: usize = 4;
    fn put(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes());
    }
    fn get(b: &[u8]) -> Self {
        i32::from_ne_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Element for u16 {
    const BYTES: usize = 2;
    fn put(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes());
    }
    fn get(b: &[u8]) -> Self {
        u16::from_ne_bytes([b[0], b[1]])
    }
}

/// [`Device::upload`] of typed elements: with a heap, one conversion and one upload; without,
/// 4 KiB at a time.
fn upload_typed<D: Device + ?Sized, T: Element>(
    dev: &D,
    dst: &mut D::Buffer,
    offset: usize,
    src: &[T],
) -> Result<(), D::Error> {
    crate::ops::copy::check_bulk(src, 0, dst, offset, core::mem::size_of_val(src))?;
    #[cfg(feature = "alloc")]
    {
        let mut bytes = alloc::vec![0u8; src.len() * T::BYTES];
        for (b, v) in bytes.chunks_exact_mut(T::BYTES).zip(src) {
            v.put(b);
        }
        dev.upload(dst, offset, &bytes)
    }
    #[cfg(not(feature = "alloc"))]
    {
        let mut chunk = [0u8; TYPED_CHUNK_BYTES];
        for (i, part) in src.chunks(TYPED_CHUNK_BYTES / T::BYTES).enumerate() {
            for (b, v) in chunk.chunks_exact_mut(T::BYTES).zip(part) {
                v.put(b);
            }
            dev.upload(
                dst,
                offset + i * TYPED_CHUNK_BYTES,
                &chunk[..part.len() * T::BYTES],
            )?;
        }
        Ok(())
    }
}

/// [`Device::download`] of typed elements, the counterpart of [`upload_typed`].
fn download_typed<D: Device + ?Sized, T: Element>(
    dev: &D,
    src: &D::Buffer,
    offset: usize,
    dst: &mut [T],
) -> Result<(), D::Error> {
    crate::ops::copy::check_bulk(src, offset, &*dst, 0, core::mem::size_of_val(dst))?;
    #[cfg(feature = "alloc")]
    {
        let mut bytes = alloc::vec![0u8; dst.len() * T::BYTES];
        dev.download(src, offset, &mut bytes)?;
        for (v, b) in dst.iter_mut().zip(bytes.chunks_exact(T::BYTES)) {
            *v = T::get(b);
        }
        Ok(())
    }
    #[cfg(not(feature = "alloc"))]
    {
        let mut chunk = [0u8; TYPED_CHUNK_BYTES];
        for (i, part) in dst.chunks_mut(TYPED_CHUNK_BYTES / T::BYTES).enumerate() {
            let bytes = &mut chunk[..part.len() * T::BYTES];
            dev.download(src, offset + i * TYPED_CHUNK_BYTES, bytes)?;
            for (v, b) in part.iter_mut().zip(bytes.chunks_exact(T::BYTES)) {
                *v = T::get(b);
            }
        }
        Ok(())
    }
}

/// [`Device::resolve_and_gather`] as two calls on `stream`: both halves checked
/// ([`crate::ops::swap_in::check`]), then [`Device::resolve`] and [`Device::gather_rows`] of its
/// miss plan. The trait's provided implementation, and what an overriding backend calls where
/// its fused launch is not the faster one.
#[cfg(feature = "alloc")]
pub fn resolve_then_gather<D: Device + ?Sized>(
    dev: &D,
    stream: &D::Stream,
    desc: &ResolveDesc,
    args: ResolveArgs<'_, D::Buffer>,
    layers: &[LayerPair],
    host: &D::HostBuffer,
    device: &mut D::Buffer,
) -> Result<(), D::Error> {
    crate::ops::swap_in::check(
        desc,
        &args.sizes(),
        layers,
        host.byte_len(),
        device.byte_len(),
    )?;
    let mut args = args;
    dev.resolve(stream, desc, args.reborrow())?;
    dev.gather_rows(
        stream,
        &crate::ops::swap_in::plan_gather(desc, layers),
        GatherArgs {
            plan_src: args.miss_src,
            plan_dst: args.miss_dst,
            plan_counts: args.miss_counts,
            host,
            device,
        },
    )
}
