//! A CPU device whose second and later streams *lag*: work enqueued on them is queued, not run,
//! until the test releases it with [`LagDevice::run_pending`]. Events on a lagging stream
//! complete only when the work before them has run; synchronous calls (rule 4 of the stream
//! rules) run everything first. The first stream a device creates — the runtime's compute
//! stream — runs eagerly, like the CPU backend.
//!
//! With it, a runtime test sees after-forward copies execute steps after they were enqueued,
//! reading the device pool *then*: a block the coordinator reused or reclaimed before its copy
//! completed shows up as wrong bytes on the host, and a batch reported complete before its copy
//! ran is caught by the runtime's own polling.
//!
//! Buffers are shared (`Arc<Mutex<CpuBuffer>>`) so queued work can reach them later; the test
//! reads and writes them directly (the engine's "kernels") through [`LagBuffer::bytes`] without
//! flushing the queue.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use hisparse_backend_cpu::{CpuBuffer, CpuDevice, CpuError, CpuStream};
use hisparse_core::Device;
use hisparse_core::ops::{
    BlockPair, BufferLen, Direction, GatherArgs, GatherDesc, HotResetDesc, IndexerBackupArgs,
    IndexerBackupDesc, InvalidateArgs, InvalidateDesc, LayerPair, PageCopyDesc, PageLayout,
    RemapArgs, RemapDesc, ResolveArgs, ResolveDesc, RowCopyDesc, RowSpan, SlotMappingArgs,
    SlotMappingDesc, TableWrite, TableWriteDesc,
};

/// A shared CPU buffer.
#[derive(Clone)]
pub struct LagBuffer(Arc<Mutex<CpuBuffer>>);

impl LagBuffer {
    /// The bytes, for the test's direct reads and writes.
    pub fn bytes(&self) -> MutexGuard<'_, CpuBuffer> {
        self.0.lock().unwrap()
    }
}

impl BufferLen for LagBuffer {
    fn byte_len(&self) -> u64 {
        self.bytes().len() as u64
    }
}

/// A stream: its id (0 = the eager one).
pub struct LagStream(usize);

/// An event: the stream and how many of its queued items must have run.
#[derive(Clone, Copy)]
pub struct LagEvent {
    stream: usize,
    ticket: u64,
}

type Work = Box<dyn FnOnce(&CpuDevice) -> Result<(), CpuError> + Send>;

#[derive(Default)]
struct Queue {
    items: VecDeque<Work>,
    /// Items enqueued so far, and items run so far.
    enqueued: u64,
    ran: u64,
}

/// The lagging device.
pub struct LagDevice {
    cpu: CpuDevice,
    queues: Mutex<Vec<Queue>>,
}

impl Default for LagDevice {
    fn default() -> Self {
        LagDevice {
            cpu: CpuDevice::new(),
            queues: Mutex::new(Vec::new()),
        }
    }
}

impl LagDevice {
    /// Runs up to `n` of the oldest queued items of every lagging stream; returns how many ran.
    pub fn run_pending(&self, n: usize) -> usize {
        let mut ran = 0;
        let mut qs = self.queues.lock().unwrap();
        for q in qs.iter_mut() {
            for _ in 0..n {
                let Some(w) = q.items.pop_front() else { break };
                w(&self.cpu).expect("queued work was checked when enqueued");
                q.ran += 1;
                ran += 1;
            }
        }
        ran
    }

    /// Items queued and not run yet.
    pub fn pending(&self) -> usize {
        self.queues
            .lock()
            .unwrap()
            .iter()
            .map(|q| q.items.len())
            .sum()
    }

    fn flush(&self) {
        self.run_pending(usize::MAX);
    }

    /// Runs `w` now (eager stream) or queues it (lagging stream).
    fn submit(&self, stream: &LagStream, w: Work) -> Result<(), CpuError> {
        if stream.0 == 0 {
            return w(&self.cpu);
        }
        let mut qs = self.queues.lock().unwrap();
        let q = &mut qs[stream.0];
        q.items.push_back(w);
        q.enqueued += 1;
        Ok(())
    }
}

