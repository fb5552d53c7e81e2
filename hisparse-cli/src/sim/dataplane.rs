//! The data-plane side of the simulation: the device and host pools, the per-index-group hot
//! state, every device operation a decode step issues, and the byte-for-byte verification of what
//! attention reads. Generic over [`Device`], so every backend runs exactly this code.
//!
//! Verification: after a step's operations, the device pool is downloaded once and every output
//! index of remap/resolve is checked — a valid top-k token must map to a row whose bytes equal
//! the synthetic row of (request, layer, token) in every layer of the index group (leader and
//! followers), and an invalid token must map to `-1`.

use std::ops::Range;
use std::time::Instant;

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, InvalidateArgs, InvalidateDesc, LayerPair,
    PageCopyDesc, PageLayout, RemapArgs, RemapDesc, ResolveArgs, ResolveDesc, RowCopyDesc, RowSpan,
};

use super::kv;
use crate::error::{CliError, CliResult};

/// `i32`s as native-endian bytes (the device element format).
pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// Native-endian bytes as `i32`s.
pub fn bytes_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn dev_err<E: hisparse_core::Error>(what: &str) -> impl FnOnce(E) -> CliError + '_ {
    move |e| CliError::device(what, e)
}

/// What one request looks like to the data plane in one step.
#[derive(Clone, Debug)]
pub struct RequestView {
    /// State row of the request in every per-request table (stable while it runs).
    pub slot: u32,
    /// Unique id of the request (seeds its synthetic rows; never reused).
    pub uid: u64,
    /// Sparse rows (token positions; compressed positions for compressed layers) that exist after
    /// this step's writes: top-k entries below it must resolve to their row.
    pub seq_len: u32,
    /// Host block of each page (`-1`/`0` = none yet).
    pub host_blocks: Vec<i32>,
    /// Per bucket: GPU block of each page, or `≤ 0` when the page must be read from host.
    pub resident: Vec<Vec<i32>>,
    /// Per bucket: the hot region's GPU blocks (empty when the request has none).
    pub hot: Vec<Vec<i32>>,
}

/// Counters the data plane accumulates.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Rows checked byte for byte (one per layer per valid top-k entry).
    pub verified_rows: u64,
    /// Rows whose bytes differ, or that resolved to `-1` although the token exists, or to a row
    /// although it does not.
    pub mismatched_rows: u64,
    /// Top-k entries served from the hot buffer.
    pub hot_hits: u64,
    /// Top-k entries swapped in from host.
    pub misses: u64,
    /// Top-k entries served by resident pages.
    pub resident_reads: u64,
    /// Bytes copied host → device (gathers and restores).
    pub h2d_bytes: u64,
    /// Bytes copied device → host (mirrors and backups).
    pub d2h_bytes: u64,
    /// Seconds spent in device operations (enqueue + synchronise).
    pub device_seconds: f64,
    /// Resolve calls.
    pub resolve_calls: u64,
    /// Remap calls (fully-resident path).
    pub remap_calls: u64,
    /// First mismatch, described.
    pub first_mismatch: Option<String>,
}

/// Per-index-group device state: the hot-slot contents and LRU orders of every state row.
struct GroupState<D: Device> {
    dgi: D::Buffer,
    lru: D::Buffer,
    /// Layer pairs of the group (leader first).
    pairs: Vec<LayerPair>,
    /// Model layers of the group (leader first).
    layers: Vec<u32>,
    bucket: u32,
}

/// Outputs of one attention read, kept for verification.
struct ReadOut {
    group: usize,
    /// (uid, seq_len) per token row.
    rows: Vec<(u64, u32)>,
    topk: Vec<i32>,
    indices: Vec<i32>,
}

/// Buffers of one step's reads, allocated once at their largest size and reused.
struct StepBuffers<D: Device> {
    req_id: D::Buffer,
    host_table: D::Buffer,
    resident: Vec<D::Buffer>,
    hot: Vec<D::Buffer>,
    /// Per index group: its top-k and the outputs read back after the step (so every group's
    /// operations are enqueued back to back, with one synchronisation per step).
    per_group: Vec<GroupBuffers<D>>,
    counts: D::Buffer,
    miss_src: D::Buffer,
    miss_dst: D::Buffer,
}

/// The per-index-group part of [`StepBuffers`].
struct GroupBuffers<D: Device> {
    topk: D::Buffer,
    indices: D::Buffer,
    hits: D::Buffer,
    misses: D::Buffer,
}

