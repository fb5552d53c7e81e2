//! The decode path captured into a graph as an engine captures it, generic over the backend and
//! its driver (an [`Engine`] the test writes over the raw graph API): run by the CUDA backend's
//! `tests/graph_capture.rs` on a GPU and by the ROCm backend's `tests/hip_double.rs` against the
//! HIP test double.
//!
//! [`run`]: the "engine" creates a stream and begins a capture on it in **global** mode through
//! the raw driver API (what `torch.cuda.graph` does); inside the capture the engine lends that
//! stream to the backend (its allocation and counter clearing must work under global capture) and enqueues a
//! table write (a staged list: it must outlive the staging memory), a `resolve_and_gather` of 64
//! one-row requests and a four-row speculative request (the fused launch, with a resolver
//! workspace) and a remap, both counting into a stats buffer (`hisparse_core::ops::stats`). The
//! engine ends and instantiates the capture.
//!
//! Step 0 runs the same calls eagerly on the lent stream (its counters must be zero for eager use
//! too); the lent stream is then dropped and memory it could have freed is reused with garbage (the
//! graph must not depend on it); steps 1.. write a new top-k (90% kept, so rows hit) and replay
//! the graph, with unrelated staging work on another stream between replays (it reuses the
//! staging memory). After every step every output, the hot state, the device pool and the stats
//! words must equal the core's reference, and the stats slot no call names must keep its words.

use hisparse_core::Device;
use hisparse_core::ops::remap::remap as reference_remap;
use hisparse_core::ops::swap_in::resolve_and_gather as reference_swap_in;
use hisparse_core::ops::{
    LayerPair, PageLayout, RemapArgs, RemapDesc, ResolveArgs, ResolveDesc, ResolveSlices,
    TableWrite, TableWriteDesc,
};

use super::{Res, device_err, download_i32, upload_i32};
use crate::SplitMix64;
use crate::cases::resolve_io::remap_of;

/// The engine's side of a capture: its own stream and graph, through the raw driver API.
pub trait Engine<D: Device> {
    /// The engine's stream handle.
    type Stream: Copy;
    /// An instantiated graph.
    type Graph;
    /// Whatever the backend needs done before a capture (kernels compiled and loaded).
    fn prepare(&mut self, dev: &D) -> Res<()>;
    /// A new stream of the engine's (non-blocking).
    fn stream(&mut self) -> Res<Self::Stream>;
    /// Begins capturing `s` in global mode.
    fn begin_global(&mut self, s: Self::Stream) -> Res<()>;
    /// Ends the capture of `s` and instantiates the graph.
    fn end(&mut self, s: Self::Stream) -> Res<Self::Graph>;
    /// Enqueues one replay of `g` on `s` and waits for it.
    fn replay(&mut self, g: &Self::Graph, s: Self::Stream) -> Res<()>;
    /// The engine's stream `s`, lent to the backend.
    fn lend(&mut self, dev: &D, s: Self::Stream) -> Res<D::Stream>;
    /// Distinct lists in the backend's list arena.
    fn arena_lists(&mut self, dev: &D) -> usize;
    /// Destroys `g` and the stream `s` (after the replays).
    fn release(&mut self, g: Self::Graph, s: Self::Stream) -> Res<()>;
}

const TOP_K: u32 = 2048;
const BLOCK: u32 = 64;
/// Hot slots per request: the speculative request wants up to `SPEC_ROWS * TOP_K` rows.
const SLOTS: u32 = 8192;
const PAGES: u32 = 128;
/// One-row requests (state rows `0..SINGLE`); request `SINGLE` has `SPEC_ROWS` rows.
const SINGLE: u32 = 64;
const SPEC_ROWS: u32 = 4;
const REQUESTS: u32 = SINGLE + 1;
/// Token rows: every request's rows and two padding rows.
const ROWS: u32 = SINGLE + SPEC_ROWS + 2;
/// Bytes of one KV row.
const ROW: u32 = 64;
const STEPS: usize = 6;
/// Stats slots: the swap-in adds to slot 1, the remap to slot 2, slot 0 is never named.
const SWAP_SLOT: u32 = 1;
const REMAP_SLOT: u32 = 2;

