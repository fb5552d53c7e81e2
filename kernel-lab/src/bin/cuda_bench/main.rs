//! CUDA benchmark of the HiSparse decode path, every figure beside the physical ceilings measured
//! in the same run. Every output is checked byte for byte against the core's reference (or, for
//! the fused path, against the resolve-then-gather pair) before it is timed.
//!
//! ```text
//! cargo build --release -p hisparse-kernel-lab --bin cuda_bench
//! cuda_bench [--json PATH] [--quick] [--only ceilings,remap,gather,resolve,path,backup,cli] [--big-pool-gib N]
//! cuda_bench --profile-targets
//! ```
//!
//! Every time is GPU time per call inside a CUDA graph (a graph of many calls, replayed, timed
//! with CUDA events, divided by the calls) unless a row says "stream". GPU clocks fall while the
//! GPU idles between tiny kernels, so every timed run starts right after 20 ms of sustained work
//! on every multiprocessor (a spinning kernel enqueued before the timing event, so the GPU does
//! not idle in between), and a short probe right after the run measures the SM clock it ran at
//! (SM cycles over the GPU's nanosecond timer): each figure's line and JSON row give that clock.
//! Nothing changes the GPU's clocks or settings.
//!
//! * ceilings: bulk pinned host→device and device→host copies (256 MiB), a device-to-device copy
//!   (1 GiB, bytes read plus written), and an empty kernel inside a graph (the launch floor);
//! * remap, top-k 2048 over 128K-token block tables, at 1, 64, 256 and 1024 tokens, plain, with
//!   valid counts, and with counts and compaction (plain rows of up to plan::REMAP_WIDE_MAX_ROWS tokens by
//!   `hs_remap_wide`, one entry a thread, and both layouts of the plain rows with stats, beside
//!   each other); warm (the same inputs every call: L2 holds them) and cold (a 64 MiB device copy before every call evicts them; the copy's own time,
//!   measured alone, is subtracted); at 1 token also a row of only invalid
//!   entries (no block-table lookup: what the lookup's round trip costs);
//! * swap-in gather of random 656 B rows (2048 and 32768 rows, 2048 rows × 4 layers) from a
//!   687 MB pinned pool, plans rotated so the rows cannot come from L2, with and without
//!   programmatic dependent launch (PDL, its output checked against the run without), against
//!   bulk host→device;
//! * resolve, 1, 64 and 256 requests × 2048 top-k, 4096 hot slots, a random walk of the top-k
//!   sets that replaces about a tenth of each set per step (about 9% misses), 16 steps in one
//!   graph replayed from the same starting state;
//! * the swap-in critical path: the same walk with each step's resolve followed by the gather of
//!   its misses as the runtime issues them, and the fused resolve-and-gather launch
//!   (`CudaDevice::resolve_and_gather`, each block copying its own request's misses), with and
//!   without PDL, against 1.2 × (missed bytes ÷ bulk H2D) + 5 µs; the fused launch is first
//!   checked byte for byte against the pair over the walk;
//! * multi-layer page backup and restore (61 layers × 64 pages) against bulk D2H / H2D;
//! * `cli`: the configurations `hisparse bench` measures, the same way (stream calls: the
//!   2048-row gather with its plan rotation, 12-layer backup and restore of 16 rotating page
//!   sets), so the two tools' figures can be told apart by what they measure.
//!
//! `--profile-targets` measures nothing: it issues the decode-size launches a profiler should look
//! at (remap at 1 and 64 tokens, the resolver at 1 and 64 requests, the fused launch at 64),
//! each three times, prints their labels in launch order and exits (`.ci/gpu/cuda-perf.sh` runs it
//! under Nsight Compute).
//!
//! The empty kernel and the clock probe are the lab's own ([`hisparse_kernel_lab::probes`]),
//! launched on the backend's stream. A section that fails prints why and the bench goes on; the
//! exit status is 1 when any section failed or any output differed.

mod ceilings;
mod copies;
mod gather;
mod profile;
mod remap;
mod walk;

use std::cell::Cell;
use std::error::Error;
use std::fmt::Write as _;

use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaError, CudaHostBuffer, CudaStream};
use hisparse_core::Device;
use hisparse_core::ops::BufferLen;
use hisparse_kernel_lab::probes::{self, Probes};

