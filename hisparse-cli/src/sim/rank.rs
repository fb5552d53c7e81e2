//! One rank of the simulation: a [`Runtime`] on one device, the simulated forward pass, the
//! workload's top-k for its decode rows and the verification of what its attention reads.
//!
//! Every rank executes every command. Run in this process (one rank) or, with `--tp N`, in N
//! worker processes ([`super::tp`]), each rank regenerates the same top-k selections from the
//! seed, so ranks agree without shipping them.

use std::collections::HashMap;
use std::time::Instant;

use hisparse_core::Device;
use hisparse_core::coordinator::{OffloadCommand, RequestId};
use hisparse_core::layout::KvCacheConfig;
use hisparse_runtime::{Counters, Indices, Pools, Runtime, TopK, WorkerReport};
use serde::{Deserialize, Serialize};

use super::engine::SimSetup;
use super::forward::{Forward, IndexerKeys, row_owner};
use super::kv;
use super::micro::MicroBatches;
use super::verify::{IndexerVerifier, ReadOut, Verified, Verifier};
use super::workload::{Pattern, TopKStream, overlap};
use crate::error::{CliError, CliResult};

/// A runtime error as the CLI reports it.
pub(super) fn rt_err(e: impl std::fmt::Display) -> CliError {
    CliError::failed(format!("runtime: {e}"))
}

/// A runtime that could not be built; memory that does not fit names the flags that size it.
fn setup_err<E: hisparse_core::Error>(e: E) -> CliError {
    use hisparse_core::ErrorKind as K;
    match e.kind() {
        K::OutOfDeviceMemory | K::OutOfPinnedMemory => CliError::failed(format!(
            "setting up the runtime: {e}; lower --gpu-mem or --host-mem (or --requests, --context)"
        )),
        _ => CliError::device("setting up the runtime", e),
    }
}

/// A decode row of a step: which request reads, and how many of its rows exist.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct DecodeRow {
    /// State row.
    pub slot: u32,
    /// Request id (seeds its synthetic rows and its top-k stream).
    pub uid: RequestId,
    /// Rows that exist after this step's writes.
    pub seq_len: u32,
    /// Rows (`start..end`) its request's rejected speculative tokens write: they hold
    /// [`super::kv::rejected_seed`] bytes until the tokens that replace them are computed.
    pub rejected: (u32, u32),
}

/// What a rank reports after a step.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RankStep {
    /// Its worker report (transfer batches enqueued and completed since the last one).
    pub report: WorkerReport,
    /// Its runtime's counters after the step.
    pub counters: Counters,
    /// Seconds of device work this step (before-forward, decode path, after-forward, to a
    /// synchronisation of both streams; not the forward pass's writes, not verification).
    pub device_seconds: f64,
    /// Seconds spent verifying this step's reads.
    pub verify_seconds: f64,
    /// Verification totals so far.
    pub verified: Verified,
    /// Prefill rows verified so far (part of `verified`).
    #[serde(default)]
    pub prefill_rows: u64,
    /// Prefill rows that mismatched so far (part of `verified`).
    #[serde(default)]
    pub prefill_mismatched: u64,
    /// Indexer keys checked so far (read back on the GPU after a prefix hit or an import, and
    /// in the host cache after each backup).
    #[serde(default)]
    pub indexer: Verified,
    /// Adjacent-step top-k overlap measured this step: sum and count.
    pub overlap_sum: f64,
    /// See `overlap_sum`.
    pub overlap_n: u64,
}

/// The engine's own per-index-group buffers: the indexer's top-k and attention's row indices.
struct GroupIo<D: Device> {
    topk: D::Buffer,
    rows: D::Buffer,
}

/// The buffers of prefill reads: per index group its top-k and row indices, and the state
/// row of each token row (one row per prefill chunk: its last token).
struct PrefillIo<D: Device> {
    groups: Vec<GroupIo<D>>,
    state_rows: D::Buffer,
    /// Token rows the buffers hold.
    capacity: usize,
}

