//! `Device::resolve_and_gather`, the swap-in critical path in one call, over multi-step random
//! sequences: every step runs the core's reference (`ops::swap_in::resolve_and_gather`, the
//! resolve and the gather of its miss plan) on host copies, the device's `resolve_and_gather` on
//! one device copy of the hot state and pools, and the device's own `resolve` + `gather_rows`
//! pair on another; both device paths must give the reference's every output (with the sentinels
//! past them intact), `slot_host_rows` and LRU rows and every byte of the device pool. A third
//! device copy takes each step as two micro-batch calls on two unordered streams
//! ([`micro_batches`]), which must leave the same.
//!
//! Each call is bracketed on its stream by a copy that stages its top-k input before it and
//! one that copies the device pool after it (rule 1 of the stream rules: in order on one stream), and an event recorded after it must report completion once the stream is
//! synchronised (rule 3).
//!
//! The shapes cover the decode batch (64 requests × 2048, 4096 hot slots), speculative rows of
//! one request spread over a shuffled batch with padding rows, split rows over 20 layers (beyond
//! the 16 layers a GPU backend may fuse into one launch), requests whose every page is resident,
//! a step with no miss, a cold start where every entry misses, host rows beyond the pool, misses
//! beyond the evictable slots, an empty batch, a corrupt LRU and the largest hot buffer. A fixed
//! case checks that a refused call writes nothing.

use hisparse_core::Device;
use hisparse_core::ops::swap_in::{plan_gather, resolve_and_gather as reference};
use hisparse_core::ops::{GatherArgs, LayerPair, ResolveDesc};

use super::copies::{Rows, V4, layouts, pool_sizes};
use super::resolve_io::{
    Asked, Coverage, DevOutputs, DevState, HostState, Outputs, initial_stats, stats_slot,
};
use crate::util::{
    Ctx, SENTINEL, at_step, dev_bytes, dev_i32, ensure, expect_invalid, pinned_bytes, read_bytes,
    read_i32, same,
};
use crate::{Case, CaseError, CaseResult, SplitMix64};

mod micro_batches;

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
    /// Pages of each request's context (one more page column exists, with no host block).
    pages: u32,
    /// Rows, pages and blocks of the pools, and the layers the plan is applied to (the leader,
    /// then its followers).
    rows: Rows,
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
    /// Start request 0 with a corrupt LRU (not a permutation) and garbage `slot_host_rows`.
    corrupt: bool,
    /// Step 1 repeats step 0's rows exactly: every entry hits, no miss.
    repeat: bool,
    /// Step 1 has no token rows.
    empty_step: bool,
    steps: usize,
    /// Seeds (cases) of the shape.
    seeds: u32,
    /// The steps add to a stats buffer (at the slots of `resolve_io::stats_slot`).
    stats: bool,
}

const BASE: Shape = Shape {
    requests: 2,
    rows_per_request: 1,
    padding_rows: 0,
    top_k: 64,
    hot_slots: 128,
    pages: 24,
    rows: Rows {
        row_bytes: 32,
        value_bytes: 32,
        block_size: 16,
        layers: 2,
        extra_rows: 0,
        page_alignment: 1,
    },
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
    stats: false,
};

/// The decode batch: 64 requests × 2048, 4096 hot slots.
const DECODE_64X2048: Shape = Shape {
    requests: 64,
    top_k: 2048,
    hot_slots: 4096,
    pages: 128,
    rows: Rows {
        block_size: 64,
        layers: 1,
        ..BASE.rows
    },
    resident_pct: 10,
    move_pct: 10,
    invalid_pct: 2,
    steps: 4,
    seeds: 1,
    ..BASE
};

