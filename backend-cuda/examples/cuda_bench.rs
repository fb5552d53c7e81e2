//! CUDA benchmark of the HiSparse decode path, every figure beside the physical ceilings measured
//! in the same run. Needs the `bench-variants` feature (the earlier kernels are measured beside
//! the production ones, and every variant's output is checked byte for byte against the core's
//! reference or against the production kernel).
//!
//! ```text
//! cargo build --release -p hisparse-backend-cuda --features bench-variants --example cuda_bench
//! cuda_bench [--json PATH] [--quick] [--only ceilings,remap,gather,resolve,path,backup]
//! ```
//!
//! Every time is GPU time per call inside a CUDA graph (a graph of many calls, replayed, timed
//! with CUDA events, divided by the calls) unless a row says "stream":
//!
//! * ceilings: bulk pinned host→device and device→host copies (256 MiB), a device-to-device copy
//!   (1 GiB, bytes read plus written), and an empty kernel inside a graph (the launch floor);
//! * remap, top-k 2048 over 128K-token block tables, at 1, 64, 256 and 1024 tokens, plain, with
//!   valid counts, and with counts and compaction, for every remap kernel; warm (the same inputs
//!   every call: L2 holds them) and cold (a 128 MiB device copy before every call evicts them;
//!   the copy's own time, measured alone, is subtracted);
//! * swap-in gather of random 656 B rows (2048 and 32768 rows, 2048 rows × 4 layers) from a
//!   687 MB pinned pool, plans rotated so the rows cannot come from L2, every gather kernel, with
//!   and without programmatic dependent launch (PDL), against bulk host→device;
//! * resolve, 1, 64 and 256 requests × 2048 top-k, 4096 hot slots, a random walk of the top-k
//!   sets that replaces about a tenth of each set per step (about 9% misses), 16 steps in one
//!   graph replayed from the same starting state, every resolver kernel;
//! * the swap-in critical path: the same walk with each step's resolve followed by the gather of
//!   its misses, as the runtime issues them, against 1.2 × (missed bytes ÷ bulk H2D) + 5 µs;
//! * multi-layer page backup and restore (61 layers × 64 pages) against bulk D2H / H2D.
//!
//! A section that fails prints why and the bench goes on; the exit status is 1 when any section
//! failed or any output differed.

use std::error::Error;
use std::fmt::Write as _;

use hisparse_backend_cuda::{
    CudaBuffer, CudaDevice, CudaError, CudaHostBuffer, CudaStream, GatherVariant, RemapVariant,
    ResolveVariant,
};
use hisparse_core::Device;
use hisparse_core::ops::remap::remap as ref_remap;
use hisparse_core::ops::{
    BlockPair, BufferLen, Direction, GatherArgs, GatherDesc, LayerPair, PageCopyDesc, PageLayout,
    RemapArgs, RemapDesc, ResolveArgs, ResolveDesc,
};

type Res<T> = Result<T, Box<dyn Error>>;

/// SplitMix64, for reproducible inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn upload(dev: &CudaDevice, v: &[i32]) -> Res<CudaBuffer> {
    let mut b = dev.alloc(v.len().max(1) * 4)?;
    dev.upload_i32(&mut b, 0, v)?;
    Ok(b)
}

fn download(dev: &CudaDevice, b: &CudaBuffer, n: usize) -> Res<Vec<i32>> {
    let mut v = vec![0i32; n];
    dev.download_i32(b, 0, &mut v)?;
    Ok(v)
}

/// One figure of the report.
#[derive(Clone, Debug, Default)]
struct Row {
    section: &'static str,
    name: String,
    variant: String,
    value: f64,
    unit: &'static str,
    ceiling: f64,
    ceiling_name: &'static str,
    target: String,
    /// `None`: no target for this figure.
    met: Option<bool>,
    note: String,
}

impl Row {
    fn ratio(&self) -> f64 {
        if self.ceiling > 0.0 {
            self.value / self.ceiling
        } else {
            0.0
        }
    }
}

struct Bench {
    dev: CudaDevice,
    s: CudaStream,
    quick: bool,
    rows: Vec<Row>,
    failures: Vec<String>,
    h2d: f64,
    d2h: f64,
    d2d: f64,
    empty_us: f64,
}

impl Bench {
    /// Microseconds per call of `calls` (a closure enqueuing `per_graph` calls), captured once in
    /// a graph and replayed `replays` times after two warm-up replays.
    fn graph_us(
        &self,
        per_graph: usize,
        replays: usize,
        calls: &mut dyn FnMut(&CudaDevice) -> Result<(), CudaError>,
    ) -> Res<f64> {
        let graph = self.dev.capture(&self.s, |d| calls(d))?;
        for _ in 0..2 {
            self.dev.launch_graph(&graph, &self.s)?;
        }
        self.dev.synchronize(&self.s)?;
        let a = self.dev.timing_event(&self.s)?;
        for _ in 0..replays {
            self.dev.launch_graph(&graph, &self.s)?;
        }
        let b = self.dev.timing_event(&self.s)?;
        let ms = f64::from(self.dev.elapsed_ms(&a, &b)?);
        Ok(ms * 1e3 / (replays * per_graph) as f64)
    }

