//! The [`Device`] trait: the executable contract every backend implements (SPEC §5).
//!
//! The core plans; a backend executes. A backend owns device memory ([`Device::Buffer`]), pinned
//! host memory the device reads directly ([`Device::HostBuffer`]) and an ordering primitive
//! ([`Device::Stream`], [`Device::Event`]). Every operation:
//!
//! * checks its descriptor and every buffer size with the core's `check` before anything is
//!   enqueued, returning the [`OpError`] (converted into [`Device::Error`]) on failure;
//! * is *enqueued* on a stream and may complete after the call returns. Operations on one stream
//!   run in order; across streams, order them with [`Device::record_event`] /
//!   [`Device::wait_event`];
//! * must produce output bit-identical to the reference function of the same name in
//!   [`crate::ops`], including every `-1`, LRU order and copied byte.
//!
//! Bulk copies take byte offsets checked by [`crate::ops::copy::check_bulk_copy`].
//!
//! Host-side lists (`pairs`, `spans`) are copied by the backend before the call returns. The
//! decode-path operations ([`Device::remap`], [`Device::resolve`], [`Device::gather_rows`],
//! [`Device::invalidate`], [`Device::compressed_slot_mapping`]) take only device buffers and must
//! not synchronise with the host, so a GPU backend can capture them in a graph.
//!
//! Buffers passed to an operation must stay alive until the work that uses them completes; a
//! backend's buffer `Drop` must therefore be stream-ordered or wait for outstanding work.
//! [`Device::upload`], [`Device::download`], [`Device::write_pinned`] and [`Device::read_pinned`]
//! are synchronous: they wait for all previously enqueued work of the device, then copy.

use crate::error::{Error, OpError};
use crate::ops::{
    BlockPair, BufferLen, GatherArgs, GatherDesc, InvalidateArgs, InvalidateDesc, PageCopyDesc,
    PageLayout, RemapArgs, RemapDesc, RowCopyDesc, RowSpan, SlotMappingArgs, SlotMappingDesc,
};
#[cfg(feature = "alloc")]
use crate::ops::{ResolveArgs, ResolveDesc};

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
    /// [`crate::ops::PINNED_ALIGNMENT`]. Refuses budgets above the safe share of RAM
    /// ([`crate::ops::check_pinned_budget`]) with an `OutOfPinnedMemory` error.
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

    /// Enqueues a contiguous copy of `bytes` from pinned `src` to device `dst`. This is the bulk
    /// host→device path (and the bandwidth ceiling the benches compare against).
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

    /// Index remap for the fully-resident path ([`crate::ops::remap`]).
    fn remap(
        &self,
        stream: &Self::Stream,
        desc: &RemapDesc,
        args: RemapArgs<'_, Self::Buffer>,
    ) -> Result<(), Self::Error>;

    /// Residency resolve and swap-in planning ([`crate::ops::resolve`]).
    #[cfg(feature = "alloc")]
    fn resolve(
        &self,
        stream: &Self::Stream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, Self::Buffer>,
    ) -> Result<(), Self::Error>;

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