/// Everything one step reads and writes, on the host (the reference's copy).
#[derive(Clone)]
struct Host {
    req_id: Vec<i32>,
    resident: Vec<i32>,
    host_table: Vec<i32>,
    hot: Vec<i32>,
    slot_host_rows: Vec<i32>,
    lru: Vec<u16>,
    host_pool: Vec<u8>,
    device_pool: Vec<u8>,
    block_table: Vec<i32>,
    stats: Vec<i32>,
}

/// The outputs of one step.
#[derive(Debug, PartialEq)]
struct Outputs {
    indices: Vec<i32>,
    valid: Vec<i32>,
    hits: Vec<i32>,
    misses: Vec<i32>,
    miss_src: Vec<i32>,
    miss_dst: Vec<i32>,
    remapped: Vec<i32>,
}

impl Outputs {
    fn sized() -> Outputs {
        let (t, tk) = (ROWS as usize, (ROWS * TOP_K) as usize);
        Outputs {
            indices: vec![7; tk],
            valid: vec![7; t],
            hits: vec![7; t],
            misses: vec![7; t],
            miss_src: vec![7; tk],
            miss_dst: vec![7; tk],
            remapped: vec![7; tk],
        }
    }
}

fn resolve_desc() -> ResolveDesc {
    ResolveDesc {
        num_tokens: ROWS,
        top_k: TOP_K,
        num_requests: REQUESTS,
        max_pages: PAGES,
        block_size: BLOCK,
        hot_slots: SLOTS,
        attention_block_stride: BLOCK,
        host_num_blocks: REQUESTS * PAGES,
        num_state_rows: None,
        stats_slot: SWAP_SLOT,
    }
}

fn remap_desc() -> RemapDesc {
    remap_of(&resolve_desc(), false, true, REMAP_SLOT)
}

/// Device blocks of the hot regions (`SLOTS / BLOCK` per request), after the null block.
fn hot_blocks() -> u32 {
    REQUESTS * SLOTS.div_ceil(BLOCK)
}

fn layers() -> [LayerPair; 1] {
    let page = u64::from(BLOCK * ROW);
    [LayerPair {
        host: PageLayout::contiguous(0, page, REQUESTS * PAGES, BLOCK, ROW),
        device: PageLayout::contiguous(0, page, 1 + hot_blocks(), BLOCK, ROW),
    }]
}

fn build(rng: &mut SplitMix64) -> Host {
    let mut req_id: Vec<i32> = (0..SINGLE as i32).collect();
    req_id.extend(std::iter::repeat_n(SINGLE as i32, SPEC_ROWS as usize));
    req_id.insert(10, -1);
    req_id.insert(40, i32::MAX);
    let pages = (REQUESTS * PAGES) as usize;
    // Host blocks: request r's page p in block r * PAGES + p; one page in 16 still resident.
    let host_table: Vec<i32> = (0..pages as i32).collect();
    let resident: Vec<i32> = (0..pages)
        .map(|i| if i % 16 == 3 { 1 + (i as i32 % 200) } else { 0 })
        .collect();
    let width = SLOTS.div_ceil(BLOCK);
    let hot: Vec<i32> = (0..REQUESTS * width).map(|i| 1 + i as i32).collect();
    let n = SLOTS as usize;
    let mut host_pool = vec![0u8; pages * (BLOCK * ROW) as usize];
    rng.fill(&mut host_pool);
    let device_pool = vec![0u8; (1 + hot_blocks() as usize) * (BLOCK * ROW) as usize];
    let block_table: Vec<i32> = (0..pages).map(|_| rng.below(4000) as i32 - 8).collect();
    let mut stats: Vec<i32> = (0..12).map(|_| rng.next_u64() as i32).collect();
    // The counted slots start a few thousand below wrapping.
    for w in &mut stats[4..] {
        *w = (u32::MAX - rng.below(3000) as u32) as i32;
    }
    Host {
        req_id,
        resident,
        host_table,
        hot,
        slot_host_rows: vec![-1; REQUESTS as usize * n],
        lru: (0..REQUESTS as usize * n).map(|i| (i % n) as u16).collect(),
        host_pool,
        device_pool,
        block_table,
        stats,
    }
}

