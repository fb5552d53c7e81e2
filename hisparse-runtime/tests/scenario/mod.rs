//! One deterministic multi-request scenario, generic over the device, for comparing two
//! runtimes that should behave identically (owned vs engine-owned pools and streams, eager vs
//! graph-replayed decode path): the coordinator plans, the runtime executes, a forward pass writes
//! a recognisable row per (request, token), and every per-group call's row indices are recorded.

#![allow(dead_code)]

use hisparse_core::Device;
use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_core::model::{LayerSpec, ModelSpec};
use hisparse_runtime::{Counters, Indices, Runtime, TopK};

/// Geometry and load of a scenario.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Sparse leader layers (one index group each).
    pub layers: usize,
    /// Bytes per KV row.
    pub row_bytes: u32,
    /// Tokens (rows) per block.
    pub block: u32,
    /// Top-k width.
    pub top_k: u32,
    /// Hot slots per request.
    pub hot: u32,
    /// Requests (and state rows).
    pub requests: u32,
    /// Prompt tokens per request.
    pub prompt: u32,
    /// Decode tokens per request.
    pub decode: u32,
    /// GPU blocks (null block included).
    pub gpu_blocks: u32,
    /// Decode only once every request's prompt is computed, so decode steps carry the whole
    /// batch (the pool must then hold every request at once: [`tight`] sizes it so); otherwise
    /// each request decodes as soon as its own prompt is in.
    pub together: bool,
}

/// Three small requests on a tight pool: pages are reclaimed and swapped in.
pub const SMALL: Shape = Shape {
    layers: 3,
    row_bytes: 32,
    block: 8,
    top_k: 8,
    hot: 16,
    requests: 3,
    prompt: 60,
    decode: 20,
    gpu_blocks: 40,
    together: false,
};

static LEADERS: [LayerSpec; 64] = [LayerSpec::sparse_leader(656, 132); 64];
static SMALL_LEADERS: [LayerSpec; 64] = [LayerSpec::sparse_leader(32, 16); 64];

/// The layout of `s`.
pub fn layout(s: &Shape) -> KvCacheConfig {
    let (layers, indexer_row_bytes) = if s.row_bytes == 656 {
        (&LEADERS[..s.layers], 132)
    } else {
        assert_eq!(s.row_bytes, 32, "scenario rows are 32 or 656 bytes");
        (&SMALL_LEADERS[..s.layers], 16)
    };
    let model = ModelSpec {
        name: "scenario",
        block_tokens: s.block,
        top_k: s.top_k,
        layers,
    };
    let len = s.prompt + s.decode + s.block;
    let pages = u64::from(len.div_ceil(s.block));
    // A host block: every layer's page in the pool and its indexer keys in the indexer host
    // cache (the host budget holds both).
    let stride = u64::from(s.row_bytes + indexer_row_bytes) * u64::from(s.block) * s.layers as u64;
    let mut cfg = HiSparseConfig::new(s.top_k, (u64::from(s.requests) * (pages + 1) + 4) * stride);
    cfg.device_buffer_size = Some(s.hot);
    let mut input = LayoutInput::new(&model, &cfg, 0, len);
    input.num_gpu_blocks_override = Some(s.gpu_blocks);
    plan_layout(&input).unwrap()
}

/// `s` with a GPU pool that holds every request's HiSparse needs plus a quarter of the extra
/// pages an all-resident cache would hold: pages get reclaimed and rows swapped in.
pub fn tight(mut s: Shape) -> Shape {
    s.gpu_blocks = 1 << 20;
    let kv = layout(&s);
    let per = kv.gpu_blocks_per_request(s.prompt + s.decode);
    let r = u64::from(s.requests);
    let extra = per.all_on_gpu.saturating_sub(per.hisparse);
    s.gpu_blocks = (1 + r * per.hisparse.min(per.all_on_gpu) + r * extra / 4) as u32;
    s
}