fn lock(b: &LagBuffer) -> MutexGuard<'_, CpuBuffer> {
    b.bytes()
}

/// The CPU backend's signature of a contiguous copy between two buffers.
type BulkCopy = fn(
    &CpuDevice,
    &CpuStream,
    &CpuBuffer,
    usize,
    &mut CpuBuffer,
    usize,
    usize,
) -> Result<(), CpuError>;

impl LagDevice {
    /// A contiguous copy (`copy` is one of the CPU backend's), checked now, run on `stream`.
    #[allow(clippy::too_many_arguments)]
    fn bulk(
        &self,
        stream: &LagStream,
        src: &LagBuffer,
        src_offset: usize,
        dst: &mut LagBuffer,
        dst_offset: usize,
        bytes: usize,
        copy: BulkCopy,
    ) -> Result<(), CpuError> {
        hisparse_core::ops::copy::check_bulk(src, src_offset, dst, dst_offset, bytes)?;
        let (s, d) = (src.clone(), dst.clone());
        self.submit(
            stream,
            Box::new(move |cpu| {
                copy(
                    cpu,
                    &CpuStream,
                    &lock(&s),
                    src_offset,
                    &mut lock(&d),
                    dst_offset,
                    bytes,
                )
            }),
        )
    }
}

impl Device for LagDevice {
    type Error = CpuError;
    type Buffer = LagBuffer;
    type HostBuffer = LagBuffer;
    type Stream = LagStream;
    type Event = LagEvent;