/// One rank's data plane.
pub struct Rank<D: Device> {
    rt: Runtime<D>,
    forward: Forward,
    verifier: Verifier,
    /// Indexer keys written, imported and checked (`None` without an indexer layer).
    indexer: Option<IndexerVerifier>,
    io: Vec<GroupIo<D>>,
    /// With `--micro-batches N` (N > 1): the decode calls' micro-batches.
    micro: Option<MicroBatches<D>>,
    prefill_io: PrefillIo<D>,
    streams: HashMap<(RequestId, usize), (TopKStream, Vec<i32>)>,
    /// The top-k streams of prefill reads (apart from decode's, which measure overlap).
    prefill_streams: HashMap<(RequestId, usize), TopKStream>,
    prefill_rows: u64,
    prefill_mismatched: u64,
    pattern: Pattern,
    seed: u64,
    ratio: u32,
    /// Device seconds of the open step so far.
    device_seconds: f64,
}

impl<D: Device> Rank<D> {
    /// A rank whose runtime owns its pools.
    pub fn new(dev: D, s: &SimSetup) -> CliResult<Self> {
        let rt = Runtime::new(dev, s.kv.clone(), s.runtime_config()).map_err(setup_err)?;
        Self::with_runtime(rt, s)
    }

    /// A rank over `host` (a host pool this rank may share with others) and a device pool it
    /// allocates; `writes_host` says whether it writes the host pool.
    pub fn with_host_pool(
        dev: D,
        s: &SimSetup,
        worker: u32,
        host: D::HostBuffer,
        writes_host: bool,
    ) -> CliResult<Self> {
        let device = dev
            .alloc(s.kv.gpu_pool_bytes() as usize)
            .map_err(|e| CliError::device("allocating the device pool", e))?;
        let mut cfg = s.runtime_config();
        cfg.worker = worker;
        cfg.writes_host = writes_host;
        let rt = Runtime::with_pools(dev, s.kv.clone(), cfg, Pools { device, host }, None)
            .map_err(setup_err)?;
        Self::with_runtime(rt, s)
    }

    fn with_runtime(mut rt: Runtime<D>, s: &SimSetup) -> CliResult<Self> {
        let kv = &s.kv;
        let ratio = kv.sparse_compress_ratio.max(1);
        let shared_rows = s.shared_prefix.min(s.context) / ratio;
        let (t, k) = (s.max_decode_rows() as usize, kv.config.top_k as usize);
        let mut io = Vec::with_capacity(kv.index_groups.len());
        for _ in 0..kv.index_groups.len() {
            let a = || {
                rt.device()
                    .alloc((t * k * 4).max(4))
                    .map_err(|e| CliError::device("allocating top-k buffers", e))
            };
            io.push(GroupIo {
                topk: a()?,
                rows: a()?,
            });
        }
        // One prefill read per scheduled request at most.
        let capacity = s.requests as usize;
        let alloc = |n: usize| {
            rt.device()
                .alloc((n * 4).max(4))
                .map_err(|e| CliError::device("allocating prefill top-k buffers", e))
        };
        let mut groups = Vec::with_capacity(kv.index_groups.len());
        for _ in 0..kv.index_groups.len() {
            groups.push(GroupIo {
                topk: alloc(capacity * k)?,
                rows: alloc(capacity * k)?,
            });
        }
        let prefill_io = PrefillIo {
            groups,
            state_rows: alloc(capacity)?,
            capacity,
        };
        let micro = if s.micro_batches > 1 {
            let groups = kv.index_groups.len();
            Some(MicroBatches::new(
                &mut rt,
                s.micro_batches as usize,
                groups,
                t,
                k,
            )?)
        } else {
            None
        };
        Ok(Rank {
            forward: Forward::new(kv, shared_rows)?,
            verifier: Verifier::new(kv, shared_rows)?,
            indexer: IndexerKeys::new(kv, shared_rows * ratio)?.map(IndexerVerifier::new),
            io,
            micro,
            prefill_io,
            prefill_streams: HashMap::new(),
            prefill_rows: 0,
            prefill_mismatched: 0,
            streams: HashMap::new(),
            pattern: Pattern::for_top_k(kv.config.top_k, s.overlap),
            seed: s.seed,
            ratio,
            device_seconds: 0.0,
            rt,
        })
    }

