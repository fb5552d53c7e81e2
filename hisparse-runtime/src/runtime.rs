//! [`Runtime`]: the state it keeps on the device and how it is built.

use std::collections::VecDeque;

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::{LayerPair, PageLayout};

use crate::config::RuntimeConfig;
use crate::counters::Counters;
use crate::error::RuntimeError;
use crate::indexer::IndexerCache;
use crate::slots::SlotMapping;
use crate::stats::DeviceStats;
use crate::streams::StreamId;
use crate::tables::Tables;

/// The KV pools the runtime executes on: the GPU pool every GPU group's blocks live in, and the
/// pinned host pool holding every sparse layer's durable rows.
pub struct Pools<D: Device> {
    /// `num_gpu_blocks × bytes_per_block` bytes of device memory.
    pub device: D::Buffer,
    /// `host_num_blocks × host_block_stride` bytes of pinned host memory.
    pub host: D::HostBuffer,
}

/// The hot state and per-call buffers of one index group.
pub(crate) struct GroupState<D: Device> {
    /// `i32[state_rows][hot_slots]`: flat host row cached per hot slot.
    pub(crate) slot_host_rows: D::Buffer,
    /// `u16[state_rows][hot_slots]`: LRU order of the hot slots.
    pub(crate) lru: D::Buffer,
    /// Layer pairs of the group, leader first.
    pub(crate) pairs: Vec<LayerPair>,
    /// Model layers of the group, leader first.
    pub(crate) layers: Vec<u32>,
    pub(crate) bucket: u32,
    /// The group's own miss plan (`src`, `dst`), kept when it has followers that apply it after
    /// other groups resolved; groups without followers use the runtime's shared plan.
    pub(crate) plan: Option<(D::Buffer, D::Buffer)>,
    /// `i32[max_step_tokens]` per-row hit, miss and valid counts of this step's call.
    pub(crate) hits: D::Buffer,
    pub(crate) misses: D::Buffer,
    pub(crate) valid: D::Buffer,
    /// This step's call: token rows, and whether it resolved (`false` = remap).
    pub(crate) call: Option<GroupCall>,
}

/// What one index group did in the current step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupCall {
    pub(crate) tokens: u32,
    pub(crate) resolved: bool,
}

/// The step between [`Runtime::begin_step`] and [`Runtime::end_step`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpenStep {
    pub(crate) step: u64,
    /// The stream `begin_step_on` ran on.
    pub(crate) stream: Option<StreamId>,
    pub(crate) fully_resident: bool,
    pub(crate) sampled: bool,
}

