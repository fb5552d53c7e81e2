//! CUDA benchmark of the HiSparse data-plane kernels, each figure beside its physical ceiling
//! measured in the same run.
//!
//! ```text
//! cargo build --release -p hisparse-backend-cuda --example cuda_bench
//! cuda_bench [--json PATH] [--quick] [--only remap,gather,resolve,backup]
//! ```
//!
//! The remap and gather figures are measured for every kernel variant of the backend
//! ([`RemapKernel`], [`GatherKernel`]; the name says which, `*` marks the default), and each
//! variant's output is compared byte for byte with the first variant's (a mismatch is an error).
//!
//! Ceilings: bulk pinned host→device and device→host copies (`cuMemcpyAsync`, 256 MiB), and a
//! device-to-device copy (1 GiB, counting bytes read plus bytes written). Figures, timed with CUDA
//! events over many back-to-back launches after a warm-up (inputs rotated so the 60 MB L2 cache
//! does not hold them), and where noted as CUDA-graph replays:
//!
//! * remap of 1024 tokens × 2048 → time vs reading + writing the indices at the D2D rate
//!   (target ≤ 1.3×);
//! * swap-in gather of random 656-byte rows (2048 and 32768 rows) from mapped pinned memory →
//!   GB/s vs bulk H2D (target ≥ 0.8×);
//! * resolver, 64 requests × 2048 top-k against 4096-slot hot buffers, ~10% misses per step
//!   (a random walk of the top-k sets), gather excluded (target ≤ 10 µs);
//! * multi-layer page backup (61 layers × 64 pages of 41,984 B, one launch) → GB/s vs bulk D2H
//!   (target ≥ 0.8×), and the matching restore vs bulk H2D.

use std::error::Error;
use std::fmt::Write as _;

use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaStream, GatherKernel, RemapKernel};
use hisparse_core::Device;
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