/// The pools, the hot state and the operations.
pub struct DataPlane<'d, D: Device> {
    dev: &'d D,
    stream: D::Stream,
    kv: KvCacheConfig,
    device_pool: D::Buffer,
    host_pool: D::HostBuffer,
    groups: Vec<GroupState<D>>,
    /// Layer pairs of each bucket's layers.
    bucket_pairs: Vec<Vec<LayerPair>>,
    /// Layer pairs of every sparse layer with its model layer id.
    layer_pairs: Vec<(u32, LayerPair)>,
    slots: u32,
    /// Per slot: (uid, hot blocks per bucket) the hot state was last reset for.
    hot_owner: Vec<Option<(u64, Vec<Vec<i32>>)>>,
    pending: Vec<ReadOut>,
    /// Counters.
    pub counters: Counters,
    scratch: Vec<u8>,
    bufs: StepBuffers<D>,
    /// Host copy of the device pool for verification (only referenced blocks are refreshed).
    pool_copy: Vec<u8>,
    /// Rows below this position hold the shared prompt prefix: their content is the same for
    /// every request (synthetic request id 0), as a real prefix's KV would be.
    shared_rows: u32,
}

/// The synthetic identity of row `pos` of request `uid` when the first `shared_rows` rows are a
/// prefix every request shares.
fn row_owner(uid: u64, pos: u32, shared_rows: u32) -> u64 {
    if pos < shared_rows { 0 } else { uid }
}

impl<'d, D: Device> DataPlane<'d, D> {
    /// Allocates the device and host pools of `kv` and hot state for `slots` concurrent requests.
    pub fn new(dev: &'d D, kv: &KvCacheConfig, slots: u32) -> CliResult<Self> {
        let stream = dev.create_stream().map_err(dev_err("creating a stream"))?;
        let device_pool = dev
            .alloc(kv.gpu_pool_bytes() as usize)
            .map_err(dev_err("allocating the device pool"))?;
        let host_pool = dev
            .alloc_pinned(kv.host_pool_bytes() as usize)
            .map_err(dev_err("allocating the pinned host pool"))?;
        let n = kv.device_buffer_size as usize;
        let mut groups = Vec::new();
        for (g, ig) in kv.index_groups.iter().enumerate() {
            let pairs = kv
                .index_group_pairs(g)
                .map_err(|e| CliError::failed(e.to_string()))?;
            let mut dgi = dev
                .alloc(slots as usize * n * 4)
                .map_err(dev_err("allocating hot state"))?;
            dev.upload(&mut dgi, 0, &i32_bytes(&vec![-1; slots as usize * n]))
                .map_err(dev_err("initialising hot state"))?;
            let lru_init: Vec<u8> = (0..slots)
                .flat_map(|_| (0..n as u16).flat_map(|s| s.to_ne_bytes()))
                .collect();
            let mut lru = dev
                .alloc(lru_init.len())
                .map_err(dev_err("allocating hot state"))?;
            dev.upload(&mut lru, 0, &lru_init)
                .map_err(dev_err("initialising hot state"))?;
            groups.push(GroupState {
                dgi,
                lru,
                pairs,
                layers: ig.layers.clone(),
                bucket: ig.bucket,
            });
        }
        let bucket_pairs = (0..kv.num_buckets)
            .map(|b| {
                kv.groups[kv.resident_group(b)]
                    .layers
                    .iter()
                    .map(|l| kv.layer_pair(l.layer))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CliError::failed(e.to_string()))?;
        let layer_pairs = kv.groups[KvCacheConfig::SOURCE_GROUP]
            .layers
            .iter()
            .map(|l| kv.layer_pair(l.layer).map(|p| (l.layer, p)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CliError::failed(e.to_string()))?;
        let (t, k) = (slots as usize, kv.config.top_k as usize);
        let m = kv.max_pages_per_request.max(1) as usize;
        let w = kv.hot_blocks_per_request as usize;
        let a = |bytes: usize| {
            dev.alloc(bytes.max(4))
                .map_err(dev_err("allocating step buffers"))
        };
        let bufs = StepBuffers {
            req_id: a(t * 4)?,
            host_table: a(t * m * 4)?,
            resident: (0..kv.num_buckets)
                .map(|_| a(t * m * 4))
                .collect::<CliResult<_>>()?,
            hot: (0..kv.num_buckets)
                .map(|_| a(t * w * 4))
                .collect::<CliResult<_>>()?,
            per_group: (0..kv.index_groups.len())
                .map(|_| {
                    Ok(GroupBuffers {
                        topk: a(t * k * 4)?,
                        indices: a(t * k * 4)?,
                        hits: a(t * 4)?,
                        misses: a(t * 4)?,
                    })
                })
                .collect::<CliResult<_>>()?,
            counts: a(t * 4)?,
            miss_src: a(t * k * 4)?,
            miss_dst: a(t * k * 4)?,
        };
        Ok(DataPlane {
            bufs,
            pool_copy: Vec::new(),
            shared_rows: 0,
            dev,
            stream,
            kv: kv.clone(),
            device_pool,
            host_pool,
            groups,
            bucket_pairs,
            layer_pairs,
            slots,
            hot_owner: vec![None; slots as usize],
            pending: Vec::new(),
            counters: Counters::default(),
            scratch: Vec::new(),
        })
    }

    /// Declares the first `rows` rows of every request a shared prefix (same bytes for all).
    pub fn set_shared_prefix_rows(&mut self, rows: u32) {
        self.shared_rows = rows;
    }

    fn timed<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&Self) -> Result<T, D::Error>,
    ) -> CliResult<T> {
        let t = Instant::now();
        let r = f(self).map_err(|e| CliError::device(what, e))?;
        self.counters.device_seconds += t.elapsed().as_secs_f64();
        Ok(r)
    }