    /// A prefill node's writes into this rank's host pool: rows `0..rows` of request `uid`
    /// (the synthetic rows its forward pass would have written) into `host_blocks`, one per
    /// page, in every layer of the source group — one write per (layer, page, row part).
    pub fn import_rows(&mut self, uid: u64, host_blocks: &[u32], rows: u32) -> CliResult<()> {
        let kv = self.rt.layout().clone();
        let shared_rows = self.forward.shared_rows();
        let bs = kv.block_size;
        let layers: Vec<u32> = kv.groups[KvCacheConfig::SOURCE_GROUP]
            .layers
            .iter()
            .map(|l| l.layer)
            .collect();
        let (dev, pools) = self.rt.device_and_pools_mut();
        let mut values = Vec::new();
        let mut scales = Vec::new();
        for layer in layers {
            let l = kv
                .host_layout(layer)
                .map_err(|e| CliError::failed(e.to_string()))?;
            let vb = l.value_bytes as usize;
            let sb = l.row_bytes as usize - vb;
            for (page, &block) in host_blocks.iter().enumerate() {
                let first = page as u32 * bs;
                let n = rows.saturating_sub(first).min(bs);
                if n == 0 {
                    break;
                }
                values.clear();
                values.resize(n as usize * vb, 0);
                scales.clear();
                scales.resize(n as usize * sb, 0);
                for r in 0..n {
                    let pos = first + r;
                    let seed = kv::row_seed(row_owner(uid, pos, shared_rows), layer, pos);
                    let i = r as usize;
                    kv::fill(seed, 0, &mut values[i * vb..(i + 1) * vb]);
                    if sb > 0 {
                        kv::fill(seed, vb, &mut scales[i * sb..(i + 1) * sb]);
                    }
                }
                let [(voff, _), (soff, _)] = l.row_parts(block, 0);
                dev.write_pinned(&mut pools.host, voff as usize, &values)
                    .and_then(|()| {
                        if sb > 0 {
                            dev.write_pinned(&mut pools.host, soff as usize, &scales)
                        } else {
                            Ok(())
                        }
                    })
                    .map_err(|e| CliError::device("writing imported KV rows", e))?;
            }
        }
        // And its keys, into the indexer host cache's pages of the same host blocks.
        if let Some(ix) = &self.indexer {
            let (dev, cache) = self.rt.device_and_indexer_host_cache_mut();
            if let Some(cache) = cache {
                let keys = ix.keys.rows_of(0..rows * kv.sparse_compress_ratio.max(1));
                ix.keys.write_host(dev, cache, uid, keys, host_blocks)?;
            }
        }
        Ok(())
    }

    /// The backend's name and the device's.
    pub fn names(&self) -> (String, String) {
        let d = self.rt.device();
        (d.backend().to_string(), d.device_name().to_string())
    }

    /// Before the forward pass: the command's updates and copies, waited for (timed). With
    /// `barrier`, also waits for the compute stream so host copy-on-write is complete before
    /// other ranks read the pages it wrote.
    pub fn begin(&mut self, cmd: &OffloadCommand) -> CliResult<()> {
        let t = Instant::now();
        self.rt.begin_step(cmd).map_err(rt_err)?;
        self.rt
            .device()
            .synchronize(self.rt.compute_stream())
            .map_err(|e| CliError::device("synchronising", e))?;
        self.device_seconds = t.elapsed().as_secs_f64();
        Ok(())
    }

