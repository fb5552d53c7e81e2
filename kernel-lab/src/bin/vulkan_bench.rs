//! Device benchmarks of the Vulkan backend, each beside its ceiling measured in the same run:
//!
//! * ceilings: bulk host→device and device→host copies of 256 MiB (`vkCmdCopyBuffer` from and to
//!   the imported pinned pool) and the device copy of 256 MiB (read + write counted) with both
//!   copy engines (`vkCmdCopyBuffer` and the copy shader);
//! * the swap-in gather (`gather_rows`, the resolver's miss plan) of random 656-byte rows from
//!   the pinned host pool into random hot rows of the device pool, 2048 and 32768 rows per call,
//!   with both gather kernels, measured two ways: **device** time from timestamp queries around
//!   back-to-back gathers in one command buffer (what the GPU spends), and **wall** time per call
//!   as `hisparse bench` measures it (calls enqueued on a stream, then one synchronisation, for
//!   at least 2 ms; the host's recording and submission included), so the two tools' figures can
//!   be told apart;
//! * page backup and restore of 61 layers × 64 pages (164 MB per call, one DeepSeek V3.2 block
//!   set), with both copy engines, against the bulk copies;
//! * where the time goes on the index paths, each resolver kernel: the remap of 256 rows × top-k
//!   2048, the resolve of 64 requests × top-k 2048 (4096 hot slots, steps overlapping 90%, state
//!   warmed up), and a whole **decode step** of `hisparse simulate`'s default workload (61 index
//!   groups, 4 requests × top-k 2048 of an 8192-token context, each group's resolve and the
//!   gather of its misses), once with hot buffers that never fill and once with full ones (every
//!   miss evicts, as in a long decode), each as device time (timestamps), wall time (enqueue, then one
//!   synchronisation), host enqueue time (recording and submitting, before the synchronisation)
//!   and queue submissions per call; on GPUs also the full decode step 30 times, each after
//!   190 ms idle (the simulation's rhythm: it verifies every row between steps), first and last
//!   five samples.
//!
//! Plans and page sets are cycled so one timed run touches ≥ 512 MiB of distinct rows: no figure
//! is served from a GPU cache.
//!
//! ```text
//! cargo run -p hisparse-kernel-lab --release --bin vulkan_bench -- \
//!     [--device SELECTOR] [--iters N] [--host-mib M] [--json PATH] [--only index] \
//!     [--option NAME=VALUE[,NAME=VALUE...]]...
//! ```
//!
//! `--option` configures the device (`hisparse_backend_vulkan::VulkanOptions::set`, e.g.
//! `--option barriers=all` or `--option queues=single`) for comparisons with the defaults.

use std::time::{Duration, Instant};

use hisparse_backend_vulkan::{
    CopyEngine, GatherKernel, ResolveKernel, VulkanBuffer, VulkanDevice, VulkanError,
    VulkanHostBuffer, VulkanOptions,
};
use hisparse_conformance::SplitMix64;
use hisparse_core::Device;
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, LayerPair, PageCopyDesc, PageLayout, ResolveArgs,
    ResolveDesc,
};
use hisparse_device_bench::DecodeRemap;

const ROW_BYTES: u32 = 656;
const BLOCK: u32 = 64;
const PAGE: u64 = (ROW_BYTES * BLOCK) as u64;
const MIB: usize = 1 << 20;

type Result<T> = core::result::Result<T, VulkanError>;

struct Opts {
    device: String,
    iters: usize,
    host_mib: u64,
    json: Option<String>,
    /// `--only index`: the index paths only (quick on CPU devices).
    only_index: bool,
    /// The device's configuration (`--option`).
    options: VulkanOptions,
}

fn parse() -> core::result::Result<Opts, String> {
    let mut o = Opts {
        device: String::new(),
        iters: 50,
        host_mib: 1024,
        json: None,
        only_index: false,
        options: VulkanOptions::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--device" => o.device = val()?,
            "--iters" => o.iters = val()?.parse().map_err(|e| format!("--iters: {e}"))?,
            "--host-mib" => o.host_mib = val()?.parse().map_err(|e| format!("--host-mib: {e}"))?,
            "--json" => o.json = Some(val()?),
            "--only" => match val()?.as_str() {
                "index" => o.only_index = true,
                other => return Err(format!("--only {other}: only `index` is known")),
            },
            "--option" => o.options.set_all(&val()?).map_err(|e| e.to_string())?,
            "--bench" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

fn gbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-12) / 1e9
}