    fn backend(&self) -> &'static str {
        "cpu-lagging"
    }

    fn device_name(&self) -> &str {
        "CPU with lagging copy streams"
    }

    fn alloc(&self, bytes: usize) -> Result<LagBuffer, CpuError> {
        Ok(LagBuffer(Arc::new(Mutex::new(self.cpu.alloc(bytes)?))))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<LagBuffer, CpuError> {
        Ok(LagBuffer(Arc::new(Mutex::new(
            self.cpu.alloc_pinned(bytes)?,
        ))))
    }

    fn pinned_address(&self, buf: &LagBuffer) -> usize {
        lock(buf).address()
    }

    fn upload(&self, dst: &mut LagBuffer, offset: usize, src: &[u8]) -> Result<(), CpuError> {
        self.flush();
        self.cpu.upload(&mut lock(dst), offset, src)
    }

    fn download(&self, src: &LagBuffer, offset: usize, dst: &mut [u8]) -> Result<(), CpuError> {
        self.flush();
        self.cpu.download(&lock(src), offset, dst)
    }

    fn write_pinned(&self, dst: &mut LagBuffer, offset: usize, src: &[u8]) -> Result<(), CpuError> {
        self.upload(dst, offset, src)
    }

    fn read_pinned(&self, src: &LagBuffer, offset: usize, dst: &mut [u8]) -> Result<(), CpuError> {
        self.download(src, offset, dst)
    }

    fn read_pinned_after(
        &self,
        event: &LagEvent,
        src: &LagBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), CpuError> {
        // Wait for the event only: run its stream up to its ticket.
        loop {
            {
                let qs = self.queues.lock().unwrap();
                if event.stream == 0 || qs[event.stream].ran >= event.ticket {
                    break;
                }
            }
            self.run_pending(1);
        }
        self.cpu.download(&lock(src), offset, dst)
    }

    fn create_stream(&self) -> Result<LagStream, CpuError> {
        let mut qs = self.queues.lock().unwrap();
        qs.push(Queue::default());
        Ok(LagStream(qs.len() - 1))
    }

    fn record_event(&self, stream: &LagStream) -> Result<LagEvent, CpuError> {
        let qs = self.queues.lock().unwrap();
        Ok(LagEvent {
            stream: stream.0,
            ticket: qs[stream.0].enqueued,
        })
    }

    fn wait_event(&self, stream: &LagStream, event: &LagEvent) -> Result<(), CpuError> {
        // The eager stream's events have completed. The eager stream waiting on a lagging one's
        // event runs that stream's work up to the event first (it cannot wait later); a lagging
        // stream waiting on another lagging one would need a dependency between queues, which
        // the runtime never asks for.
        if event.stream == 0 || event.stream == stream.0 {
            return Ok(());
        }
        assert_eq!(stream.0, 0, "cross-lagging-stream waits are not modelled");
        let mut qs = self.queues.lock().unwrap();
        let q = &mut qs[event.stream];
        while q.ran < event.ticket {
            let w = q.items.pop_front().expect("an event's work was enqueued");
            w(&self.cpu)?;
            q.ran += 1;
        }
        Ok(())
    }

    fn synchronize(&self, stream: &LagStream) -> Result<(), CpuError> {
        if stream.0 != 0 {
            let mut qs = self.queues.lock().unwrap();
            let q = &mut qs[stream.0];
            while let Some(w) = q.items.pop_front() {
                w(&self.cpu)?;
                q.ran += 1;
            }
        }
        Ok(())
    }

    fn query_event(&self, event: &LagEvent) -> Result<bool, CpuError> {
        let qs = self.queues.lock().unwrap();
        Ok(event.stream == 0 || qs[event.stream].ran >= event.ticket)
    }

    fn copy_to_device(
        &self,
        stream: &LagStream,
        src: &LagBuffer,
        src_offset: usize,
        dst: &mut LagBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), CpuError> {
        self.bulk(
            stream,
            src,
            src_offset,
            dst,
            dst_offset,
            bytes,
            CpuDevice::copy_to_device,
        )
    }

    fn copy_to_host(
        &self,
        stream: &LagStream,
        src: &LagBuffer,
        src_offset: usize,
        dst: &mut LagBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), CpuError> {
        self.bulk(
            stream,
            src,
            src_offset,
            dst,
            dst_offset,
            bytes,
            CpuDevice::copy_to_host,
        )
    }

    fn copy_on_device(
        &self,
        stream: &LagStream,
        src: &LagBuffer,
        src_offset: usize,
        dst: &mut LagBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), CpuError> {
        self.bulk(
            stream,
            src,
            src_offset,
            dst,
            dst_offset,
            bytes,
            CpuDevice::copy_on_device,
        )
    }

    fn copy_within_device(
        &self,
        stream: &LagStream,
        buf: &mut LagBuffer,
        src_offset: usize,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), CpuError> {
        assert_eq!(
            stream.0, 0,
            "the runtime copies within the pool on its compute stream"
        );
        self.cpu
            .copy_within_device(&CpuStream, &mut lock(buf), src_offset, dst_offset, bytes)
    }

    fn write_table(
        &self,
        stream: &LagStream,
        desc: &TableWriteDesc,
        writes: &[TableWrite],
        table: &mut LagBuffer,
    ) -> Result<(), CpuError> {
        assert_eq!(
            stream.0, 0,
            "the runtime writes tables on its compute stream"
        );
        self.cpu
            .write_table(&CpuStream, desc, writes, &mut lock(table))
    }

    fn reset_hot_state(
        &self,
        stream: &LagStream,
        desc: &HotResetDesc,
        rows: &[u32],
        slot_host_rows: &mut LagBuffer,
        lru: &mut LagBuffer,
    ) -> Result<(), CpuError> {
        assert_eq!(
            stream.0, 0,
            "the runtime resets hot state on its compute stream"
        );
        self.cpu.reset_hot_state(
            &CpuStream,
            desc,
            rows,
            &mut lock(slot_host_rows),
            &mut lock(lru),
        )
    }

    fn remap(
        &self,
        stream: &LagStream,
        desc: &RemapDesc,
        a: RemapArgs<'_, LagBuffer>,
    ) -> Result<(), CpuError> {
        let desc = *desc;
        let (req, table, topk, out) = (
            a.req_id.clone(),
            a.block_table.clone(),
            a.topk.clone(),
            a.out.clone(),
        );
        let map = a.idx_mapping.cloned();
        let counts = a.counts.map(|c| c.clone());
        let stats = a.stats.map(|s| s.clone());
        // On a lagging stream (a micro-batch's side stream) the call runs when released, and
        // its arguments are checked then.
        self.submit(
            stream,
            Box::new(move |cpu| {
                let map = map.as_ref().map(lock);
                let mut counts = counts.as_ref().map(lock);
                let mut stats = stats.as_ref().map(lock);
                cpu.remap(
                    &CpuStream,
                    &desc,
                    RemapArgs {
                        req_id: &lock(&req),
                        block_table: &lock(&table),
                        topk: &lock(&topk),
                        idx_mapping: map.as_deref(),
                        out: &mut lock(&out),
                        counts: counts.as_deref_mut(),
                        stats: stats.as_deref_mut(),
                    },
                )
            }),
        )
    }

    fn resolve(
        &self,
        stream: &LagStream,
        desc: &ResolveDesc,
        a: ResolveArgs<'_, LagBuffer>,
    ) -> Result<(), CpuError> {
        assert!(
            a.idx_mapping.is_none(),
            "the runtime resolves in state-row order"
        );
        let desc = *desc;
        let (req, topk, res, host, hot) = (
            a.req_id.clone(),
            a.topk.clone(),
            a.resident_table.clone(),
            a.host_table.clone(),
            a.hot_table.clone(),
        );
        let (rows, lru, idx, valid) = (
            a.slot_host_rows.clone(),
            a.lru.clone(),
            a.indices.clone(),
            a.valid_counts.clone(),
        );
        let (hits, misses, msrc, mdst) = (
            a.hit_counts.clone(),
            a.miss_counts.clone(),
            a.miss_src.clone(),
            a.miss_dst.clone(),
        );
        let stats = a.stats.map(|s| s.clone());
        // On a lagging stream (a micro-batch's side stream) the call runs when released, and
        // its arguments are checked then.
        self.submit(
            stream,
            Box::new(move |cpu| {
                let mut stats = stats.as_ref().map(lock);
                cpu.resolve(
                    &CpuStream,
                    &desc,
                    ResolveArgs {
                        req_id: &lock(&req),
                        topk: &lock(&topk),
                        resident_table: &lock(&res),
                        host_table: &lock(&host),
                        hot_table: &lock(&hot),
                        slot_host_rows: &mut lock(&rows),
                        lru: &mut lock(&lru),
                        indices: &mut lock(&idx),
                        valid_counts: &mut lock(&valid),
                        hit_counts: &mut lock(&hits),
                        miss_counts: &mut lock(&misses),
                        miss_src: &mut lock(&msrc),
                        miss_dst: &mut lock(&mdst),
                        idx_mapping: None,
                        stats: stats.as_deref_mut(),
                    },
                )
            }),
        )
    }

    fn gather_rows(
        &self,
        stream: &LagStream,
        desc: &GatherDesc<'_>,
        a: GatherArgs<'_, LagBuffer, LagBuffer>,
    ) -> Result<(), CpuError> {
        let (num_tokens, top_k, layers) = (desc.num_tokens, desc.top_k, desc.layers.to_vec());
        let (src, dst, counts, host, dev) = (
            a.plan_src.clone(),
            a.plan_dst.clone(),
            a.plan_counts.clone(),
            a.host.clone(),
            a.device.clone(),
        );
        self.submit(
            stream,
            Box::new(move |cpu| {
                cpu.gather_rows(
                    &CpuStream,
                    &GatherDesc {
                        num_tokens,
                        top_k,
                        layers: &layers,
                    },
                    GatherArgs {
                        plan_src: &lock(&src),
                        plan_dst: &lock(&dst),
                        plan_counts: &lock(&counts),
                        host: &lock(&host),
                        device: &mut lock(&dev),
                    },
                )
            }),
        )
    }

    fn copy_pages(
        &self,
        stream: &LagStream,
        desc: &PageCopyDesc<'_>,
        pairs: &[BlockPair],
        host: &mut LagBuffer,
        device: &mut LagBuffer,
    ) -> Result<(), CpuError> {
        desc.check(pairs, host.byte_len(), device.byte_len())?;
        let (direction, layers): (Direction, Vec<LayerPair>) =
            (desc.direction, desc.layers.to_vec());
        let pairs = pairs.to_vec();
        let (h, d) = (host.clone(), device.clone());
        self.submit(
            stream,
            Box::new(move |cpu| {
                let desc = PageCopyDesc {
                    direction,
                    layers: &layers,
                };
                cpu.copy_pages(&CpuStream, &desc, &pairs, &mut lock(&h), &mut lock(&d))
            }),
        )
    }

    fn copy_rows(
        &self,
        stream: &LagStream,
        desc: &RowCopyDesc<'_>,
        spans: &[RowSpan],
        host: &mut LagBuffer,
        device: &mut LagBuffer,
    ) -> Result<(), CpuError> {
        desc.check(spans, host.byte_len(), device.byte_len())?;
        let (direction, layers): (Direction, Vec<LayerPair>) =
            (desc.direction, desc.layers.to_vec());
        let spans = spans.to_vec();
        let (h, d) = (host.clone(), device.clone());
        self.submit(
            stream,
            Box::new(move |cpu| {
                let desc = RowCopyDesc {
                    direction,
                    layers: &layers,
                };
                cpu.copy_rows(&CpuStream, &desc, &spans, &mut lock(&h), &mut lock(&d))
            }),
        )
    }

    fn indexer_backup(
        &self,
        stream: &LagStream,
        desc: &IndexerBackupDesc<'_>,
        a: IndexerBackupArgs<'_, LagBuffer, LagBuffer>,
    ) -> Result<(), CpuError> {
        desc.check(&a)?;
        let (num_tokens, layers) = (desc.num_tokens, desc.layers.to_vec());
        let (ds, hs, d, h) = (
            a.device_slots.clone(),
            a.host_slots.clone(),
            a.device.clone(),
            a.host.clone(),
        );
        // Queued like the other after-forward copies: it reads the slots and the pool when it
        // runs.
        self.submit(
            stream,
            Box::new(move |cpu| {
                let desc = IndexerBackupDesc {
                    num_tokens,
                    layers: &layers,
                };
                cpu.indexer_backup(
                    &CpuStream,
                    &desc,
                    IndexerBackupArgs {
                        device_slots: &lock(&ds),
                        host_slots: &lock(&hs),
                        device: &lock(&d),
                        host: &mut lock(&h),
                    },
                )
            }),
        )
    }

    fn copy_host_pages(
        &self,
        stream: &LagStream,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &mut LagBuffer,
    ) -> Result<(), CpuError> {
        assert_eq!(stream.0, 0, "host copy-on-write runs on the compute stream");
        self.cpu
            .copy_host_pages(&CpuStream, layers, pairs, &mut lock(host))
    }

    fn invalidate(
        &self,
        stream: &LagStream,
        desc: &InvalidateDesc,
        a: InvalidateArgs<'_, LagBuffer>,
    ) -> Result<(), CpuError> {
        assert_eq!(stream.0, 0, "invalidation runs on the compute stream");
        let ranges = lock(a.ranges);
        let mut slot_host_rows = lock(a.slot_host_rows);
        self.cpu.invalidate(
            &CpuStream,
            desc,
            InvalidateArgs {
                ranges: &ranges,
                slot_host_rows: &mut slot_host_rows,
            },
        )
    }

    fn compressed_slot_mapping(
        &self,
        stream: &LagStream,
        desc: &SlotMappingDesc,
        a: SlotMappingArgs<'_, LagBuffer>,
    ) -> Result<(), CpuError> {
        assert_eq!(stream.0, 0, "slot mapping runs on the compute stream");
        let (p, s, r, t) = (
            lock(a.positions),
            lock(a.slot_mapping),
            lock(a.table_row),
            lock(a.block_table),
        );
        let mut out = lock(a.out);
        self.cpu.compressed_slot_mapping(
            &CpuStream,
            desc,
            SlotMappingArgs {
                positions: &p,
                slot_mapping: &s,
                table_row: &r,
                block_table: &t,
                out: &mut out,
            },
        )
    }
}