/// The HiSparse engine runtime: executes each step's coordinator command on a [`Device`].
///
/// See the crate docs for the per-step sequence. All device work is enqueued on two streams:
/// the *compute* stream (before-forward updates and the per-layer decode path, in order with the
/// engine's forward pass when the engine passes its own stream) and the *copy* stream (the
/// after-forward mirrors and spills, which wait for the forward pass through an event).
pub struct Runtime<D: Device> {
    pub(crate) dev: D,
    pub(crate) kv: KvCacheConfig,
    pub(crate) cfg: RuntimeConfig,
    pub(crate) compute: D::Stream,
    pub(crate) copy: D::Stream,
    pub(crate) pools: Pools<D>,
    pub(crate) tables: Tables<D>,
    pub(crate) groups: Vec<GroupState<D>>,
    /// Layer pairs of each bucket (page transfers, mirrors, restores).
    pub(crate) bucket_pairs: Vec<Vec<LayerPair>>,
    /// Host layouts of every sparse layer (host copy-on-write).
    pub(crate) host_layers: Vec<PageLayout>,
    /// The indexer host cache (`None` without an indexer layer): indexer keys kept as durable
    /// as the KV rows.
    pub(crate) indexer: Option<IndexerCache<D>>,
    /// Shared miss plan of groups without followers.
    pub(crate) plan_src: D::Buffer,
    pub(crate) plan_dst: D::Buffer,
    /// `i32[max_step_tokens]`: token row → state row of the current batch ([`Runtime::set_batch`]).
    pub(crate) batch: D::Buffer,
    /// Token rows of the batch set this step, and whether every request in it is fully
    /// resident (then the batch takes the remap even when other scheduled requests do not).
    pub(crate) batch_len: Option<u32>,
    pub(crate) batch_fully_resident: bool,
    /// Per state row: whether a request scheduled in the open step holds it, and whether that
    /// request is fully resident.
    pub(crate) row_scheduled: Vec<bool>,
    pub(crate) row_fully_resident: Vec<bool>,
    /// Entries of `batch` that may hold a state row (the rest are `-1`).
    pub(crate) batch_written: u32,
    /// Token-row counts of the per-layer calls captured into graphs (sorted, distinct).
    pub(crate) captured_tokens: Vec<u32>,
    /// The step's slot mapping.
    pub(crate) slots: SlotMapping<D>,
    /// Streams the engine lent ([`Runtime::adopt_stream`]).
    pub(crate) lent_streams: Vec<D::Stream>,
    /// The step of the last command begun, for the order check.
    pub(crate) last_step: Option<u64>,
    /// An event after the open step's before-forward work, recorded when a per-layer call runs
    /// on another stream than `begin_step_on`'s.
    pub(crate) step_begun: Option<D::Event>,
    /// The stream of the open step's last per-layer resolve that ran outside a capture, once
    /// one has: a later one on another stream is ordered after it, and `end_step` after the
    /// last (they share the miss-plan scratch and each group's counters).
    pub(crate) last_resolve_on: Option<Option<StreamId>>,
    /// The events of that ordering, kept until the step ends.
    pub(crate) resolve_order: Vec<D::Event>,
    /// `i32[2 * capacity]` invalidation ranges, grown on demand.
    pub(crate) ranges: D::Buffer,
    pub(crate) ranges_capacity: usize,
    pub(crate) open: Option<OpenStep>,
    /// Transfer batches enqueued on the copy stream, oldest first.
    pub(crate) in_flight: VecDeque<(u64, D::Event)>,
    /// Transfer ids enqueued but not yet reported to the coordinator.
    pub(crate) unreported: Vec<u64>,
    /// The decode path's counters on the device and their way to the host.
    pub(crate) stats: DeviceStats<D>,
    pub(crate) counters: Counters,
    /// Scratch lists reused every step.
    pub(crate) scratch_rows: Vec<Vec<u32>>,
    pub(crate) scratch_i32: Vec<i32>,
}

impl<D: Device> Runtime<D> {
    /// Allocates the layout's pools on `dev` and builds a runtime over them.
    ///
    /// Everything the runtime will allocate is checked against [`Device::memory_info`] first
    /// (where the backend reports it): a layout that cannot fit fails with
    /// [`RuntimeError::NotEnoughMemory`] before any memory is taken.
    pub fn new(
        dev: D,
        kv: KvCacheConfig,
        cfg: RuntimeConfig,
    ) -> Result<Self, RuntimeError<D::Error>> {
        let state = Self::check_config(&kv, &cfg)?;
        let device_pool = kv.gpu_pool_bytes();
        let host_pool = kv.host_pool_bytes();
        Self::check_memory(
            &dev,
            device_pool + state,
            host_pool + IndexerCache::<D>::bytes(&kv),
        )?;
        let pools = Pools {
            device: dev
                .alloc(to_usize(device_pool)?)
                .map_err(RuntimeError::device("allocating the device pool"))?,
            host: dev
                .alloc_pinned(to_usize(host_pool)?)
                .map_err(RuntimeError::device("allocating the pinned host pool"))?,
        };
        Self::build(dev, kv, cfg, pools, None)
    }