type Res<T> = Result<T, Box<dyn Error>>;

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

/// KV row bytes (DeepSeek V3.2 fp8 MLA).
const ROW: u32 = 656;
/// Rows per page.
const BS: u32 = 64;
const PAGE: u64 = (ROW * BS) as u64;
/// Blocks of the benchmark's host pool: 687 MB of host rows.
const HOST_BLOCKS: u32 = 16384;

/// A pinned host pool of [`HOST_BLOCKS`] pages filled with a byte pattern.
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

/// One figure of the report.
#[derive(Clone, Debug, Default)]
struct Row {
    section: &'static str,
    name: String,
    /// Which path of the operation (`-` where there is one), e.g. `pdl` or `fused`.
    path: String,
    value: f64,
    unit: &'static str,
    ceiling: f64,
    ceiling_name: &'static str,
    target: String,
    /// `None`: no target judged for this figure.
    met: Option<bool>,
    note: String,
    /// The SM clock the run ran at, MHz (0: the last probe's).
    sm_mhz: f64,
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
    /// The empty kernel and the clock probe (shared, so timed closures can launch them).
    probes: std::rc::Rc<Probes>,
    /// Where the clock probe writes (two u64).
    probe: CudaBuffer,
    /// The SM clock the last timed run ran at, MHz.
    clock: Cell<f64>,
}

/// Sustained work before every timed run (keeps the GPU's clocks up).
const WARM_NS: u64 = 20_000_000;
/// The clock probe right after a timed run.
const PROBE_NS: u64 = 50_000;

/// Work enqueued on a stream for timing: a closure given the device and the stream.
type Calls<'a> = dyn FnMut(&CudaDevice, &CudaStream) -> Result<(), CudaError> + 'a;

impl Bench {
    /// Enqueues the warm-up spin (no host synchronisation: the timed work queues behind it).
    fn warm(&mut self) -> Res<()> {
        Ok(self
            .probes
            .launch_clock_probe(&self.s, &mut self.probe, WARM_NS)?)
    }