/// One measured figure: `bytes` per call in `time` per call.
struct Figure {
    name: String,
    time: Duration,
    bytes: u64,
    ceiling: &'static str,
}

/// Where the time of one call goes (see the module docs).
struct Timing {
    name: String,
    device: Duration,
    wall: Duration,
    enqueue: Duration,
    submissions: f64,
}

impl Timing {
    fn print(&self) {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "  {:<52} device {:>8.1} us  wall {:>8.1} us  enqueue {:>8.1} us  {:>5.2} submissions",
            self.name,
            us(self.device),
            us(self.wall),
            us(self.enqueue),
            self.submissions
        );
    }
}

/// Everything the run measured, printed and written as JSON.
struct Report {
    device: String,
    ceilings: Vec<(&'static str, f64)>,
    figures: Vec<Figure>,
    timings: Vec<Timing>,
}

impl Report {
    fn ceiling(&self, name: &str) -> f64 {
        self.ceilings
            .iter()
            .find(|c| c.0 == name)
            .map_or(f64::NAN, |c| c.1)
    }

    fn print_figure(&self, f: &Figure) {
        let g = gbps(f.bytes, f.time);
        println!(
            "  {:<58} {:>10.1} us {:>8.2} GB/s  {:>4.0}% of {}",
            f.name,
            f.time.as_secs_f64() * 1e6,
            g,
            100.0 * g / self.ceiling(f.ceiling),
            f.ceiling
        );
    }

