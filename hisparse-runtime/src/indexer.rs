//! The indexer host cache and the copies that keep indexer keys as durable as the KV rows
//! (`hisparse_core::coordinator`'s `indexer.rs` plans them): after the forward, the step's
//! [`OffloadCommand::indexer_backups`] through [`Device::indexer_backup`] on the copy stream,
//! in the step's transfer batch (its slots staged on the compute stream, like every table the
//! runtime writes, in buffers reserved until the batch completes); before the forward,
//! [`OffloadCommand::indexer_restores`] and the indexer half of host copy-on-write.
//!
//! The cache is the runtime's own pinned buffer (`KvCacheConfig::indexer_host_pool_bytes`):
//! the page of host block `h` of every indexer layer holds the keys of the page whose KV is in
//! host block `h` (`KvCacheConfig::indexer_layer_pair`). Every rank keeps its own.
//!
//! [`OffloadCommand::indexer_backups`]: hisparse_core::coordinator::OffloadCommand::indexer_backups
//! [`OffloadCommand::indexer_restores`]: hisparse_core::coordinator::OffloadCommand::indexer_restores

use std::collections::VecDeque;

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::{
    BlockPair, Direction, IndexerBackupArgs, IndexerBackupDesc, LayerPair, PageCopyDesc,
    PageLayout, RowSpan, TableWrite, TableWriteDesc,
};

use crate::error::RuntimeError;

/// `i32[capacity]` device and host slots of one backup.
struct SlotBuffers<D: Device> {
    device: D::Buffer,
    host: D::Buffer,
    capacity: usize,
}

/// The indexer host cache, its layouts and the slot buffers of the backups.
pub(crate) struct IndexerCache<D: Device> {
    /// The cache (pinned host memory).
    pub(crate) host: D::HostBuffer,
    /// Row layouts of every indexer layer (device pool, host cache): what a backup copies.
    rows: Vec<LayerPair>,
    /// The same pages as one row each (a whole page, padding included): what restores and
    /// host copy-on-write copy. Pages sit on 16-byte boundaries and are multiples of 16 bytes,
    /// so the page copies take them whatever the indexer rows' size.
    pages: Vec<LayerPair>,
    /// The host side of `pages` (host copy-on-write).
    host_pages: Vec<PageLayout>,
    /// Slot buffers no batch uses, the ones staged for the open step's backup (and its rows),
    /// and those of batches in flight (by transfer id, oldest first): a batch's slots are
    /// read by its copy, which may run long after the next step staged its own.
    free: Vec<SlotBuffers<D>>,
    staged: Option<(SlotBuffers<D>, u32)>,
    in_flight: VecDeque<(u64, SlotBuffers<D>)>,
    device_writes: Vec<TableWrite>,
    host_writes: Vec<TableWrite>,
}

impl<D: Device> IndexerCache<D> {
    /// Host bytes of `kv`'s indexer host cache (0 without an indexer layer).
    pub(crate) fn bytes(kv: &KvCacheConfig) -> u64 {
        if kv.indexer_layer_pairs().is_empty() {
            0
        } else {
            kv.indexer_host_pool_bytes()
        }
    }

    /// The cache of `kv`, or `None` when it has no indexer layer.
    pub(crate) fn new(dev: &D, kv: &KvCacheConfig) -> Result<Option<Self>, RuntimeError<D::Error>> {
        let rows: Vec<LayerPair> = kv
            .indexer_layer_pairs()
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        if rows.is_empty() {
            return Ok(None);
        }
        let whole = |l: &PageLayout, page_bytes: u32| {
            PageLayout::contiguous(l.base, l.block_stride, l.num_blocks, 1, page_bytes)
        };
        let pages = rows
            .iter()
            .map(|p| {
                // The host page's stride is the page (padding included).
                let page = u32::try_from(p.host.block_stride).map_err(|_| {
                    RuntimeError::Command(format!(
                        "an indexer page of {} bytes is beyond what one page copy moves (4 GiB); re-plan the layout",
                        p.host.block_stride
                    ))
                })?;
                Ok(LayerPair {
                    host: whole(&p.host, page),
                    device: whole(&p.device, page),
                })
            })
            .collect::<Result<Vec<_>, RuntimeError<D::Error>>>()?;
        let bytes = usize::try_from(kv.indexer_host_pool_bytes()).map_err(|_| {
            RuntimeError::Command(
                "the indexer host cache does not fit this machine's address space".into(),
            )
        })?;
        Ok(Some(IndexerCache {
            host: dev
                .alloc_pinned(bytes.max(4))
                .map_err(RuntimeError::device("allocating the indexer host cache"))?,
            host_pages: pages.iter().map(|p| p.host).collect(),
            rows,
            pages,
            free: Vec::new(),
            staged: None,
            in_flight: VecDeque::new(),
            device_writes: Vec::new(),
            host_writes: Vec::new(),
        }))
    }