    /// Enqueues the clock probe, waits for the stream, and records the clock it measured.
    fn read_clock(&mut self) -> Res<f64> {
        self.probes
            .launch_clock_probe(&self.s, &mut self.probe, PROBE_NS)?;
        self.dev.synchronize(&self.s)?;
        let mut raw = [0u8; 16];
        self.dev.download(&self.probe, 0, &mut raw)?;
        let w = |i: usize| u64::from_ne_bytes(raw[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let mhz = probes::clock_mhz([w(0), w(1)]).unwrap_or(0.0);
        self.clock.set(mhz);
        Ok(mhz)
    }

    /// Microseconds per call of `calls` (enqueuing `per_graph` calls), captured once in a graph
    /// and replayed `replays` times after two untimed replays and the warm-up spin; the clock
    /// probe follows.
    fn graph_us(&mut self, per_graph: usize, replays: usize, calls: &mut Calls<'_>) -> Res<f64> {
        let graph = self.dev.capture(&self.s, |d| calls(d, &self.s))?;
        for _ in 0..2 {
            self.dev.launch_graph(&graph, &self.s)?;
        }
        self.warm()?;
        let a = self.dev.timing_event(&self.s)?;
        for _ in 0..replays {
            self.dev.launch_graph(&graph, &self.s)?;
        }
        let b = self.dev.timing_event(&self.s)?;
        self.read_clock()?;
        let ms = f64::from(self.dev.elapsed_ms(&a, &b)?);
        Ok(ms * 1e3 / (replays * per_graph) as f64)
    }

    /// Milliseconds per call of `op` over back-to-back stream calls after `warm` untimed calls
    /// and the warm-up spin; the clock probe follows.
    fn stream_ms(
        &mut self,
        warm: usize,
        iters: usize,
        op: &mut dyn FnMut(&CudaDevice, &CudaStream, usize) -> Result<(), CudaError>,
    ) -> Res<f64> {
        for i in 0..warm {
            op(&self.dev, &self.s, i)?;
        }
        self.warm()?;
        let a = self.dev.timing_event(&self.s)?;
        for i in 0..iters {
            op(&self.dev, &self.s, warm + i)?;
        }
        let b = self.dev.timing_event(&self.s)?;
        self.read_clock()?;
        Ok(f64::from(self.dev.elapsed_ms(&a, &b)?) / iters as f64)
    }

    fn push(&mut self, mut r: Row) {
        if r.sm_mhz == 0.0 {
            r.sm_mhz = self.clock.get();
        }
        println!(
            "{:<9} {:<72} {:>10.3} {:<5} SM {:>4.0} MHz {}",
            r.section,
            format!("{} [{}]", r.name, r.path),
            r.value,
            r.unit,
            r.sm_mhz,
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
        // Whatever the section changed, the next one starts without programmatic launch.
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
    let big_pool_gib: Option<u64> = args
        .iter()
        .position(|a| a == "--big-pool-gib")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok());
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
    let probes = std::rc::Rc::new(Probes::load(&dev, 0)?);
    let probe = dev.alloc(16)?;
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
        probes,
        probe,
        clock: Cell::new(0.0),
    };
    if args.iter().any(|a| a == "--profile-targets") {
        profile::run(&mut b)?;
        return Ok(true);
    }
    // The clock of a GPU that may have idled (a probe of 50 us), then after 20 ms of work.
    let idle = b.read_clock()?;
    b.warm()?;
    let busy = b.read_clock()?;
    println!("SM clock: {idle:.0} MHz at the start, {busy:.0} MHz after 20 ms of sustained work");
    b.push(Row {
        section: "ceiling",
        name: "SM clock after 20 ms of sustained work".into(),
        path: "-".into(),
        value: busy,
        unit: "MHz",
        ceiling: busy,
        ceiling_name: "itself",
        target: "-".into(),
        note: format!("{idle:.0} MHz measured first, at the start"),
        sm_mhz: busy,
        ..Row::default()
    });
    // The ceilings every other section divides by: always measured.
    b.section("ceilings", ceilings::section);
    if b.h2d <= 0.0 {
        println!("no ceilings, nothing else is meaningful");
        return Ok(false);
    }
    if wanted("remap") {
        b.section("remap", remap::section);
    }
    if wanted("gather") {
        b.section("gather", gather::section);
        if let Some(gib) = big_pool_gib {
            b.section("gather by pool size", |b| gather::pool_size_section(b, gib));
        }
    }
    if wanted("resolve") || wanted("path") {
        let path = wanted("path");
        let resolve = wanted("resolve");
        b.section("resolve and swap-in path", |b| {
            walk::section(b, resolve, path)
        });
    }
    if wanted("backup") {
        b.section("backup", copies::backup_section);
    }
    if wanted("cli") {
        b.section("as hisparse bench measures", copies::cli_section);
    }
    report(&b, json.as_deref())?;
    for f in &b.failures {
        println!("FAILED: {f}");
    }
    Ok(b.failures.is_empty())
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
        "| {:<72} | {:<24} | {:>10} | {:<5} | {:>10} | {:>7} | {:<11} | {:<6} | {:>6} |",
        "figure", "path", "value", "unit", "ceiling", "ratio", "target", "met", "SM MHz"
    );
    for r in &b.rows {
        println!(
            "| {:<72} | {:<24} | {:>10.3} | {:<5} | {:>10.3} | {:>7.3} | {:<11} | {:<6} | {:>6.0} |",
            r.name,
            r.path,
            r.value,
            r.unit,
            r.ceiling,
            r.ratio(),
            r.target,
            match r.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            },
            r.sm_mhz
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
                "{}{{\"section\":{},\"name\":{},\"path\":{},\"value\":{:.4},\"unit\":{},\"ceiling\":{:.4},\"ceiling_name\":{},\"ratio\":{:.4},\"target\":{},\"met\":{},\"note\":{},\"sm_mhz\":{:.0}}}",
                if i > 0 { "," } else { "" },
                json_str(r.section),
                json_str(&r.name),
                json_str(&r.path),
                r.value,
                json_str(r.unit),
                r.ceiling,
                json_str(r.ceiling_name),
                r.ratio(),
                json_str(&r.target),
                r.met.map_or("null".into(), |m| m.to_string()),
                json_str(&r.note),
                r.sm_mhz
            );
        }
        out.push_str("]}\n");
        std::fs::write(path, out)?;
        println!("wrote {path}");
    }
    Ok(())
}