/// The next step's top-k: each row keeps 90% of its entries (rows of the speculative request
/// differ a little from each other), the rest new positions or `-1`.
fn next_topk(rng: &mut SplitMix64, prev: Option<&[i32]>) -> Vec<i32> {
    let span = u64::from(PAGES * BLOCK);
    (0..(ROWS * TOP_K) as usize)
        .map(|i| match prev {
            Some(p) if rng.below(10) != 0 => p[i],
            _ if rng.below(50) == 0 => -1,
            _ => rng.below(span) as i32,
        })
        .collect()
}

/// The reference step: the swap-in (stats slot 1), then the remap (slot 2).
fn reference_step(h: &mut Host, topk: &[i32]) -> Res<Outputs> {
    let mut o = Outputs::sized();
    reference_swap_in(
        &resolve_desc(),
        ResolveSlices {
            req_id: &h.req_id,
            topk,
            resident_table: &h.resident,
            host_table: &h.host_table,
            hot_table: &h.hot,
            slot_host_rows: &mut h.slot_host_rows,
            lru: &mut h.lru,
            indices: &mut o.indices,
            valid_counts: &mut o.valid,
            hit_counts: &mut o.hits,
            miss_counts: &mut o.misses,
            miss_src: &mut o.miss_src,
            miss_dst: &mut o.miss_dst,
            idx_mapping: None,
            stats: Some(&mut h.stats),
        },
        &layers(),
        &h.host_pool,
        &mut h.device_pool,
    )
    .map_err(|err| format!("reference swap-in: {err}"))?;
    reference_remap(
        &remap_desc(),
        RemapArgs {
            req_id: &h.req_id[..],
            block_table: &h.block_table[..],
            topk,
            idx_mapping: None,
            out: &mut o.remapped[..],
            counts: None,
            stats: Some(&mut h.stats[..]),
        },
    )
    .map_err(|err| format!("reference remap: {err}"))?;
    Ok(o)
}

/// The device copies of a step's buffers.
struct Bufs<D: Device> {
    req_id: D::Buffer,
    topk: D::Buffer,
    resident: D::Buffer,
    host_table: D::Buffer,
    hot: D::Buffer,
    slot_host_rows: D::Buffer,
    lru: D::Buffer,
    indices: D::Buffer,
    valid: D::Buffer,
    hits: D::Buffer,
    misses: D::Buffer,
    miss_src: D::Buffer,
    miss_dst: D::Buffer,
    remapped: D::Buffer,
    block_table: D::Buffer,
    stats: D::Buffer,
    host_pool: D::HostBuffer,
    device_pool: D::Buffer,
}

fn upload<D: Device>(dev: &D, h: &Host) -> Res<Bufs<D>> {
    let o = Outputs::sized();
    let mut lru = dev.alloc(h.lru.len() * 2).map_err(device_err)?;
    dev.upload_u16(&mut lru, 0, &h.lru).map_err(device_err)?;
    let mut host_pool = dev.alloc_pinned(h.host_pool.len()).map_err(device_err)?;
    dev.write_pinned(&mut host_pool, 0, &h.host_pool)
        .map_err(device_err)?;
    let mut device_pool = dev.alloc(h.device_pool.len()).map_err(device_err)?;
    dev.upload(&mut device_pool, 0, &h.device_pool)
        .map_err(device_err)?;
    Ok(Bufs::<D> {
        req_id: upload_i32(dev, &h.req_id)?,
        topk: dev.alloc((ROWS * TOP_K) as usize * 4).map_err(device_err)?,
        resident: upload_i32(dev, &h.resident)?,
        host_table: upload_i32(dev, &h.host_table)?,
        hot: upload_i32(dev, &h.hot)?,
        slot_host_rows: upload_i32(dev, &h.slot_host_rows)?,
        lru,
        indices: upload_i32(dev, &o.indices)?,
        valid: upload_i32(dev, &o.valid)?,
        hits: upload_i32(dev, &o.hits)?,
        misses: upload_i32(dev, &o.misses)?,
        miss_src: upload_i32(dev, &o.miss_src)?,
        miss_dst: upload_i32(dev, &o.miss_dst)?,
        remapped: upload_i32(dev, &o.remapped)?,
        block_table: upload_i32(dev, &h.block_table)?,
        stats: upload_i32(dev, &h.stats)?,
        host_pool,
        device_pool,
    })
}

