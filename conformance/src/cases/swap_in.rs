//! `Device::resolve_and_gather`, the swap-in critical path in one call, over multi-step random
//! sequences: every step runs the core's reference (`ops::swap_in::resolve_and_gather`, the
//! resolve and the gather of its miss plan) on host copies, the device's `resolve_and_gather` on
//! one device copy of the hot state and pools, and the device's own `resolve` + `gather_rows`
//! pair on another; both device paths must give the reference's every output (with the sentinels
//! past them intact), `dgi` and LRU rows and every byte of the device pool.
//!
//! Each call is bracketed on its stream by a copy that stages its top-k input before it and
//! copies its indices and the device pool after it (rule 1 of the stream rules: in order on one
//! stream), and an event recorded after it must report completion once the stream is
//! synchronised (rule 3).
//!
//! The shapes cover the decode batch (64 requests × 2048, 4096 hot slots), speculative rows of
//! one request spread over a shuffled batch with padding rows, split rows over 20 layers (beyond
//! the 16 layers a GPU backend may fuse into one launch), requests whose every page is resident,
//! a step with no miss, a cold start where every entry misses, host rows beyond the pool, misses
//! beyond the evictable slots, an empty batch, a corrupt LRU and the largest hot buffer. A fixed
//! case checks that a refused call writes nothing.

use hisparse_core::Device;
use hisparse_core::ops::resolve::Entry;
use hisparse_core::ops::swap_in::{plan_gather, resolve_and_gather as reference};
use hisparse_core::ops::{
    GatherArgs, LayerPair, PageLayout, ResolveArgs, ResolveDesc, ResolveSlices,
};

use crate::util::{
    Ctx, SENTINEL, at_step, dev_bytes, dev_i32, dev_u16, ensure, expect_invalid, pinned_bytes,
    read_bytes, read_i32, read_u16, same,
};
use crate::{Case, CaseError, CaseResult, SplitMix64};

/// One random sequence of swap-in calls.
#[derive(Clone, Copy, Debug)]
struct Shape {
    requests: u32,
    /// Token rows per request per step (speculative decoding when > 1).
    rows_per_request: u32,
    /// Padding rows per step (state rows `-1`, `-7`, `num_requests`, `i32::MAX`).
    padding_rows: u32,
    top_k: u32,
    hot_slots: u32,
    block_size: u32,
    /// Pages of each request's context (one more page column exists, with no host block).
    pages: u32,
    /// Layer pairs the plan is applied to (the leader, then its followers).
    layers: u32,
    /// Split rows (values, then scales) in the pages.
    split: bool,
    /// Percent of the other requests' pages still resident on the GPU.
    resident_pct: u64,
    /// The first requests whose every page is resident (their rows never touch the hot state).
    resident_requests: u32,
    /// Percent of pages whose host block lies beyond the host pool.
    beyond_pct: u64,
    /// Percent of entries copied from another entry of the same row.
    dup_pct: u64,
    /// Percent of entries that are invalid (negative, past the pages, no host block).
    invalid_pct: u64,
    /// Percent of each request's top-k that moves to a new position each step.
    move_pct: u64,
    /// Shuffle the token rows of a step (one request's rows are then not adjacent).
    shuffle: bool,
    /// Start request 0 with a corrupt LRU (not a permutation) and garbage `dgi`.
    corrupt: bool,
    /// Step 1 repeats step 0's rows exactly: every entry hits, no miss.
    repeat: bool,
    /// Step 1 has no token rows.
    empty_step: bool,
    steps: usize,
    /// Seeds (cases) of the shape.
    seeds: u32,
}

const BASE: Shape = Shape {
    requests: 2,
    rows_per_request: 1,
    padding_rows: 0,
    top_k: 64,
    hot_slots: 128,
    block_size: 16,
    pages: 24,
    layers: 2,
    split: false,
    resident_pct: 0,
    resident_requests: 0,
    beyond_pct: 0,
    dup_pct: 0,
    invalid_pct: 3,
    move_pct: 15,
    shuffle: false,
    corrupt: false,
    repeat: false,
    empty_step: false,
    steps: 5,
    seeds: 2,
};