    /// Waits for all enqueued work (counted as device time).
    pub fn synchronize(&mut self) -> CliResult<()> {
        self.timed("synchronising", |s| s.dev.synchronize(&s.stream))
    }

    /// Writes the synthetic rows `positions` of request `uid` into its resident pages in every
    /// sparse layer, as the model's forward pass would (`block_of(bucket, page)` = GPU block).
    /// Not counted as device time: this is the model, not HiSparse.
    pub fn write_rows(
        &mut self,
        uid: u64,
        positions: Range<u32>,
        block_of: impl Fn(u32, u32) -> Option<i32>,
    ) -> CliResult<()> {
        let bs = self.kv.block_size;
        let rb = self.kv.row_bytes as usize;
        let mut p = positions.start;
        while p < positions.end {
            let page = p / bs;
            let end = positions.end.min((page + 1) * bs);
            let (r0, r1) = (p % bs, (end - 1) % bs + 1);
            for b in 0..self.kv.num_buckets {
                let Some(block) = block_of(b, page).filter(|&x| x > 0) else {
                    return Err(CliError::failed(format!(
                        "simulation: request {uid} page {page} has no resident block in bucket {b} to write into"
                    )));
                };
                for li in 0..self.bucket_pairs[b as usize].len() {
                    let pair = self.bucket_pairs[b as usize][li];
                    let layer = self.kv.groups[self.kv.resident_group(b)].layers[li].layer;
                    self.write_layer_rows(
                        uid,
                        layer,
                        &pair.device,
                        block as u32,
                        page,
                        r0..r1,
                        rb,
                    )?;
                }
            }
            p = end;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write_layer_rows(
        &mut self,
        uid: u64,
        layer: u32,
        l: &PageLayout,
        block: u32,
        page: u32,
        rows: Range<u32>,
        rb: usize,
    ) -> CliResult<()> {
        let vb = l.value_bytes as usize;
        let sb = rb - vb;
        let n = (rows.end - rows.start) as usize;
        let pos0 = page * l.block_size;
        // Value parts of consecutive rows are contiguous, and so are scale parts.
        let mut values = std::mem::take(&mut self.scratch);
        values.clear();
        values.resize(n * vb, 0);
        let mut scales = vec![0u8; n * sb];
        for (i, r) in rows.clone().enumerate() {
            let seed = kv::row_seed(row_owner(uid, pos0 + r, self.shared_rows), layer, pos0 + r);
            kv::fill(seed, 0, &mut values[i * vb..(i + 1) * vb]);
            if sb > 0 {
                kv::fill(seed, vb, &mut scales[i * sb..(i + 1) * sb]);
            }
        }
        let [(voff, _), (soff, _)] = l.row_parts(block, rows.start);
        let r = self
            .dev
            .upload(&mut self.device_pool, voff as usize, &values)
            .and_then(|()| {
                if sb > 0 {
                    self.dev
                        .upload(&mut self.device_pool, soff as usize, &scales)
                } else {
                    Ok(())
                }
            });
        self.scratch = values;
        r.map_err(|e| CliError::device("writing KV rows", e))
    }

    /// Row mirrors / partial copies device → host for the layers of `bucket`.
    pub fn mirror_rows(&mut self, bucket: u32, spans: &[RowSpan]) -> CliResult<()> {
        if spans.is_empty() {
            return Ok(());
        }
        let layers = self.bucket_pairs[bucket as usize].clone();
        let rows: u64 = spans.iter().map(|s| u64::from(s.num_rows)).sum();
        self.counters.d2h_bytes += rows * u64::from(self.kv.row_bytes) * layers.len() as u64;
        let desc = RowCopyDesc {
            direction: Direction::DeviceToHost,
            layers: &layers,
        };
        let t = Instant::now();
        self.dev
            .copy_rows(
                &self.stream,
                &desc,
                spans,
                &mut self.host_pool,
                &mut self.device_pool,
            )
            .map_err(dev_err("mirroring rows to host"))?;
        self.counters.device_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Whole-page copies for the layers of `bucket` (`src`/`dst` per `direction`).
    pub fn copy_pages(
        &mut self,
        bucket: u32,
        direction: Direction,
        pairs: &[BlockPair],
    ) -> CliResult<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let layers = self.bucket_pairs[bucket as usize].clone();
        let bytes = pairs.len() as u64 * layers.iter().map(|l| l.host.page_bytes()).sum::<u64>();
        match direction {
            Direction::DeviceToHost => self.counters.d2h_bytes += bytes,
            Direction::HostToDevice => self.counters.h2d_bytes += bytes,
        }
        let desc = PageCopyDesc {
            direction,
            layers: &layers,
        };
        let t = Instant::now();
        self.dev
            .copy_pages(
                &self.stream,
                &desc,
                pairs,
                &mut self.host_pool,
                &mut self.device_pool,
            )
            .map_err(dev_err("copying pages"))?;
        self.counters.device_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Host → host page copies (copy-on-write) for every sparse layer.
    pub fn copy_host_pages(&mut self, pairs: &[BlockPair]) -> CliResult<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let layers: Vec<PageLayout> = self.layer_pairs.iter().map(|(_, p)| p.host).collect();
        let t = Instant::now();
        self.dev
            .copy_host_pages(&self.stream, &layers, pairs, &mut self.host_pool)
            .map_err(dev_err("copy-on-write of host pages"))?;
        self.counters.device_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Marks the hot state of `slot` stale: the next read resets it (LRU identity, `dgi` all
    /// `-1`) before use. Called for hot regions given out or released and rows restarted.
    pub fn forget_hot_state(&mut self, slot: u32) {
        if let Some(o) = self.hot_owner.get_mut(slot as usize) {
            *o = None;
        }
    }

    /// Copies whole GPU blocks (GPU copy-on-write).
    pub fn copy_gpu_blocks(&mut self, pairs: &[BlockPair]) -> CliResult<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let bpb = self.kv.bytes_per_block as usize;
        let t = Instant::now();
        for p in pairs {
            // Source and destination are different blocks of one buffer: stage through a
            // second buffer because the trait's copy takes distinct source and destination.
            let mut tmp = self
                .dev
                .alloc(bpb)
                .map_err(dev_err("allocating a copy-on-write staging block"))?;
            self.dev
                .copy_on_device(
                    &self.stream,
                    &self.device_pool,
                    p.src as usize * bpb,
                    &mut tmp,
                    0,
                    bpb,
                )
                .and_then(|()| {
                    self.dev.copy_on_device(
                        &self.stream,
                        &tmp,
                        0,
                        &mut self.device_pool,
                        p.dst as usize * bpb,
                        bpb,
                    )
                })
                .map_err(dev_err("GPU copy-on-write"))?;
            self.dev
                .synchronize(&self.stream)
                .map_err(dev_err("synchronising"))?;
        }
        self.counters.device_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Drops hot entries caching any row of `host_blocks` (blocks just (re)assigned), in every
    /// index group.
    pub fn invalidate_host_blocks(&mut self, host_blocks: &[u32]) -> CliResult<()> {
        if host_blocks.is_empty() {
            return Ok(());
        }
        let bs = self.kv.block_size as i32;
        let ranges: Vec<i32> = host_blocks
            .iter()
            .flat_map(|&h| [h as i32 * bs, (h as i32 + 1) * bs])
            .collect();
        let ranges_b = self.upload_i32(&ranges)?;
        let desc = InvalidateDesc {
            num_requests: self.slots,
            hot_slots: self.kv.device_buffer_size,
            num_ranges: host_blocks.len() as u32,
        };
        let t = Instant::now();
        for g in &mut self.groups {
            self.dev
                .invalidate(
                    &self.stream,
                    &desc,
                    InvalidateArgs {
                        ranges: &ranges_b,
                        dgi: &mut g.dgi,
                    },
                )
                .map_err(dev_err("invalidating hot entries"))?;
        }
        self.counters.device_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    fn upload_i32(&self, v: &[i32]) -> CliResult<D::Buffer> {
        let bytes = i32_bytes(v);
        let mut b = self
            .dev
            .alloc(bytes.len().max(4))
            .map_err(dev_err("allocating a step buffer"))?;
        if !bytes.is_empty() {
            self.dev
                .upload(&mut b, 0, &bytes)
                .map_err(dev_err("uploading a step buffer"))?;
        }
        Ok(b)
    }

    /// Resets the hot state of slots whose owner or hot blocks changed since the last step (a new
    /// hot region holds stale bytes from its previous owner).
    fn reset_hot_state(&mut self, reqs: &[RequestView]) -> CliResult<()> {
        let n = self.kv.device_buffer_size as usize;
        for r in reqs {
            let owner = Some((r.uid, r.hot.clone()));
            if r.hot.iter().all(Vec::is_empty) || self.hot_owner[r.slot as usize] == owner {
                continue;
            }
            let dgi = i32_bytes(&vec![-1; n]);
            let lru: Vec<u8> = (0..n as u16).flat_map(|s| s.to_ne_bytes()).collect();
            for g in &mut self.groups {
                self.dev
                    .upload(&mut g.dgi, r.slot as usize * n * 4, &dgi)
                    .and_then(|()| self.dev.upload(&mut g.lru, r.slot as usize * n * 2, &lru))
                    .map_err(dev_err("resetting hot state"))?;
            }
            self.hot_owner[r.slot as usize] = owner;
        }
        Ok(())
    }

    /// One decode step's attention reads: per index group, `topk[g]` (`T × K`, one token row per
    /// request in `reqs` order) is remapped (fully-resident path) or resolved against the hot
    /// buffers with the leader's and followers' gathers. Outputs are kept for [`Self::verify`].
    pub fn attend(
        &mut self,
        reqs: &[RequestView],
        topk: &[Vec<i32>],
        fully_resident: bool,
    ) -> CliResult<()> {
        if reqs.is_empty() {
            return Ok(());
        }
        let (k, slots) = (self.kv.config.top_k, self.slots as usize);
        if reqs.len() > slots
            || topk.len() != self.groups.len()
            || topk.iter().any(|t| t.len() != reqs.len() * k as usize)
        {
            return Err(CliError::failed(format!(
                "simulation: {} requests and {} top-k lists for {} slots and {} index groups (each list {} × {} entries)",
                reqs.len(),
                topk.len(),
                slots,
                self.groups.len(),
                reqs.len(),
                k
            )));
        }
        self.reset_hot_state(reqs)?;
        let t = reqs.len() as u32;
        let m = self.kv.max_pages_per_request.max(1);
        let w = self.kv.hot_blocks_per_request;
        let nbk = self.kv.num_buckets as usize;
        // Per-slot tables (rows of absent slots stay null / -1).
        let mut host_table = vec![-1i32; slots * m as usize];
        let mut resident = vec![vec![0i32; slots * m as usize]; nbk];
        let mut hot = vec![vec![0i32; slots * w as usize]; nbk];
        for r in reqs {
            let s = r.slot as usize;
            for (p, &h) in r.host_blocks.iter().enumerate().take(m as usize) {
                host_table[s * m as usize + p] = h;
            }
            for b in 0..nbk {
                for (p, &x) in r.resident[b].iter().enumerate().take(m as usize) {
                    resident[b][s * m as usize + p] = x;
                }
                for (i, &x) in r.hot[b].iter().enumerate().take(w as usize) {
                    hot[b][s * w as usize + i] = x;
                }
            }
        }
        let req_id: Vec<i32> = reqs.iter().map(|r| r.slot as i32).collect();
        let rows: Vec<(u64, u32)> = reqs.iter().map(|r| (r.uid, r.seq_len)).collect();
        let DataPlane {
            dev,
            stream,
            kv,
            device_pool,
            host_pool,
            groups,
            counters,
            pending,
            bufs,
            ..
        } = self;
        let dev = *dev;
        let up = |what: &str, buf: &mut D::Buffer, v: &[i32]| {
            dev.upload(buf, 0, &i32_bytes(v))
                .map_err(|e| CliError::device(&format!("uploading {what}"), e))
        };
        let down = |buf: &D::Buffer, n: usize| -> CliResult<Vec<i32>> {
            let mut bytes = vec![0u8; n * 4];
            dev.download(buf, 0, &mut bytes)
                .map_err(dev_err("downloading step outputs"))?;
            Ok(bytes_i32(&bytes))
        };
        up("request ids", &mut bufs.req_id, &req_id)?;
        up("the host table", &mut bufs.host_table, &host_table)?;
        for b in 0..nbk {
            up("a resident table", &mut bufs.resident[b], &resident[b])?;
            up("a hot table", &mut bufs.hot[b], &hot[b])?;
        }
        let tk = (t * k) as usize;
        for (gb, topk_g) in bufs.per_group.iter_mut().zip(topk) {
            up("top-k", &mut gb.topk, topk_g)?;
        }
        // Every group's operations back to back on one stream, one synchronisation.
        let t0 = Instant::now();
        for (gs, gb) in groups.iter_mut().zip(bufs.per_group.iter_mut()) {
            let bucket = gs.bucket as usize;
            if fully_resident {
                let desc = RemapDesc {
                    num_tokens: t,
                    top_k: k,
                    table_rows: slots as u32,
                    max_blocks: m,
                    block_size: kv.block_size,
                    block_stride_rows: kv.attention_block_stride,
                    idx_mapping_len: None,
                    write_counts: true,
                    compact: false,
                };
                dev.remap(
                    stream,
                    &desc,
                    RemapArgs {
                        req_id: &bufs.req_id,
                        block_table: &bufs.resident[bucket],
                        topk: &gb.topk,
                        idx_mapping: None,
                        out: &mut gb.indices,
                        counts: Some(&mut bufs.counts),
                    },
                )
                .map_err(dev_err("remap"))?;
                counters.remap_calls += 1;
            } else {
                let desc = ResolveDesc {
                    num_tokens: t,
                    top_k: k,
                    num_requests: slots as u32,
                    max_pages: m,
                    block_size: kv.block_size,
                    hot_slots: kv.device_buffer_size,
                    attention_block_stride: kv.attention_block_stride,
                    host_num_blocks: kv.host_num_blocks,
                };
                dev.resolve(
                    stream,
                    &desc,
                    ResolveArgs {
                        req_id: &bufs.req_id,
                        topk: &gb.topk,
                        resident_table: &bufs.resident[bucket],
                        host_table: &bufs.host_table,
                        hot_table: &bufs.hot[bucket],
                        dgi: &mut gs.dgi,
                        lru: &mut gs.lru,
                        indices: &mut gb.indices,
                        valid_counts: &mut bufs.counts,
                        hit_counts: &mut gb.hits,
                        miss_counts: &mut gb.misses,
                        miss_src: &mut bufs.miss_src,
                        miss_dst: &mut bufs.miss_dst,
                    },
                )
                .map_err(dev_err("resolve"))?;
                let gdesc = GatherDesc {
                    num_tokens: t,
                    top_k: k,
                    layers: &gs.pairs,
                };
                dev.gather_rows(
                    stream,
                    &gdesc,
                    GatherArgs {
                        plan_src: &bufs.miss_src,
                        plan_dst: &bufs.miss_dst,
                        plan_counts: &gb.misses,
                        host: &*host_pool,
                        device: &mut *device_pool,
                    },
                )
                .map_err(dev_err("gather_rows"))?;
                counters.resolve_calls += 1;
            }
        }
        dev.synchronize(stream).map_err(dev_err("synchronising"))?;
        counters.device_seconds += t0.elapsed().as_secs_f64();
        for (g, (gb, topk_g)) in bufs.per_group.iter().zip(topk).enumerate() {
            let idx = down(&gb.indices, tk)?;
            let valid = idx.iter().filter(|&&x| x != -1).count() as u64;
            if fully_resident {
                counters.resident_reads += valid;
            } else {
                let sum = |v: Vec<i32>| v.iter().map(|&x| u64::from(x.max(0) as u32)).sum::<u64>();
                let h = sum(down(&gb.hits, t as usize)?);
                let mi = sum(down(&gb.misses, t as usize)?);
                counters.hot_hits += h;
                counters.misses += mi;
                counters.resident_reads += valid.saturating_sub(h + mi);
                counters.h2d_bytes += mi * u64::from(kv.row_bytes) * groups[g].layers.len() as u64;
            }
            pending.push(ReadOut {
                group: g,
                rows: rows.clone(),
                topk: topk_g.clone(),
                indices: idx,
            });
        }
        Ok(())
    }

    /// Checks every pending read against the synthetic rows; returns rows verified this call.
    pub fn verify(&mut self) -> CliResult<u64> {
        if self.pending.is_empty() {
            return Ok(0);
        }
        // Refresh the host copy of every referenced block (runs of consecutive blocks in one
        // download each); the rest of the copy is never read.
        let stride = i64::from(self.kv.attention_block_stride);
        let bpb = self.kv.bytes_per_block as usize;
        self.pool_copy.resize(self.kv.gpu_pool_bytes() as usize, 0);
        let mut blocks: Vec<usize> = self
            .pending
            .iter()
            .flat_map(|o| o.indices.iter())
            .filter(|&&i| i >= 0)
            .map(|&i| (i64::from(i) / stride) as usize)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mut i = 0;
        while i < blocks.len() {
            let mut j = i + 1;
            while j < blocks.len() && blocks[j] == blocks[j - 1] + 1 {
                j += 1;
            }
            let (first, end) = (blocks[i], blocks[j - 1] + 1);
            if end * bpb <= self.pool_copy.len() {
                self.dev
                    .download(
                        &self.device_pool,
                        first * bpb,
                        &mut self.pool_copy[first * bpb..end * bpb],
                    )
                    .map_err(dev_err("downloading the device pool for verification"))?;
            }
            i = j;
        }
        let pool = &self.pool_copy;
        let k = self.kv.config.top_k as usize;
        let pending = std::mem::take(&mut self.pending);
        let groups: Vec<(&[LayerPair], &[u32])> = self
            .groups
            .iter()
            .map(|g| (g.pairs.as_slice(), g.layers.as_slice()))
            .collect();
        let groups = &groups;
        let shared = self.shared_rows;
        // Split the reads over the cores; each part tallies its own counters.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8);
        let parts: Vec<Tally> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads)
                .map(|part| {
                    let pending = &pending;
                    sc.spawn(move || {
                        let mut t = Tally::default();
                        for out in pending.iter().skip(part).step_by(threads) {
                            check_read(out, groups[out.group], k, stride, pool, shared, &mut t);
                        }
                        t
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let mut verified = 0;
        for t in parts {
            verified += t.verified;
            self.counters.mismatched_rows += t.mismatched;
            if let Some(m) = t.first {
                note(&mut self.counters, m);
            }
        }
        self.counters.verified_rows += verified;
        Ok(verified)
    }
}

/// Verification counts of one part of a step's reads.
#[derive(Default)]
struct Tally {
    verified: u64,
    mismatched: u64,
    first: Option<String>,
}

impl Tally {
    fn bad(&mut self, rows: u64, what: impl FnOnce() -> String) {
        self.mismatched += rows;
        if self.first.is_none() {
            self.first = Some(what());
        }
    }
}

/// Checks one group's read: every valid token's row, in every layer of the group.
fn check_read(
    out: &ReadOut,
    (pairs, layer_ids): (&[LayerPair], &[u32]),
    k: usize,
    stride: i64,
    pool: &[u8],
    shared_rows: u32,
    t: &mut Tally,
) {
    let layers = layer_ids.len() as u64;
    for (row, &(uid, seq_len)) in out.rows.iter().enumerate() {
        for j in 0..k {
            let tok = out.topk[row * k + j];
            let idx = out.indices[row * k + j];
            let exists = tok >= 0 && (tok as u32) < seq_len;
            if !exists {
                if idx != -1 {
                    t.bad(layers, || {
                        format!(
                            "index group {} request {uid}: token {tok} does not exist but maps to row {idx}",
                            out.group
                        )
                    });
                }
                continue;
            }
            if idx < 0 {
                t.bad(layers, || {
                    format!(
                        "index group {} request {uid}: token {tok} (context {seq_len}) resolved to -1",
                        out.group
                    )
                });
                continue;
            }
            for (pair, &layer) in pairs.iter().zip(layer_ids) {
                t.verified += 1;
                let ok = pair.device.locate(i64::from(idx)).is_some_and(|(b, o)| {
                    let owner = row_owner(uid, tok as u32, shared_rows);
                    let seed = kv::row_seed(owner, layer, tok as u32);
                    let [(v0, vl), (s0, sl)] = pair.device.row_parts(b, o);
                    let vb = pair.device.value_bytes as usize;
                    let part = |a: u64, l: u64| pool.get(a as usize..(a + l) as usize);
                    part(v0, vl).is_some_and(|p| kv::matches(seed, 0, p))
                        && (sl == 0 || part(s0, sl).is_some_and(|p| kv::matches(seed, vb, p)))
                });
                if !ok {
                    t.bad(1, || {
                        format!(
                            "layer {layer} request {uid}: token {tok} read from row {idx} (block {}) holds other bytes",
                            i64::from(idx) / stride
                        )
                    });
                }
            }
        }
    }
}

fn note(c: &mut Counters, what: String) {
    if c.first_mismatch.is_none() {
        c.first_mismatch = Some(what);
    }
}

#[cfg(all(test, feature = "cpu"))]
mod tests {
    use super::*;
    use hisparse_backend_cpu::CpuDevice;
    use hisparse_core::config::HiSparseConfig;
    use hisparse_core::layout::{LayoutInput, plan_layout};
    use hisparse_core::model::{LayerSpec, ModelSpec};

    /// Two index groups of a leader and a follower each: 64 B rows, 16-token blocks, top-k 32,
    /// 64 hot slots (4 hot blocks).
    fn layout() -> KvCacheConfig {
        let layers = [
            LayerSpec::sparse_leader(64, 32),
            LayerSpec::sparse_follower(64),
            LayerSpec::sparse_leader(64, 32),
            LayerSpec::sparse_follower(64),
        ];
        let model = ModelSpec {
            name: "tiny",
            block_tokens: 16,
            top_k: 32,
            layers: &layers,
        };
        let mut cfg = HiSparseConfig::new(32, 64 * 64 * 4 * 64);
        cfg.device_buffer_size = Some(64);
        plan_layout(&LayoutInput::new(&model, &cfg, 200 * 4096, 256)).unwrap()
    }

    struct Alloc {
        next_gpu: i32,
    }

    impl Alloc {
        fn take(&mut self, n: usize) -> Vec<i32> {
            let v = (self.next_gpu..self.next_gpu + n as i32).collect();
            self.next_gpu += n as i32;
            v
        }
    }

    fn request(kv: &KvCacheConfig, a: &mut Alloc, slot: u32, uid: u64, host0: i32) -> RequestView {
        let pages = 16;
        RequestView {
            slot,
            uid,
            seq_len: 256,
            host_blocks: (host0..host0 + pages as i32).collect(),
            resident: (0..kv.num_buckets).map(|_| a.take(pages)).collect(),
            hot: (0..kv.num_buckets)
                .map(|_| a.take(kv.hot_blocks_per_request as usize))
                .collect(),
        }
    }

    fn topk(kv: &KvCacheConfig, reqs: usize, seed: u64) -> Vec<Vec<i32>> {
        let mut rng = super::super::workload::Rng::new(seed, 0);
        (0..kv.index_groups.len())
            .map(|_| {
                let mut v = Vec::new();
                for _ in 0..reqs {
                    let mut row: Vec<i32> = Vec::new();
                    while row.len() < 31 {
                        let p = rng.below(256) as i32;
                        if !row.contains(&p) {
                            row.push(p);
                        }
                    }
                    row.push(-1); // padding entry
                    v.extend(row);
                }
                v
            })
            .collect()
    }

    fn write_and_mirror(dp: &mut DataPlane<'_, CpuDevice>, r: &RequestView, mirror: bool) {
        let res = r.resident.clone();
        dp.write_rows(r.uid, 0..r.seq_len, |b, p| {
            Some(res[b as usize][p as usize])
        })
        .unwrap();
        if mirror {
            for b in 0..dp.kv.num_buckets {
                let spans: Vec<RowSpan> = (0..16)
                    .map(|p| RowSpan {
                        device_block: r.resident[b as usize][p] as u32,
                        host_block: r.host_blocks[p] as u32,
                        first_row: 0,
                        num_rows: 16,
                    })
                    .collect();
                dp.mirror_rows(b, &spans).unwrap();
            }
        }
    }

    #[test]
    fn resolve_path_reads_exact_rows_and_hot_buffer_hits() {
        let kv = layout();
        assert_eq!(kv.index_groups.len(), 2);
        assert_eq!(kv.index_groups[0].layers, [0, 1]);
        let dev = CpuDevice::new();
        let mut dp = DataPlane::new(&dev, &kv, 2).unwrap();
        let mut a = Alloc { next_gpu: 1 };
        let mut r0 = request(&kv, &mut a, 0, 100, 1);
        let r1 = request(&kv, &mut a, 1, 101, 20);
        write_and_mirror(&mut dp, &r0, true);
        write_and_mirror(&mut dp, &r1, true);
        // Reclaim r0's first 12 pages and reuse their GPU blocks for another request's rows:
        // reading them from the GPU now would return wrong bytes.
        let stale: Vec<Vec<i32>> = r0.resident.clone();
        for b in 0..kv.num_buckets as usize {
            for p in 0..12 {
                r0.resident[b][p] = 0;
            }
        }
        dp.write_rows(999, 0..12 * 16, |b, p| Some(stale[b as usize][p as usize]))
            .unwrap();
        let reqs = [r0.clone(), r1.clone()];
        let sel = topk(&kv, 2, 5);
        dp.attend(&reqs, &sel, false).unwrap();
        dp.verify().unwrap();
        let c = dp.counters.clone();
        assert_eq!(c.mismatched_rows, 0, "{:?}", c.first_mismatch);
        assert_eq!(c.verified_rows, 2 * 2 * 31 * 2);
        assert!(c.misses > 0);
        assert_eq!(c.hot_hits, 0);
        // Same selection again: everything host-resident now hits the hot buffer.
        dp.attend(&reqs, &sel, false).unwrap();
        dp.verify().unwrap();
        assert_eq!(dp.counters.mismatched_rows, 0);
        assert_eq!(dp.counters.hot_hits, c.misses);
        assert_eq!(dp.counters.misses, c.misses);
        // Fully resident path: remap of r1 alone.
        dp.attend(&reqs[1..], &topk(&kv, 1, 6), true).unwrap();
        dp.verify().unwrap();
        assert_eq!(
            dp.counters.mismatched_rows, 0,
            "{:?}",
            dp.counters.first_mismatch
        );
        assert_eq!(dp.counters.remap_calls, 2);
    }

    #[test]
    fn a_missing_mirror_is_caught() {
        let kv = layout();
        let dev = CpuDevice::new();
        let mut dp = DataPlane::new(&dev, &kv, 1).unwrap();
        let mut a = Alloc { next_gpu: 1 };
        let mut r0 = request(&kv, &mut a, 0, 7, 1);
        write_and_mirror(&mut dp, &r0, false);
        for b in 0..kv.num_buckets as usize {
            r0.resident[b][0] = 0;
        }
        // Every selection includes a token of page 0, whose host copy was never written.
        let mut sel = topk(&kv, 1, 9);
        for s in &mut sel {
            if !s.contains(&3) {
                s[0] = 3;
            }
        }
        dp.attend(&[r0], &sel, false).unwrap();
        dp.verify().unwrap();
        assert!(dp.counters.mismatched_rows >= 4, "{:?}", dp.counters);
        assert!(dp.counters.first_mismatch.is_some());
    }
}