    fn json(&self) -> String {
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let ceilings: Vec<String> = self
            .ceilings
            .iter()
            .map(|(n, g)| format!("{{\"name\":\"{}\",\"gbps\":{g:.3}}}", esc(n)))
            .collect();
        let figures: Vec<String> = self
            .figures
            .iter()
            .map(|f| {
                let g = gbps(f.bytes, f.time);
                format!(
                    "{{\"name\":\"{}\",\"us\":{:.3},\"bytes\":{},\"gbps\":{g:.3},\"ceiling\":\"{}\",\
                     \"share\":{:.4}}}",
                    esc(&f.name),
                    f.time.as_secs_f64() * 1e6,
                    f.bytes,
                    esc(f.ceiling),
                    g / self.ceiling(f.ceiling)
                )
            })
            .collect();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let timings: Vec<String> = self
            .timings
            .iter()
            .map(|t| {
                format!(
                    "{{\"name\":\"{}\",\"device_us\":{:.3},\"wall_us\":{:.3},\"enqueue_us\":{:.3},\
                     \"submissions\":{:.3}}}",
                    esc(&t.name),
                    us(t.device),
                    us(t.wall),
                    us(t.enqueue),
                    t.submissions
                )
            })
            .collect();
        format!(
            "{{\"backend\":\"vulkan\",\"device\":\"{}\",\"ceilings\":[{}],\"figures\":[{}],\
             \"timings\":[{}]}}\n",
            esc(&self.device),
            ceilings.join(","),
            figures.join(","),
            timings.join(",")
        )
    }
}

const H2D: &str = "host->device bulk";
const D2H: &str = "device->host bulk";
const D2D: &str = "device copy (read+write)";

/// Device time per call of `op` (timestamp queries around `iters` back-to-back calls).
fn device_time(
    dev: &VulkanDevice,
    iters: usize,
    mut op: impl FnMut(&VulkanDevice, usize) -> Result<()>,
) -> Result<Duration> {
    op(dev, 0)?;
    let t = dev.timed(|d| {
        for i in 0..iters {
            op(d, i)?;
        }
        Ok(())
    })?;
    Ok(t / iters as u32)
}

/// Wall time, host enqueue time and queue submissions per call as `hisparse bench` measures the
/// wall time: after a warm-up call and a calibration burst, the median of samples of `reps` calls
/// enqueued on `stream` and one synchronisation, `reps` chosen so a sample lasts ≥ 2 ms.
fn wall_time(
    dev: &VulkanDevice,
    stream: &<VulkanDevice as Device>::Stream,
    samples: usize,
    mut op: impl FnMut(usize) -> Result<()>,
) -> Result<(Duration, Duration, f64)> {
    let mut call = 0;
    op(call)?;
    call += 1;
    dev.synchronize(stream)?;
    let mut burst = 1usize;
    let per_call = loop {
        let t = Instant::now();
        for _ in 0..burst {
            op(call)?;
            call += 1;
        }
        dev.synchronize(stream)?;
        let took = t.elapsed().as_secs_f64().max(1e-9);
        if took >= 1e-3 || burst >= 1000 {
            break took / burst as f64;
        }
        burst *= 2;
    };
    let reps = ((2e-3 / per_call).ceil() as usize).clamp(1, 1000);
    let mut wall = Vec::with_capacity(samples);
    let mut enqueue = Vec::with_capacity(samples);
    let subs0 = dev.submissions();
    for _ in 0..samples.max(1) {
        let t = Instant::now();
        for _ in 0..reps {
            op(call)?;
            call += 1;
        }
        enqueue.push(t.elapsed() / reps as u32);
        dev.synchronize(stream)?;
        wall.push(t.elapsed() / reps as u32);
    }
    let subs = (dev.submissions() - subs0) as f64 / (samples.max(1) * reps) as f64;
    wall.sort();
    enqueue.sort();
    Ok((wall[wall.len() / 2], enqueue[enqueue.len() / 2], subs))
}

fn upload_i32(dev: &VulkanDevice, v: &[i32]) -> Result<VulkanBuffer> {
    let mut b = dev.alloc(v.len() * 4)?;
    dev.upload_i32(&mut b, 0, v)?;
    Ok(b)
}

fn ceilings(
    dev: &VulkanDevice,
    iters: usize,
    host: &VulkanHostBuffer,
    r: &mut Report,
) -> Result<()> {
    let stream = dev.create_stream()?;
    let n = (256 * MIB).min(host.len());
    let mut a = dev.alloc(n)?;
    let mut b = dev.alloc(n)?;
    let it = iters.clamp(1, 10);
    let h2d = device_time(dev, it, |d, _| {
        d.copy_to_device(&stream, host, 0, &mut a, 0, n)
    })?;
    r.ceilings.push((H2D, gbps(n as u64, h2d)));
    let mut host_dst = dev.alloc_pinned(n)?;
    let d2h = device_time(dev, it, |d, _| {
        d.copy_to_host(&stream, &a, 0, &mut host_dst, 0, n)
    })?;
    r.ceilings.push((D2H, gbps(n as u64, d2h)));
    for (engine, label) in [(CopyEngine::Dma, "dma"), (CopyEngine::Shader, "shader")] {
        dev.set_copy_engine(engine);
        let t = device_time(dev, it, |d, _| {
            d.copy_on_device(&stream, &a, 0, &mut b, 0, n)
        })?;
        r.figures.push(Figure {
            name: format!("device copy 256 MiB, {label}"),
            time: t,
            bytes: 2 * n as u64,
            ceiling: D2D,
        });
    }
    dev.set_copy_engine(CopyEngine::Auto);
    // The device copy ceiling: the faster engine.
    let best = r
        .figures
        .iter()
        .map(|f| gbps(f.bytes, f.time))
        .fold(0.0, f64::max);
    r.ceilings.push((D2D, best));
    println!("ceilings (timestamps):");
    for (name, g) in &r.ceilings {
        println!("  {name:<28} {g:>9.2} GB/s");
    }
    Ok(())
}

fn gathers(
    dev: &VulkanDevice,
    o: &Opts,
    host: &VulkanHostBuffer,
    host_rows: u32,
    r: &mut Report,
) -> Result<()> {
    let max_rows = 32768u32;
    let dev_layout = PageLayout::contiguous(0, PAGE, max_rows / BLOCK, BLOCK, ROW_BYTES);
    let host_layout = PageLayout::contiguous(0, PAGE, host_rows / BLOCK, BLOCK, ROW_BYTES);
    let layers = [LayerPair {
        host: host_layout,
        device: dev_layout,
    }];
    let mut pool = dev.alloc((u64::from(max_rows / BLOCK) * PAGE) as usize)?;
    let stream = dev.create_stream()?;
    let mut rng = SplitMix64::new(0x0656_2048);
    println!("gather (device: timestamps around back-to-back calls; wall: as `hisparse bench`):");
    for rows in [2048u32, 32768] {
        let k = 2048u32;
        let t = rows / k;
        let bytes = u64::from(rows) * u64::from(ROW_BYTES);
        // Enough different plans that one timed run gathers ≥ 512 MiB of distinct rows.
        let plans = (512 * MIB).div_ceil(bytes as usize).clamp(2, 400);
        let mut set = Vec::with_capacity(plans);
        for _ in 0..plans {
            let mut src: Vec<i32> = Vec::with_capacity(rows as usize);
            let mut seen = std::collections::HashSet::new();
            while src.len() < rows as usize {
                let g = rng.below(u64::from(host_rows)) as i32;
                if seen.insert(g) {
                    src.push(g);
                }
            }
            let mut dst: Vec<i32> = rng
                .permutation(max_rows)
                .into_iter()
                .map(|x| x as i32)
                .collect();
            dst.truncate(rows as usize);
            let counts = vec![k as i32; t as usize];
            let bufs = (
                upload_i32(dev, &src)?,
                upload_i32(dev, &dst)?,
                upload_i32(dev, &counts)?,
            );
            set.push((src, dst, bufs));
        }
        let desc = GatherDesc {
            num_tokens: t,
            top_k: k,
            layers: &layers,
        };
        for kernel in [GatherKernel::PerEntry, GatherKernel::Pipelined] {
            dev.set_gather_kernel(kernel);
            let gather = |d: &VulkanDevice, i: usize, pool: &mut VulkanBuffer| {
                let (_, _, (plan_src, plan_dst, plan_counts)) = &set[i % plans];
                d.gather_rows(
                    &stream,
                    &desc,
                    GatherArgs {
                        plan_src,
                        plan_dst,
                        plan_counts,
                        host,
                        device: pool,
                    },
                )
            };
            // Every plan's rows land (first, middle and last entry checked).
            for (i, (src, dst, _)) in set.iter().enumerate() {
                gather(dev, i, &mut pool)?;
                for e in [0usize, rows as usize / 2, rows as usize - 1] {
                    let mut got = [0u8; 4];
                    dev.download(&pool, dst[e] as usize * ROW_BYTES as usize, &mut got)?;
                    if u32::from_ne_bytes(got) != src[e] as u32 {
                        return Err(VulkanError::InvalidArgument(format!(
                            "{kernel:?} plan {i}: gathered row {e} holds {} instead of host row {}",
                            u32::from_ne_bytes(got),
                            src[e]
                        )));
                    }
                }
            }
            let iters = o.iters.max(plans);
            let dt = device_time(dev, iters, |d, i| gather(d, i, &mut pool))?;
            let (wt, _, _) = wall_time(dev, &stream, 10, |i| gather(dev, i, &mut pool))?;
            for (how, time) in [("device", dt), ("wall", wt)] {
                let f = Figure {
                    name: format!("gather {rows} x {ROW_BYTES} B, {kernel:?}, {how}"),
                    time,
                    bytes,
                    ceiling: H2D,
                };
                r.print_figure(&f);
                r.figures.push(f);
            }
        }
    }
    dev.set_gather_kernel(GatherKernel::Auto);
    Ok(())
}

/// Top-k sets of `r` requests over a `ctx`-token context (distinct positions per request), one
/// per step: each step replaces a tenth of every request's entries. The steps then run back
/// (0, 1, …, n-1, n-2, …, 1), so cycling through them keeps a 90% overlap between consecutive
/// calls.
fn topk_cycle(rng: &mut SplitMix64, r: u32, k: u32, ctx: u32, n: usize) -> Vec<Vec<i32>> {
    let mut cur: Vec<i32> = Vec::with_capacity((r * k) as usize);
    for _ in 0..r {
        let mut seen = std::collections::HashSet::new();
        while seen.len() < k as usize {
            seen.insert(rng.below(u64::from(ctx)) as i32);
        }
        cur.extend(seen);
    }
    let mut steps = vec![cur.clone()];
    for _ in 1..n {
        for row in cur.chunks_mut(k as usize) {
            let mut present: std::collections::HashSet<i32> = row.iter().copied().collect();
            for _ in 0..k / 10 {
                let col = rng.below(u64::from(k)) as usize;
                let mut p = rng.below(u64::from(ctx)) as i32;
                while present.contains(&p) {
                    p = rng.below(u64::from(ctx)) as i32;
                }
                present.remove(&row[col]);
                present.insert(p);
                row[col] = p;
            }
        }
        steps.push(cur.clone());
    }
    let back: Vec<Vec<i32>> = steps[1..n.saturating_sub(1)]
        .iter()
        .rev()
        .cloned()
        .collect();
    steps.extend(back);
    steps
}

/// One index group's resolver inputs and state: `r` requests whose pages are all on host.
struct Group {
    desc: ResolveDesc,
    steps: Vec<VulkanBuffer>,
    req: VulkanBuffer,
    resident: VulkanBuffer,
    host_table: VulkanBuffer,
    hot: VulkanBuffer,
    slot_host_rows: VulkanBuffer,
    lru: VulkanBuffer,
    out: [VulkanBuffer; 6],
}

impl Group {
    #[allow(clippy::too_many_arguments)]
    fn new(
        dev: &VulkanDevice,
        rng: &mut SplitMix64,
        r: u32,
        k: u32,
        n: u32,
        ctx: u32,
        host_blocks: u32,
        first_host_block: u32,
        cycle: usize,
    ) -> Result<Group> {
        let m = ctx / BLOCK;
        let w = n.div_ceil(BLOCK);
        let desc = ResolveDesc {
            num_tokens: r,
            top_k: k,
            num_requests: r,
            max_pages: m,
            block_size: BLOCK,
            hot_slots: n,
            attention_block_stride: BLOCK,
            host_num_blocks: host_blocks,
            num_state_rows: None,
            stats_slot: 0,
        };
        let steps = topk_cycle(rng, r, k, ctx, cycle)
            .iter()
            .map(|s| upload_i32(dev, s))
            .collect::<Result<Vec<_>>>()?;
        let host: Vec<i32> = (0..r * m)
            .map(|i| (1 + (first_host_block + i) % (host_blocks - 1)) as i32)
            .collect();
        let hot: Vec<i32> = (0..r * w).map(|i| 1 + i as i32).collect();
        let lru: Vec<u8> = (0..r)
            .flat_map(|_| (0..n as u16).flat_map(|s| s.to_ne_bytes()))
            .collect();
        let mut lru_b = dev.alloc(lru.len())?;
        dev.upload(&mut lru_b, 0, &lru)?;
        let (tk, t4) = ((r * k * 4) as usize, (r * 4) as usize);
        Ok(Group {
            desc,
            steps,
            req: upload_i32(dev, &(0..r as i32).collect::<Vec<_>>())?,
            resident: upload_i32(dev, &vec![0; (r * m) as usize])?,
            host_table: upload_i32(dev, &host)?,
            hot: upload_i32(dev, &hot)?,
            slot_host_rows: upload_i32(dev, &vec![-1; (r * n) as usize])?,
            lru: lru_b,
            out: [
                dev.alloc(tk)?,
                dev.alloc(t4)?,
                dev.alloc(t4)?,
                dev.alloc(t4)?,
                dev.alloc(tk)?,
                dev.alloc(tk)?,
            ],
        })
    }