/// The coordinator of `s`.
/// Tokens a scenario step computes at most (the coordinator's budget, the slot mapping's size).
pub const MAX_BATCHED_TOKENS: u32 = 4096;

/// A runtime configuration for `rows` state rows and decode rows, its slot mapping sized for the
/// scenario coordinator's steps.
pub fn runtime_config(rows: u32) -> hisparse_runtime::RuntimeConfig {
    let mut cfg = hisparse_runtime::RuntimeConfig::new(rows, rows);
    cfg.max_batched_tokens = MAX_BATCHED_TOKENS;
    cfg
}

pub fn coordinator(s: &Shape, kv: &KvCacheConfig) -> Coordinator {
    Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: s.requests,
            max_batched_tokens: MAX_BATCHED_TOKENS,
            reclaim_min_blocks: 0,
            ..CoordinatorConfig::default()
        },
    )
    .unwrap()
}

/// The row the forward pass writes for (request, token): every byte `id ^ token`.
pub fn row(id: u64, pos: u32, len: usize) -> Vec<u8> {
    vec![(id as u8) ^ (pos as u8) ^ ((pos >> 8) as u8); len]
}

/// The forward pass: writes every computed token's row into its resident pages, one upload per
/// (page, layer) run of rows.
pub fn forward<D: Device>(rt: &mut Runtime<D>, kv: &KvCacheConfig, cmd: &OffloadCommand) {
    // The engine's way: the device slot mapping gives each token's row in each write group's
    // view; the row's bytes go where the layer's view puts that row. Checked against the
    // resident tables' host shadows (the page's block, the token's offset).
    let groups = rt.slot_mapping_groups();
    let cap = rt.config().max_batched_tokens as usize;
    let tokens = rt.step_tokens() as usize;
    assert_eq!(
        tokens,
        cmd.scheduled
            .iter()
            .map(|s| s.num_tokens as usize)
            .sum::<usize>()
    );
    let mut slots = vec![0i32; groups.len() * cap];
    rt.device()
        .download_i32(rt.slot_mapping(), 0, &mut slots)
        .unwrap();
    let mut t = 0;
    for s in &cmd.scheduled {
        for b in 0..kv.num_buckets {
            let g = kv.resident_group(b);
            let w = groups.iter().position(|&x| x == g).unwrap();
            let table = rt.resident_row(b, s.slot).unwrap().to_vec();
            // Runs of consecutive rows (one page's worth at most) go up in one copy per layer.
            let mut run: Vec<(u32, i32)> = Vec::new();
            for (i, pos) in (s.first_token..s.first_token + s.num_tokens).enumerate() {
                let slot = slots[w * cap + t + i];
                let blk = table[(pos / kv.block_size) as usize];
                assert!(
                    blk > 0,
                    "request {} position {pos} has no resident block",
                    s.id
                );
                assert_eq!(
                    i64::from(slot),
                    i64::from(blk) * i64::from(kv.attention_block_stride)
                        + i64::from(pos % kv.block_size),
                    "slot mapping of request {} position {pos}, bucket {b}",
                    s.id
                );
                if run.last().is_some_and(|&(_, last)| last + 1 != slot) {
                    write_run(rt, kv, g, s.id, &run);
                    run.clear();
                }
                run.push((pos, slot));
            }
            write_run(rt, kv, g, s.id, &run);
        }
        t += s.num_tokens as usize;
    }
    for w in 0..groups.len() {
        assert!(
            slots[w * cap + tokens..(w + 1) * cap]
                .iter()
                .all(|&r| r == -1),
            "slot mapping beyond the step's tokens"
        );
    }
}