/// The calls one step enqueues on `s` (what the graph records): the hot table rewritten with its
/// own values through a staged list, the swap-in and the remap.
fn enqueue_step<D: Device>(dev: &D, s: &D::Stream, b: &mut Bufs<D>, h: &Host) -> Res<()> {
    let writes: Vec<TableWrite> = h
        .hot
        .iter()
        .enumerate()
        .map(|(i, &value)| TableWrite {
            index: i as u32,
            value,
        })
        .collect();
    dev.write_table(
        s,
        &TableWriteDesc {
            table_len: h.hot.len() as u32,
        },
        &writes,
        &mut b.hot,
    )
    .map_err(device_err)?;
    dev.resolve_and_gather(
        s,
        &resolve_desc(),
        ResolveArgs {
            req_id: &b.req_id,
            topk: &b.topk,
            resident_table: &b.resident,
            host_table: &b.host_table,
            hot_table: &b.hot,
            slot_host_rows: &mut b.slot_host_rows,
            lru: &mut b.lru,
            idx_mapping: None,
            indices: &mut b.indices,
            valid_counts: &mut b.valid,
            hit_counts: &mut b.hits,
            miss_counts: &mut b.misses,
            miss_src: &mut b.miss_src,
            miss_dst: &mut b.miss_dst,
            stats: Some(&mut b.stats),
        },
        &layers(),
        &b.host_pool,
        &mut b.device_pool,
    )
    .map_err(device_err)?;
    dev.remap(
        s,
        &remap_desc(),
        RemapArgs {
            req_id: &b.req_id,
            block_table: &b.block_table,
            topk: &b.topk,
            idx_mapping: None,
            out: &mut b.remapped,
            counts: None,
            stats: Some(&mut b.stats),
        },
    )
    .map_err(device_err)
}

/// Compares everything a step left on the device with the reference.
fn compare<D: Device>(dev: &D, b: &Bufs<D>, h: &Host, want: &Outputs, step: usize) -> Res<()> {
    let (t, tk) = (ROWS as usize, (ROWS * TOP_K) as usize);
    let got = Outputs {
        indices: download_i32(dev, &b.indices, tk)?,
        valid: download_i32(dev, &b.valid, t)?,
        hits: download_i32(dev, &b.hits, t)?,
        misses: download_i32(dev, &b.misses, t)?,
        miss_src: download_i32(dev, &b.miss_src, tk)?,
        miss_dst: download_i32(dev, &b.miss_dst, tk)?,
        remapped: download_i32(dev, &b.remapped, tk)?,
    };
    for (name, g, w) in [
        ("indices", &got.indices, &want.indices),
        ("valid_counts", &got.valid, &want.valid),
        ("hit_counts", &got.hits, &want.hits),
        ("miss_counts", &got.misses, &want.misses),
        ("miss_src", &got.miss_src, &want.miss_src),
        ("miss_dst", &got.miss_dst, &want.miss_dst),
        ("remap out", &got.remapped, &want.remapped),
        (
            "slot_host_rows",
            &download_i32(dev, &b.slot_host_rows, h.slot_host_rows.len())?,
            &h.slot_host_rows,
        ),
        ("stats", &download_i32(dev, &b.stats, 12)?, &h.stats),
    ] {
        if g != w {
            let at = g.iter().zip(w.iter()).position(|(a, b)| a != b);
            return Err(format!(
                "step {step}: {name} differs from the reference (first at {at:?})"
            ));
        }
    }
    let mut lru = vec![0u16; h.lru.len()];
    dev.download_u16(&b.lru, 0, &mut lru).map_err(device_err)?;
    if lru != h.lru {
        return Err(format!("step {step}: lru differs from the reference"));
    }
    let mut pool = vec![0u8; h.device_pool.len()];
    dev.download(&b.device_pool, 0, &mut pool)
        .map_err(device_err)?;
    if pool != h.device_pool {
        return Err(format!(
            "step {step}: the device pool differs from the reference"
        ));
    }
    let hits: i32 = want.hits.iter().sum();
    if step > 0 && hits == 0 {
        return Err(format!("step {step}: no hit; the test exercises nothing"));
    }
    Ok(())
}

