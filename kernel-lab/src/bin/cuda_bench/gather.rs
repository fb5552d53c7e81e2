//! The swap-in gather of random 656 B rows from a 687 MB pinned pool (2048 and 32768 rows, and
//! 2048 rows × 4 layers in one call), with and without PDL; with `--big-pool-gib N`, the same
//! rows drawn from an N GiB pool beside the 687 MB one (what the host's and the GPU's address
//! translation cost when a decode step's misses spread over a pool of many requests).

use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaHostBuffer, CudaOptions, GatherWalk};
use hisparse_core::Device;
use hisparse_core::ops::{BufferLen, GatherArgs, GatherDesc, LayerPair, PageLayout};
use hisparse_gpu_kernels::plan::gather_in_order;

use hisparse_conformance::SplitMix64;

use crate::{BS, Bench, HOST_BLOCKS, PAGE, ROW, Res, Row, host_pool, upload};

/// The plans of one configuration and where they land.
struct Plans {
    layers: Vec<LayerPair>,
    pool: CudaBuffer,
    /// `(sources, destinations)` per plan: distinct destinations, random sources.
    bufs: Vec<(CudaBuffer, CudaBuffer)>,
    counts: CudaBuffer,
    /// Token rows of each plan (their counts in `counts`).
    tokens: u32,
    /// Entries of each token row (the gather's `top_k`).
    rows: u32,
}

fn plans(b: &Bench, rng: &mut SplitMix64, rows_n: u32, layers_n: u32) -> Res<Plans> {
    plans_over(b, rng, rows_n, layers_n, HOST_BLOCKS)
}

/// [`plans`] over a host pool of `host_blocks` pages.
fn plans_over(
    b: &Bench,
    rng: &mut SplitMix64,
    rows_n: u32,
    layers_n: u32,
    host_blocks: u32,
) -> Res<Plans> {
    let host_rows = u64::from(host_blocks) * u64::from(BS);
    // Device pool: every plan writes distinct rows of a pool of rows_n rows per layer.
    let dev_blocks = rows_n.div_ceil(BS) + 1;
    let dstride = PAGE * u64::from(layers_n);
    // Each layer reads its own part of the host pool (no layer's rows come from another's L2
    // lines).
    let part = host_blocks / layers_n;
    let layers: Vec<LayerPair> = (0..layers_n)
        .map(|l| LayerPair {
            host: PageLayout::contiguous(u64::from(l * part) * PAGE, PAGE, part, BS, ROW),
            device: PageLayout::contiguous(u64::from(l) * PAGE, dstride, dev_blocks, BS, ROW),
        })
        .collect();
    let pool = b.dev.alloc((dstride * u64::from(dev_blocks)) as usize)?;
    // Enough distinct plans that one pass reads far more than L2 holds.
    let n = (((96u64 << 20) / (u64::from(rows_n) * u64::from(ROW))) as usize).clamp(2, 64);
    let mut bufs = Vec::new();
    for _ in 0..n {
        let src: Vec<i32> = (0..rows_n)
            .map(|_| rng.below(host_rows / u64::from(layers_n)) as i32)
            .collect();
        let mut dst: Vec<i32> = (0..rows_n as i32).collect();
        rng.shuffle(&mut dst);
        bufs.push((upload(&b.dev, &src)?, upload(&b.dev, &dst)?));
    }
    Ok(Plans {
        layers,
        pool,
        bufs,
        counts: upload(&b.dev, &[rows_n as i32])?,
        tokens: 1,
        rows: rows_n,
    })
}

/// One gather of plan `i` into the pool, then its bytes (to compare the kernels).
fn run_once(b: &Bench, p: &mut Plans, host: &CudaHostBuffer) -> Res<Vec<u8>> {
    let len = p.pool.byte_len() as usize;
    let zero = b.dev.alloc(len)?;
    b.dev.copy_on_device(&b.s, &zero, 0, &mut p.pool, 0, len)?;
    let (src, dst) = &p.bufs[0];
    b.dev.gather_rows(
        &b.s,
        &GatherDesc {
            num_tokens: p.tokens,
            top_k: p.rows,
            layers: &p.layers,
        },
        GatherArgs {
            plan_src: src,
            plan_dst: dst,
            plan_counts: &p.counts,
            host,
            device: &mut p.pool,
        },
    )?;
    let mut got = vec![0u8; len];
    b.dev.download(&p.pool, 0, &mut got)?;
    Ok(got)
}

/// Microseconds per gather of a graph cycling through every plan.
fn graph_us(b: &mut Bench, p: &mut Plans, host: &CudaHostBuffer) -> Res<f64> {
    let reps = if b.quick { 2 } else { 10 };
    let Plans {
        layers,
        pool,
        bufs,
        counts,
        tokens,
        rows,
    } = p;
    let desc = GatherDesc {
        num_tokens: *tokens,
        top_k: *rows,
        layers,
    };
    b.graph_us(bufs.len(), reps, &mut |d, s| {
        for (src, dst) in bufs.iter() {
            d.gather_rows(
                s,
                &desc,
                GatherArgs {
                    plan_src: src,
                    plan_dst: dst,
                    plan_counts: counts,
                    host,
                    device: pool,
                },
            )?;
        }
        Ok(())
    })
}