    /// Indexer rows per page.
    pub(crate) fn rows_per_page(&self) -> u32 {
        self.rows[0].device.block_size
    }

    /// Bytes of one page of every indexer layer.
    pub(crate) fn page_bytes(&self) -> u64 {
        self.pages.iter().map(|p| p.host.page_bytes()).sum()
    }

    /// Host → device page copies `pairs` (`src` host block, `dst` indexer GPU block) on
    /// `stream`.
    pub(crate) fn restore(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        pairs: &[BlockPair],
        device: &mut D::Buffer,
    ) -> Result<(), RuntimeError<D::Error>> {
        if pairs.is_empty() {
            return Ok(());
        }
        dev.copy_pages(
            stream,
            &PageCopyDesc {
                direction: Direction::HostToDevice,
                layers: &self.pages,
            },
            pairs,
            &mut self.host,
            device,
        )
        .map_err(RuntimeError::device("restoring indexer pages"))
    }

    /// Host copy-on-write of the indexer pages `pairs` (host block → host block) on `stream`.
    pub(crate) fn host_cow(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        pairs: &[BlockPair],
    ) -> Result<(), RuntimeError<D::Error>> {
        if pairs.is_empty() {
            return Ok(());
        }
        dev.copy_host_pages(stream, &self.host_pages, pairs, &mut self.host)
            .map_err(RuntimeError::device("indexer host copy-on-write"))
    }

    /// Stages the slots of the backups `spans` (`device_block`: indexer GPU block,
    /// `host_block`: the page's host block) on `stream` — the compute stream, before the
    /// forward's end is recorded, like every table the runtime writes — into a pair of slot
    /// buffers no batch in flight reads; returns the rows staged (per layer).
    pub(crate) fn stage(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        spans: &[RowSpan],
    ) -> Result<u64, RuntimeError<D::Error>> {
        let rows_per_page = u64::from(self.rows_per_page());
        self.device_writes.clear();
        self.host_writes.clear();
        for s in spans {
            for r in s.first_row..s.first_row.saturating_add(s.num_rows) {
                let slot = |block: u32| {
                    i32::try_from(u64::from(block) * rows_per_page + u64::from(r)).unwrap_or(-1)
                };
                let index = self.device_writes.len() as u32;
                self.device_writes.push(TableWrite {
                    index,
                    value: slot(s.device_block),
                });
                self.host_writes.push(TableWrite {
                    index,
                    value: slot(s.host_block),
                });
            }
        }
        let n = self.device_writes.len();
        if n == 0 {
            return Ok(0);
        }
        let err = RuntimeError::device;
        let mut bufs = match self.free.iter().position(|b| b.capacity >= n) {
            Some(i) => self.free.swap_remove(i),
            None => {
                let cap = n.next_power_of_two().max(256);
                SlotBuffers {
                    device: dev
                        .alloc(cap * 4)
                        .map_err(err("allocating indexer backup slots"))?,
                    host: dev
                        .alloc(cap * 4)
                        .map_err(err("allocating indexer backup slots"))?,
                    capacity: cap,
                }
            }
        };
        let desc = TableWriteDesc {
            table_len: bufs.capacity as u32,
        };
        dev.write_table(stream, &desc, &self.device_writes, &mut bufs.device)
            .and_then(|()| dev.write_table(stream, &desc, &self.host_writes, &mut bufs.host))
            .map_err(err("staging indexer backup slots"))?;
        self.staged = Some((bufs, n as u32));
        Ok(n as u64)
    }

    /// Enqueues the staged backup on `stream` (the copy stream, after the forward) as part of
    /// transfer batch `id`; its slot buffers stay reserved until [`IndexerCache::completed`]
    /// says the batch is done.
    pub(crate) fn backup(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        id: u64,
        device: &D::Buffer,
    ) -> Result<(), RuntimeError<D::Error>> {
        let Some((bufs, n)) = self.staged.take() else {
            return Ok(());
        };
        let r = dev.indexer_backup(
            stream,
            &IndexerBackupDesc {
                num_tokens: n,
                layers: &self.rows,
            },
            IndexerBackupArgs {
                device_slots: &bufs.device,
                host_slots: &bufs.host,
                device,
                host: &mut self.host,
            },
        );
        self.in_flight.push_back((id, bufs));
        r.map_err(RuntimeError::device("backing up indexer rows"))
    }

    /// Transfer batches up to `id` completed: their slot buffers are free again.
    pub(crate) fn completed(&mut self, id: u64) {
        while self.in_flight.front().is_some_and(|&(b, _)| b <= id) {
            if let Some((_, bufs)) = self.in_flight.pop_front() {
                self.free.push(bufs);
            }
        }
    }

    /// Bytes of one indexer row of every layer.
    pub(crate) fn row_bytes(&self) -> u64 {
        self.rows.iter().map(|p| u64::from(p.host.row_bytes)).sum()
    }
}