fn shapes() -> Vec<(&'static str, Shape)> {
    vec![
        (
            "decode-64x2048",
            Shape {
                requests: 64,
                top_k: 2048,
                hot_slots: 4096,
                block_size: 64,
                pages: 128,
                layers: 1,
                resident_pct: 10,
                move_pct: 10,
                invalid_pct: 2,
                steps: 4,
                seeds: 1,
                ..BASE
            },
        ),
        (
            "speculative-padding-corrupt-lru",
            Shape {
                requests: 3,
                rows_per_request: 3,
                padding_rows: 2,
                top_k: 128,
                hot_slots: 512,
                pages: 64,
                layers: 3,
                resident_pct: 20,
                beyond_pct: 5,
                dup_pct: 20,
                shuffle: true,
                corrupt: true,
                steps: 4,
                ..BASE
            },
        ),
        (
            "split-rows-20-layers",
            Shape {
                requests: 4,
                padding_rows: 1,
                block_size: 8,
                pages: 32,
                layers: 20,
                split: true,
                resident_pct: 30,
                beyond_pct: 10,
                dup_pct: 10,
                steps: 3,
                ..BASE
            },
        ),
        (
            "padding-rows",
            Shape {
                requests: 3,
                padding_rows: 4,
                shuffle: true,
                ..BASE
            },
        ),
        (
            "fully-resident-rows-beside-others",
            Shape {
                requests: 4,
                resident_requests: 2,
                resident_pct: 20,
                shuffle: true,
                ..BASE
            },
        ),
        (
            "every-row-fully-resident",
            Shape {
                requests: 3,
                resident_requests: 3,
                steps: 3,
                ..BASE
            },
        ),
        (
            "a-step-without-misses",
            Shape {
                layers: 3,
                repeat: true,
                ..BASE
            },
        ),
        (
            "cold-every-entry-misses",
            Shape {
                pages: 256,
                move_pct: 100,
                invalid_pct: 0,
                steps: 3,
                ..BASE
            },
        ),
        (
            "host-rows-beyond-the-pool",
            Shape {
                beyond_pct: 30,
                ..BASE
            },
        ),
        (
            "several-rows-of-one-request",
            Shape {
                rows_per_request: 4,
                hot_slots: 512,
                dup_pct: 10,
                shuffle: true,
                ..BASE
            },
        ),
        (
            "misses-beyond-the-evictable-slots",
            Shape {
                requests: 1,
                rows_per_request: 3,
                top_k: 128,
                hot_slots: 128,
                move_pct: 70,
                ..BASE
            },
        ),
        (
            "zero-tokens",
            Shape {
                empty_step: true,
                steps: 3,
                ..BASE
            },
        ),
        (
            "leader-and-followers",
            Shape {
                layers: 4,
                resident_pct: 30,
                beyond_pct: 10,
                dup_pct: 10,
                ..BASE
            },
        ),
        (
            "max-hot-slots-32768",
            Shape {
                requests: 1,
                top_k: 2048,
                hot_slots: 32768,
                block_size: 64,
                pages: 1024,
                layers: 1,
                move_pct: 50,
                invalid_pct: 1,
                steps: 6,
                seeds: 1,
                ..BASE
            },
        ),
    ]
}

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    for (name, shape) in shapes() {
        for s in 0..shape.seeds {
            v.push(Case::seeded(
                format!("resolve_and_gather/{name}/{s}"),
                move |d: &D, seed| random(d, seed, shape),
            ));
        }
    }
    v.push(Case::fixed(
        "resolve_and_gather/refused-before-any-write",
        refused_before_any_write::<D>,
    ));
}

/// Elements past every output that must keep their sentinel.
const SLACK: usize = 3;

/// The host copy of a sequence: tables, hot state, pools.
struct World {
    desc: ResolveDesc,
    resident: Vec<i32>,
    host_table: Vec<i32>,
    hot: Vec<i32>,
    dgi: Vec<i32>,
    lru: Vec<u16>,
    layers: Vec<LayerPair>,
    host_pool: Vec<u8>,
    device_pool: Vec<u8>,
}