pub(crate) fn section(b: &mut Bench) -> Res<()> {
    let host = host_pool(b)?;
    let mut rng = SplitMix64::new(0x6a7e);
    for (rows_n, layers_n) in [(2048u32, 1u32), (32768, 1), (2048, 4)] {
        let mut p = plans(b, &mut rng, rows_n, layers_n)?;
        let mut first: Option<Vec<u8>> = None;
        for pdl in [false, true] {
            if pdl && !b.dev.set_programmatic_launch(true) {
                continue;
            }
            let measured = (|| -> Res<f64> {
                let got = run_once(b, &mut p, &host)?;
                match &first {
                    None => first = Some(got),
                    Some(want) if *want != got => {
                        return Err("gather with PDL differs from the gather without".into());
                    }
                    Some(_) => {}
                }
                graph_us(b, &mut p, &host)
            })();
            b.dev.set_programmatic_launch(false);
            let us = match measured {
                Ok(us) => us,
                Err(e) if pdl => {
                    // PDL is optional: its failure is reported, the other figures stand.
                    println!("gather with PDL FAILED: {e}");
                    b.failures.push(format!("gather with PDL: {e}"));
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
            let name = format!(
                "gather {rows_n} x 656 B random rows{what}{}",
                if pdl { ", PDL" } else { "" }
            );
            let path = if pdl { "pdl" } else { "-" };
            let row = h2d_row(
                b,
                "gather",
                name,
                path,
                gbs,
                true,
                format!("{us:.1} us per call"),
            );
            b.push(row);
        }
    }
    Ok(())
}

/// The 2048-row gather as `hisparse bench` measures it: stream calls (no graph), a new plan of
/// sources every call (rotating over half of a 2^20-row pool), one destination list.
pub(crate) fn cli_gather(b: &mut Bench) -> Res<()> {
    let host = host_pool(b)?;
    let mut rng = SplitMix64::new(3);
    let rows_n = 2048u32;
    let mut p = plans(b, &mut rng, rows_n, 1)?;
    let iters = if b.quick { 10 } else { 100 };
    let Plans {
        layers,
        pool,
        bufs,
        counts,
        ..
    } = &mut p;
    let desc = GatherDesc {
        num_tokens: 1,
        top_k: rows_n,
        layers,
    };
    let n = bufs.len();
    let ms = b.stream_ms(4, iters, &mut |d, s, i| {
        let (src, dst) = &bufs[i % n];
        d.gather_rows(
            s,
            &desc,
            GatherArgs {
                plan_src: src,
                plan_dst: dst,
                plan_counts: counts,
                host: &host,
                device: pool,
            },
        )
    })?;
    let gbs = f64::from(rows_n) * f64::from(ROW) / ms / 1e6;
    let name = "gather 2048 x 656 B random rows, stream calls (as hisparse bench)".into();
    let row = h2d_row(
        b,
        "cli",
        name,
        "-",
        gbs,
        false,
        format!("{:.1} us per call", ms * 1e3),
    );
    b.push(row);
    Ok(())
}

/// Gathers of 2048 and 3,500 random rows (a decode step's misses per layer at 64 requests)
/// from the 687 MB pool and from one of `gib` GiB, one after the other in the same run, each
/// with the walk the production rule picks for its pool (`plan::gather_in_order`); then
/// [`decode_misses`] over the same big pool.
pub(crate) fn pool_size_section(b: &mut Bench, gib: u64) -> Res<()> {
    let small = host_pool(b)?;
    // Not filled: the bytes are not compared, only the time to bring them in.
    let big = b.dev.alloc_pinned((gib << 30) as usize)?;
    let big_blocks = u32::try_from(big.byte_len() / PAGE).map_err(|_| "pool too large")?;
    let mut rng = SplitMix64::new(0xb16);
    for rows_n in [2048u32, 3500] {
        for (host, blocks, what) in [
            (&small, HOST_BLOCKS, "687 MB".to_string()),
            (&big, big_blocks, format!("{gib} GiB")),
        ] {
            let mut p = plans_over(b, &mut rng, rows_n, 1, blocks)?;
            let us = graph_us(b, &mut p, host)?;
            let gbs = f64::from(rows_n) * f64::from(ROW) / us / 1e3;
            let name = format!("gather {rows_n} x 656 B random rows of a {what} pool");
            let walk = if gather_in_order(&p.layers, GatherWalk::Auto) {
                "in order"
            } else {
                "all rows"
            };
            let row = h2d_row(
                b,
                "gather",
                name,
                walk,
                gbs,
                false,
                format!("{us:.1} us per call"),
            );
            b.push(row);
        }
    }
    decode_misses(b, &big, gib)
}

/// A gather's rate beside the bulk H2D ceiling of the same run; `judged`: held to the
/// `>= 0.8x` target.
fn h2d_row(
    b: &Bench,
    section: &'static str,
    name: String,
    path: &str,
    gbs: f64,
    judged: bool,
    note: String,
) -> Row {
    Row {
        section,
        name,
        path: path.into(),
        value: gbs,
        unit: "GB/s",
        ceiling: b.h2d,
        ceiling_name: "bulk H2D",
        target: if judged { ">= 0.8x" } else { "-" }.into(),
        met: judged.then(|| gbs / b.h2d >= 0.8),
        note,
        sm_mhz: 0.0,
    }
}

/// Missed rows per request and layer in [`decode_misses`]: a tenth of top-k 2048, what a
/// decode step at 90% step-to-step overlap misses.
const DECODE_MISSES: u32 = 205;
/// Rows of one request's host window in [`decode_misses`]: one layer of a 32K context,
/// its pages side by side (21 MiB).
const DECODE_WINDOW_ROWS: u32 = 32768;

/// A decode step's swap-in gather of one layer from `big` (a pool of `gib` GiB), as the decode
/// step meets it: 17 and 66 token rows of [`DECODE_MISSES`] missed rows each, every request's
/// rows inside its own [`DECODE_WINDOW_ROWS`]-row window (its layer array, pages side by side) at
/// a random place of the pool; each with both walks of the gather (every row at once, rows in
/// order: `plan::GatherWalk`), whose copies must be identical.
fn decode_misses(b: &mut Bench, big: &CudaHostBuffer, gib: u64) -> Res<()> {
    let blocks = u32::try_from(big.byte_len() / PAGE).map_err(|_| "pool too large")?;
    let window_blocks = DECODE_WINDOW_ROWS / BS;
    if blocks < window_blocks * 2 {
        return Err(format!("a {gib} GiB pool holds fewer than two request windows").into());
    }
    let mut rng = SplitMix64::new(0xdec0de);
    let walks = [
        ("every row at once", GatherWalk::AllRows),
        ("rows in order", GatherWalk::InOrder),
    ];
    let mut devs = Vec::new();
    for (_, walk) in walks {
        let d = CudaDevice::open_with(
            0,
            CudaOptions {
                gather_walk: walk,
                ..CudaOptions::default()
            },
        )?;
        d.prepare()?;
        devs.push(d);
    }
    for requests in [17u32, 66] {
        let top_k = 2048u32;
        let rows_n = requests * DECODE_MISSES;
        let dev_blocks = rows_n.div_ceil(BS) + 1;
        // Enough plans that one pass reads far more than L2 holds.
        let n = (((96u64 << 20) / (u64::from(rows_n) * u64::from(ROW))) as usize).clamp(2, 64);
        let mut bufs = Vec::new();
        for _ in 0..n {
            let mut src = vec![-1i32; (requests * top_k) as usize];
            let mut dst = vec![-1i32; (requests * top_k) as usize];
            let mut slots: Vec<i32> = (0..rows_n as i32).collect();
            rng.shuffle(&mut slots);
            for r in 0..requests {
                let first = rng.below(u64::from(blocks - window_blocks)) * u64::from(BS);
                for m in 0..DECODE_MISSES {
                    let at = (r * top_k + m) as usize;
                    src[at] = (first + rng.below(u64::from(DECODE_WINDOW_ROWS))) as i32;
                    dst[at] = slots[(r * DECODE_MISSES + m) as usize];
                }
            }
            bufs.push((upload(&b.dev, &src)?, upload(&b.dev, &dst)?));
        }
        let mut p = Plans {
            layers: vec![LayerPair {
                host: PageLayout::contiguous(0, PAGE, blocks, BS, ROW),
                device: PageLayout::contiguous(0, PAGE, dev_blocks, BS, ROW),
            }],
            pool: b.dev.alloc((PAGE * u64::from(dev_blocks)) as usize)?,
            bufs,
            counts: upload(&b.dev, &vec![DECODE_MISSES as i32; requests as usize])?,
            tokens: requests,
            rows: top_k,
        };
        let mut copies: Vec<Vec<u8>> = Vec::new();
        for ((what, _), dev) in walks.iter().zip(devs.iter_mut()) {
            // The timed device is the one whose options force this walk.
            std::mem::swap(&mut b.dev, dev);
            let measured =
                run_once(b, &mut p, big).and_then(|got| Ok((graph_us(b, &mut p, big)?, got)));
            std::mem::swap(&mut b.dev, dev);
            let (us, got) = measured?;
            copies.push(got);
            let gbs = f64::from(rows_n) * f64::from(ROW) / us / 1e3;
            let name = format!(
                "gather {requests} requests x {DECODE_MISSES} rows, each in its own 21 MiB window \
                 of a {gib} GiB pool, {what}"
            );
            let row = h2d_row(
                b,
                "gather",
                name,
                "-",
                gbs,
                false,
                format!("{us:.1} us per call"),
            );
            b.push(row);
        }
        if copies.windows(2).any(|w| w[0] != w[1]) {
            return Err(
                format!("{requests} requests: the two walks copied different bytes").into(),
            );
        }
    }
    Ok(())
}