/// Staging work on another stream that reuses the staging ring: large random table writes.
fn unrelated<D: Device>(
    dev: &D,
    s: &D::Stream,
    junk: &mut D::Buffer,
    rng: &mut SplitMix64,
) -> Res<()> {
    for _ in 0..3 {
        let writes: Vec<TableWrite> = (0..65_536u32)
            .map(|index| TableWrite {
                index,
                value: rng.next_u64() as i32,
            })
            .collect();
        dev.write_table(s, &TableWriteDesc { table_len: 65_536 }, &writes, junk)
            .map_err(device_err)?;
    }
    Ok(())
}

/// The scenario of the module docs on `dev`, the engine side through `eng`.
pub fn run<D: Device, G: Engine<D>>(dev: &D, eng: &mut G) -> Res<()> {
    eng.prepare(dev)?;
    let mut rng = SplitMix64::new(0x6A09_E667_F3BC_C908);
    let mut h = build(&mut rng);
    let mut b = upload(dev, &h)?;
    let other = dev.create_stream().map_err(device_err)?;
    let mut junk = dev.alloc(65_536 * 4).map_err(device_err)?;
    let raw = eng.stream()?;
    let topk = next_topk(&mut rng, None);
    dev.upload_i32(&mut b.topk, 0, &topk).map_err(device_err)?;

    // Capture, global mode, the lending inside it.
    eng.begin_global(raw)?;
    let captured = (|| -> Res<D::Stream> {
        let lent = eng.lend(dev, raw)?;
        if !dev.is_capturing(&lent).map_err(device_err)? {
            return Err("is_capturing is false on a stream being captured".into());
        }
        enqueue_step(dev, &lent, &mut b, &h)?;
        Ok(lent)
    })();
    let graph = eng.end(raw);
    let lent = captured?;
    let graph = graph?;
    if dev.is_capturing(&lent).map_err(device_err)? {
        return Err("is_capturing is still true after the capture ended".into());
    }
    if eng.arena_lists(dev) == 0 {
        return Err("the captured table write placed no list in the list arena".into());
    }

    // Step 0: the same calls eagerly on the stream lent under capture.
    enqueue_step(dev, &lent, &mut b, &h)?;
    dev.synchronize(&lent).map_err(device_err)?;
    let want = reference_step(&mut h, &topk)?;
    compare(dev, &b, &h, &want, 0)?;
    // The lent stream goes; memory it could have freed is reused with garbage.
    drop(lent);
    let mut reuse = Vec::new();
    for bytes in [16usize, 1 << 20, 4 << 20] {
        let mut m = dev.alloc(bytes).map_err(device_err)?;
        dev.upload(&mut m, 0, &vec![0xFF; bytes])
            .map_err(device_err)?;
        reuse.push(m);
    }

    let mut prev = topk;
    for step in 1..=STEPS {
        let topk = next_topk(&mut rng, Some(&prev));
        dev.upload_i32(&mut b.topk, 0, &topk).map_err(device_err)?;
        unrelated(dev, &other, &mut junk, &mut rng)?;
        eng.replay(&graph, raw)?;
        let want = reference_step(&mut h, &topk)?;
        compare(dev, &b, &h, &want, step)?;
        prev = topk;
    }
    eng.release(graph, raw)
}