    /// Milliseconds per call of `op` over back-to-back stream calls after a warm-up.
    fn stream_ms(
        &self,
        warm: usize,
        iters: usize,
        mut op: impl FnMut(usize) -> Res<()>,
    ) -> Res<f64> {
        for i in 0..warm {
            op(i)?;
        }
        self.dev.synchronize(&self.s)?;
        let a = self.dev.timing_event(&self.s)?;
        for i in 0..iters {
            op(i)?;
        }
        let b = self.dev.timing_event(&self.s)?;
        Ok(f64::from(self.dev.elapsed_ms(&a, &b)?) / iters as f64)
    }

    fn push(&mut self, r: Row) {
        println!(
            "{:<9} {:<64} {:>10.3} {:<5} {}",
            r.section,
            format!("{} [{}]", r.name, r.variant),
            r.value,
            r.unit,
            match r.met {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "",
            }
        );
        self.rows.push(r);
    }

    fn section(&mut self, name: &str, f: impl FnOnce(&mut Bench) -> Res<()>) {
        println!("--- {name}");
        if let Err(e) = f(self) {
            println!("section {name} FAILED: {e}");
            self.failures.push(format!("{name}: {e}"));
        }
        // Whatever the section changed, the next one starts from the production kernels.
        self.dev.set_remap_variant(RemapVariant::V3);
        self.dev.set_gather_variant(GatherVariant::V3);
        self.dev.set_resolve_variant(ResolveVariant::V2);
        self.dev.set_programmatic_launch(false);
    }
}

fn main() {
    match run() {
        Ok(ok) => std::process::exit(if ok { 0 } else { 1 }),
        Err(e) => {
            println!("cuda_bench FAILED: {e}");
            std::process::exit(1);
        }
    }
}

fn run() -> Res<bool> {
    let args: Vec<String> = std::env::args().collect();
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned());
    let quick = args.iter().any(|a| a == "--quick");
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(|x| x.trim().to_owned()).collect());
    let wanted = |section: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == section));
    let dev = CudaDevice::open(0)?;
    dev.prepare()?;
    let s = dev.create_stream()?;
    println!("device: {}", dev.device_name());
    for r in dev.kernel_report()? {
        println!(
            "kernel {}: {} registers, {} B local, {} B static shared, {} blocks of {} threads per SM",
            r.name,
            r.registers,
            r.local_bytes,
            r.shared_bytes,
            r.blocks_per_multiprocessor,
            r.block_threads
        );
    }
    let mut b = Bench {
        dev,
        s,
        quick,
        rows: Vec::new(),
        failures: Vec::new(),
        h2d: 0.0,
        d2h: 0.0,
        d2d: 0.0,
        empty_us: 0.0,
    };
    // The ceilings every other section divides by: always measured.
    b.section("ceilings", ceilings);
    if b.h2d <= 0.0 {
        println!("no ceilings, nothing else is meaningful");
        return Ok(false);
    }
    if wanted("remap") {
        b.section("remap", remap_section);
    }
    if wanted("gather") {
        b.section("gather", gather_section);
    }
    if wanted("resolve") || wanted("path") {
        let path = wanted("path");
        let resolve = wanted("resolve");
        b.section("resolve and swap-in path", |b| {
            walk_section(b, resolve, path)
        });
    }
    if wanted("backup") {
        b.section("backup", backup_section);
    }
    report(&b, json.as_deref())?;
    for f in &b.failures {
        println!("FAILED: {f}");
    }
    Ok(b.failures.is_empty())
}

// ------------------------------------------------------------------------------------------------
// Ceilings
// ------------------------------------------------------------------------------------------------