    /// Builds a runtime over pools the engine already owns and lends it (e.g. PyTorch tensors'
    /// memory), and optionally the engine's own compute stream (e.g. PyTorch's current stream,
    /// lent to the backend); the runtime then enqueues its before-forward and decode-path work on it, in
    /// order with the engine's forward pass.
    ///
    /// The pools must be at least the layout's sizes ([`KvCacheConfig::gpu_pool_bytes`],
    /// [`KvCacheConfig::host_pool_bytes`]); their contents are used as they are. The indexer
    /// host cache ([`Runtime::indexer_host_cache`]) is the runtime's own either way.
    pub fn with_pools(
        dev: D,
        kv: KvCacheConfig,
        cfg: RuntimeConfig,
        pools: Pools<D>,
        compute_stream: Option<D::Stream>,
    ) -> Result<Self, RuntimeError<D::Error>> {
        use hisparse_core::ops::BufferLen;
        let state = Self::check_config(&kv, &cfg)?;
        for (what, needed, available) in [
            ("device pool", kv.gpu_pool_bytes(), pools.device.byte_len()),
            ("host pool", kv.host_pool_bytes(), pools.host.byte_len()),
        ] {
            if available < needed {
                return Err(RuntimeError::PoolTooSmall {
                    what,
                    needed,
                    available,
                });
            }
        }
        let addr = dev.pinned_address(&pools.host);
        if !addr.is_multiple_of(hisparse_core::ops::PINNED_ALIGNMENT) {
            return Err(RuntimeError::Config {
                field: "pools.host",
                reason: format!(
                    "the host pool starts at {addr:#x}, not a multiple of {} bytes; pass page-aligned pinned memory",
                    hisparse_core::ops::PINNED_ALIGNMENT
                ),
            });
        }
        Self::check_memory(&dev, state, IndexerCache::<D>::bytes(&kv))?;
        Self::build(dev, kv, cfg, pools, compute_stream)
    }

    /// Checks the configuration against the layout; returns the device bytes of the runtime's
    /// own state (tables, hot states, plans, counters).
    fn check_config(
        kv: &KvCacheConfig,
        cfg: &RuntimeConfig,
    ) -> Result<u64, RuntimeError<D::Error>> {
        if cfg.state_rows == 0 {
            return Err(RuntimeError::Config {
                field: "state_rows",
                reason: "must be at least 1 (the coordinator's max_running)".into(),
            });
        }
        if cfg.max_step_tokens == 0 {
            return Err(RuntimeError::Config {
                field: "max_step_tokens",
                reason: "must be at least 1 (token rows per per-layer call)".into(),
            });
        }
        if cfg.max_batched_tokens < cfg.max_step_tokens {
            return Err(RuntimeError::Config {
                field: "max_batched_tokens",
                reason: format!(
                    "{} is below max_step_tokens ({}): a step computes at least the token rows of its per-layer calls; pass the coordinator's max_batched_tokens",
                    cfg.max_batched_tokens, cfg.max_step_tokens
                ),
            });
        }
        let hot_width = kv.resolve_desc(1, cfg.state_rows).hot_table_width();
        if hot_width != kv.hot_blocks_per_request {
            return Err(RuntimeError::Command(format!(
                "the layout gives {} hot blocks per request but the resolver reads {hot_width} \
                 ({} hot slots of {}-row blocks); re-plan the layout",
                kv.hot_blocks_per_request, kv.device_buffer_size, kv.block_size
            )));
        }
        let rows = u64::from(cfg.state_rows);
        let slots = u64::from(kv.device_buffer_size);
        let groups = kv.index_groups.len() as u64;
        let t = u64::from(cfg.max_step_tokens);
        let k = u64::from(kv.config.top_k);
        let with_followers = kv
            .index_groups
            .iter()
            .filter(|g| g.layers.len() > 1)
            .count() as u64;
        let bytes = Tables::<D>::bytes(kv, cfg.state_rows, hot_width)
            + groups * rows * slots * 6
            + groups * t * 12
            + (1 + with_followers) * t * k * 8
            + t * 4
            + SlotMapping::<D>::bytes(kv, cfg.max_batched_tokens)
            + DeviceStats::<D>::bytes(kv);
        Ok(bytes)
    }