    /// Step `i` of the cycle: the resolve, then (with `gather`) the gather of its misses.
    fn step(
        &mut self,
        dev: &VulkanDevice,
        stream: &<VulkanDevice as Device>::Stream,
        i: usize,
        gather: Option<(&[LayerPair], &VulkanHostBuffer, &mut VulkanBuffer)>,
    ) -> Result<()> {
        let [indices, valid, hits, misses, src, dst] = &mut self.out;
        dev.resolve(
            stream,
            &self.desc,
            ResolveArgs {
                req_id: &self.req,
                topk: &self.steps[i % self.steps.len()],
                resident_table: &self.resident,
                host_table: &self.host_table,
                hot_table: &self.hot,
                slot_host_rows: &mut self.slot_host_rows,
                lru: &mut self.lru,
                indices,
                valid_counts: valid,
                hit_counts: hits,
                miss_counts: misses,
                miss_src: src,
                miss_dst: dst,
                idx_mapping: None,
                stats: None,
            },
        )?;
        if let Some((layers, host, pool)) = gather {
            dev.gather_rows(
                stream,
                &GatherDesc {
                    num_tokens: self.desc.num_tokens,
                    top_k: self.desc.top_k,
                    layers,
                },
                GatherArgs {
                    plan_src: src,
                    plan_dst: dst,
                    plan_counts: misses,
                    host,
                    device: pool,
                },
            )?;
        }
        Ok(())
    }
}

/// Device time (median of `runs` timestamped calls), wall and enqueue time and submissions per
/// call of `op`.
fn timing(
    dev: &VulkanDevice,
    stream: &<VulkanDevice as Device>::Stream,
    name: String,
    runs: usize,
    mut op: impl FnMut(&VulkanDevice, usize) -> Result<()>,
) -> Result<Timing> {
    let mut call = 0usize;
    let mut device = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        device.push(dev.timed(|d| op(d, call))?);
        call += 1;
    }
    device.sort();
    let (wall, enqueue, submissions) = wall_time(dev, stream, 10, |i| op(dev, call + i))?;
    Ok(Timing {
        name,
        device: device[device.len() / 2],
        wall,
        enqueue,
        submissions,
    })
}