/// Writes the rows of `run` — `(position, slot)` with consecutive slots — of request `id` into
/// every layer of resident group `g`, one copy per layer.
fn write_run<D: Device>(
    rt: &mut Runtime<D>,
    kv: &KvCacheConfig,
    g: usize,
    id: u64,
    run: &[(u32, i32)],
) {
    let Some(&(_, first)) = run.first() else {
        return;
    };
    let rb = kv.row_bytes as usize;
    for i in 0..kv.groups[g].layers.len() {
        let view = kv.layer_view(g, i).unwrap();
        let at = view.row_offset(first as u64).unwrap();
        let layer = kv.groups[g].layers[i].layer;
        let bytes: Vec<u8> = run
            .iter()
            .flat_map(|&(pos, _)| row(id, pos + layer * 7, rb))
            .collect();
        let (dev, pools) = rt.device_and_pools_mut();
        dev.upload(&mut pools.device, at as usize, &bytes).unwrap();
    }
}

/// A scenario in progress: the coordinator, the engine's per-call buffers and what was read.
pub struct Run<D: Device> {
    pub shape: Shape,
    pub kv: KvCacheConfig,
    pub coord: Coordinator,
    pub topk: D::Buffer,
    pub rows: D::Buffer,
    /// Row indices of every per-group call, in call order.
    pub outputs: Vec<Vec<i32>>,
    pub step: u32,
}

impl<D: Device> Run<D> {
    /// Admits the requests; `dev` allocates the engine's buffers.
    pub fn new(shape: Shape, dev: &D) -> Self {
        let kv = layout(&shape);
        let mut coord = coordinator(&shape, &kv);
        for id in 1..=u64::from(shape.requests) {
            let prompt: Vec<u32> = (0..shape.prompt).map(|t| t + 1000 * id as u32).collect();
            coord.admit(id, &prompt).unwrap();
        }
        let n = shape.requests as usize * shape.top_k as usize * 4;
        Run {
            topk: dev.alloc(n).unwrap(),
            rows: dev.alloc(n).unwrap(),
            outputs: Vec::new(),
            step: 0,
            shape,
            kv,
            coord,
        }
    }

    /// Whether every request finished.
    pub fn done(&self) -> bool {
        self.coord.is_empty()
    }

    /// Plans the next step, applies it and runs the forward pass; returns the command and the
    /// batch (every scheduled request's state row).
    pub fn begin(&mut self, rt: &mut Runtime<D>) -> (OffloadCommand, Vec<i32>) {
        self.step += 1;
        assert!(
            self.step < 100_000,
            "the scenario made no progress in 100000 steps"
        );
        let cmd = self.coord.step().unwrap();
        rt.begin_step(&cmd).unwrap();
        forward(rt, &self.kv, &cmd);
        let batch: Vec<i32> = cmd.scheduled.iter().map(|s| s.slot as i32).collect();
        rt.set_batch(&batch).unwrap();
        (cmd, batch)
    }

    /// The top-k of index group `g` in this step: `top_k` distinct-ish positions below each
    /// scheduled request's length, drifting with the step.
    pub fn topk_of(&self, cmd: &OffloadCommand, g: usize) -> Vec<i32> {
        let k = self.shape.top_k;
        cmd.scheduled
            .iter()
            .flat_map(|s| {
                let n = s.first_token + s.num_tokens;
                let salt = self.step + g as u32 * 13;
                (0..k).map(move |j| ((j * 7919 + salt * 31) % n) as i32)
            })
            .collect()
    }

    /// Uploads group `g`'s top-k and resolves it eagerly; records the rows.
    pub fn resolve(&mut self, rt: &mut Runtime<D>, cmd: &OffloadCommand, g: usize, t: u32) {
        let sel = self.topk_of(cmd, g);
        rt.device().upload_i32(&mut self.topk, 0, &sel).unwrap();
        let input = TopK {
            positions: &self.topk,
            num_tokens: t,
            state_rows: None,
        };
        rt.resolve_index_group(
            g,
            &input,
            Indices {
                rows: &mut self.rows,
                counts: None,
            },
        )
        .unwrap();
        self.record(rt, sel.len());
    }