fn shapes() -> Vec<(&'static str, Shape)> {
    vec![
        ("decode-64x2048", DECODE_64X2048),
        (
            "speculative-padding-corrupt-lru",
            Shape {
                requests: 3,
                rows_per_request: 3,
                padding_rows: 2,
                top_k: 128,
                hot_slots: 512,
                pages: 64,
                rows: Rows {
                    layers: 3,
                    ..BASE.rows
                },
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
                pages: 32,
                rows: Rows {
                    row_bytes: 48,
                    value_bytes: 32,
                    block_size: 8,
                    layers: 20,
                    ..BASE.rows
                },
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
                rows: Rows {
                    layers: 3,
                    ..BASE.rows
                },
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
            "stats-zero-tokens-and-speculative-rows",
            Shape {
                requests: 3,
                rows_per_request: 2,
                padding_rows: 2,
                shuffle: true,
                resident_pct: 20,
                beyond_pct: 10,
                empty_step: true,
                steps: 8,
                stats: true,
                ..BASE
            },
        ),
        (
            "stats-decode-64x2048",
            Shape {
                steps: 5,
                stats: true,
                ..DECODE_64X2048
            },
        ),
        (
            "leader-and-followers",
            Shape {
                rows: Rows {
                    layers: 4,
                    ..BASE.rows
                },
                resident_pct: 30,
                beyond_pct: 10,
                dup_pct: 10,
                ..BASE
            },
        ),
        (
            "v4-split-rows-padded-pages-wide-blocks",
            Shape {
                pages: 12,
                rows: V4,
                resident_pct: 20,
                beyond_pct: 25,
                steps: 3,
                ..BASE
            },
        ),
        (
            "max-hot-slots-32768",
            Shape {
                requests: 1,
                top_k: 2048,
                hot_slots: 32768,
                pages: 1024,
                rows: Rows {
                    block_size: 64,
                    layers: 1,
                    ..BASE.rows
                },
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

/// The host copy of a sequence: tables, hot state, pools.
struct World {
    desc: ResolveDesc,
    h: HostState,
    layers: Vec<LayerPair>,
    host_pool: Vec<u8>,
    device_pool: Vec<u8>,
}

impl World {
    /// The descriptor of a call over `t` token rows adding to stats slot `slot` (`None`: a call
    /// without stats).
    fn call_desc(&self, t: usize, slot: Option<u32>) -> ResolveDesc {
        ResolveDesc {
            num_tokens: t as u32,
            stats_slot: slot.unwrap_or(0),
            ..self.desc
        }
    }

    /// Runs one step on the reference, adding to stats slot `slot` (`None`: without the stats
    /// buffer); returns its outputs.
    fn reference_step(
        &mut self,
        req_id: &[i32],
        topk: &[i32],
        slot: Option<u32>,
    ) -> Result<Outputs, CaseError> {
        let desc = self.call_desc(req_id.len(), slot);
        let parked = if slot.is_none() {
            self.h.stats.take()
        } else {
            None
        };
        let mut out = Outputs::sentinels(req_id.len(), desc.top_k as usize);
        let r = reference(
            &desc,
            self.h.slices(req_id, topk, &mut out),
            &self.layers,
            &self.host_pool,
            &mut self.device_pool,
        );
        if parked.is_some() {
            self.h.stats = parked;
        }
        r.ctx("reference resolve_and_gather")?;
        Ok(out)
    }
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
    /// The prefix of a difference found on this path.
    fn label(self) -> &'static str {
        match self {
            Path::Fused => "resolve_and_gather: ",
            Path::Pair => "resolve + gather_rows: ",
        }
    }
}

/// One device path's own tables, hot state and device pool.
struct Twin<D: Device> {
    state: DevState<D>,
    pool: D::Buffer,
}

impl<D: Device> Twin<D> {
    fn new(dev: &D, w: &World) -> Result<Self, CaseError> {
        Ok(Twin {
            state: DevState::upload(dev, &w.h)?,
            pool: dev_bytes(dev, &w.device_pool)?,
        })
    }

    /// Runs one step on the device along `path` and compares everything it left behind with
    /// the reference's: `want`, and `w` (the hot state and device pool after the reference
    /// step).
    fn step(
        &mut self,
        dev: &D,
        host_pool: &D::HostBuffer,
        w: &World,
        path: Path,
        (req_id, topk, slot): (&[i32], &[i32], Option<u32>),
        want: &Outputs,
    ) -> CaseResult {
        let (t, k) = (req_id.len(), w.desc.top_k as usize);
        let desc = w.call_desc(t, slot);
        let label = path.label();
        // A call without stats: the buffer is parked (and compared below, unchanged).
        let parked = if slot.is_none() {
            self.state.stats.take()
        } else {
            None
        };

        let stream = dev.create_stream().ctx("create_stream")?;
        let d_req = dev_i32(dev, req_id)?;
        // The top-k reaches its buffer through a copy enqueued on the stream just before.
        let staged = dev_i32(dev, topk)?;
        let mut d_topk = dev_i32(dev, &vec![SENTINEL; topk.len()])?;
        if !topk.is_empty() {
            dev.copy_on_device(&stream, &staged, 0, &mut d_topk, 0, topk.len() * 4)
                .ctx("staging the top-k on the stream")?;
        }
        let mut out = DevOutputs::upload(dev, &Outputs::sentinels(t, k))?;
        let args = self.state.args(&d_req, &d_topk, &mut out);
        match path {
            Path::Fused => dev
                .resolve_and_gather(&stream, &desc, args, &w.layers, host_pool, &mut self.pool)
                .ctx("resolve_and_gather")?,
            Path::Pair => {
                dev.resolve(&stream, &desc, args).ctx("resolve")?;
                dev.gather_rows(
                    &stream,
                    &plan_gather(&desc, &w.layers),
                    GatherArgs {
                        plan_src: &out.miss_src,
                        plan_dst: &out.miss_dst,
                        plan_counts: &out.misses,
                        host: host_pool,
                        device: &mut self.pool,
                    },
                )
                .ctx("gather_rows")?;
            }
        }
        // What later work on the stream sees: a copy of the device pool.
        let pool_len = w.device_pool.len();
        let mut pool_after = dev.alloc(pool_len).ctx("alloc")?;
        dev.copy_on_device(&stream, &self.pool, 0, &mut pool_after, 0, pool_len)
            .ctx("copying the device pool on the stream")?;
        let done = dev.record_event(&stream).ctx("record_event")?;
        dev.synchronize(&stream).ctx("synchronize")?;
        if parked.is_some() {
            self.state.stats = parked;
        }
        ensure!(
            dev.query_event(&done).ctx("query_event")?,
            "{label}an event recorded after the call is not complete once its stream is \
             synchronised"
        );
        out.read(dev, t, k)?.expect(label, want)?;
        self.state.expect_hot_state(dev, label, &w.h)?;
        same(
            &format!("{label}device pool"),
            &read_bytes(dev, &pool_after, pool_len)?,
            &w.device_pool,
        )
    }
}

/// Builds the tables, the hot state and the pools of `sh`.
fn build(rng: &mut SplitMix64, sh: &Shape) -> World {
    let (r_count, bs, pages) = (sh.requests, sh.rows.block_size, sh.pages);
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
    let mut host = vec![-1i32; (r_count * max_pages) as usize];
    let mut resident = vec![0i32; host.len()];
    for r in 0..r_count {
        for p in 0..pages {
            let at = (r * max_pages + p) as usize;
            let block = blocks.next().unwrap_or(0);
            host[at] = if rng.percent(sh.beyond_pct) {
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
    let layers = layouts(sh.rows, host_num_blocks, device_blocks);
    let (host_len, device_len) = pool_sizes(sh.rows, host_num_blocks, device_blocks);
    let mut host_pool = vec![0u8; host_len];
    rng.fill(&mut host_pool);
    let mut device_pool = vec![0u8; device_len];
    rng.fill(&mut device_pool);
    let n = sh.hot_slots as usize;
    let mut lru: Vec<u16> = (0..r_count as usize * n).map(|s| (s % n) as u16).collect();
    for region in lru.chunks_mut(n) {
        rng.shuffle(region);
    }
    let mut slot_host_rows = vec![-1i32; r_count as usize * n];
    if sh.corrupt {
        lru[1] = lru[0];
        let rows = (host_num_blocks * bs) as i32;
        for d in &mut slot_host_rows[..n] {
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
            attention_block_stride: layers[0].device.index_stride_rows,
            host_num_blocks,
            num_state_rows: None,
            stats_slot: 0,
        },
        h: HostState {
            resident,
            host,
            hot,
            slot_host_rows,
            lru,
            idx_mapping: None,
            stats: sh.stats.then(|| initial_stats(rng)),
        },
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
    let ctx = (sh.pages * sh.rows.block_size) as i32;
    let span = (w.desc.max_pages * sh.rows.block_size) as i32;
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

fn random<D: Device>(dev: &D, seed: u64, sh: Shape) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let mut w = build(&mut rng, &sh);
    let host_pool = pinned_bytes(dev, &w.host_pool)?;
    let mut fused = Twin::new(dev, &w)?;
    let mut pair = Twin::new(dev, &w)?;
    let mut micro = micro_batches::MicroBatches::new(dev, &w)?;
    let ctx = (sh.pages * sh.rows.block_size) as i32;
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
        let slot = stats_slot(step);
        let want = at_step(step, w.reference_step(&req_id, &topk, slot))?;
        for (twin, path) in [(&mut fused, Path::Fused), (&mut pair, Path::Pair)] {
            at_step(
                step,
                twin.step(dev, &host_pool, &w, path, (&req_id, &topk, slot), &want),
            )?;
        }
        at_step(
            step,
            micro.step(dev, &host_pool, &w, (&req_id, &topk, slot), &want),
        )?;
        let (hits, misses) = seen.add(&w.desc, &w.h, (&req_id, &topk), &want);
        // A cold hot state (every slot_host_rows -1, or request 0's corrupt one reset) hits nothing.
        ensure!(
            step > 0 || hits == 0,
            "the first step hit a cold hot state: {seen:?}"
        );
        if step == 1 && sh.repeat {
            ensure!(
                misses == 0 && hits > 0,
                "the repeated step should hit every entry and miss none: {hits} hits, {misses} \
                 misses"
            );
        }
        previous = rows;
    }
    seen.expect(&Asked {
        fully_resident: sh.resident_requests == sh.requests,
        hits: sh.move_pct < 100,
        resident: sh.resident_pct > 0 || sh.resident_requests > 0,
        beyond_pool: sh.beyond_pct > 0,
        beyond_slots: sh.rows_per_request * sh.top_k > sh.hot_slots,
    })
}

/// Calls the device cannot accept — no layers, a device pool, host pool or plan buffer too
/// small for them — are refused with an invalid-argument error before anything is written: the
/// hot state, the outputs and the device pool keep their bytes. The same call with valid
/// arguments then succeeds and misses (so the refusals were the arguments' doing).
fn refused_before_any_write<D: Device>(dev: &D) -> CaseResult {
    let sh = Shape {
        requests: 1,
        top_k: 4,
        hot_slots: 8,
        pages: 4,
        rows: Rows {
            block_size: 4,
            layers: 1,
            ..BASE.rows
        },
        invalid_pct: 0,
        ..BASE
    };
    let mut rng = SplitMix64::new(0x5EED);
    let w = build(&mut rng, &sh);
    let desc = ResolveDesc {
        num_tokens: 1,
        ..w.desc
    };
    let stream = dev.create_stream().ctx("create_stream")?;
    let host_pool = pinned_bytes(dev, &w.host_pool)?;
    let short_host = pinned_bytes(dev, &w.host_pool[..16])?;
    let mut twin = Twin::new(dev, &w)?;
    let mut short_pool = dev_bytes(dev, &w.device_pool[..16])?;
    let d_req = dev_i32(dev, &[0])?;
    let d_topk = dev_i32(dev, &[0, 5, 9, 14])?;
    let init = Outputs::sentinels(1, 4);
    let mut out = DevOutputs::upload(dev, &init)?;
    let mut short_dst = DevOutputs::upload(
        dev,
        &Outputs {
            miss_dst: vec![SENTINEL],
            ..Outputs::sentinels(1, 4)
        },
    )?;
    let no_layers: &[LayerPair] = &[];
    let all = &w.layers[..];
    // (what, layers, host pool, short device pool, one-element miss_dst)
    for (what, layers, host, pool_is_short, dst_is_short) in [
        ("no layers", no_layers, &host_pool, false, false),
        (
            "a device pool too small for the layer",
            all,
            &host_pool,
            true,
            false,
        ),
        (
            "a host pool too small for the layer",
            all,
            &short_host,
            false,
            false,
        ),
        ("a miss_dst of one element", all, &host_pool, false, true),
        ("valid", all, &host_pool, false, false),
    ] {
        let pool = if pool_is_short {
            &mut short_pool
        } else {
            &mut twin.pool
        };
        let outs = if dst_is_short {
            &mut short_dst
        } else {
            &mut out
        };
        let r = dev.resolve_and_gather(
            &stream,
            &desc,
            twin.state.args(&d_req, &d_topk, outs),
            layers,
            host,
            pool,
        );
        if what == "valid" {
            r.ctx("the same call with valid arguments")?;
            dev.synchronize(&stream).ctx("synchronize")?;
            ensure!(
                read_i32(dev, &out.misses, 1)?[0] > 0,
                "the valid call after the refused ones missed nothing; the case tests nothing"
            );
            return Ok(());
        }
        expect_invalid(what, r)?;
        dev.synchronize(&stream).ctx("synchronize")?;
        let kept = format!("after a refused call ({what}): ");
        twin.state.expect_hot_state(dev, &kept, &w.h)?;
        out.read(dev, 1, 4)?.expect(&kept, &init)?;
        same(
            &format!("{kept}device pool"),
            &read_bytes(dev, &twin.pool, w.device_pool.len())?,
            &w.device_pool,
        )?;
        same(
            &format!("{kept}short device pool"),
            &read_bytes(dev, &short_pool, 16)?,
            &w.device_pool[..16],
        )?;
    }
    Err(CaseError::Fail("the valid call was not made".into()))
}