/// Everything one call leaves behind: its outputs, the hot state and the device pool.
#[derive(Debug, PartialEq)]
struct After {
    indices: Vec<i32>,
    valid: Vec<i32>,
    hits: Vec<i32>,
    misses: Vec<i32>,
    miss_src: Vec<i32>,
    miss_dst: Vec<i32>,
    dgi: Vec<i32>,
    lru: Vec<u16>,
    pool: Vec<u8>,
}

impl After {
    /// Outputs of `t` token rows of top-k `k`, every element (and the slack) a sentinel.
    fn sentinels(t: usize, k: usize) -> Self {
        let (tk, tu) = (vec![SENTINEL; t * k + SLACK], vec![SENTINEL; t + SLACK]);
        After {
            indices: tk.clone(),
            valid: tu.clone(),
            hits: tu.clone(),
            misses: tu,
            miss_src: tk.clone(),
            miss_dst: tk,
            dgi: Vec::new(),
            lru: Vec::new(),
            pool: Vec::new(),
        }
    }

    /// Compares everything with `want`, naming the path on a difference.
    fn expect(&self, path: &str, want: &After) -> CaseResult {
        let name = |what: &str| format!("{path}: {what}");
        same(&name("indices"), &self.indices, &want.indices)?;
        same(&name("valid_counts"), &self.valid, &want.valid)?;
        same(&name("hit_counts"), &self.hits, &want.hits)?;
        same(&name("miss_counts"), &self.misses, &want.misses)?;
        same(&name("miss_src"), &self.miss_src, &want.miss_src)?;
        same(&name("miss_dst"), &self.miss_dst, &want.miss_dst)?;
        same(&name("dgi"), &self.dgi, &want.dgi)?;
        same(&name("lru"), &self.lru, &want.lru)?;
        same(&name("device pool"), &self.pool, &want.pool)
    }
}

impl World {
    /// Runs one step on the reference; returns what it left behind.
    fn reference_step(&mut self, req_id: &[i32], topk: &[i32]) -> Result<After, CaseError> {
        let desc = ResolveDesc {
            num_tokens: req_id.len() as u32,
            ..self.desc
        };
        let mut out = After::sentinels(req_id.len(), desc.top_k as usize);
        reference(
            &desc,
            ResolveSlices {
                req_id,
                topk,
                resident_table: &self.resident,
                host_table: &self.host_table,
                hot_table: &self.hot,
                dgi: &mut self.dgi,
                lru: &mut self.lru,
                indices: &mut out.indices,
                valid_counts: &mut out.valid,
                hit_counts: &mut out.hits,
                miss_counts: &mut out.misses,
                miss_src: &mut out.miss_src,
                miss_dst: &mut out.miss_dst,
            },
            &self.layers,
            &self.host_pool,
            &mut self.device_pool,
        )
        .ctx("reference resolve_and_gather")?;
        out.dgi = self.dgi.clone();
        out.lru = self.lru.clone();
        out.pool = self.device_pool.clone();
        Ok(out)
    }
}

/// The stream both paths run on and the device buffers they read.
struct Shared<D: Device> {
    stream: D::Stream,
    resident: D::Buffer,
    host_table: D::Buffer,
    hot: D::Buffer,
    host_pool: D::HostBuffer,
}

/// One device path's own hot state and device pool.
struct Twin<D: Device> {
    dgi: D::Buffer,
    lru: D::Buffer,
    pool: D::Buffer,
}

/// How a device path issues the swap-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// `Device::resolve_and_gather`.
    Fused,
    /// `Device::resolve`, then `Device::gather_rows` of its plan, on the same stream.
    Pair,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Fused => "resolve_and_gather",
            Path::Pair => "resolve + gather_rows",
        }
    }
}