    /// Refuses allocations the device cannot hold, before any is made — after waiting for the
    /// pools this process dropped a moment ago and is still releasing
    /// ([`hisparse_host_memory::check_after_releases`]).
    fn check_memory(dev: &D, device: u64, host: u64) -> Result<(), RuntimeError<D::Error>> {
        hisparse_host_memory::check_after_releases(|| Self::check_memory_now(dev, device, host))
    }

    fn check_memory_now(dev: &D, device: u64, host: u64) -> Result<(), RuntimeError<D::Error>> {
        let Some(info) = dev.memory_info() else {
            return Ok(());
        };
        if info.unified {
            let needed = device.saturating_add(host);
            if needed > info.host_available {
                return Err(RuntimeError::NotEnoughMemory {
                    what: "host (this backend's device memory is host memory)",
                    needed,
                    available: info.host_available,
                });
            }
            return Ok(());
        }
        if device > info.device_free {
            return Err(RuntimeError::NotEnoughMemory {
                what: "device",
                needed: device,
                available: info.device_free,
            });
        }
        if host > info.host_available {
            return Err(RuntimeError::NotEnoughMemory {
                what: "host",
                needed: host,
                available: info.host_available,
            });
        }
        Ok(())
    }

    fn build(
        dev: D,
        kv: KvCacheConfig,
        cfg: RuntimeConfig,
        pools: Pools<D>,
        compute_stream: Option<D::Stream>,
    ) -> Result<Self, RuntimeError<D::Error>> {
        let err = RuntimeError::device;
        let rows = cfg.state_rows as usize;
        let n = kv.device_buffer_size as usize;
        let t = cfg.max_step_tokens as usize;
        let k = kv.config.top_k as usize;
        let hot_width = kv.hot_blocks_per_request;
        let tables = Tables::new(&dev, &kv, cfg.state_rows, hot_width)?;
        let alloc = |bytes: usize, what: &'static str| dev.alloc(bytes.max(4)).map_err(err(what));
        let mut groups = Vec::with_capacity(kv.index_groups.len());
        let empty_slot_host_rows = vec![-1i32; rows * n];
        let identity: Vec<u16> = (0..rows).flat_map(|_| 0..n as u16).collect();
        for (g, ig) in kv.index_groups.iter().enumerate() {
            let mut slot_host_rows = alloc(rows * n * 4, "allocating hot state")?;
            dev.upload_i32(&mut slot_host_rows, 0, &empty_slot_host_rows)
                .map_err(err("initialising hot state"))?;
            let mut lru = alloc(rows * n * 2, "allocating hot state")?;
            dev.upload_u16(&mut lru, 0, &identity)
                .map_err(err("initialising hot state"))?;
            let plan = if ig.layers.len() > 1 {
                Some((
                    alloc(t * k * 4, "allocating a miss plan")?,
                    alloc(t * k * 4, "allocating a miss plan")?,
                ))
            } else {
                None
            };
            groups.push(GroupState {
                slot_host_rows,
                lru,
                pairs: kv.index_group_pairs(g)?,
                layers: ig.layers.clone(),
                bucket: ig.bucket,
                plan,
                hits: alloc(t * 4, "allocating counters")?,
                misses: alloc(t * 4, "allocating counters")?,
                valid: alloc(t * 4, "allocating counters")?,
                call: None,
            });
        }
        let bucket_pairs = (0..kv.num_buckets)
            .map(|b| kv.bucket_layer_pairs(b))
            .collect::<Result<Vec<_>, _>>()?;
        let host_layers = kv
            .all_layer_pairs()
            .iter()
            .map(|p| p.host)
            .collect::<Vec<_>>();
        let compute = match compute_stream {
            Some(s) => s,
            None => dev
                .create_stream()
                .map_err(err("creating the compute stream"))?,
        };
        let copy = dev
            .create_stream()
            .map_err(err("creating the copy stream"))?;
        let ranges_capacity = 256;
        let indexer = IndexerCache::new(&dev, &kv)?;
        Ok(Runtime {
            indexer,
            plan_src: alloc(t * k * 4, "allocating the miss plan")?,
            plan_dst: alloc(t * k * 4, "allocating the miss plan")?,
            batch: {
                let mut b = alloc(t * 4, "allocating the batch table")?;
                dev.upload_i32(&mut b, 0, &vec![-1; t])
                    .map_err(err("initialising the batch table"))?;
                b
            },
            batch_written: 0,
            captured_tokens: Vec::new(),
            slots: SlotMapping::new(&dev, &kv, cfg.max_batched_tokens)?,
            lent_streams: Vec::new(),
            last_step: None,
            step_begun: None,
            last_resolve_on: None,
            resolve_order: Vec::new(),
            batch_len: None,
            batch_fully_resident: false,
            row_scheduled: vec![false; rows],
            row_fully_resident: vec![false; rows],
            ranges: alloc(ranges_capacity * 8, "allocating invalidation ranges")?,
            ranges_capacity,
            open: None,
            in_flight: VecDeque::new(),
            unreported: Vec::new(),
            stats: DeviceStats::new(&dev, &kv)?,
            counters: Counters::default(),
            scratch_rows: vec![Vec::new(); kv.index_groups.len()],
            scratch_i32: Vec::new(),
            bucket_pairs,
            host_layers,
            groups,
            tables,
            pools,
            compute,
            copy,
            cfg,
            kv,
            dev,
        })
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The layout the runtime executes.
    pub fn layout(&self) -> &KvCacheConfig {
        &self.kv
    }

    /// The configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.cfg
    }