/// The index paths (remap, resolve, a whole decode step) with each resolver kernel the device
/// runs.
fn index_paths(dev: &VulkanDevice, host: &VulkanHostBuffer, r: &mut Report) -> Result<()> {
    let stream = dev.create_stream()?;
    let mut rng = SplitMix64::new(0x1d3a);
    println!(
        "index paths (device: timestamps; wall: enqueue + synchronisation; enqueue: host only):"
    );
    // Remap of 256 rows × top-k 2048 over 32K-token block tables (`hisparse bench`'s workload).
    {
        let mut call = DecodeRemap::new(dev, &mut rng)?;
        let (t, k) = (call.desc.num_tokens, call.desc.top_k);
        let f = timing(
            dev,
            &stream,
            format!("remap {t} rows x top-k {k}"),
            20,
            |d, _| call.enqueue(d, &stream),
        )?;
        f.print();
        r.timings.push(f);
    }
    let host_blocks = (host.len() as u64 / PAGE) as u32;
    let (k, n) = (2048u32, 4096u32);
    let hot_blocks = 4 * n / BLOCK + 1;
    let mut pool = dev.alloc((u64::from(hot_blocks) * PAGE) as usize)?;
    let layers = [LayerPair {
        host: PageLayout::contiguous(0, PAGE, host_blocks, BLOCK, ROW_BYTES),
        device: PageLayout::contiguous(0, PAGE, hot_blocks, BLOCK, ROW_BYTES),
    }];
    let mut resolve64 = Group::new(dev, &mut rng, 64, k, n, 32768, host_blocks, 0, 8)?;
    // The default simulation's decode step: 61 groups of 4 requests × 8192 tokens. A cycle of 8
    // top-k sets touches about 3500 distinct rows per request, fewer than the 4096 hot slots; one
    // of 40 sets (10 000 rows) keeps the hot buffers full, as a long decode does, so every miss
    // evicts a cached row.
    let mut groups = (0..61u32)
        .map(|g| Group::new(dev, &mut rng, 4, k, n, 8192, host_blocks, g * 4 * 128, 8))
        .collect::<Result<Vec<_>>>()?;
    let mut full = (0..61u32)
        .map(|g| Group::new(dev, &mut rng, 4, k, n, 8192, host_blocks, g * 4 * 128, 40))
        .collect::<Result<Vec<_>>>()?;
    for kernel in [ResolveKernel::Workgroup, ResolveKernel::Portable] {
        if let Err(e) = dev.set_resolve_kernel(kernel) {
            println!("  (resolver {kernel:?} skipped: {e})");
            continue;
        }
        // Warm the states up: a full cycle fills the hot buffers.
        for i in 0..16 {
            resolve64.step(dev, &stream, i, None)?;
            for g in &mut groups {
                g.step(dev, &stream, i, Some((&layers, host, &mut pool)))?;
            }
        }
        dev.synchronize(&stream)?;
        let f = timing(
            dev,
            &stream,
            format!("resolve 64 req x top-k {k}, {n} slots, {kernel:?}"),
            20,
            |d, i| resolve64.step(d, &stream, i, None),
        )?;
        f.print();
        r.timings.push(f);
        let f = timing(
            dev,
            &stream,
            format!("decode step 61 x (resolve + gather) 4 req, {kernel:?}"),
            8,
            |d, i| {
                for g in &mut groups {
                    g.step(d, &stream, i, Some((&layers, host, &mut pool)))?;
                }
                Ok(())
            },
        )?;
        f.print();
        r.timings.push(f);
        for i in 0..48 {
            for g in &mut full {
                g.step(dev, &stream, i, Some((&layers, host, &mut pool)))?;
            }
        }
        dev.synchronize(&stream)?;
        let f = timing(
            dev,
            &stream,
            format!("decode step, hot buffers full, {kernel:?}"),
            8,
            |d, i| {
                for g in &mut full {
                    g.step(d, &stream, 48 + i, Some((&layers, host, &mut pool)))?;
                }
                Ok(())
            },
        )?;
        f.print();
        r.timings.push(f);
        if kernel == ResolveKernel::Workgroup && dev.is_gpu() {
            idle_series(dev, &mut full, &layers, host, &mut pool, r)?;
        }
    }
    dev.set_resolve_kernel(ResolveKernel::Auto)?;
    Ok(())
}