impl<D: Device> Twin<D> {
    fn new(dev: &D, w: &World) -> Result<Self, CaseError> {
        Ok(Twin {
            dgi: dev_i32(dev, &w.dgi)?,
            lru: dev_u16(dev, &w.lru)?,
            pool: dev_bytes(dev, &w.device_pool)?,
        })
    }

    /// Runs one step on the device along `path`; returns what it left behind.
    fn step(
        &mut self,
        dev: &D,
        shared: &Shared<D>,
        w: &World,
        path: Path,
        req_id: &[i32],
        topk: &[i32],
    ) -> Result<After, CaseError> {
        let (t, k) = (req_id.len(), w.desc.top_k as usize);
        let desc = ResolveDesc {
            num_tokens: t as u32,
            ..w.desc
        };
        let pool_len = w.device_pool.len();
        let what = path.name();
        let stream = &shared.stream;
        let d_req = dev_i32(dev, req_id)?;
        // The top-k reaches its buffer through a copy enqueued just before the call.
        let staged = dev_i32(dev, topk)?;
        let mut d_topk = dev_i32(dev, &vec![SENTINEL; topk.len()])?;
        if !topk.is_empty() {
            dev.copy_on_device(stream, &staged, 0, &mut d_topk, 0, topk.len() * 4)
                .ctx("staging the top-k on the stream")?;
        }
        let init = After::sentinels(t, k);
        let mut indices = dev_i32(dev, &init.indices)?;
        let mut valid = dev_i32(dev, &init.valid)?;
        let mut hits = dev_i32(dev, &init.hits)?;
        let mut misses = dev_i32(dev, &init.misses)?;
        let mut miss_src = dev_i32(dev, &init.miss_src)?;
        let mut miss_dst = dev_i32(dev, &init.miss_dst)?;
        let args = ResolveArgs {
            req_id: &d_req,
            topk: &d_topk,
            resident_table: &shared.resident,
            host_table: &shared.host_table,
            hot_table: &shared.hot,
            dgi: &mut self.dgi,
            lru: &mut self.lru,
            indices: &mut indices,
            valid_counts: &mut valid,
            hit_counts: &mut hits,
            miss_counts: &mut misses,
            miss_src: &mut miss_src,
            miss_dst: &mut miss_dst,
        };
        match path {
            Path::Fused => dev
                .resolve_and_gather(
                    stream,
                    &desc,
                    args,
                    &w.layers,
                    &shared.host_pool,
                    &mut self.pool,
                )
                .ctx(what)?,
            Path::Pair => {
                dev.resolve(stream, &desc, args).ctx("resolve")?;
                dev.gather_rows(
                    stream,
                    &plan_gather(&desc, &w.layers),
                    GatherArgs {
                        plan_src: &miss_src,
                        plan_dst: &miss_dst,
                        plan_counts: &misses,
                        host: &shared.host_pool,
                        device: &mut self.pool,
                    },
                )
                .ctx("gather_rows")?;
            }
        }
        // What later work on the stream sees: copies of the indices and of the device pool.
        let mut indices_after = dev.alloc((t * k + SLACK) * 4).ctx("alloc")?;
        dev.copy_on_device(
            stream,
            &indices,
            0,
            &mut indices_after,
            0,
            (t * k + SLACK) * 4,
        )
        .ctx("copying the indices on the stream")?;
        let mut pool_after = dev.alloc(pool_len).ctx("alloc")?;
        dev.copy_on_device(stream, &self.pool, 0, &mut pool_after, 0, pool_len)
            .ctx("copying the device pool on the stream")?;
        let done = dev.record_event(stream).ctx("record_event")?;
        dev.synchronize(stream).ctx("synchronize")?;
        ensure!(
            dev.query_event(&done).ctx("query_event")?,
            "{what}: an event recorded after the call is not complete once its stream is \
             synchronised"
        );
        Ok(After {
            indices: read_i32(dev, &indices_after, t * k + SLACK)?,
            valid: read_i32(dev, &valid, t + SLACK)?,
            hits: read_i32(dev, &hits, t + SLACK)?,
            misses: read_i32(dev, &misses, t + SLACK)?,
            miss_src: read_i32(dev, &miss_src, t * k + SLACK)?,
            miss_dst: read_i32(dev, &miss_dst, t * k + SLACK)?,
            dgi: read_i32(dev, &self.dgi, w.dgi.len())?,
            lru: read_u16(dev, &self.lru, w.lru.len())?,
            pool: read_bytes(dev, &pool_after, pool_len)?,
        })
    }
}