    /// The pools.
    pub fn pools(&self) -> &Pools<D> {
        &self.pools
    }

    /// The device and the pools, mutably (for an engine that writes its forward pass's KV rows
    /// into the device pool through the same device, and for tests).
    pub fn device_and_pools_mut(&mut self) -> (&D, &mut Pools<D>) {
        (&self.dev, &mut self.pools)
    }

    /// The compute stream: before-forward work and the decode path run on it. An engine that
    /// did not pass its own stream orders its forward pass after this stream's work.
    pub fn compute_stream(&self) -> &D::Stream {
        &self.compute
    }

    /// The copy stream the after-forward mirrors and spills run on.
    pub fn copy_stream(&self) -> &D::Stream {
        &self.copy
    }

    /// Totals since the runtime was built, as of the last [`Runtime::poll`] (exact after
    /// [`Runtime::drain`]): the decode path's hits, misses, rows and calls are counted on the
    /// device (graph replays included) and folded in as their snapshots reach the host.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Transfer batches enqueued and not yet seen complete.
    pub fn pending_transfers(&self) -> usize {
        self.in_flight.len()
    }

    /// The device resident table of `bucket`: `i32[state_rows][max_pages_per_request]`, page →
    /// GPU block, `0` for pages read from host.
    pub fn resident_table(&self, bucket: u32) -> Option<&D::Buffer> {
        self.tables.resident.get(bucket as usize).map(|t| &t.buf)
    }

    /// The device host table: `i32[state_rows][max_pages_per_request]`, page → host block, `-1`
    /// for none.
    pub fn host_table(&self) -> &D::Buffer {
        &self.tables.host.buf
    }

    /// The device hot table of `bucket`: `i32[state_rows][hot_blocks_per_request]`.
    pub fn hot_table(&self, bucket: u32) -> Option<&D::Buffer> {
        self.tables.hot.get(bucket as usize).map(|t| &t.buf)
    }

    /// The device block table of the indexer group (the engine's indexer kernels read it):
    /// `i32[state_rows][max_pages_per_request]`, `0` for none.
    pub fn indexer_table(&self) -> &D::Buffer {
        &self.tables.indexer.buf
    }