/// The full decode step as `hisparse simulate` issues it: one step after about 190 ms without
/// GPU work (the simulation verifies every row between steps), 30 times in a row. A GPU that
/// lowers its clocks while it idles runs the later steps slower than the first ones; the first
/// and last five samples (device time from timestamps, wall time around the call) show it.
fn idle_series(
    dev: &VulkanDevice,
    full: &mut [Group],
    layers: &[LayerPair],
    host: &VulkanHostBuffer,
    pool: &mut VulkanBuffer,
    r: &mut Report,
) -> Result<()> {
    const SAMPLES: usize = 30;
    const IDLE: Duration = Duration::from_millis(190);
    let stream = dev.create_stream()?;
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        std::thread::sleep(IDLE);
        let t = Instant::now();
        let device = dev.timed(|d| {
            for g in full.iter_mut() {
                g.step(d, &stream, 100 + i, Some((layers, host, &mut *pool)))?;
            }
            Ok(())
        })?;
        samples.push((device, t.elapsed()));
    }
    let us: Vec<String> = samples
        .iter()
        .map(|s| format!("{:.0}", s.0.as_secs_f64() * 1e6))
        .collect();
    println!(
        "  decode step after {IDLE:?} idle, device us per sample: {}",
        us.join(" ")
    );
    for (what, part) in [("first", &samples[..5]), ("last", &samples[SAMPLES - 5..])] {
        let mut d: Vec<Duration> = part.iter().map(|s| s.0).collect();
        let mut w: Vec<Duration> = part.iter().map(|s| s.1).collect();
        d.sort();
        w.sort();
        let f = Timing {
            name: format!("decode step after 190 ms idle, {what} 5 of {SAMPLES}"),
            device: d[2],
            wall: w[2],
            enqueue: Duration::ZERO,
            submissions: 0.0,
        };
        f.print();
        r.timings.push(f);
    }
    Ok(())
}