/// Builds the tables, the hot state and the pools of `sh`.
fn build(rng: &mut SplitMix64, sh: &Shape) -> World {
    let (r_count, bs, pages) = (sh.requests, sh.block_size, sh.pages);
    let host_num_blocks = r_count * pages;
    let max_pages = pages + 1;
    let width = sh.hot_slots.div_ceil(bs);
    // GPU blocks: the null block 0, each request's hot region, then 16 blocks resident pages
    // sit in (shared between pages: a resident block is only read).
    let hot: Vec<i32> = (0..r_count * width).map(|i| 1 + i as i32).collect();
    let resident_base = 1 + r_count * width;
    let device_blocks = resident_base + 16;
    let mut blocks: Vec<i32> = (0..host_num_blocks as i32).collect();
    rng.shuffle(&mut blocks);
    let mut blocks = blocks.into_iter();
    let mut host_table = vec![-1i32; (r_count * max_pages) as usize];
    let mut resident = vec![0i32; host_table.len()];
    for r in 0..r_count {
        for p in 0..pages {
            let at = (r * max_pages + p) as usize;
            let block = blocks.next().unwrap_or(0);
            host_table[at] = if rng.percent(sh.beyond_pct) {
                (host_num_blocks + rng.u32_in(0, 3)) as i32
            } else {
                block
            };
            if r < sh.resident_requests || rng.percent(sh.resident_pct) {
                resident[at] = (resident_base + rng.u32_in(0, 16)) as i32;
            } else if rng.percent(20) {
                resident[at] = -1;
            }
        }
    }
    let (row_bytes, value_bytes) = if sh.split { (48u32, 32u32) } else { (32, 32) };
    let page = u64::from(bs * row_bytes);
    let n_layers = u64::from(sh.layers);
    let stride = sh.layers * bs;
    let layers: Vec<LayerPair> = (0..n_layers)
        .map(|l| LayerPair {
            host: PageLayout {
                base: l * page * u64::from(host_num_blocks),
                block_stride: page,
                num_blocks: host_num_blocks,
                block_size: bs,
                row_bytes,
                value_bytes,
                index_stride_rows: bs,
            },
            device: PageLayout {
                base: l * page,
                block_stride: n_layers * page,
                num_blocks: device_blocks,
                block_size: bs,
                row_bytes,
                value_bytes,
                index_stride_rows: stride,
            },
        })
        .collect();
    let mut host_pool = vec![0u8; (n_layers * page * u64::from(host_num_blocks)) as usize];
    rng.fill(&mut host_pool);
    let mut device_pool = vec![0u8; (n_layers * page * u64::from(device_blocks)) as usize];
    rng.fill(&mut device_pool);
    let n = sh.hot_slots as usize;
    let mut lru: Vec<u16> = (0..r_count as usize * n).map(|s| (s % n) as u16).collect();
    for region in lru.chunks_mut(n) {
        rng.shuffle(region);
    }
    let mut dgi = vec![-1i32; r_count as usize * n];
    if sh.corrupt {
        lru[1] = lru[0];
        let rows = (host_num_blocks * bs) as i32;
        for d in &mut dgi[..n] {
            *d = rng.i32_in(-5, rows + 50);
        }
    }
    World {
        desc: ResolveDesc {
            num_tokens: 0,
            top_k: sh.top_k,
            num_requests: r_count,
            max_pages,
            block_size: bs,
            hot_slots: sh.hot_slots,
            attention_block_stride: stride,
            host_num_blocks,
        },
        resident,
        host_table,
        hot,
        dgi,
        lru,
        layers,
        host_pool,
        device_pool,
    }
}

