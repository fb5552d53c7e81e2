//! Device-level benchmarks of HiSparse's data-plane operations, generic over [`Device`]: the
//! routines behind `hisparse bench`, usable on any backend an engine builds.
//!
//! [`run`] measures remap, the resolver, the swap-in gather of 656 B rows and the multi-layer page
//! backup and restore and, in the same run, the ceilings they are judged against: host `memcpy`,
//! the device's own bandwidth (`copy_on_device`) and host↔device bulk copies (`copy_to_device` /
//! `copy_to_host`). Every figure is reported beside its ceiling, so a number is never read
//! without what it could have been.
//!
//! Conventions: a *copy bandwidth* counts each byte moved once (bytes / time), as memcpy figures
//! usually do; the *device bandwidth* counts bytes read plus bytes written (contract §6: "about 4.2 TB/s
//! read + write" on an H200), and the remap and resolver figures count the bytes they must read and
//! write the same way, so they compare like with like. Each figure is the median of `iters`
//! samples; a sample enqueues the operation `reps` times (calibrated after a warm-up call so a
//! sample lasts about 2 ms) and then synchronises, so launch latency is amortised as it is on a
//! real decode stream.

use std::time::{Duration, Instant};

pub mod host_pool;

use hisparse_conformance::SplitMix64;
use hisparse_core::Device;
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, LayerPair, PageCopyDesc, PageLayout, RemapArgs,
    RemapDesc, ResolveArgs, ResolveDesc,
};

/// What to measure and how long.
#[derive(Clone, Copy, Debug)]
pub struct BenchConfig {
    /// Samples per figure (the median is reported).
    pub iters: usize,
    /// Bytes of the buffers used for the bandwidth ceilings.
    pub ceiling_bytes: usize,
    /// Target duration of one sample.
    pub sample_time: Duration,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            iters: 10,
            ceiling_bytes: 256 << 20,
            sample_time: Duration::from_millis(2),
        }
    }
}

/// A bandwidth ceiling measured in the same run.
#[derive(Clone, Debug, PartialEq)]
pub struct Ceiling {
    /// Short name, e.g. `"host→device bulk"`.
    pub name: &'static str,
    /// Bytes per second (see the module docs for what is counted).
    pub bytes_per_s: f64,
    /// Median time of one copy of `bytes`.
    pub seconds: f64,
    /// Bytes copied per call.
    pub bytes: u64,
}

/// One measured operation.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// What was measured, e.g. `"gather 656 B rows × 2048"`.
    pub name: String,
    /// Median seconds per call.
    pub seconds: f64,
    /// Work items per call (rows, entries, pages).
    pub items: u64,
    /// What an item is.
    pub item: &'static str,
    /// Bytes per call counted against the ceiling.
    pub bytes: u64,
    /// The ceiling it is compared with (a name of [`Report::ceilings`]).
    pub ceiling: &'static str,
}

impl Figure {
    /// Bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds
    }

    /// Items per second.
    pub fn items_per_s(&self) -> f64 {
        self.items as f64 / self.seconds
    }
}

/// Everything one run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Backend name.
    pub backend: &'static str,
    /// Device name.
    pub device: String,
    /// Ceilings measured in this run.
    pub ceilings: Vec<Ceiling>,
    /// The operations.
    pub figures: Vec<Figure>,
}

impl Report {
    /// The ceiling called `name`.
    pub fn ceiling(&self, name: &str) -> Option<&Ceiling> {
        self.ceilings.iter().find(|c| c.name == name)
    }
}

/// Name of the host `memcpy` ceiling.
pub const MEMCPY: &str = "host memcpy";
/// Name of the pinned host → device bulk-copy ceiling.
pub const H2D: &str = "host→device bulk";
/// Name of the device → pinned host bulk-copy ceiling.
pub const D2H: &str = "device→host bulk";
/// Name of the device bandwidth ceiling (read + write).
pub const DEVICE: &str = "device copy (read+write)";

/// DeepSeek V3.2 fp8 MLA row.
pub const ROW_BYTES: u32 = 656;
/// Rows per block.
pub const BLOCK: u32 = 64;

/// A new device buffer holding `v` (the trait's typed upload: no byte conversion here).
fn upload_i32s<D: Device>(dev: &D, v: &[i32]) -> Result<D::Buffer, D::Error> {
    let mut b = dev.alloc(size_of_val(v))?;
    dev.upload_i32(&mut b, 0, v)?;
    Ok(b)
}