/// 61 layers × 64 pages per call between a device pool of 256 blocks (61 pages each, padded)
/// and a layer-major host pool of 256 blocks per layer, four page sets cycled.
fn page_copies(dev: &VulkanDevice, iters: usize, r: &mut Report) -> Result<()> {
    const LAYERS: u32 = 61;
    const PAGES: usize = 64;
    const BLOCKS: u32 = 256;
    const SETS: usize = BLOCKS as usize / PAGES;
    let dev_stride = PAGE * u64::from(LAYERS) + 4096;
    let layers: Vec<LayerPair> = (0..LAYERS)
        .map(|l| LayerPair {
            host: PageLayout::contiguous(
                u64::from(l) * PAGE * u64::from(BLOCKS),
                PAGE,
                BLOCKS,
                BLOCK,
                ROW_BYTES,
            ),
            device: PageLayout {
                index_stride_rows: (dev_stride / u64::from(ROW_BYTES)) as u32,
                ..PageLayout::contiguous(u64::from(l) * PAGE, dev_stride, BLOCKS, BLOCK, ROW_BYTES)
            },
        })
        .collect();
    let mut host = dev.alloc_pinned((PAGE * u64::from(LAYERS * BLOCKS)) as usize)?;
    let mut pool = dev.alloc((dev_stride * u64::from(BLOCKS)) as usize)?;
    let mut rng = SplitMix64::new(4);
    let (a, b) = (rng.permutation(BLOCKS), rng.permutation(BLOCKS));
    let sets: Vec<Vec<BlockPair>> = (0..SETS)
        .map(|s| {
            (0..PAGES)
                .map(|i| BlockPair {
                    src: a[s * PAGES + i],
                    dst: b[s * PAGES + i],
                })
                .collect()
        })
        .collect();
    let stream = dev.create_stream()?;
    let bytes = PAGE * u64::from(LAYERS) * PAGES as u64;
    println!(
        "page copies, {LAYERS} layers x {PAGES} pages ({} MB) per call (timestamps):",
        bytes / 1_000_000
    );
    for (direction, what, ceiling) in [
        (Direction::DeviceToHost, "backup", D2H),
        (Direction::HostToDevice, "restore", H2D),
    ] {
        let desc = PageCopyDesc {
            direction,
            layers: &layers,
        };
        for (engine, label) in [
            (CopyEngine::Auto, "auto"),
            (CopyEngine::Dma, "dma"),
            (CopyEngine::Shader, "shader"),
        ] {
            dev.set_copy_engine(engine);
            let t = device_time(dev, iters.clamp(SETS, 20), |d, i| {
                d.copy_pages(&stream, &desc, &sets[i % SETS], &mut host, &mut pool)
            })?;
            let f = Figure {
                name: format!("{what} {LAYERS} layers x {PAGES} pages, {label}"),
                time: t,
                bytes,
                ceiling,
            };
            r.print_figure(&f);
            r.figures.push(f);
        }
    }
    dev.set_copy_engine(CopyEngine::Auto);
    Ok(())
}