/// A step's token rows `(state row, top-k)`: every request's rows, evolved from `current`,
/// and the padding rows.
fn next_rows(
    rng: &mut SplitMix64,
    sh: &Shape,
    w: &World,
    current: &mut [Vec<i32>],
) -> Vec<(i32, Vec<i32>)> {
    let ctx = (sh.pages * sh.block_size) as i32;
    let span = (w.desc.max_pages * sh.block_size) as i32;
    let mut rows = Vec::new();
    for (r, top) in current.iter_mut().enumerate() {
        for tok in top.iter_mut() {
            if rng.percent(sh.move_pct) {
                *tok = rng.i32_in(0, ctx);
            }
        }
        for q in 0..sh.rows_per_request {
            let mut row = top.clone();
            for j in 0..row.len() {
                if q > 0 && rng.percent(20) {
                    row[j] = rng.i32_in(0, ctx);
                }
                if rng.percent(sh.dup_pct) {
                    row[j] = row[rng.below(row.len() as u64) as usize];
                }
                if rng.percent(sh.invalid_pct) {
                    row[j] = match rng.below(3) {
                        0 => rng.i32_in(i32::MIN, 0),
                        1 => span + rng.i32_in(0, 100),
                        // The page column past the context: no host block.
                        _ => rng.i32_in(ctx, span),
                    };
                }
            }
            rows.push((r as i32, row));
        }
    }
    for _ in 0..sh.padding_rows {
        let id = rng.pick(&[-1, -7, sh.requests as i32, i32::MAX]);
        let row = (0..sh.top_k).map(|_| rng.i32_in(0, span)).collect();
        let at = rng.below(rows.len() as u64 + 1) as usize;
        rows.insert(at, (id, row));
    }
    if sh.shuffle {
        rng.shuffle(&mut rows);
    }
    rows
}

/// What a sequence exercised, so a shape that silently stopped testing its feature fails.
#[derive(Debug, Default)]
struct Coverage {
    hits: i64,
    misses: i64,
    resident: i64,
    /// Host entries left without a slot (misses beyond the evictable slots).
    unslotted: i64,
    /// Plan entries with source -1 (host rows beyond the pool, zero-filled).
    zero_fill: i64,
    /// Hits of the first step (a cold hot state: none).
    first_step_hits: i64,
    /// Misses and hits of the repeated step.
    repeated: Option<(i64, i64)>,
}

impl Coverage {
    fn add(&mut self, w: &World, req_id: &[i32], topk: &[i32], out: &After) -> (i64, i64) {
        let k = w.desc.top_k as usize;
        let (mut hits, mut misses) = (0, 0);
        for (t, &id) in req_id.iter().enumerate() {
            let Some(r) = w.desc.state_row(id) else {
                continue;
            };
            hits += i64::from(out.hits[t]);
            misses += i64::from(out.misses[t]);
            for m in 0..out.misses[t].max(0) as usize {
                self.zero_fill += i64::from(out.miss_src[t * k + m] == -1);
            }
            for j in 0..k {
                match w
                    .desc
                    .classify(&w.resident, &w.host_table, r, topk[t * k + j])
                {
                    Entry::Resident(_) => self.resident += 1,
                    Entry::Host(_) => self.unslotted += i64::from(out.indices[t * k + j] == -1),
                    Entry::Invalid => {}
                }
            }
        }
        self.hits += hits;
        self.misses += misses;
        (hits, misses)
    }