    /// The rest of the step: the forward pass's writes, the decode rows' reads through the
    /// runtime, the after-forward copies, a poll, and verification of the reads.
    pub fn finish(&mut self, cmd: &OffloadCommand, decode: &[DecodeRow]) -> CliResult<RankStep> {
        let nb = self.rt.layout().num_buckets;
        let ratio = self.ratio;
        for sr in &cmd.scheduled {
            let end = sr.first_token + sr.num_tokens;
            let rejected = decode
                .iter()
                .find(|r| r.slot == sr.slot)
                .map_or(0..0, |r| r.rejected.0..r.rejected.1);
            let resident: Vec<Vec<i32>> = (0..nb)
                .map(|b| {
                    self.rt
                        .resident_row(b, sr.slot)
                        .map(<[i32]>::to_vec)
                        .unwrap_or_default()
                })
                .collect();
            let (dev, pools) = self.rt.device_and_pools_mut();
            self.forward.write(
                dev,
                &mut pools.device,
                sr.id,
                sr.first_token / ratio..end / ratio,
                rejected,
                |b, p| {
                    resident
                        .get(b as usize)
                        .and_then(|r| r.get(p as usize).copied())
                },
            )?;
        }
        if let Some(ix) = &mut self.indexer {
            ix.forward(&mut self.rt, cmd)?;
        }
        let mut step = RankStep::default();
        let mut reads: Vec<ReadOut> = Vec::new();
        if !decode.is_empty() {
            let groups = self.io.len();
            // Workload generation and the top-k uploads are the model's, not device time.
            let mut topk: Vec<Vec<i32>> = vec![Vec::new(); groups];
            for r in decode {
                for (g, out) in topk.iter_mut().enumerate() {
                    let (pattern, seed) = (self.pattern, self.seed);
                    let (stream, prev) = self.streams.entry((r.uid, g)).or_insert_with(|| {
                        (
                            TopKStream::new(pattern, seed, r.uid * 1_000 + g as u64),
                            Vec::new(),
                        )
                    });
                    let sel = stream.step(r.seq_len);
                    if !prev.is_empty() {
                        step.overlap_sum += overlap(prev, sel);
                        step.overlap_n += 1;
                    }
                    prev.clear();
                    prev.extend_from_slice(sel);
                    out.extend_from_slice(sel);
                }
            }
            let t = Instant::now();
            if let Some(micro) = &mut self.micro {
                micro.call(&mut self.rt, decode, &topk)?;
            } else {
                self.call_whole_batch(decode, &topk)?;
            }
            self.device_seconds += t.elapsed().as_secs_f64();
            let rows: Vec<(u64, u32)> = decode.iter().map(|r| (r.uid, r.seq_len)).collect();
            let rejected: Vec<std::ops::Range<u32>> =
                decode.iter().map(|r| r.rejected.0..r.rejected.1).collect();
            for (g, sel) in topk.into_iter().enumerate() {
                reads.push(ReadOut {
                    group: g,
                    rows: rows.clone(),
                    rejected: rejected.clone(),
                    topk: sel,
                    indices: Vec::new(),
                });
            }
        }
        // Prefill reads: each prefill chunk's last token reads a top-k of its whole earlier
        // context through the resident tables (not timed: decode's device time stays apart).
        let prefill_reads = self.read_prefill(cmd, decode)?;
        // After the forward pass; then wait for the step's work (the simulation checks it).
        let t = Instant::now();
        self.rt.end_step(cmd).map_err(rt_err)?;
        for stream in [self.rt.compute_stream(), self.rt.copy_stream()] {
            self.rt
                .device()
                .synchronize(stream)
                .map_err(|e| CliError::device("synchronising", e))?;
        }
        self.device_seconds += t.elapsed().as_secs_f64();
        step.report = self.rt.poll().map_err(rt_err)?;
        // Verify (the step's work has completed).
        let t = Instant::now();
        for r in &mut reads {
            r.indices.resize(r.topk.len(), 0);
            if let Some(micro) = &self.micro {
                micro.download(&self.rt, r.group, &mut r.indices)?;
                continue;
            }
            self.rt
                .device()
                .download_i32(&self.io[r.group].rows, 0, &mut r.indices)
                .map_err(|e| CliError::device("downloading row indices", e))?;
        }
        self.verifier
            .check(self.rt.device(), &self.rt.pools().device, &reads)?;
        let mut prefill_reads = prefill_reads;
        for out in prefill_reads.iter_mut() {
            out.indices.resize(out.topk.len(), 0);
            self.rt
                .device()
                .download_i32(&self.prefill_io.groups[out.group].rows, 0, &mut out.indices)
                .map_err(|e| CliError::device("downloading prefill row indices", e))?;
        }
        let bad_before = self.verifier.verified.mismatched;
        self.prefill_rows +=
            self.verifier
                .check(self.rt.device(), &self.rt.pools().device, &prefill_reads)?;
        self.prefill_mismatched += self.verifier.verified.mismatched - bad_before;
        if let Some(ix) = &mut self.indexer {
            ix.check_backups(&self.rt, cmd)?;
            step.indexer = ix.verified.clone();
        }
        step.prefill_rows = self.prefill_rows;
        step.prefill_mismatched = self.prefill_mismatched;
        step.verify_seconds = t.elapsed().as_secs_f64();
        step.device_seconds = self.device_seconds;
        step.counters = *self.rt.counters();
        step.verified = self.verifier.verified.clone();
        Ok(step)
    }