    /// The device block table of layout group `group` when it is a regular group.
    pub fn regular_table(&self, group: usize) -> Option<&D::Buffer> {
        let start = self.kv.regular_groups().start;
        group
            .checked_sub(start)
            .and_then(|i| self.tables.regular.get(i))
            .map(|t| &t.buf)
    }

    /// The device batch table [`Runtime::set_batch_on`] writes: `i32[max_step_tokens]`, token
    /// row → state row, `-1` for padding. Per-layer calls without their own state rows read it;
    /// it keeps its address for the runtime's life (graphs capture it).
    pub fn batch_buffer(&self) -> &D::Buffer {
        &self.batch
    }

    /// The device slot mapping of the open step: `i32[write groups][max_batched_tokens]`, for
    /// each write group ([`Runtime::slot_mapping_groups`]) and each token the step computes (the
    /// command's scheduled requests in order, each request's tokens in order) the row the token
    /// writes in the group's view ([`KvCacheConfig::layer_view`]), `-1` for a token that writes
    /// no row of the group (a compressed group between its rows) and beyond the step's tokens.
    /// Rewritten on the compute stream by every `begin_step`; it keeps its address.
    pub fn slot_mapping(&self) -> &D::Buffer {
        &self.slots.buf
    }

    /// The layout group of each row of [`Runtime::slot_mapping`]: every resident bucket, the
    /// indexer group, every regular group, in layout order.
    pub fn slot_mapping_groups(&self) -> Vec<usize> {
        self.slots.groups.iter().map(|&(g, _)| g).collect()
    }

    /// Tokens the open (or last) step computes: the valid prefix of each slot-mapping row.
    pub fn step_tokens(&self) -> u32 {
        self.slots.tokens
    }

    /// Token-row counts of the per-layer calls captured into graphs so far (what
    /// [`Runtime::set_batch_on`]'s `pad_to` may name).
    pub fn captured_token_rows(&self) -> &[u32] {
        &self.captured_tokens
    }

    /// The host shadow of the resident table row of `state_row` in `bucket` (what the device
    /// holds once the current step's updates are enqueued).
    pub fn resident_row(&self, bucket: u32, state_row: u32) -> Option<&[i32]> {
        let t = self.tables.resident.get(bucket as usize)?;
        (state_row < self.cfg.state_rows).then(|| t.row(state_row))
    }

    /// The indexer host cache: the keys of every indexer layer, the page of host block `h` for
    /// the page whose KV is in host block `h`, laid out as
    /// [`KvCacheConfig::indexer_layer_pair`]'s host side says (`None` when the layout has no
    /// indexer layer). Backups write it after the forward; an engine importing a request's KV
    /// writes the request's keys here, in the host blocks
    /// `Coordinator::reserve_import` named, before `complete_import` (the runtime restores
    /// them to the GPU when the request starts).
    pub fn indexer_host_cache(&self) -> Option<&D::HostBuffer> {
        self.indexer.as_ref().map(|c| &c.host)
    }

    /// [`Runtime::indexer_host_cache`], writable (an importer fills it), with the device.
    pub fn device_and_indexer_host_cache_mut(&mut self) -> (&D, Option<&mut D::HostBuffer>) {
        (&self.dev, self.indexer.as_mut().map(|c| &mut c.host))
    }

    /// The host shadow of the host table row of `state_row`.
    pub fn host_row(&self, state_row: u32) -> Option<&[i32]> {
        (state_row < self.cfg.state_rows).then(|| self.tables.host.row(state_row))
    }

    /// The host shadow of the indexer block table row of `state_row` (page → GPU block, `0`
    /// for none).
    pub fn indexer_row(&self, state_row: u32) -> Option<&[i32]> {
        (state_row < self.cfg.state_rows).then(|| self.tables.indexer.row(state_row))
    }
}

fn to_usize<E>(bytes: u64) -> Result<usize, RuntimeError<E>> {
    usize::try_from(bytes).map_err(|_| RuntimeError::Config {
        field: "layout",
        reason: format!("a pool of {bytes} bytes does not fit this machine's address space"),
    })
}