    fn expect(&self, sh: &Shape) -> CaseResult {
        let c = self;
        ensure!(
            c.first_step_hits == 0,
            "the first step hit a cold hot state: {c:?}"
        );
        if sh.resident_requests == sh.requests {
            ensure!(c.hits == 0 && c.misses == 0, "fully resident, yet {c:?}");
            ensure!(c.resident > 0, "no resident entry: {c:?}");
            return Ok(());
        }
        ensure!(c.misses > 0, "no miss was exercised: {c:?}");
        ensure!(
            sh.move_pct == 100 || c.hits > 0,
            "no hit was exercised: {c:?}"
        );
        ensure!(
            sh.resident_pct + u64::from(sh.resident_requests) == 0 || c.resident > 0,
            "no resident entry: {c:?}"
        );
        ensure!(
            sh.beyond_pct == 0 || c.zero_fill > 0,
            "no host row beyond the pool: {c:?}"
        );
        ensure!(
            sh.rows_per_request * sh.top_k <= sh.hot_slots || c.unslotted > 0,
            "no miss beyond the evictable slots: {c:?}"
        );
        if sh.repeat {
            ensure!(
                matches!(c.repeated, Some((0, h)) if h > 0),
                "the repeated step should hit every entry and miss none: {c:?}"
            );
        }
        Ok(())
    }
}

fn random<D: Device>(dev: &D, seed: u64, sh: Shape) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let mut w = build(&mut rng, &sh);
    let shared = Shared {
        stream: dev.create_stream().ctx("create_stream")?,
        resident: dev_i32(dev, &w.resident)?,
        host_table: dev_i32(dev, &w.host_table)?,
        hot: dev_i32(dev, &w.hot)?,
        host_pool: pinned_bytes(dev, &w.host_pool)?,
    };
    let mut fused = Twin::new(dev, &w)?;
    let mut pair = Twin::new(dev, &w)?;
    let ctx = (sh.pages * sh.block_size) as i32;
    let mut current: Vec<Vec<i32>> = (0..sh.requests)
        .map(|_| (0..sh.top_k).map(|_| rng.i32_in(0, ctx)).collect())
        .collect();
    let mut seen = Coverage::default();
    let mut previous = Vec::new();
    for step in 0..sh.steps {
        let rows = match step {
            1 if sh.empty_step => Vec::new(),
            1 if sh.repeat => previous.clone(),
            _ => next_rows(&mut rng, &sh, &w, &mut current),
        };
        let req_id: Vec<i32> = rows.iter().map(|(id, _)| *id).collect();
        let topk: Vec<i32> = rows.iter().flat_map(|(_, row)| row.clone()).collect();
        let want = at_step(step, w.reference_step(&req_id, &topk))?;
        for (twin, path) in [(&mut fused, Path::Fused), (&mut pair, Path::Pair)] {
            let got = twin.step(dev, &shared, &w, path, &req_id, &topk);
            at_step(step, got.and_then(|g| g.expect(path.name(), &want)))?;
        }
        let (hits, misses) = seen.add(&w, &req_id, &topk, &want);
        if step == 0 {
            seen.first_step_hits = hits;
        }
        if step == 1 && sh.repeat {
            seen.repeated = Some((misses, hits));
        }
        previous = rows;
    }
    seen.expect(&sh)
}