fn run(o: &Opts) -> Result<()> {
    let dev = VulkanDevice::open_with(&o.device, &o.options)?;
    let host_bytes = ((o.host_mib << 20) / PAGE * PAGE) as usize;
    let host_rows = (host_bytes as u64 / u64::from(ROW_BYTES)) as u32;
    if host_rows < 4 * 32768 {
        return Err(VulkanError::InvalidArgument(format!(
            "--host-mib {} holds {host_rows} rows; the bench needs at least {}",
            o.host_mib,
            4 * 32768
        )));
    }
    let mut host = dev.alloc_pinned(host_bytes)?;
    // Row r starts with r, so a gathered row names its source.
    let mut fill = vec![0u8; host_bytes];
    for (r, row) in fill.chunks_mut(ROW_BYTES as usize).enumerate() {
        row[..4].copy_from_slice(&(r as u32).to_ne_bytes());
        row[4] = r as u8 ^ 0x5a;
    }
    dev.write_pinned(&mut host, 0, &fill)?;
    drop(fill);
    println!(
        "device: {} | {} compute queue(s){} | host pool {} MiB ({}) | binding window {} MiB",
        dev.device_name(),
        dev.compute_queues(),
        if dev.has_transfer_queue() {
            " + a transfer queue"
        } else {
            ""
        },
        host_bytes >> 20,
        if host.is_imported() {
            "imported host memory"
        } else {
            "host-visible memory"
        },
        dev.binding_window() >> 20
    );
    let mut report = Report {
        device: dev.device_name().to_string(),
        ceilings: Vec::new(),
        figures: Vec::new(),
        timings: Vec::new(),
    };
    if !o.only_index {
        ceilings(&dev, o.iters, &host, &mut report)?;
        for f in &report.figures {
            report.print_figure(f);
        }
        gathers(&dev, o, &host, host_rows, &mut report)?;
    }
    index_paths(&dev, &host, &mut report)?;
    drop(host);
    if !o.only_index {
        page_copies(&dev, o.iters, &mut report)?;
    }
    if let Some(path) = &o.json
        && let Err(e) = std::fs::write(path, report.json())
    {
        eprintln!("could not write {path}: {e}");
    }
    Ok(())
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vulkan_bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&o) {
        eprintln!("vulkan_bench: {e}");
        std::process::exit(1);
    }
}