fn bytes_i32(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn upload_i32(dev: &CudaDevice, v: &[i32]) -> Res<CudaBuffer> {
    let mut b = dev.alloc(v.len() * 4)?;
    dev.upload(&mut b, 0, &bytes_i32(v))?;
    Ok(b)
}

fn download_i32(dev: &CudaDevice, b: &CudaBuffer, n: usize) -> Res<Vec<i32>> {
    let mut raw = vec![0u8; n * 4];
    dev.download(b, 0, &mut raw)?;
    Ok(raw
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Milliseconds per call of `op(i)` over `iters` back-to-back calls, after `warm` calls.
fn time_ms(
    dev: &CudaDevice,
    s: &CudaStream,
    warm: usize,
    iters: usize,
    mut op: impl FnMut(usize) -> Res<()>,
) -> Res<f64> {
    for i in 0..warm {
        op(i)?;
    }
    dev.synchronize(s)?;
    let a = dev.timing_event(s)?;
    for i in 0..iters {
        op(i)?;
    }
    let b = dev.timing_event(s)?;
    Ok(f64::from(dev.elapsed_ms(&a, &b)?) / iters as f64)
}

struct Row {
    name: String,
    value: f64,
    unit: &'static str,
    ceiling: f64,
    ratio: f64,
    target: String,
    met: bool,
    note: String,
}

fn main() -> Res<()> {
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
    let run = |section: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == section));
    let dev = CudaDevice::open(0)?;
    dev.prepare()?;
    let s = dev.create_stream()?;
    println!("device: {}", dev.device_name());
    let (remap_default, gather_default) = (dev.remap_kernel(), dev.gather_kernel());
    let pdl_default = dev.programmatic_launch();
    // The variant loops measure with programmatic launch off, then (where the device supports it)
    // the v2 kernels once more with it on: rows marked "PDL".
    dev.set_programmatic_launch(false);
    println!(
        "default kernels: remap {}, gather {}",
        remap_default.name(),
        gather_default.name()
    );
    for r in dev.kernel_report()? {
        println!(
            "kernel {}: {} registers, {} B local, {} B shared, {} blocks of {} threads per SM",
            r.name,
            r.registers,
            r.local_bytes,
            r.shared_bytes,
            r.blocks_per_multiprocessor,
            r.block_threads
        );
    }
    let mut rows: Vec<Row> = Vec::new();

    // ---- ceilings ------------------------------------------------------------------------
    let bulk = 256usize << 20;
    let mut pinned = dev.alloc_pinned(bulk)?;
    let mut dbuf = dev.alloc(bulk)?;
    let it = if quick { 3 } else { 10 };
    let h2d_ms = time_ms(&dev, &s, 2, it, |_| {
        Ok(dev.copy_to_device(&s, &pinned, 0, &mut dbuf, 0, bulk)?)
    })?;
    let h2d = bulk as f64 / h2d_ms / 1e6;
    let d2h_ms = time_ms(&dev, &s, 2, it, |_| {
        Ok(dev.copy_to_host(&s, &dbuf, 0, &mut pinned, 0, bulk)?)
    })?;
    let d2h = bulk as f64 / d2h_ms / 1e6;
    drop(pinned);
    drop(dbuf);
    let dd = 1usize << 30;
    let src = dev.alloc(dd)?;
    let mut dst = dev.alloc(dd)?;
    let d2d_ms = time_ms(&dev, &s, 2, it, |_| {
        Ok(dev.copy_on_device(&s, &src, 0, &mut dst, 0, dd)?)
    })?;
    let d2d = 2.0 * dd as f64 / d2d_ms / 1e6;
    drop(src);
    drop(dst);
    println!("ceilings: H2D {h2d:.1} GB/s, D2H {d2h:.1} GB/s, D2D {d2d:.0} GB/s (read+write)");
    for (name, v) in [
        ("bulk pinned H2D (ceiling)", h2d),
        ("bulk pinned D2H (ceiling)", d2h),
        ("device-to-device, read+write (ceiling)", d2d),
    ] {
        rows.push(Row {
            name: name.into(),
            value: v,
            unit: "GB/s",
            ceiling: v,
            ratio: 1.0,
            target: "-".into(),
            met: true,
            note: String::new(),
        });
    }

    let mut rng = Rng(0x5eed);

    // ---- remap 1024 x 2048 ----------------------------------------------------------------
    // Two block tables: 1024 requests of 128K tokens (an 8 MB table, each token its own
    // request: the table is read from DRAM too) and 64 requests of 16 tokens each (512 KB).
    let remap_cases = [(1024u32, "1024 req x 128K ctx"), (64, "64 req x 16 tok")];
    for (reqs, label) in remap_cases.into_iter().filter(|_| run("remap")) {
        let (t, k, bs, m) = (1024u32, 2048u32, 64u32, 2048u32);
        let sets = 8;
        let table: Vec<i32> = (0..reqs * m).map(|_| rng.below(1 << 20) as i32).collect();
        let table = upload_i32(&dev, &table)?;
        let req: Vec<i32> = (0..t).map(|i| (i * reqs / t) as i32).collect();
        let req = upload_i32(&dev, &req)?;
        let mut topks = Vec::new();
        let mut outs = Vec::new();
        for _ in 0..sets {
            let v: Vec<i32> = (0..t * k)
                .map(|_| rng.below(u64::from(bs * m)) as i32)
                .collect();
            topks.push(upload_i32(&dev, &v)?);
            outs.push(dev.alloc((t * k * 4) as usize)?);
        }
        let desc = RemapDesc {
            num_tokens: t,
            top_k: k,
            table_rows: reqs,
            max_blocks: m,
            block_size: bs,
            block_stride_rows: bs,
            idx_mapping_len: None,
            write_counts: false,
            compact: false,
        };
        let bytes = 2.0 * f64::from(t) * f64::from(k) * 4.0;
        let ceil_us = bytes / d2d / 1e3;
        let mut first: Option<Vec<u8>> = None;
        for variant in RemapKernel::ALL {
            dev.set_remap_kernel(variant);
            let tag = format!(
                "{}{}",
                variant.name(),
                if variant == remap_default { "*" } else { "" }
            );
            // Correctness against the first variant, on set 0.
            let mut check = dev.alloc((t * k * 4) as usize)?;
            dev.remap(
                &s,
                &desc,
                RemapArgs {
                    req_id: &req,
                    block_table: &table,
                    topk: &topks[0],
                    idx_mapping: None,
                    out: &mut check,
                    counts: None,
                },
            )?;
            let mut got = vec![0u8; (t * k * 4) as usize];
            dev.download(&check, 0, &mut got)?;
            match &first {
                None => first = Some(got),
                Some(want) if *want != got => {
                    return Err(
                        format!("remap {tag} output differs from the first variant's").into(),
                    );
                }
                Some(_) => {}
            }
            let iters = if quick { 40 } else { 400 };
            let ms = time_ms(&dev, &s, 8, iters, |i| {
                let j = i % sets;
                let (o, tk) = (&mut outs[j], &topks[j]);
                Ok(dev.remap(
                    &s,
                    &desc,
                    RemapArgs {
                        req_id: &req,
                        block_table: &table,
                        topk: tk,
                        idx_mapping: None,
                        out: o,
                        counts: None,
                    },
                )?)
            })?;
            let us = ms * 1e3;
            rows.push(Row {
                name: format!("remap 1024 tok x 2048, {label} (stream) [{tag}]"),
                value: us,
                unit: "us",
                ceiling: ceil_us,
                ratio: us / ceil_us,
                target: "<= 1.3x".into(),
                met: us / ceil_us <= 1.3,
                note: format!("{:.0} GB/s effective", bytes / us / 1e3),
            });
            if variant != RemapKernel::V1 && dev.set_programmatic_launch(true) {
                // A failure here is reported and the bench goes on (the other figures matter).
                let mut pdl = || -> Res<f64> {
                    let mut check = dev.alloc((t * k * 4) as usize)?;
                    let mut got = vec![0u8; (t * k * 4) as usize];
                    // Two remaps into the same buffer: the second may only write after the first.
                    for j in 0..2 {
                        dev.remap(
                            &s,
                            &desc,
                            RemapArgs {
                                req_id: &req,
                                block_table: &table,
                                topk: &topks[1 - j],
                                idx_mapping: None,
                                out: &mut check,
                                counts: None,
                            },
                        )?;
                    }
                    dev.download(&check, 0, &mut got)?;
                    if first.as_ref().is_some_and(|want| *want != got) {
                        return Err(format!(
                            "remap {tag} with PDL differs from the first variant's"
                        )
                        .into());
                    }
                    time_ms(&dev, &s, 8, iters, |i| {
                        let j = i % sets;
                        let (o, tk) = (&mut outs[j], &topks[j]);
                        Ok(dev.remap(
                            &s,
                            &desc,
                            RemapArgs {
                                req_id: &req,
                                block_table: &table,
                                topk: tk,
                                idx_mapping: None,
                                out: o,
                                counts: None,
                            },
                        )?)
                    })
                };
                let r = pdl();
                dev.set_programmatic_launch(false);
                match r {
                    Ok(ms) => {
                        let us = ms * 1e3;
                        rows.push(Row {
                            name: format!("remap 1024 tok x 2048, {label} (stream, PDL) [{tag}]"),
                            value: us,
                            unit: "us",
                            ceiling: ceil_us,
                            ratio: us / ceil_us,
                            target: "<= 1.3x".into(),
                            met: us / ceil_us <= 1.3,
                            note: format!("{:.0} GB/s effective", bytes / us / 1e3),
                        });
                    }
                    Err(e) => println!("remap {tag} with PDL FAILED: {e}"),
                }
            }
            // Same, as CUDA-graph replays of 8 remaps.
            let graph = dev.capture(&s, |d| {
                for j in 0..sets {
                    let (o, tk) = (&mut outs[j], &topks[j]);
                    d.remap(
                        &s,
                        &desc,
                        RemapArgs {
                            req_id: &req,
                            block_table: &table,
                            topk: tk,
                            idx_mapping: None,
                            out: o,
                            counts: None,
                        },
                    )?;
                }
                Ok(())
            })?;
            let reps = if quick { 5 } else { 50 };
            let ms = time_ms(&dev, &s, 2, reps, |_| Ok(dev.launch_graph(&graph, &s)?))?;
            let us = ms * 1e3 / sets as f64;
            rows.push(Row {
                name: format!("remap 1024 tok x 2048, {label} (graph) [{tag}]"),
                value: us,
                unit: "us",
                ceiling: ceil_us,
                ratio: us / ceil_us,
                target: "<= 1.3x".into(),
                met: us / ceil_us <= 1.3,
                note: format!("{:.0} GB/s effective", bytes / us / 1e3),
            });
        }
        dev.set_remap_kernel(remap_default);
    }

    // ---- swap-in gather of random 656 B rows ----------------------------------------------
    let (row, bs) = (656u32, 64u32);
    let page = u64::from(row * bs);
    let host_blocks = 16384u32; // 687 MB of host rows
    let mut host = dev.alloc_pinned((page * u64::from(host_blocks)) as usize)?;
    {
        let mut fill = vec![0u8; host.byte_len() as usize];
        for (i, b) in fill.iter_mut().enumerate() {
            *b = (i as u64).wrapping_mul(0x9E37_79B9) as u8;
        }
        dev.write_pinned(&mut host, 0, &fill)?;
    }
    let gather_cases = [(2048u32, 1u32), (32768, 1), (2048, 4)];
    for (rows_n, layers_n) in gather_cases.into_iter().filter(|_| run("gather")) {
        let k = 2048u32;
        let t = rows_n / k;
        let dev_blocks = rows_n / bs;
        let dev_bytes = page * u64::from(dev_blocks);
        let mut pool = dev.alloc((dev_bytes * u64::from(layers_n)) as usize)?;
        // Each layer reads its own share of the host pool.
        let per_layer = host_blocks / layers_n;
        let layers: Vec<LayerPair> = (0..layers_n)
            .map(|l| LayerPair {
                host: PageLayout::contiguous(
                    u64::from(l * per_layer) * page,
                    page,
                    per_layer,
                    bs,
                    row,
                ),
                device: PageLayout::contiguous(u64::from(l) * dev_bytes, page, dev_blocks, bs, row),
            })
            .collect();
        let plans = if rows_n * layers_n <= 8192 { 64 } else { 8 };
        let host_rows = u64::from(per_layer * bs);
        let mut plan_bufs = Vec::new();
        for _ in 0..plans {
            let src: Vec<i32> = (0..rows_n).map(|_| rng.below(host_rows) as i32).collect();
            let dst: Vec<i32> = (0..rows_n as i32).collect();
            plan_bufs.push((upload_i32(&dev, &src)?, upload_i32(&dev, &dst)?));
        }
        let counts = upload_i32(&dev, &vec![k as i32; t as usize])?;
        let desc = GatherDesc {
            num_tokens: t,
            top_k: k,
            layers: &layers,
        };
        let mut first: Option<Vec<u8>> = None;
        for variant in GatherKernel::ALL {
            dev.set_gather_kernel(variant);
            let tag = format!(
                "{}{}",
                variant.name(),
                if variant == gather_default { "*" } else { "" }
            );
            // Correctness against the first variant: plan 0 into a cleared pool.
            let pool_len = pool.byte_len() as usize;
            let zero = dev.alloc(pool_len)?;
            dev.copy_on_device(&s, &zero, 0, &mut pool, 0, pool_len)?;
            {
                let (src, dst) = &plan_bufs[0];
                dev.gather_rows(
                    &s,
                    &desc,
                    GatherArgs {
                        plan_src: src,
                        plan_dst: dst,
                        plan_counts: &counts,
                        host: &host,
                        device: &mut pool,
                    },
                )?;
            }
            let mut got = vec![0u8; pool.byte_len() as usize];
            dev.download(&pool, 0, &mut got)?;
            match &first {
                None => first = Some(got),
                Some(want) if *want != got => {
                    return Err(
                        format!("gather {tag} result differs from the first variant's").into(),
                    );
                }
                Some(_) => {}
            }
            let iters = if quick {
                16
            } else if rows_n == 2048 {
                640
            } else {
                80
            };
            let ms = time_ms(&dev, &s, plans, iters, |i| {
                let (src, dst) = &plan_bufs[i % plans];
                Ok(dev.gather_rows(
                    &s,
                    &desc,
                    GatherArgs {
                        plan_src: src,
                        plan_dst: dst,
                        plan_counts: &counts,
                        host: &host,
                        device: &mut pool,
                    },
                )?)
            })?;
            let gbs = f64::from(rows_n * layers_n) * f64::from(row) / ms / 1e6;
            let what = if layers_n == 1 {
                String::new()
            } else {
                format!(" x {layers_n} layers (one launch)")
            };
            rows.push(Row {
                name: format!("swap-in gather {rows_n} x 656 B rows{what} [{tag}]"),
                value: gbs,
                unit: "GB/s",
                ceiling: h2d,
                ratio: gbs / h2d,
                target: ">= 0.8x".into(),
                met: gbs / h2d >= 0.8,
                note: format!("{:.1} us per call", ms * 1e3),
            });
            if variant != GatherKernel::V1 && dev.set_programmatic_launch(true) {
                let ms = time_ms(&dev, &s, plans, iters, |i| {
                    let (src, dst) = &plan_bufs[i % plans];
                    Ok(dev.gather_rows(
                        &s,
                        &desc,
                        GatherArgs {
                            plan_src: src,
                            plan_dst: dst,
                            plan_counts: &counts,
                            host: &host,
                            device: &mut pool,
                        },
                    )?)
                });
                dev.set_programmatic_launch(false);
                let ms = match ms {
                    Ok(ms) => ms,
                    Err(e) => {
                        println!("gather {tag} with PDL FAILED: {e}");
                        continue;
                    }
                };
                let gbs = f64::from(rows_n * layers_n) * f64::from(row) / ms / 1e6;
                rows.push(Row {
                    name: format!("swap-in gather {rows_n} x 656 B rows{what} PDL [{tag}]"),
                    value: gbs,
                    unit: "GB/s",
                    ceiling: h2d,
                    ratio: gbs / h2d,
                    target: ">= 0.8x".into(),
                    met: gbs / h2d >= 0.8,
                    note: format!("{:.1} us per call", ms * 1e3),
                });
            }
        }
        dev.set_gather_kernel(gather_default);
    }

    dev.set_programmatic_launch(pdl_default);

    // ---- resolver 64 x 2048, 4096 hot slots, ~10% misses ------------------------------------
    if run("resolve") {
        let (r, k, n, bs) = (64u32, 2048u32, 4096u32, 64u32);
        let ctx_tokens = 65536u32;
        let max_pages = ctx_tokens / bs;
        let steps = if quick { 20 } else { 200 };
        let resident = upload_i32(&dev, &vec![0; (r * max_pages) as usize])?;
        let host_table: Vec<i32> = (0..r * max_pages).map(|i| i as i32).collect();
        let host_table = upload_i32(&dev, &host_table)?;
        let hot_w = n.div_ceil(bs);
        let hot: Vec<i32> = (0..r * hot_w).map(|i| i as i32).collect();
        let hot = upload_i32(&dev, &hot)?;
        let req = upload_i32(&dev, &(0..r as i32).collect::<Vec<_>>())?;
        // A random walk of top-k sets: each step replaces ~10% of each request's entries.
        let mut sets: Vec<Vec<i32>> = (0..r)
            .map(|_| {
                let mut v: Vec<i32> = Vec::with_capacity(k as usize);
                let mut seen = std::collections::HashSet::new();
                while v.len() < k as usize {
                    let x = rng.below(u64::from(ctx_tokens)) as i32;
                    if seen.insert(x) {
                        v.push(x);
                    }
                }
                v
            })
            .collect();
        let mut topks = Vec::new();
        for _ in 0..steps {
            let flat: Vec<i32> = sets.iter().flatten().copied().collect();
            topks.push(upload_i32(&dev, &flat)?);
            for set in sets.iter_mut() {
                let seen: std::collections::HashSet<i32> = set.iter().copied().collect();
                let mut fresh = std::collections::HashSet::new();
                for _ in 0..k / 10 {
                    let at = rng.below(u64::from(k)) as usize;
                    loop {
                        let x = rng.below(u64::from(ctx_tokens)) as i32;
                        if !seen.contains(&x) && fresh.insert(x) {
                            set[at] = x;
                            break;
                        }
                    }
                }
            }
        }
        let mut dgi = upload_i32(&dev, &vec![-1; (r * n) as usize])?;
        let lru_init: Vec<u8> = (0..r)
            .flat_map(|_| (0..n as u16).flat_map(|x| x.to_ne_bytes()))
            .collect();
        let mut lru = dev.alloc(lru_init.len())?;
        dev.upload(&mut lru, 0, &lru_init)?;
        let tk = (r * k) as usize * 4;
        let mut indices = dev.alloc(tk)?;
        let mut valid = dev.alloc(r as usize * 4)?;
        let mut hits = dev.alloc(r as usize * 4)?;
        let mut misses = dev.alloc(r as usize * 4)?;
        let mut msrc = dev.alloc(tk)?;
        let mut mdst = dev.alloc(tk)?;
        let desc = ResolveDesc {
            num_tokens: r,
            top_k: k,
            num_requests: r,
            max_pages,
            block_size: bs,
            hot_slots: n,
            attention_block_stride: bs,
            host_num_blocks: r * max_pages,
        };
        let mut call = |i: usize| -> Res<()> {
            Ok(dev.resolve(
                &s,
                &desc,
                ResolveArgs {
                    req_id: &req,
                    topk: &topks[i],
                    resident_table: &resident,
                    host_table: &host_table,
                    hot_table: &hot,
                    dgi: &mut dgi,
                    lru: &mut lru,
                    indices: &mut indices,
                    valid_counts: &mut valid,
                    hit_counts: &mut hits,
                    miss_counts: &mut misses,
                    miss_src: &mut msrc,
                    miss_dst: &mut mdst,
                },
            )?)
        };
        // Step 0 fills the hot buffers (all misses), untimed; steps 1.. are timed.
        call(0)?;
        dev.synchronize(&s)?;
        let a = dev.timing_event(&s)?;
        for i in 1..steps {
            call(i)?;
        }
        let b = dev.timing_event(&s)?;
        let us = f64::from(dev.elapsed_ms(&a, &b)?) * 1e3 / (steps - 1) as f64;
        let h = download_i32(&dev, &hits, r as usize)?;
        let m = download_i32(&dev, &misses, r as usize)?;
        let (hs, msum): (i64, i64) = (
            h.iter().map(|&x| i64::from(x)).sum(),
            m.iter().map(|&x| i64::from(x)).sum(),
        );
        let miss_pct = 100.0 * msum as f64 / (hs + msum).max(1) as f64;
        rows.push(Row {
            name: "resolve 64 req x 2048, 4096 slots (stream)".into(),
            value: us,
            unit: "us",
            ceiling: 10.0,
            ratio: us / 10.0,
            target: "<= 10 us".into(),
            met: us <= 10.0,
            note: format!("{miss_pct:.1}% misses in the last step"),
        });

        // The same walk as one CUDA graph of steps 1.. (no launch gaps), from fresh state.
        dev.upload(&mut dgi, 0, &bytes_i32(&vec![-1; (r * n) as usize]))?;
        dev.upload(&mut lru, 0, &lru_init)?;
        let mut call2 = |i: usize| -> Res<()> {
            Ok(dev.resolve(
                &s,
                &desc,
                ResolveArgs {
                    req_id: &req,
                    topk: &topks[i],
                    resident_table: &resident,
                    host_table: &host_table,
                    hot_table: &hot,
                    dgi: &mut dgi,
                    lru: &mut lru,
                    indices: &mut indices,
                    valid_counts: &mut valid,
                    hit_counts: &mut hits,
                    miss_counts: &mut misses,
                    miss_src: &mut msrc,
                    miss_dst: &mut mdst,
                },
            )?)
        };
        call2(0)?;
        dev.synchronize(&s)?;
        let graph = dev.capture(&s, |_| {
            for i in 1..steps {
                call2(i)
                    .map_err(|e| hisparse_backend_cuda::CudaError::Unsupported(e.to_string()))?;
            }
            Ok(())
        })?;
        let a = dev.timing_event(&s)?;
        dev.launch_graph(&graph, &s)?;
        let b = dev.timing_event(&s)?;
        let gus = f64::from(dev.elapsed_ms(&a, &b)?) * 1e3 / (steps - 1) as f64;
        rows.push(Row {
            name: "resolve 64 req x 2048, 4096 slots (graph)".into(),
            value: gus,
            unit: "us",
            ceiling: 10.0,
            ratio: gus / 10.0,
            target: "<= 10 us".into(),
            met: gus <= 10.0,
            note: "same walk, one graph of all steps".into(),
        });
    }

    // ---- multi-layer page backup and restore ----------------------------------------------
    if run("backup") {
        let layers_n = 61u32;
        let pages = 64u32;
        let dev_blocks = 128u32;
        let host_blocks = 128u32;
        let dstride = page * u64::from(layers_n);
        let layers: Vec<LayerPair> = (0..layers_n)
            .map(|l| LayerPair {
                host: PageLayout::contiguous(
                    u64::from(l) * page * u64::from(host_blocks),
                    page,
                    host_blocks,
                    bs,
                    row,
                ),
                device: PageLayout::contiguous(u64::from(l) * page, dstride, dev_blocks, bs, row),
            })
            .collect();
        let mut hostp = dev.alloc_pinned((page * u64::from(layers_n * host_blocks)) as usize)?;
        let mut pool = dev.alloc((dstride * u64::from(dev_blocks)) as usize)?;
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
        let bytes = f64::from(layers_n * pages) * page as f64;
        for (dir, ceil, label) in [
            (
                Direction::DeviceToHost,
                d2h,
                "page backup 61 layers x 64 pages (D2H)",
            ),
            (
                Direction::HostToDevice,
                h2d,
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
            let iters = if quick { 3 } else { 10 };
            let ms = time_ms(&dev, &s, 2, iters, |_| {
                Ok(dev.copy_pages(&s, &desc, pl, &mut hostp, &mut pool)?)
            })?;
            let gbs = bytes / ms / 1e6;
            rows.push(Row {
                name: label.into(),
                value: gbs,
                unit: "GB/s",
                ceiling: ceil,
                ratio: gbs / ceil,
                target: ">= 0.8x".into(),
                met: gbs / ceil >= 0.8,
                note: format!("{:.0} MB in one launch, {:.0} us", bytes / 1e6, ms * 1e3),
            });
        }
    }

    // ---- table -----------------------------------------------------------------------------
    println!();
    println!(
        "| {:<44} | {:>10} | {:>5} | {:>10} | {:>6} | {:>8} | {:<4} | note",
        "figure", "value", "unit", "ceiling", "ratio", "target", "met"
    );
    println!(
        "|{:-<46}|{:-<12}|{:-<7}|{:-<12}|{:-<8}|{:-<10}|{:-<6}|------",
        "", "", "", "", "", "", ""
    );
    for r in &rows {
        println!(
            "| {:<44} | {:>10.2} | {:>5} | {:>10.2} | {:>6.2} | {:>8} | {:<4} | {}",
            r.name,
            r.value,
            r.unit,
            r.ceiling,
            r.ratio,
            r.target,
            if r.met { "yes" } else { "NO" },
            r.note
        );
    }
    if let Some(path) = json {
        let mut out = String::new();
        let _ = write!(
            out,
            "{{\"device\":\"{}\",\"figures\":[",
            dev.device_name().replace('"', "'")
        );
        for (i, r) in rows.iter().enumerate() {
            let _ = write!(
                out,
                "{}{{\"name\":\"{}\",\"value\":{:.4},\"unit\":\"{}\",\"ceiling\":{:.4},\"ratio\":{:.4},\"target\":\"{}\",\"met\":{},\"note\":\"{}\"}}",
                if i > 0 { "," } else { "" },
                r.name,
                r.value,
                r.unit,
                r.ceiling,
                r.ratio,
                r.target,
                r.met,
                r.note
            );
        }
        out.push_str("]}\n");
        std::fs::write(&path, out)?;
        println!("wrote {path}");
    }
    Ok(())
}