/// Calls the device cannot accept — no layers, a device pool, host pool or plan buffer too
/// small for them — are refused with an invalid-argument error before anything is written: the
/// hot state, the outputs and the device pool keep their bytes. A valid call on the same buffers
/// then succeeds (so the refusals were the arguments' doing).
fn refused_before_any_write<D: Device>(dev: &D) -> CaseResult {
    let sh = Shape {
        requests: 1,
        top_k: 4,
        hot_slots: 8,
        block_size: 4,
        pages: 4,
        layers: 1,
        invalid_pct: 0,
        ..BASE
    };
    let mut rng = SplitMix64::new(0x5EED);
    let w = build(&mut rng, &sh);
    let desc = ResolveDesc {
        num_tokens: 1,
        ..w.desc
    };
    let shared = Shared::<D> {
        stream: dev.create_stream().ctx("create_stream")?,
        resident: dev_i32(dev, &w.resident)?,
        host_table: dev_i32(dev, &w.host_table)?,
        hot: dev_i32(dev, &w.hot)?,
        host_pool: pinned_bytes(dev, &w.host_pool)?,
    };
    let short_host = pinned_bytes(dev, &w.host_pool[..16])?;
    let mut twin = Twin::new(dev, &w)?;
    let mut short_pool = dev_bytes(dev, &w.device_pool[..16])?;
    let d_req = dev_i32(dev, &[0])?;
    let d_topk = dev_i32(dev, &[0, 5, 9, 14])?;
    let init = After::sentinels(1, 4);
    let mut indices = dev_i32(dev, &init.indices)?;
    let mut valid = dev_i32(dev, &init.valid)?;
    let mut hits = dev_i32(dev, &init.hits)?;
    let mut misses = dev_i32(dev, &init.misses)?;
    let mut miss_src = dev_i32(dev, &init.miss_src)?;
    let mut miss_dst = dev_i32(dev, &init.miss_dst)?;
    let mut short_dst = dev_i32(dev, &[SENTINEL])?;
    let no_layers: &[LayerPair] = &[];
    for (what, layers, host, pool_is_short, dst_is_short) in [
        ("no layers", no_layers, &shared.host_pool, false, false),
        (
            "a device pool too small for the layer",
            &w.layers[..],
            &shared.host_pool,
            true,
            false,
        ),
        (
            "a host pool too small for the layer",
            &w.layers[..],
            &short_host,
            false,
            false,
        ),
        (
            "a miss_dst of one element",
            &w.layers[..],
            &shared.host_pool,
            false,
            true,
        ),
    ] {
        let pool = if pool_is_short {
            &mut short_pool
        } else {
            &mut twin.pool
        };
        let r = dev.resolve_and_gather(
            &shared.stream,
            &desc,
            ResolveArgs {
                req_id: &d_req,
                topk: &d_topk,
                resident_table: &shared.resident,
                host_table: &shared.host_table,
                hot_table: &shared.hot,
                dgi: &mut twin.dgi,
                lru: &mut twin.lru,
                indices: &mut indices,
                valid_counts: &mut valid,
                hit_counts: &mut hits,
                miss_counts: &mut misses,
                miss_src: &mut miss_src,
                miss_dst: if dst_is_short {
                    &mut short_dst
                } else {
                    &mut miss_dst
                },
            },
            layers,
            host,
            pool,
        );
        expect_invalid(what, r)?;
        dev.synchronize(&shared.stream).ctx("synchronize")?;
        let kept = |name: &str| format!("{name} after a refused call ({what})");
        same(
            &kept("dgi"),
            &read_i32(dev, &twin.dgi, w.dgi.len())?,
            &w.dgi,
        )?;
        same(
            &kept("lru"),
            &read_u16(dev, &twin.lru, w.lru.len())?,
            &w.lru,
        )?;
        same(
            &kept("indices"),
            &read_i32(dev, &indices, 4 + SLACK)?,
            &init.indices,
        )?;
        same(
            &kept("miss_counts"),
            &read_i32(dev, &misses, 1 + SLACK)?,
            &init.misses,
        )?;
        same(
            &kept("device pool"),
            &read_bytes(dev, &twin.pool, w.device_pool.len())?,
            &w.device_pool,
        )?;
        same(
            &kept("short device pool"),
            &read_bytes(dev, &short_pool, 16)?,
            &w.device_pool[..16],
        )?;
    }
    dev.resolve_and_gather(
        &shared.stream,
        &desc,
        ResolveArgs {
            req_id: &d_req,
            topk: &d_topk,
            resident_table: &shared.resident,
            host_table: &shared.host_table,
            hot_table: &shared.hot,
            dgi: &mut twin.dgi,
            lru: &mut twin.lru,
            indices: &mut indices,
            valid_counts: &mut valid,
            hit_counts: &mut hits,
            miss_counts: &mut misses,
            miss_src: &mut miss_src,
            miss_dst: &mut miss_dst,
        },
        &w.layers,
        &shared.host_pool,
        &mut twin.pool,
    )
    .ctx("the same call with valid arguments")?;
    dev.synchronize(&shared.stream).ctx("synchronize")?;
    ensure!(
        read_i32(dev, &misses, 1)?[0] > 0,
        "the valid call after the refused ones missed nothing; the case tests nothing"
    );
    Ok(())
}