    /// Downloads the rows of the last call into [`Run::outputs`].
    pub fn record(&mut self, rt: &Runtime<D>, n: usize) {
        let mut out = vec![0; n];
        rt.device().download_i32(&self.rows, 0, &mut out).unwrap();
        self.outputs.push(out);
    }

    /// Ends the step: after-forward copies, reports, sampling and finishing.
    pub fn end(&mut self, rt: &mut Runtime<D>, cmd: &OffloadCommand) {
        rt.end_step(cmd).unwrap();
        rt.poll_and_report(&mut self.coord).unwrap();
        let final_len = self.shape.prompt + self.shape.decode;
        let ids: Vec<_> = self.coord.running_ids().collect();
        // Decoding starts once every admitted request has its prompt computed, so the decode
        // steps carry the whole batch (and the pool holds every request at once).
        let prefilled = |c: &Coordinator, id| c.num_computed(id) == c.num_tokens(id);
        if self.shape.together
            && (self.coord.num_waiting() > 0 || !ids.iter().all(|&id| prefilled(&self.coord, id)))
        {
            return;
        }
        for id in ids {
            if self.coord.num_computed(id) == self.coord.num_tokens(id) {
                if self.coord.num_tokens(id).unwrap() >= final_len {
                    self.coord.finish(id).unwrap();
                } else {
                    self.coord.append_tokens(id, &[1]).unwrap();
                }
            }
        }
    }

    /// One whole step with eager per-group calls.
    pub fn step(&mut self, rt: &mut Runtime<D>) {
        let (cmd, batch) = self.begin(rt);
        for g in 0..self.kv.index_groups.len() {
            self.resolve(rt, &cmd, g, batch.len() as u32);
        }
        self.end(rt, &cmd);
    }
}

/// Everything a finished run leaves: every call's rows, both pools' bytes, the counters.
pub struct Outcome {
    pub outputs: Vec<Vec<i32>>,
    pub device_pool: Vec<u8>,
    pub host_pool: Vec<u8>,
    pub counters: Counters,
}

/// Runs `shape` to the end on `rt` with eager calls.
pub fn drive<D: Device>(shape: Shape, mut rt: Runtime<D>) -> Outcome {
    let mut run = Run::new(shape, rt.device());
    while !run.done() {
        run.step(&mut rt);
    }
    finish(run, rt)
}

/// Drains `rt` and collects the outcome of `run`.
pub fn finish<D: Device>(mut run: Run<D>, mut rt: Runtime<D>) -> Outcome {
    let rep = rt.drain().unwrap();
    if !rep.is_empty() {
        run.coord
            .report(rep.worker, &rep.enqueued, &rep.completed)
            .unwrap();
    }
    let kv = &run.kv;
    let mut device_pool = vec![0; kv.gpu_pool_bytes() as usize];
    let mut host_pool = vec![0; kv.host_pool_bytes() as usize];
    rt.device()
        .download(&rt.pools().device, 0, &mut device_pool)
        .unwrap();
    rt.device()
        .read_pinned(&rt.pools().host, 0, &mut host_pool)
        .unwrap();
    Outcome {
        outputs: run.outputs,
        device_pool,
        host_pool,
        counters: *rt.counters(),
    }
}

/// Compares two outcomes that must be identical; names the first difference.
pub fn same(a: &Outcome, b: &Outcome) -> Result<(), String> {
    if a.outputs.len() != b.outputs.len() {
        return Err(format!("{} calls vs {}", a.outputs.len(), b.outputs.len()));
    }
    if let Some(i) = (0..a.outputs.len()).find(|&i| a.outputs[i] != b.outputs[i]) {
        return Err(format!("the rows of call {i} differ"));
    }
    if a.device_pool != b.device_pool {
        return Err("the device pools differ".into());
    }
    if a.host_pool != b.host_pool {
        return Err("the host pools differ".into());
    }
    if a.counters != b.counters {
        return Err(format!(
            "counters differ: {:?} vs {:?}",
            a.counters, b.counters
        ));
    }
    Ok(())
}
