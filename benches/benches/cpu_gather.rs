//! CPU backend: the 656-byte-row swap-in gather against this machine's memcpy bandwidth.
//!
//! `cargo bench -p hisparse-benches --bench cpu_gather`
//!
//! * `memcpy/256MiB`: one large `copy_from_slice` between two page-aligned buffers (the ceiling).
//! * `gather/656B/{2048,32768}`: `CpuDevice::gather_rows` of that many random host rows (from a
//!   128K-row, 86 MB host pool) into random slots of a hot region of the default size
//!   (`device_buffer_size` = 2 × rows, at most 32768 slots). Successive iterations use different
//!   plans that together cover the whole host pool, so rows come from DRAM, not a warm cache.
//!
//! After criterion's report the bench prints its own figures: 25 rounds, each timing the memcpy
//! and both gathers back to back (so all three see the same background load), the median of
//! each, and the ratio gather / memcpy. That is what `docs/PERF.md` records.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use hisparse_backend_cpu::{CpuBuffer, CpuDevice};
use hisparse_conformance::SplitMix64;
use hisparse_core::Device;
use hisparse_core::ops::{GatherArgs, GatherDesc, LayerPair, PageLayout};

const ROW: usize = 656;
const BLOCK: u32 = 64;
const HOST_ROWS: usize = 131_072;
const HOT_ROWS: usize = 32_768;
const MEMCPY_BYTES: usize = 256 << 20;

/// Plans of `rows` entries each: random distinct host rows, random distinct hot rows. Enough
/// plans to touch the whole host pool once per cycle.
struct Plans {
    rows: usize,
    bufs: Vec<(CpuBuffer, CpuBuffer, CpuBuffer)>,
}

fn i32_buffer(dev: &CpuDevice, v: &[i32]) -> CpuBuffer {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let mut b = dev.alloc(bytes.len()).expect("alloc plan");
    dev.upload(&mut b, 0, &bytes).expect("upload plan");
    b
}

fn plans(dev: &CpuDevice, rng: &mut SplitMix64, rows: usize) -> Plans {
    let mut host: Vec<i32> = (0..HOST_ROWS as i32).collect();
    rng.shuffle(&mut host);
    let bufs = host
        .chunks_exact(rows)
        .map(|src| {
            // The hot region of one request: `device_buffer_size` = 2 × top-k (the default),
            // at most 32768 slots.
            let hot = (2 * rows).min(HOT_ROWS) as i32;
            let mut dst: Vec<i32> = (0..hot).collect();
            rng.shuffle(&mut dst);
            (
                i32_buffer(dev, src),
                i32_buffer(dev, &dst[..rows]),
                i32_buffer(dev, &[rows as i32]),
            )
        })
        .collect();
    Plans { rows, bufs }
}

struct Setup {
    dev: CpuDevice,
    layers: [LayerPair; 1],
    host: CpuBuffer,
    hot: CpuBuffer,
    src: CpuBuffer,
    dst: CpuBuffer,
}

fn setup() -> Setup {
    let dev = CpuDevice::new();
    let page = u64::from(BLOCK) * ROW as u64;
    let host_layout = PageLayout::contiguous(0, page, HOST_ROWS as u32 / BLOCK, BLOCK, ROW as u32);
    let hot_layout = PageLayout::contiguous(0, page, HOT_ROWS as u32 / BLOCK, BLOCK, ROW as u32);
    let mut host = dev.alloc_pinned(HOST_ROWS * ROW).expect("host pool");
    let mut rng = SplitMix64::new(0x9e37_79b9_7f4a_7c15);
    rng.fill(host.as_mut_slice());
    let mut hot = dev.alloc(HOT_ROWS * ROW).expect("hot pool");
    hot.as_mut_slice().fill(1);
    let mut src = dev.alloc(MEMCPY_BYTES).expect("memcpy source");
    src.as_mut_slice().fill(2);
    let mut dst = dev.alloc(MEMCPY_BYTES).expect("memcpy destination");
    dst.as_mut_slice().fill(3);
    Setup {
        dev,
        layers: [LayerPair {
            host: host_layout,
            device: hot_layout,
        }],
        host,
        hot,
        src,
        dst,
    }
}

fn memcpy(s: &mut Setup) {
    let (src, dst) = (&s.src, &mut s.dst);
    dst.as_mut_slice()
        .copy_from_slice(black_box(src.as_slice()));
    black_box(dst.as_slice().as_ptr());
}

fn gather(s: &mut Setup, p: &Plans, i: usize) {
    let (src, dst, count) = &p.bufs[i % p.bufs.len()];
    let stream = s.dev.create_stream().expect("stream");
    let desc = GatherDesc {
        num_tokens: 1,
        top_k: p.rows as u32,
        layers: &s.layers,
    };
    s.dev
        .gather_rows(
            &stream,
            &desc,
            GatherArgs {
                plan_src: src,
                plan_dst: dst,
                plan_counts: count,
                host: &s.host,
                device: &mut s.hot,
            },
        )
        .expect("gather");
    black_box(s.hot.as_slice().as_ptr());
}

fn main() {
    let mut s = setup();
    let mut rng = SplitMix64::new(42);
    let small = plans(&s.dev, &mut rng, 2048);
    let large = plans(&s.dev, &mut rng, 32768);

    let mut c = Criterion::default()
        .sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("cpu");
        g.throughput(Throughput::Bytes(MEMCPY_BYTES as u64));
        g.bench_function("memcpy/256MiB", |b| b.iter(|| memcpy(&mut s)));
        for p in [&small, &large] {
            g.throughput(Throughput::Bytes((p.rows * ROW) as u64));
            let mut i = 0;
            g.bench_function(format!("gather/656B/{}", p.rows), |b| {
                b.iter(|| {
                    i += 1;
                    gather(&mut s, p, i)
                })
            });
        }
        g.finish();
    }
    c.final_summary();

    // The same figures from plain timed runs, interleaved so that the ceiling and the gathers
    // see the same background load (this box is shared), and the ratio of the medians.
    let gbs = |bytes: usize, secs: f64| bytes as f64 / secs / 1e9;
    let (mut mem, mut small_t, mut large_t) = (Vec::new(), Vec::new(), Vec::new());
    memcpy(&mut s);
    gather(&mut s, &small, 0);
    gather(&mut s, &large, 0);
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed().as_secs_f64()
    };
    for round in 0..25 {
        mem.push(gbs(MEMCPY_BYTES, time(&mut || memcpy(&mut s))));
        // 16 small gathers per round: each takes ~0.2 ms, too short to time alone.
        let t = time(&mut || {
            for i in 0..16 {
                gather(&mut s, &small, round * 16 + i)
            }
        });
        small_t.push(gbs(16 * small.rows * ROW, t));
        large_t.push(gbs(
            large.rows * ROW,
            time(&mut || gather(&mut s, &large, round)),
        ));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mem = median(&mut mem);
    println!("summary: memcpy 256 MiB        {mem:6.2} GB/s (ceiling, median of 25)");
    for (p, v) in [(&small, &mut small_t), (&large, &mut large_t)] {
        let g = median(v);
        println!(
            "summary: gather 656 B x {:5}   {g:6.2} GB/s = {:5.1}% of memcpy",
            p.rows,
            100.0 * g / mem
        );
    }
}