/// A new device buffer holding `v`.
fn upload_u16s<D: Device>(dev: &D, v: &[u16]) -> Result<D::Buffer, D::Error> {
    let mut b = dev.alloc(size_of_val(v))?;
    dev.upload_u16(&mut b, 0, v)?;
    Ok(b)
}

/// Median seconds per call of `op`: a warm-up call (which pays one-time costs: pipeline or module
/// creation, scratch allocation), a calibration that doubles a burst of calls until it lasts half a
/// sample, then `iters` samples of `reps` calls each, `reps` sized from the calibration so a sample
/// lasts about `sample_time`. (Sizing `reps` from the warm-up call alone made samples of one or two
/// calls whenever the first call was slow, so the per-sample synchronisation was not amortised.)
fn time<D: Device>(
    dev: &D,
    stream: &D::Stream,
    cfg: &BenchConfig,
    mut op: impl FnMut(usize) -> Result<(), D::Error>,
) -> Result<f64, D::Error> {
    const MAX_REPS: usize = 1000;
    let mut call = 0usize;
    op(call)?;
    call += 1;
    dev.synchronize(stream)?;
    let target = cfg.sample_time.as_secs_f64();
    let mut burst = 1usize;
    let per_call = loop {
        let t = Instant::now();
        for _ in 0..burst {
            op(call)?;
            call += 1;
        }
        dev.synchronize(stream)?;
        let took = t.elapsed().as_secs_f64().max(1e-9);
        if took >= target / 2.0 || burst >= MAX_REPS {
            break took / burst as f64;
        }
        burst *= 2;
    };
    let reps = ((target / per_call).ceil() as usize).clamp(1, MAX_REPS);
    let mut samples = Vec::with_capacity(cfg.iters);
    for _ in 0..cfg.iters.max(1) {
        let t = Instant::now();
        for _ in 0..reps {
            op(call)?;
            call += 1;
        }
        dev.synchronize(stream)?;
        samples.push(t.elapsed().as_secs_f64() / reps as f64);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

fn memcpy_ceiling(cfg: &BenchConfig) -> Ceiling {
    let n = cfg.ceiling_bytes;
    let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let mut samples = Vec::new();
    for _ in 0..cfg.iters.max(1) {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    let s = samples[samples.len() / 2];
    Ceiling {
        name: MEMCPY,
        bytes_per_s: n as f64 / s,
        seconds: s,
        bytes: n as u64,
    }
}

/// Measures the ceilings and every operation on `dev`.
pub fn run<D: Device>(dev: &D, cfg: &BenchConfig) -> Result<Report, D::Error> {
    let stream = dev.create_stream()?;
    let mut ceilings = vec![memcpy_ceiling(cfg)];
    ceilings.extend(bulk_ceilings(dev, &stream, cfg)?);
    let mut figures = Vec::new();
    figures.push(remap(dev, &stream, cfg)?);
    figures.push(resolver(dev, &stream, cfg)?);
    for rows in [2048u32, 32768] {
        figures.push(gather(dev, &stream, cfg, rows)?);
    }
    for direction in [Direction::DeviceToHost, Direction::HostToDevice] {
        figures.push(page_copy(dev, &stream, cfg, direction)?);
    }
    Ok(Report {
        backend: dev.backend(),
        device: dev.device_name().to_string(),
        ceilings,
        figures,
    })
}

fn bulk_ceilings<D: Device>(
    dev: &D,
    stream: &D::Stream,
    cfg: &BenchConfig,
) -> Result<Vec<Ceiling>, D::Error> {
    let n = cfg.ceiling_bytes;
    let mut host = dev.alloc_pinned(n)?;
    let fill: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
    dev.write_pinned(&mut host, 0, &fill)?;
    drop(fill);
    let mut a = dev.alloc(n)?;
    let mut b = dev.alloc(n)?;
    let h2d = time(dev, stream, cfg, |_| {
        dev.copy_to_device(stream, &host, 0, &mut a, 0, n)
    })?;
    let d2h = time(dev, stream, cfg, |_| {
        dev.copy_to_host(stream, &a, 0, &mut host, 0, n)
    })?;
    let d2d = time(dev, stream, cfg, |_| {
        dev.copy_on_device(stream, &a, 0, &mut b, 0, n)
    })?;
    let c = |name, s: f64, bytes: usize| Ceiling {
        name,
        bytes_per_s: bytes as f64 / s,
        seconds: s,
        bytes: bytes as u64,
    };
    Ok(vec![c(H2D, h2d, n), c(D2H, d2h, n), c(DEVICE, d2d, 2 * n)])
}

/// A decode batch's remap on a device: 256 requests × top-k 2048 over 32K-token block tables
/// (512 pages of [`BLOCK`] rows) of random blocks, with counts: the figure [`run`] reports and
/// the kernel lab's Vulkan harness times (one workload, so their figures compare).
pub struct DecodeRemap<D: Device> {
    /// The call's shape.
    pub desc: RemapDesc,
    req_id: D::Buffer,
    block_table: D::Buffer,
    topk: D::Buffer,
    out: D::Buffer,
    counts: D::Buffer,
}

impl<D: Device> DecodeRemap<D> {
    /// The inputs drawn from `rng` (block table, then top-k) and uploaded, the outputs allocated.
    pub fn new(dev: &D, rng: &mut SplitMix64) -> Result<Self, D::Error> {
        let (t, k, m) = (256u32, 2048u32, 512u32);
        let req: Vec<i32> = (0..t as i32).collect();
        let table: Vec<i32> = (0..t * m).map(|_| 1 + rng.below(100_000) as i32).collect();
        let topk: Vec<i32> = (0..t * k)
            .map(|_| rng.below(u64::from(m * BLOCK)) as i32)
            .collect();
        Ok(DecodeRemap {
            desc: RemapDesc {
                num_tokens: t,
                top_k: k,
                table_rows: t,
                max_blocks: m,
                block_size: BLOCK,
                block_stride_rows: 832,
                idx_mapping_len: None,
                write_counts: true,
                compact: false,
                stats_slot: 0,
            },
            req_id: upload_i32s(dev, &req)?,
            block_table: upload_i32s(dev, &table)?,
            topk: upload_i32s(dev, &topk)?,
            out: dev.alloc((t * k * 4) as usize)?,
            counts: dev.alloc((t * 4) as usize)?,
        })
    }

    /// Enqueues the remap on `stream`.
    pub fn enqueue(&mut self, dev: &D, stream: &D::Stream) -> Result<(), D::Error> {
        dev.remap(
            stream,
            &self.desc,
            RemapArgs {
                req_id: &self.req_id,
                block_table: &self.block_table,
                topk: &self.topk,
                idx_mapping: None,
                out: &mut self.out,
                counts: Some(&mut self.counts),
                stats: None,
            },
        )
    }
}

/// Remap of a decode batch ([`DecodeRemap`]).
fn remap<D: Device>(dev: &D, stream: &D::Stream, cfg: &BenchConfig) -> Result<Figure, D::Error> {
    let mut call = DecodeRemap::new(dev, &mut SplitMix64::new(1))?;
    let (t, k) = (call.desc.num_tokens, call.desc.top_k);
    let s = time(dev, stream, cfg, |_| call.enqueue(dev, stream))?;
    let entries = u64::from(t * k);
    Ok(Figure {
        name: format!("remap {t} rows × top-k {k}"),
        seconds: s,
        items: entries,
        item: "entries",
        // topk read + out written; the block table is mostly cached.
        bytes: entries * 8,
        ceiling: DEVICE,
    })
}

/// The resolver over a decode batch: 64 requests × top-k 2048, hot buffer 4096 slots, 32K-token
/// contexts entirely on host, successive steps overlapping ~90%.
fn resolver<D: Device>(dev: &D, stream: &D::Stream, cfg: &BenchConfig) -> Result<Figure, D::Error> {
    let (r, k, n, m) = (64u32, 2048u32, 4096u32, 512u32);
    const STEPS: usize = 8;
    let mut rng = SplitMix64::new(2);
    let ctx = u64::from(m * BLOCK);
    let mut sets: Vec<Vec<i32>> = Vec::new();
    let mut cur: Vec<i32> = Vec::with_capacity((r * k) as usize);
    for _ in 0..r {
        // Distinct positions per request.
        let mut seen = std::collections::HashSet::new();
        while seen.len() < k as usize {
            seen.insert(rng.below(ctx) as i32);
        }
        cur.extend(seen);
    }
    for _ in 0..STEPS {
        sets.push(cur.clone());
        for row in cur.chunks_mut(k as usize) {
            let mut present: std::collections::HashSet<i32> = row.iter().copied().collect();
            for _ in 0..k / 10 {
                let col = rng.below(u64::from(k)) as usize;
                let mut p = rng.below(ctx) as i32;
                while present.contains(&p) {
                    p = rng.below(ctx) as i32;
                }
                present.remove(&row[col]);
                present.insert(p);
                row[col] = p;
            }
        }
    }
    let up = |v: &[i32]| upload_i32s(dev, v);
    let topk_b: Vec<D::Buffer> = sets.iter().map(|s| up(s)).collect::<Result<_, _>>()?;
    let req_b = up(&(0..r as i32).collect::<Vec<_>>())?;
    let resident_b = up(&vec![0; (r * m) as usize])?;
    let host_b = up(&(0..(r * m) as i32).map(|i| i + 1).collect::<Vec<_>>())?;
    let w = n.div_ceil(BLOCK);
    let hot_b = up(&(0..(r * w) as i32).map(|i| i + 1).collect::<Vec<_>>())?;
    let mut slot_host_rows = up(&vec![-1; (r * n) as usize])?;
    let lru: Vec<u16> = (0..r).flat_map(|_| 0..n as u16).collect();
    let mut lru_b = upload_u16s(dev, &lru)?;
    let tk = (r * k * 4) as usize;
    let t4 = (r * 4) as usize;
    let mut indices = dev.alloc(tk)?;
    let mut valid = dev.alloc(t4)?;
    let mut hits = dev.alloc(t4)?;
    let mut misses = dev.alloc(t4)?;
    let mut miss_src = dev.alloc(tk)?;
    let mut miss_dst = dev.alloc(tk)?;
    let desc = ResolveDesc {
        num_tokens: r,
        top_k: k,
        num_requests: r,
        max_pages: m,
        block_size: BLOCK,
        hot_slots: n,
        attention_block_stride: 832,
        host_num_blocks: r * m + 1,
        num_state_rows: None,
        stats_slot: 0,
    };
    let s = time(dev, stream, cfg, |call| {
        dev.resolve(
            stream,
            &desc,
            ResolveArgs {
                req_id: &req_b,
                topk: &topk_b[call % STEPS],
                resident_table: &resident_b,
                host_table: &host_b,
                hot_table: &hot_b,
                slot_host_rows: &mut slot_host_rows,
                lru: &mut lru_b,
                indices: &mut indices,
                valid_counts: &mut valid,
                hit_counts: &mut hits,
                miss_counts: &mut misses,
                miss_src: &mut miss_src,
                miss_dst: &mut miss_dst,
                idx_mapping: None,
                stats: None,
            },
        )
    })?;
    let entries = u64::from(r * k);
    // Must read: topk, slot_host_rows and lru; must write: indices, lru, the plan (~10% of entries, 2 × i32).
    let bytes = entries * 8 + u64::from(r * n) * (4 + 2 * 2) + entries / 10 * 8;
    Ok(Figure {
        name: format!("resolve {r} requests × top-k {k}, {n} hot slots, ~90% overlap"),
        seconds: s,
        items: entries,
        item: "entries",
        bytes,
        ceiling: DEVICE,
    })
}

/// The swap-in gather: `rows` random 656 B rows of a 2^20-row (688 MB, larger than any CPU
/// cache) pinned host pool into distinct device rows.
fn gather<D: Device>(
    dev: &D,
    stream: &D::Stream,
    cfg: &BenchConfig,
    rows: u32,
) -> Result<Figure, D::Error> {
    let host_blocks = (1u32 << 20) / BLOCK;
    let dev_blocks = rows.div_ceil(BLOCK);
    let page = u64::from(BLOCK * ROW_BYTES);
    let layer = LayerPair {
        host: PageLayout::contiguous(0, page, host_blocks, BLOCK, ROW_BYTES),
        device: PageLayout::contiguous(0, page, dev_blocks, BLOCK, ROW_BYTES),
    };
    let mut host = dev.alloc_pinned((u64::from(host_blocks) * page) as usize)?;
    let mut rng = SplitMix64::new(3);
    let pattern: Vec<u8> = (0..host_blocks as usize * page as usize)
        .map(|i| (i ^ (i >> 9)) as u8)
        .collect();
    dev.write_pinned(&mut host, 0, &pattern)?;
    drop(pattern);
    let mut device = dev.alloc((u64::from(dev_blocks) * page) as usize)?;
    // Several plans, cycled call after call, so the same rows are not re-read from cache: together
    // they cover about half the host pool.
    let plans = ((host_blocks * BLOCK) / rows / 2).max(1) as usize;
    let mut dst: Vec<i32> = (0..rows as i32).collect();
    rng.shuffle(&mut dst);
    let up = |v: &[i32]| upload_i32s(dev, v);
    let src_b: Vec<D::Buffer> = (0..plans)
        .map(|_| {
            let src: Vec<i32> = (0..rows)
                .map(|_| rng.below(u64::from(host_blocks * BLOCK)) as i32)
                .collect();
            up(&src)
        })
        .collect::<Result<_, _>>()?;
    let (dst_b, cnt_b) = (up(&dst)?, up(&[rows as i32])?);
    let layers = [layer];
    let desc = GatherDesc {
        num_tokens: 1,
        top_k: rows,
        layers: &layers,
    };
    let s = time(dev, stream, cfg, |call| {
        dev.gather_rows(
            stream,
            &desc,
            GatherArgs {
                plan_src: &src_b[call % plans],
                plan_dst: &dst_b,
                plan_counts: &cnt_b,
                host: &host,
                device: &mut device,
            },
        )
    })?;
    Ok(Figure {
        name: format!("gather {ROW_BYTES} B rows × {rows} (random, host→device)"),
        seconds: s,
        items: u64::from(rows),
        item: "rows",
        bytes: u64::from(rows) * u64::from(ROW_BYTES),
        ceiling: H2D,
    })
}

/// Page backup (device → host) or restore (host → device): 64 resident pages of a 12-layer group
/// (one DeepSeek V3.2 resident group) between the device pool and scattered host blocks, all
/// layers in one call. Successive calls take different pages (16 sets covering a 1024-block,
/// ~520 MB device pool), so the source is not served from a cache.
fn page_copy<D: Device>(
    dev: &D,
    stream: &D::Stream,
    cfg: &BenchConfig,
    direction: Direction,
) -> Result<Figure, D::Error> {
    const SETS: usize = 16;
    let (layers_n, pages, dev_blocks, host_blocks) = (12u32, 64u32, 1024u32, 1024u32);
    let page = u64::from(BLOCK * ROW_BYTES);
    let dev_stride = page * u64::from(layers_n) + 4 * 1024; // ≈ a V3.2 block (545 792 B) with padding
    let layers: Vec<LayerPair> = (0..layers_n)
        .map(|l| LayerPair {
            host: PageLayout::contiguous(
                u64::from(l) * page * u64::from(host_blocks),
                page,
                host_blocks,
                BLOCK,
                ROW_BYTES,
            ),
            device: PageLayout {
                index_stride_rows: (dev_stride / u64::from(ROW_BYTES)) as u32,
                ..PageLayout::contiguous(
                    u64::from(l) * page,
                    dev_stride,
                    dev_blocks,
                    BLOCK,
                    ROW_BYTES,
                )
            },
        })
        .collect();
    let mut host = dev.alloc_pinned((page * u64::from(host_blocks * layers_n)) as usize)?;
    let mut device = dev.alloc((dev_stride * u64::from(dev_blocks)) as usize)?;
    let mut rng = SplitMix64::new(4);
    let (srcs, dsts) = (rng.permutation(dev_blocks), rng.permutation(host_blocks));
    let sets: Vec<Vec<BlockPair>> = (0..SETS)
        .map(|s| {
            (0..pages as usize)
                .map(|i| BlockPair {
                    src: srcs[s * pages as usize + i],
                    dst: dsts[s * pages as usize + i],
                })
                .collect()
        })
        .collect();
    // A restore copies host blocks to device blocks: the pairs the other way round.
    let sets: Vec<Vec<BlockPair>> = match direction {
        Direction::DeviceToHost => sets,
        Direction::HostToDevice => sets
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .map(|p| BlockPair {
                        src: p.dst,
                        dst: p.src,
                    })
                    .collect()
            })
            .collect(),
    };
    let desc = PageCopyDesc {
        direction,
        layers: &layers,
    };
    let s = time(dev, stream, cfg, |call| {
        dev.copy_pages(stream, &desc, &sets[call % SETS], &mut host, &mut device)
    })?;
    let n = u64::from(pages * layers_n);
    let (what, way, ceiling) = match direction {
        Direction::DeviceToHost => ("backup", "device→host", D2H),
        Direction::HostToDevice => ("restore", "host→device", H2D),
    };
    Ok(Figure {
        name: format!("{what} {pages} pages × {layers_n} layers ({way})"),
        seconds: s,
        items: n,
        item: "pages",
        bytes: n * page,
        ceiling,
    })
}