    /// The step's per-layer calls over `decode`'s rows as one call per index group over the
    /// batch `set_batch` gives: `topk[g]` holds group `g`'s top-k of every row, in row order.
    fn call_whole_batch(&mut self, decode: &[DecodeRow], topk: &[Vec<i32>]) -> CliResult<()> {
        for (g, sel) in topk.iter().enumerate() {
            self.rt
                .device()
                .upload_i32(&mut self.io[g].topk, 0, sel)
                .map_err(|e| CliError::device("uploading top-k", e))?;
        }
        let batch: Vec<i32> = decode.iter().map(|r| r.slot as i32).collect();
        self.rt.set_batch(&batch).map_err(rt_err)?;
        for (g, gio) in self.io.iter_mut().enumerate() {
            let input = TopK {
                positions: &gio.topk,
                num_tokens: batch.len() as u32,
                state_rows: None,
            };
            self.rt
                .resolve_index_group(
                    g,
                    &input,
                    Indices {
                        rows: &mut gio.rows,
                        counts: None,
                    },
                )
                .map_err(rt_err)?;
        }
        Ok(())
    }

    /// Enqueues the prefill reads of `cmd`: for every scheduled request that is not decoding
    /// (not among `decode`'s rows) and has rows, its chunk's last token reads a top-k of the
    /// rows that exist up to it, from the same synthetic generator decode uses, remapped through
    /// the resident tables ([`Runtime::remap_prefill`]). Returns the reads (indices downloaded
    /// once the step's work completed).
    fn read_prefill(
        &mut self,
        cmd: &OffloadCommand,
        decode: &[DecodeRow],
    ) -> CliResult<Vec<ReadOut>> {
        let ratio = self.ratio;
        let rows: Vec<(u32, RequestId, u32)> = cmd
            .scheduled
            .iter()
            .filter(|sr| !decode.iter().any(|r| r.slot == sr.slot))
            .map(|sr| (sr.slot, sr.id, (sr.first_token + sr.num_tokens) / ratio))
            .filter(|&(_, _, seq_len)| seq_len > 0)
            .take(self.prefill_io.capacity)
            .collect();
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let state_rows: Vec<i32> = rows.iter().map(|&(slot, _, _)| slot as i32).collect();
        self.rt
            .device()
            .upload_i32(&mut self.prefill_io.state_rows, 0, &state_rows)
            .map_err(|e| CliError::device("uploading prefill state rows", e))?;
        let mut reads = Vec::with_capacity(self.prefill_io.groups.len());
        for g in 0..self.prefill_io.groups.len() {
            let mut sel = Vec::new();
            for &(_, uid, seq_len) in &rows {
                let (pattern, seed) = (self.pattern, self.seed);
                let stream = self.prefill_streams.entry((uid, g)).or_insert_with(|| {
                    TopKStream::new(pattern, seed, uid * 1_000 + 500 + g as u64)
                });
                sel.extend_from_slice(stream.step(seq_len));
            }
            let gio = &mut self.prefill_io.groups[g];
            self.rt
                .device()
                .upload_i32(&mut gio.topk, 0, &sel)
                .map_err(|e| CliError::device("uploading prefill top-k", e))?;
            let input = TopK {
                positions: &gio.topk,
                num_tokens: rows.len() as u32,
                state_rows: Some(&self.prefill_io.state_rows),
            };
            self.rt
                .remap_prefill(
                    g,
                    &input,
                    Indices {
                        rows: &mut gio.rows,
                        counts: None,
                    },
                )
                .map_err(rt_err)?;
            reads.push(ReadOut {
                group: g,
                rows: rows
                    .iter()
                    .map(|&(_, uid, seq_len)| (uid, seq_len))
                    .collect(),
                rejected: Vec::new(),
                topk: sel,
                indices: Vec::new(),
            });
        }
        Ok(reads)
    }

    /// Waits for everything in flight and reports what completed.
    pub fn drain(&mut self) -> CliResult<RankStep> {
        let report = self.rt.drain().map_err(rt_err)?;
        Ok(RankStep {
            report,
            counters: *self.rt.counters(),
            verified: self.verifier.verified.clone(),
            indexer: self
                .indexer
                .as_ref()
                .map(|ix| ix.verified.clone())
                .unwrap_or_default(),
            prefill_rows: self.prefill_rows,
            prefill_mismatched: self.prefill_mismatched,
            ..RankStep::default()
        })
    }
}