fn ceilings(b: &mut Bench) -> Res<()> {
    let bulk = 256usize << 20;
    let mut pinned = b.dev.alloc_pinned(bulk)?;
    let mut dbuf = b.dev.alloc(bulk)?;
    let it = if b.quick { 3 } else { 10 };
    let (dev, s) = (&b.dev, &b.s);
    let h2d_ms = b.stream_ms(2, it, |_| {
        Ok(dev.copy_to_device(s, &pinned, 0, &mut dbuf, 0, bulk)?)
    })?;
    let d2h_ms = b.stream_ms(2, it, |_| {
        Ok(dev.copy_to_host(s, &dbuf, 0, &mut pinned, 0, bulk)?)
    })?;
    drop(pinned);
    drop(dbuf);
    let dd = 1usize << 30;
    let src = b.dev.alloc(dd)?;
    let mut dst = b.dev.alloc(dd)?;
    let d2d_ms = b.stream_ms(2, it, |_| {
        Ok(dev.copy_on_device(s, &src, 0, &mut dst, 0, dd)?)
    })?;
    drop(src);
    drop(dst);
    b.h2d = bulk as f64 / h2d_ms / 1e6;
    b.d2h = bulk as f64 / d2h_ms / 1e6;
    b.d2d = 2.0 * dd as f64 / d2d_ms / 1e6;
    let n = 100;
    b.empty_us = b.graph_us(n, if b.quick { 5 } else { 50 }, &mut |d| {
        for _ in 0..n {
            d.launch_empty(s)?;
        }
        Ok(())
    })?;
    for (name, v, unit) in [
        ("bulk pinned H2D, 256 MiB", b.h2d, "GB/s"),
        ("bulk pinned D2H, 256 MiB", b.d2h, "GB/s"),
        ("device-to-device, read+write, 1 GiB", b.d2d, "GB/s"),
        ("empty kernel in a graph", b.empty_us, "us"),
    ] {
        b.push(Row {
            section: "ceiling",
            name: name.into(),
            variant: "-".into(),
            value: v,
            unit,
            ceiling: v,
            ceiling_name: "itself",
            target: "-".into(),
            ..Row::default()
        });
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Remap
// ------------------------------------------------------------------------------------------------

fn remap_section(b: &mut Bench) -> Res<()> {
    let (k, bs, m) = (2048u32, 64u32, 2048u32); // 128K-token tables
    let mut rng = Rng(0x5eed);
    // A 64 MiB copy (64 MiB read, 64 MiB written) evicts the 60 MB L2 before each cold call;
    // the same graph without the remaps, measured right before and after, is subtracted.
    let flush_bytes = 64usize << 20;
    let flush_src = b.dev.alloc(flush_bytes)?;
    let mut flush_dst = b.dev.alloc(flush_bytes)?;
    let calls = if b.quick { 4 } else { 20 };
    let replays = if b.quick { 3 } else { 20 };
    let flush_graph_us = |b: &Bench, dst: &mut CudaBuffer| -> Res<f64> {
        b.graph_us(calls, replays, &mut |d| {
            for _ in 0..calls {
                d.copy_on_device(&b.s, &flush_src, 0, dst, 0, flush_bytes)?;
            }
            Ok(())
        })
    };
    println!(
        "L2 flush copy: {:.1} us per call (subtracted from cold figures)",
        flush_graph_us(b, &mut flush_dst)?
    );
    for t in [1u32, 64, 256, 1024] {
        let table: Vec<i32> = (0..t * m).map(|_| rng.below(1 << 20) as i32).collect();
        let req: Vec<i32> = (0..t as i32).collect();
        let topk: Vec<i32> = (0..t * k)
            .map(|_| {
                if rng.below(20) == 0 {
                    -1
                } else {
                    rng.below(u64::from(bs * m)) as i32
                }
            })
            .collect();
        let (table_b, req_b, topk_b) = (
            upload(&b.dev, &table)?,
            upload(&b.dev, &req)?,
            upload(&b.dev, &topk)?,
        );
        let mut out = b.dev.alloc((t * k * 4) as usize)?;
        let mut counts = b.dev.alloc((t * 4) as usize)?;
        for (mode, write_counts, compact) in [
            ("plain", false, false),
            ("counts", true, false),
            ("counts+compaction", true, true),
        ] {
            let desc = RemapDesc {
                num_tokens: t,
                top_k: k,
                table_rows: t,
                max_blocks: m,
                block_size: bs,
                block_stride_rows: bs,
                idx_mapping_len: None,
                write_counts,
                compact,
            };
            let mut want = vec![0i32; (t * k) as usize];
            let mut want_c = vec![0i32; t as usize];
            ref_remap(
                &desc,
                RemapArgs {
                    req_id: &req[..],
                    block_table: &table[..],
                    topk: &topk[..],
                    idx_mapping: None,
                    out: &mut want[..],
                    counts: write_counts.then_some(&mut want_c[..]),
                },
            )?;
            let mut warm_by_variant = Vec::new();
            for v in RemapVariant::ALL {
                b.dev.set_remap_variant(v);
                let args =
                    |out: &mut CudaBuffer, counts: &mut CudaBuffer| -> Result<(), CudaError> {
                        b.dev.remap(
                            &b.s,
                            &desc,
                            RemapArgs {
                                req_id: &req_b,
                                block_table: &table_b,
                                topk: &topk_b,
                                idx_mapping: None,
                                out,
                                counts: write_counts.then_some(counts),
                            },
                        )
                    };
                args(&mut out, &mut counts)?;
                let got = download(&b.dev, &out, (t * k) as usize)?;
                let got_c = download(&b.dev, &counts, t as usize)?;
                if got != want || (write_counts && got_c != want_c) {
                    return Err(format!(
                        "remap {} {mode} at {t} tokens differs from the reference",
                        v.name()
                    )
                    .into());
                }
                let warm = b.graph_us(calls, replays, &mut |_| {
                    for _ in 0..calls {
                        args(&mut out, &mut counts)?;
                    }
                    Ok(())
                })?;
                let flush_before = flush_graph_us(b, &mut flush_dst)?;
                let cold_total = {
                    let (src, dst) = (&flush_src, &mut flush_dst);
                    b.graph_us(calls, replays, &mut |d| {
                        for _ in 0..calls {
                            d.copy_on_device(&b.s, src, 0, dst, 0, flush_bytes)?;
                            args(&mut out, &mut counts)?;
                        }
                        Ok(())
                    })?
                };
                let flush_after = flush_graph_us(b, &mut flush_dst)?;
                let flush_us = (flush_before + flush_after) / 2.0;
                let cold = (cold_total - flush_us).max(0.0);
                let flush_spread = (flush_before - flush_after).abs();
                warm_by_variant.push((v, warm));
                let target = match t {
                    1 => Some(1.2),
                    64 => Some(1.5),
                    1024 => Some(6.0),
                    _ => None,
                };
                let bytes = f64::from(t) * f64::from(k) * 8.0;
                for (l2, us) in [("warm", warm), ("cold", cold)] {
                    b.push(Row {
                        section: "remap",
                        name: format!("remap {t} tok x 2048, {mode}, L2 {l2}"),
                        variant: v.name().into(),
                        value: us,
                        unit: "us",
                        ceiling: bytes / b.d2d / 1e3 + b.empty_us,
                        ceiling_name: "empty launch + top-k read and written at D2D",
                        target: match (l2, target) {
                            ("warm", Some(x)) => format!("<= {x} us"),
                            _ => "-".into(),
                        },
                        met: match (l2, target) {
                            ("warm", Some(x)) => Some(us <= x),
                            _ => None,
                        },
                        note: if l2 == "cold" {
                            format!(
                                "{:.0} GB/s top-k in+out; flush {flush_us:.1} us subtracted \
                                 (before/after differ by {flush_spread:.2} us)",
                                bytes / us / 1e3
                            )
                        } else {
                            format!("{:.0} GB/s top-k in+out", bytes / us / 1e3)
                        },
                    });
                }
            }
            b.dev.set_remap_variant(RemapVariant::V3);
            if compact {
                // Compaction's cost over counts alone, production kernel (warm).
                let counts_only = b
                    .rows
                    .iter()
                    .rev()
                    .find(|r| {
                        r.name == format!("remap {t} tok x 2048, counts, L2 warm")
                            && r.variant == "v3"
                    })
                    .map(|r| r.value);
                let with = warm_by_variant
                    .iter()
                    .find(|(v, _)| *v == RemapVariant::V3)
                    .map(|&(_, us)| us);
                if let (Some(c), Some(w)) = (counts_only, with) {
                    b.push(Row {
                        section: "remap",
                        name: format!("remap {t} tok: compaction over counts alone"),
                        variant: "v3".into(),
                        value: w / c,
                        unit: "x",
                        ceiling: 1.0,
                        ceiling_name: "counts alone",
                        target: "<= 1.10x".into(),
                        met: Some(w / c <= 1.10),
                        note: String::new(),
                    });
                }
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Gather
// ------------------------------------------------------------------------------------------------

const ROW: u32 = 656;
const BS: u32 = 64;
const PAGE: u64 = (ROW * BS) as u64;
const HOST_BLOCKS: u32 = 16384; // 687 MB of host rows

fn host_pool(b: &Bench) -> Res<CudaHostBuffer> {
    let mut host = b
        .dev
        .alloc_pinned((PAGE * u64::from(HOST_BLOCKS)) as usize)?;
    let mut fill = vec![0u8; host.byte_len() as usize];
    for (i, x) in fill.iter_mut().enumerate() {
        *x = (i as u64).wrapping_mul(0x9E37_79B9) as u8;
    }
    b.dev.write_pinned(&mut host, 0, &fill)?;
    Ok(host)
}

fn gather_section(b: &mut Bench) -> Res<()> {
    let host = host_pool(b)?;
    let host_rows = u64::from(HOST_BLOCKS * BS);
    let mut rng = Rng(0x6a7e);
    for (rows_n, layers_n) in [(2048u32, 1u32), (32768, 1), (2048, 4)] {
        // Device pool: every plan writes distinct rows of a pool of rows_n rows per layer.
        let dev_blocks = rows_n.div_ceil(BS) + 1;
        let dstride = PAGE * u64::from(layers_n);
        let layers: Vec<LayerPair> = (0..layers_n)
            .map(|l| LayerPair {
                host: PageLayout::contiguous(0, PAGE, HOST_BLOCKS, BS, ROW),
                device: PageLayout::contiguous(u64::from(l) * PAGE, dstride, dev_blocks, BS, ROW),
            })
            .collect();
        let mut pool = b.dev.alloc((dstride * u64::from(dev_blocks)) as usize)?;
        // Enough distinct plans that one pass reads far more than L2 holds.
        let plans = (((96u64 << 20) / (u64::from(rows_n) * u64::from(ROW))) as usize).clamp(2, 64);
        let mut plan_bufs = Vec::new();
        for _ in 0..plans {
            let src: Vec<i32> = (0..rows_n).map(|_| rng.below(host_rows) as i32).collect();
            let mut dst: Vec<i32> = (0..rows_n as i32).collect();
            for i in (1..dst.len()).rev() {
                dst.swap(i, rng.below(i as u64 + 1) as usize);
            }
            plan_bufs.push((upload(&b.dev, &src)?, upload(&b.dev, &dst)?));
        }
        let counts = upload(&b.dev, &[rows_n as i32])?;
        let desc = GatherDesc {
            num_tokens: 1,
            top_k: rows_n,
            layers: &layers,
        };
        let mut first: Option<Vec<u8>> = None;
        for v in GatherVariant::ALL {
            b.dev.set_gather_variant(v);
            for pdl in [false, true] {
                if pdl && !b.dev.set_programmatic_launch(true) {
                    continue;
                }
                let mut one = || -> Res<f64> {
                    let zero = b.dev.alloc(pool.byte_len() as usize)?;
                    let len = pool.byte_len() as usize;
                    b.dev.copy_on_device(&b.s, &zero, 0, &mut pool, 0, len)?;
                    let (src, dst) = &plan_bufs[0];
                    b.dev.gather_rows(
                        &b.s,
                        &desc,
                        GatherArgs {
                            plan_src: src,
                            plan_dst: dst,
                            plan_counts: &counts,
                            host: &host,
                            device: &mut pool,
                        },
                    )?;
                    let mut got = vec![0u8; len];
                    b.dev.download(&pool, 0, &mut got)?;
                    match &first {
                        None => first = Some(got),
                        Some(want) if *want != got => {
                            return Err(format!(
                                "gather {} (pdl {pdl}) differs from the first variant's",
                                v.name()
                            )
                            .into());
                        }
                        Some(_) => {}
                    }
                    let reps = if b.quick { 2 } else { 10 };
                    let pool_ref = &mut pool;
                    b.graph_us(plans, reps, &mut |d| {
                        for (src, dst) in &plan_bufs {
                            d.gather_rows(
                                &b.s,
                                &desc,
                                GatherArgs {
                                    plan_src: src,
                                    plan_dst: dst,
                                    plan_counts: &counts,
                                    host: &host,
                                    device: pool_ref,
                                },
                            )?;
                        }
                        Ok(())
                    })
                };
                let measured = one();
                b.dev.set_programmatic_launch(false);
                let us = match measured {
                    Ok(us) => us,
                    Err(e) if pdl => {
                        // PDL is optional: its failure is reported, the other figures stand.
                        println!("gather {} with PDL FAILED: {e}", v.name());
                        b.failures
                            .push(format!("gather {} with PDL: {e}", v.name()));
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let bytes = f64::from(rows_n * layers_n) * f64::from(ROW);
                let gbs = bytes / us / 1e3;
                let what = if layers_n == 1 {
                    String::new()
                } else {
                    format!(" x {layers_n} layers (one call)")
                };
                b.push(Row {
                    section: "gather",
                    name: format!(
                        "gather {rows_n} x 656 B random rows{what}{}",
                        if pdl { ", PDL" } else { "" }
                    ),
                    variant: v.name().into(),
                    value: gbs,
                    unit: "GB/s",
                    ceiling: b.h2d,
                    ceiling_name: "bulk H2D",
                    target: ">= 0.8x".into(),
                    met: Some(gbs / b.h2d >= 0.8),
                    note: format!("{us:.1} us per call"),
                });
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Resolve and the swap-in critical path
// ------------------------------------------------------------------------------------------------

/// One request set's walk: state, inputs of every step, and per-step outputs (kept apart so the
/// gathers of every step's plan can be replayed alone).
struct Walk {
    r: u32,
    desc: ResolveDesc,
    req: CudaBuffer,
    resident: CudaBuffer,
    host_table: CudaBuffer,
    hot: CudaBuffer,
    dgi: CudaBuffer,
    lru: CudaBuffer,
    dgi0: CudaBuffer,
    lru0: CudaBuffer,
    topk: Vec<CudaBuffer>,
    /// Per step: indices, valid, hits, misses, src, dst.
    outs: Vec<[CudaBuffer; 6]>,
}

const K: u32 = 2048;
const N: u32 = 4096;
const CTX: u32 = 32768;

impl Walk {
    fn new(b: &Bench, r: u32, steps: usize, rng: &mut Rng) -> Res<Walk> {
        let pages = CTX / BS;
        let desc = ResolveDesc {
            num_tokens: r,
            top_k: K,
            num_requests: r,
            max_pages: pages,
            block_size: BS,
            hot_slots: N,
            attention_block_stride: BS,
            host_num_blocks: HOST_BLOCKS,
        };
        let dev = &b.dev;
        let host_table: Vec<i32> = (0..r * pages).map(|i| (i % HOST_BLOCKS) as i32).collect();
        let hot_w = desc.hot_table_width();
        let hot: Vec<i32> = (0..(r * hot_w) as i32).collect();
        let lru: Vec<u16> = (0..r).flat_map(|_| 0..N as u16).collect();
        let mut lru0 = dev.alloc(lru.len() * 2)?;
        dev.upload_u16(&mut lru0, 0, &lru)?;
        let mut sets: Vec<Vec<i32>> = (0..r)
            .map(|_| {
                let mut seen = std::collections::HashSet::new();
                let mut v = Vec::with_capacity(K as usize);
                while v.len() < K as usize {
                    let x = rng.below(u64::from(CTX)) as i32;
                    if seen.insert(x) {
                        v.push(x);
                    }
                }
                v
            })
            .collect();
        let mut topk = Vec::new();
        let mut outs = Vec::new();
        for _ in 0..=steps {
            let flat: Vec<i32> = sets.iter().flatten().copied().collect();
            topk.push(upload(dev, &flat)?);
            let tk = (r * K) as usize * 4;
            let t = r as usize * 4;
            outs.push([
                dev.alloc(tk)?,
                dev.alloc(t)?,
                dev.alloc(t)?,
                dev.alloc(t)?,
                dev.alloc(tk)?,
                dev.alloc(tk)?,
            ]);
            for set in sets.iter_mut() {
                let seen: std::collections::HashSet<i32> = set.iter().copied().collect();
                let mut fresh = std::collections::HashSet::new();
                for _ in 0..K / 10 {
                    let at = rng.below(u64::from(K)) as usize;
                    loop {
                        let x = rng.below(u64::from(CTX)) as i32;
                        if !seen.contains(&x) && fresh.insert(x) {
                            set[at] = x;
                            break;
                        }
                    }
                }
            }
        }
        Ok(Walk {
            r,
            desc,
            req: upload(dev, &(0..r as i32).collect::<Vec<_>>())?,
            resident: upload(dev, &vec![0; (r * pages) as usize])?,
            host_table: upload(dev, &host_table)?,
            hot: upload(dev, &hot)?,
            dgi: upload(dev, &vec![-1; (r * N) as usize])?,
            lru: dev.alloc(lru.len() * 2)?,
            dgi0: upload(dev, &vec![-1; (r * N) as usize])?,
            lru0,
            topk,
            outs,
        })
    }

    /// Puts the hot state back to empty (all slots free), on the stream.
    fn reset(&mut self, b: &Bench) -> Res<()> {
        let (dgi_len, lru_len) = (self.dgi.byte_len() as usize, self.lru.byte_len() as usize);
        b.dev
            .copy_on_device(&b.s, &self.dgi0, 0, &mut self.dgi, 0, dgi_len)?;
        b.dev
            .copy_on_device(&b.s, &self.lru0, 0, &mut self.lru, 0, lru_len)?;
        Ok(())
    }

    fn resolve(&mut self, d: &CudaDevice, s: &CudaStream, step: usize) -> Result<(), CudaError> {
        let [ind, valid, hits, misses, src, dst] = &mut self.outs[step];
        d.resolve(
            s,
            &self.desc,
            ResolveArgs {
                req_id: &self.req,
                topk: &self.topk[step],
                resident_table: &self.resident,
                host_table: &self.host_table,
                hot_table: &self.hot,
                dgi: &mut self.dgi,
                lru: &mut self.lru,
                indices: ind,
                valid_counts: valid,
                hit_counts: hits,
                miss_counts: misses,
                miss_src: src,
                miss_dst: dst,
            },
        )
    }
}

/// The gather of step `step`'s miss plan into the hot rows of `pool`.
fn gather_step(
    d: &CudaDevice,
    s: &CudaStream,
    w: &Walk,
    step: usize,
    layer: &[LayerPair],
    host: &CudaHostBuffer,
    pool: &mut CudaBuffer,
) -> Result<(), CudaError> {
    let [_, _, _, misses, src, dst] = &w.outs[step];
    d.gather_rows(
        s,
        &GatherDesc {
            num_tokens: w.r,
            top_k: K,
            layers: layer,
        },
        GatherArgs {
            plan_src: src,
            plan_dst: dst,
            plan_counts: misses,
            host,
            device: pool,
        },
    )
}

/// Microseconds per step of one replay of `graph` from the empty state, averaged over `reps`
/// replays (the state is reset before each, outside the timing).
fn time_walk(
    b: &Bench,
    w: &mut Walk,
    reps: usize,
    steps: usize,
    graph: &hisparse_backend_cuda::CudaGraph,
) -> Res<f64> {
    let mut total = 0.0;
    for _ in 0..reps {
        w.reset(b)?;
        // Step 0 fills the hot buffers (all misses); the timed graph holds steps 1..=steps.
        w.resolve(&b.dev, &b.s, 0)?;
        b.dev.synchronize(&b.s)?;
        let a = b.dev.timing_event(&b.s)?;
        b.dev.launch_graph(graph, &b.s)?;
        let e = b.dev.timing_event(&b.s)?;
        total += f64::from(b.dev.elapsed_ms(&a, &e)?) * 1e3;
    }
    Ok(total / (reps * steps) as f64)
}

fn walk_section(b: &mut Bench, resolve: bool, path: bool) -> Res<()> {
    let host = host_pool(b)?;
    let mut rng = Rng(0x12e5);
    let steps = if b.quick { 4 } else { 16 };
    let reps = if b.quick { 2 } else { 5 };
    for r in [1u32, 64, 256] {
        let mut w = Walk::new(b, r, steps, &mut rng)?;
        let hot_blocks = r * w.desc.hot_table_width();
        let layer = [LayerPair {
            host: PageLayout::contiguous(0, PAGE, HOST_BLOCKS, BS, ROW),
            device: PageLayout::contiguous(0, PAGE, hot_blocks, BS, ROW),
        }];
        let mut pool = b.dev.alloc((PAGE * u64::from(hot_blocks)) as usize)?;
        // Eager walk with every resolver kernel: outputs of every step identical, miss counts.
        let mut reference: Option<Vec<Vec<i32>>> = None;
        let mut missed_rows = 0u64;
        let mut looked_up = 0u64;
        for v in ResolveVariant::ALL {
            b.dev.set_resolve_variant(v);
            w.reset(b)?;
            let mut all = Vec::new();
            for step in 0..=steps {
                w.resolve(&b.dev, &b.s, step)?;
                let [ind, valid, hits, misses, src, dst] = &w.outs[step];
                let mut v_out = Vec::new();
                for (buf, n) in [
                    (ind, r * K),
                    (valid, r),
                    (hits, r),
                    (misses, r),
                    (src, r * K),
                    (dst, r * K),
                ] {
                    v_out.extend(download(&b.dev, buf, n as usize)?);
                }
                if v == ResolveVariant::V2 && step > 0 {
                    let m = download(&b.dev, misses, r as usize)?;
                    let h = download(&b.dev, hits, r as usize)?;
                    missed_rows += m.iter().map(|&x| x as u64).sum::<u64>();
                    looked_up += m.iter().chain(&h).map(|&x| x as u64).sum::<u64>();
                }
                all.push(v_out);
            }
            match &reference {
                None => reference = Some(all),
                Some(want) if *want != all => {
                    return Err(format!(
                        "resolve {} differs from {} over the walk of {r} requests",
                        v.name(),
                        ResolveVariant::ALL[0].name()
                    )
                    .into());
                }
                Some(_) => {}
            }
        }
        let misses_per_step = missed_rows as f64 / steps as f64;
        let miss_pct = 100.0 * missed_rows as f64 / looked_up.max(1) as f64;
        let bytes = misses_per_step * f64::from(ROW);
        let path_ceiling = 1.2 * bytes / b.h2d / 1e3 + 5.0;
        println!(
            "{r} requests: {misses_per_step:.0} missed rows per step ({miss_pct:.1}% of distinct wanted rows), {:.2} MB",
            bytes / 1e6
        );
        if resolve {
            for v in ResolveVariant::ALL {
                b.dev.set_resolve_variant(v);
                let wr = &mut w;
                let graph = b.dev.capture(&b.s, |d| {
                    for step in 1..=steps {
                        wr.resolve(d, &b.s, step)?;
                    }
                    Ok(())
                })?;
                let us = time_walk(b, &mut w, reps, steps, &graph)?;
                let target = (r == 64).then_some(10.0);
                b.push(Row {
                    section: "resolve",
                    name: format!("resolve {r} req x 2048, 4096 slots, {miss_pct:.1}% misses"),
                    variant: v.name().into(),
                    value: us,
                    unit: "us",
                    ceiling: b.empty_us,
                    ceiling_name: "empty launch",
                    target: target.map_or("-".into(), |x| format!("<= {x} us")),
                    met: target.map(|x| us <= x),
                    note: format!("{steps} steps in one graph, from empty hot buffers"),
                });
            }
            b.dev.set_resolve_variant(ResolveVariant::V2);
        }
        if path {
            // The gathers alone (every step's plan from the eager walk), then resolve + gather.
            for gv in GatherVariant::ALL
                .into_iter()
                .filter(|g| matches!(g, GatherVariant::V2 | GatherVariant::V3))
            {
                b.dev.set_gather_variant(gv);
                for pdl in [false, true] {
                    if pdl && !b.dev.set_programmatic_launch(true) {
                        continue;
                    }
                    let tag = format!("gather {}{}", gv.name(), if pdl { " PDL" } else { "" });
                    let mut one = || -> Res<(f64, f64)> {
                        let (wr, pr) = (&w, &mut pool);
                        let g_us = b.graph_us(steps, reps, &mut |d| {
                            for step in 1..=steps {
                                gather_step(d, &b.s, wr, step, &layer, &host, pr)?;
                            }
                            Ok(())
                        })?;
                        let wr = &mut w;
                        let pr = &mut pool;
                        let graph = b.dev.capture(&b.s, |d| {
                            for step in 1..=steps {
                                wr.resolve(d, &b.s, step)?;
                                gather_step(d, &b.s, wr, step, &layer, &host, pr)?;
                            }
                            Ok(())
                        })?;
                        Ok((g_us, time_walk(b, &mut w, reps, steps, &graph)?))
                    };
                    let measured = one();
                    b.dev.set_programmatic_launch(false);
                    let (g_us, us) = match measured {
                        Ok(x) => x,
                        Err(e) if pdl => {
                            println!("swap-in path with {tag} FAILED: {e}");
                            b.failures.push(format!("swap-in path with {tag}: {e}"));
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    b.push(Row {
                        section: "path",
                        name: format!("gather of the misses alone, {r} req"),
                        variant: tag.clone(),
                        value: g_us,
                        unit: "us",
                        ceiling: bytes / b.h2d / 1e3,
                        ceiling_name: "missed bytes at bulk H2D",
                        target: "-".into(),
                        met: None,
                        note: format!("{:.1} GB/s", bytes / g_us / 1e3),
                    });
                    b.push(Row {
                        section: "path",
                        name: format!(
                            "swap-in path (resolve + gather), {r} req x 2048, {miss_pct:.1}% misses"
                        ),
                        variant: format!("resolve v2, {tag}"),
                        value: us,
                        unit: "us",
                        ceiling: path_ceiling,
                        ceiling_name: "1.2 x missed bytes / bulk H2D + 5 us",
                        target: format!("<= {path_ceiling:.1} us"),
                        met: (r == 64).then_some(us <= path_ceiling),
                        note: format!("{misses_per_step:.0} rows, {:.2} MB per step", bytes / 1e6),
                    });
                }
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Page backup and restore
// ------------------------------------------------------------------------------------------------

fn backup_section(b: &mut Bench) -> Res<()> {
    let mut rng = Rng(0xbac0);
    let (layers_n, pages, dev_blocks, host_blocks) = (61u32, 64u32, 128u32, 128u32);
    let dstride = PAGE * u64::from(layers_n);
    let layers: Vec<LayerPair> = (0..layers_n)
        .map(|l| LayerPair {
            host: PageLayout::contiguous(
                u64::from(l) * PAGE * u64::from(host_blocks),
                PAGE,
                host_blocks,
                BS,
                ROW,
            ),
            device: PageLayout::contiguous(u64::from(l) * PAGE, dstride, dev_blocks, BS, ROW),
        })
        .collect();
    let mut hostp = b
        .dev
        .alloc_pinned((PAGE * u64::from(layers_n * host_blocks)) as usize)?;
    let mut pool = b.dev.alloc((dstride * u64::from(dev_blocks)) as usize)?;
    let mut perm: Vec<u32> = (0..host_blocks).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let pairs: Vec<BlockPair> = (0..pages)
        .map(|i| BlockPair {
            src: i * 2,
            dst: perm[i as usize],
        })
        .collect();
    let bytes = f64::from(layers_n * pages) * PAGE as f64;
    for (dir, ceil, label) in [
        (
            Direction::DeviceToHost,
            b.d2h,
            "page backup 61 layers x 64 pages (D2H)",
        ),
        (
            Direction::HostToDevice,
            b.h2d,
            "page restore 61 layers x 64 pages (H2D)",
        ),
    ] {
        let rev: Vec<BlockPair> = pairs
            .iter()
            .map(|p| BlockPair {
                src: p.dst,
                dst: p.src,
            })
            .collect();
        let pl = if dir == Direction::DeviceToHost {
            &pairs
        } else {
            &rev
        };
        let desc = PageCopyDesc {
            direction: dir,
            layers: &layers,
        };
        let iters = if b.quick { 3 } else { 10 };
        let (dev, s) = (&b.dev, &b.s);
        let ms = b.stream_ms(2, iters, |_| {
            Ok(dev.copy_pages(s, &desc, pl, &mut hostp, &mut pool)?)
        })?;
        let gbs = bytes / ms / 1e6;
        b.push(Row {
            section: "backup",
            name: label.into(),
            variant: "-".into(),
            value: gbs,
            unit: "GB/s",
            ceiling: ceil,
            ceiling_name: if dir == Direction::DeviceToHost {
                "bulk D2H"
            } else {
                "bulk H2D"
            },
            target: ">= 0.8x".into(),
            met: Some(gbs / ceil >= 0.8),
            note: format!(
                "{:.0} MB in one call (stream), {:.0} us",
                bytes / 1e6,
                ms * 1e3
            ),
        });
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Report
// ------------------------------------------------------------------------------------------------

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn report(b: &Bench, json: Option<&str>) -> Res<()> {
    println!();
    println!(
        "| {:<70} | {:<22} | {:>10} | {:<5} | {:>10} | {:>7} | {:<10} | {:<6} |",
        "figure", "variant", "value", "unit", "ceiling", "ratio", "target", "met"
    );
    for r in &b.rows {
        println!(
            "| {:<70} | {:<22} | {:>10.3} | {:<5} | {:>10.3} | {:>7.3} | {:<10} | {:<6} |",
            r.name,
            r.variant,
            r.value,
            r.unit,
            r.ceiling,
            r.ratio(),
            r.target,
            match r.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            }
        );
    }
    if let Some(path) = json {
        let mut out = String::new();
        let _ = write!(
            out,
            "{{\"device\":{},\"h2d_gbs\":{:.4},\"d2h_gbs\":{:.4},\"d2d_gbs\":{:.4},\"empty_launch_us\":{:.4},\"failures\":[{}],\"figures\":[",
            json_str(b.dev.device_name()),
            b.h2d,
            b.d2h,
            b.d2d,
            b.empty_us,
            b.failures
                .iter()
                .map(|f| json_str(f))
                .collect::<Vec<_>>()
                .join(",")
        );
        for (i, r) in b.rows.iter().enumerate() {
            let _ = write!(
                out,
                "{}{{\"section\":{},\"name\":{},\"variant\":{},\"value\":{:.4},\"unit\":{},\"ceiling\":{:.4},\"ceiling_name\":{},\"ratio\":{:.4},\"target\":{},\"met\":{},\"note\":{}}}",
                if i > 0 { "," } else { "" },
                json_str(r.section),
                json_str(&r.name),
                json_str(&r.variant),
                r.value,
                json_str(r.unit),
                r.ceiling,
                json_str(r.ceiling_name),
                r.ratio(),
                json_str(&r.target),
                r.met.map_or("null".into(), |m| m.to_string()),
                json_str(&r.note)
            );
        }
        out.push_str("]}\n");
        std::fs::write(path, out)?;
        println!("wrote {path}");
    }
    Ok(())
}
