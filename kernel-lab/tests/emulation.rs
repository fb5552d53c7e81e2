//! The kernel lab's resolver experiments executed on the CPU by the kernels' emulation (`gpu-kernels/emu`:
//! every GPU thread a fiber, the blocks of a cluster one schedule, block and cluster barriers
//! checked, the order between barriers drawn at random) and compared bit for bit with the core's
//! reference:
//!
//! * the resolver experiments (`kernels/resolve_cluster.cu`, every variant of
//!   `resolve_cluster::VARIANTS`) over walks of three steps: each variant at its own block size
//!   and at 32 or 64 threads a block, decode shapes up to its one pass, padding rows, `-1` and
//!   out-of-range entries, resident pages, host rows beyond the pool, duplicate entries,
//!   shuffled and corrupt LRU rows, rows cached in several slots; requests with several rows
//!   and top-k buffers at odd offsets, which the kernel hands to the production general body
//!   (its workspace counters checked back to zero);
//!
//! Needs a C++20 compiler (as the production emulation): without one the check prints
//! `SKIPPED` and succeeds, unless `HISPARSE_REQUIRE_CXX=1`. `HISPARSE_EMU_CASES=n` runs `n`
//! seeds instead of 4.

use std::ffi::c_void;
use std::path::PathBuf;

use hisparse_conformance::SplitMix64;
use hisparse_conformance::check::{Check, EmulationBuildError, REQUIRE_CXX_ENV, build_emulation};
use hisparse_core::ops::resolve::resolve;
use hisparse_core::ops::{ResolveDesc, ResolveSlices};
use hisparse_gpu_kernels as gk;
use hisparse_kernel_lab::resolve_cluster;

type LaunchFn = unsafe extern "C" fn(u32, u32, u32, u32, *mut *mut c_void) -> i32;
type SharedFn = unsafe extern "C" fn(u32, u32, u32) -> u32;

struct Emu {
    _lib: libloading::Library,
    launch: LaunchFn,
    shared: SharedFn,
}

const WRAPPER: &str = r#"
template <u32 C, u32 EK, u32 EN>
static void lab_run(unsigned rows, unsigned threads, unsigned smem, void** a) {
    hs_cpu_run_cluster(rows * C, threads, C, smem, [a] {
        lab_resolve_cluster<C, EK, EN>(
            hs_cpu_ptr{*(void**)a[0]}, hs_cpu_ptr{*(void**)a[1]}, hs_cpu_ptr{*(void**)a[2]},
            hs_cpu_ptr{*(void**)a[3]}, hs_cpu_ptr{*(void**)a[4]}, hs_cpu_ptr{*(void**)a[5]},
            hs_cpu_ptr{*(void**)a[6]}, hs_cpu_ptr{*(void**)a[7]}, hs_cpu_ptr{*(void**)a[8]},
            hs_cpu_ptr{*(void**)a[9]}, hs_cpu_ptr{*(void**)a[10]}, hs_cpu_ptr{*(void**)a[11]},
            hs_cpu_ptr{*(void**)a[12]}, hs_cpu_ptr{*(void**)a[13]}, hs_cpu_ptr{*(void**)a[14]},
            *(u32*)a[15], *(u32*)a[16], *(u32*)a[17], *(u32*)a[18], *(u32*)a[19], *(u32*)a[20],
            *(u32*)a[21], *(u32*)a[22], *(u32*)a[23], *(u32*)a[24], hs_cpu_ptr{*(void**)a[25]},
            hs_cpu_ptr{*(void**)a[26]});
    });
}
extern "C" unsigned lab_cluster_shared(unsigned threads, unsigned per_thread, unsigned per_block) {
    return lab_cluster_shared_bytes(threads, per_thread, per_block);
}
"#;

/// `lab_cluster_launch(v, ...)`: variant `v` of [`resolve_cluster::VARIANTS`] (its cluster size
/// and work per thread as the kernel's template arguments), at any block size.
fn dispatch() -> String {
    let mut s = String::from(
        "extern \"C\" int lab_cluster_launch(unsigned v, unsigned rows, unsigned threads, \
         unsigned smem, void** a) {\n  switch (v) {\n",
    );
    for (i, v) in resolve_cluster::VARIANTS.iter().enumerate() {
        s.push_str(&format!(
            "  case {i}: lab_run<{}, {}, {}>(rows, threads, smem, a); return 0;\n",
            v.cluster, v.entries, v.slots
        ));
    }
    s.push_str("  }\n  return 1;\n}\n");
    s
}

fn build() -> Result<Emu, EmulationBuildError> {
    let src = format!(
        "{}{}{}{}{}",
        include_str!("../../gpu-kernels/emu/vendor_cpu.h"),
        gk::COMMON_SOURCE,
        resolve_cluster::SOURCE,
        include_str!("../../gpu-kernels/emu/driver.cpp"),
        WRAPPER
    ) + &dispatch();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hisparse-lab-emulation");
    let so = build_emulation(&dir, "lab", &src)?;
    let failed = |e: libloading::Error| EmulationBuildError::Failed(e.to_string());
    // SAFETY: the library was just built from the kernel source and the emulation driver; its
    // initialisers only construct empty globals.
    let lib = unsafe { libloading::Library::new(&so) }.map_err(failed)?;
    // SAFETY: both symbols are defined by WRAPPER with exactly these signatures.
    let (launch, shared) = unsafe {
        (
            lib.get::<LaunchFn>(b"lab_cluster_launch")
                .map(|f| *f)
                .map_err(failed)?,
            lib.get::<SharedFn>(b"lab_cluster_shared")
                .map(|f| *f)
                .map_err(failed)?,
        )
    };
    Ok(Emu {
        _lib: lib,
        launch,
        shared,
    })
}

/// Everything one resolve reads and writes, as host vectors (the emulated device's memory).
#[derive(Clone, PartialEq, Debug)]
struct Outputs {
    slot_host_rows: Vec<i32>,
    lru: Vec<u16>,
    indices: Vec<i32>,
    valid: Vec<i32>,
    hits: Vec<i32>,
    misses: Vec<i32>,
    src: Vec<i32>,
    dst: Vec<i32>,
    stats: Vec<i32>,
}

/// A random decode-shaped sequence of three resolves, each compared with the reference; returns
/// the launches run and the rows handed to the general body.
fn check_walk(emu: &Emu, rng: &mut SplitMix64) -> Result<(u32, u32), String> {
    let vi = rng.below(resolve_cluster::VARIANTS.len() as u64) as usize;
    let full = resolve_cluster::VARIANTS[vi];
    // The variant at its own block size now and then; mostly at 32 or 64 threads a block (the
    // same code: each thread's share is fixed, the block size a launch parameter), so the
    // emulation stays quick.
    let v = if rng.percent(15) {
        full
    } else {
        resolve_cluster::Variant {
            threads: 32 * rng.range_inclusive(1, 2) as u32,
            ..full
        }
    };
    let (cluster, threads) = (v.cluster, v.threads);
    let all = threads * cluster;
    let k = 2 * rng.range_inclusive(1, i64::from(all * v.entries / 2)) as u32;
    let n = 4 * rng.range_inclusive(i64::from(k.div_ceil(4)), i64::from(all * v.slots / 4)) as u32;
    let bs = [1u32, 2, 3, 4, 8, 16][rng.below(6) as usize];
    let r = rng.range_inclusive(1, 4) as u32;
    let pages = (k * 2).div_ceil(bs).max(1) + rng.below(4) as u32;
    let host_blocks = rng.range_inclusive(1, i64::from(pages) + 4) as u32;
    let stride = bs + rng.below(3) as u32;
    let desc = ResolveDesc {
        num_tokens: 0,
        top_k: k,
        num_requests: r,
        max_pages: pages,
        block_size: bs,
        hot_slots: n,
        attention_block_stride: stride,
        host_num_blocks: host_blocks,
        num_state_rows: None,
        stats_slot: 0,
    };
    let resident: Vec<i32> = (0..r * pages)
        .map(|_| {
            if rng.percent(10) {
                rng.range_inclusive(1, 50) as i32
            } else {
                0
            }
        })
        .collect();
    let host: Vec<i32> = (0..r * pages)
        .map(|_| {
            if rng.percent(5) {
                -1
            } else {
                rng.range_inclusive(0, i64::from(host_blocks) + 2) as i32
            }
        })
        .collect();
    let w = desc.hot_table_width();
    let hot: Vec<i32> = (0..r * w)
        .map(|_| {
            if rng.percent(3) {
                -1
            } else {
                rng.range_inclusive(0, 500) as i32
            }
        })
        .collect();
    let mut slot_host_rows: Vec<i32> = vec![-1; (r * n) as usize];
    let mut lru: Vec<u16> = (0..r).flat_map(|_| 0..n as u16).collect();
    // Now and then a state the resolver did not leave: cached rows drawn from a small range (the
    // same row in several slots: the first LRU position caching it takes the hit), over an LRU
    // that is a shuffled permutation, or one with slots repeated or beyond the buffer (corrupt:
    // the row starts over).
    if rng.percent(40) {
        for d in slot_host_rows.iter_mut() {
            *d = rng.range_inclusive(-1, i64::from(host_blocks * bs) + 3) as i32;
        }
        for row in lru.chunks_mut(n as usize) {
            for i in (1..row.len()).rev() {
                row.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        if rng.percent(50) {
            for s in lru.iter_mut() {
                if rng.percent(3) {
                    *s = rng.range_inclusive(0, i64::from(n) + 2) as u16;
                }
            }
        }
    }
    let with_stats = rng.percent(50);
    let mut want = Outputs {
        slot_host_rows: slot_host_rows.clone(),
        lru: lru.clone(),
        indices: Vec::new(),
        valid: Vec::new(),
        hits: Vec::new(),
        misses: Vec::new(),
        src: Vec::new(),
        dst: Vec::new(),
        stats: vec![0; 4],
    };
    let mut got = want.clone();
    // The previous step's top-k of each request: most of a step's entries repeat it (hits).
    let mut previous: Vec<Vec<i32>> = vec![Vec::new(); r as usize];
    let mut launches = 0;
    let mut handed = 0;
    for step in 0..3 {
        // Each request at most once (the cluster path's shape), padding rows among them; now and
        // then a request twice, or a top-k at an odd offset (both handed to the general body).
        let twice = rng.percent(10);
        let misaligned = rng.percent(8);
        let mut order: Vec<i32> = (0..r as i32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut req: Vec<i32> = order
            .into_iter()
            .take(rng.range_inclusive(1, i64::from(r)) as usize)
            .collect();
        for _ in 0..rng.below(3) {
            let at = rng.below(req.len() as u64 + 1) as usize;
            req.insert(at, if rng.percent(50) { -1 } else { r as i32 + 1 });
        }
        if twice {
            let again = req.iter().copied().find(|&x| x >= 0 && x < r as i32);
            if let Some(x) = again {
                req.push(x);
            }
        }
        let t = req.len() as u32;
        let mut topk = Vec::with_capacity((t * k) as usize + 1);
        for &q in &req {
            let prev = (q >= 0 && (q as u32) < r).then(|| previous[q as usize].clone());
            let row: Vec<i32> = (0..k as usize)
                .map(|j| match &prev {
                    Some(p) if j < p.len() && rng.percent(85) => p[j],
                    _ if rng.percent(3) => -1,
                    _ if rng.percent(2) => (pages * bs + 1) as i32,
                    _ => rng.range_inclusive(0, i64::from(pages * bs) - 1) as i32,
                })
                .collect();
            if q >= 0 && (q as u32) < r {
                previous[q as usize] = row.clone();
            }
            topk.extend(row);
        }
        // A duplicate entry now and then.
        if k >= 4 && rng.percent(30) {
            let (a, b) = (rng.below(u64::from(t * k)), rng.below(u64::from(t * k)));
            topk[b as usize] = topk[a as usize];
        }
        let d = ResolveDesc {
            num_tokens: t,
            ..desc
        };
        let tk = (t * k) as usize;
        let fresh = |o: &mut Outputs| {
            o.indices = vec![7; tk];
            o.src = vec![7; tk];
            o.dst = vec![7; tk];
            o.valid = vec![7; t as usize];
            o.hits = vec![7; t as usize];
            o.misses = vec![7; t as usize];
        };
        fresh(&mut want);
        fresh(&mut got);
        let mut ws = want.stats.clone();
        resolve(
            &d,
            ResolveSlices {
                req_id: &req,
                topk: &topk,
                resident_table: &resident,
                host_table: &host,
                hot_table: &hot,
                slot_host_rows: &mut want.slot_host_rows,
                lru: &mut want.lru,
                indices: &mut want.indices,
                valid_counts: &mut want.valid,
                hit_counts: &mut want.hits,
                miss_counts: &mut want.misses,
                miss_src: &mut want.src,
                miss_dst: &mut want.dst,
                idx_mapping: None,
                stats: with_stats.then_some(&mut ws[..]),
            },
        )
        .map_err(|e| e.to_string())?;
        want.stats = ws;
        let table = v.table_entries(k);
        let smem = v.shared_bytes(k);
        // SAFETY: a function of the library built from WRAPPER, pure.
        let emu_smem = unsafe { (emu.shared)(threads, v.slots, table / cluster) };
        if emu_smem != smem {
            return Err(format!(
                "the host sizes the shared memory at {smem} bytes, the kernel lays out {emu_smem}"
            ));
        }
        if !v.eligible(&d) {
            return Err(format!("a drawn launch is not the kernel's shape: {d:?}"));
        }
        let mut stats = got.stats.clone();
        // The fallback's workspace (garbage: the body initialises what it reads) and counters
        // (zero, as every launch must leave them), and the fallback count.
        let entries = resolve_cluster::workspace_entries(&d);
        let mut workspace = vec![0xA5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5u128; entries as usize];
        let mut counter = [0u32; 4];
        let mut fallbacks = 0u32;
        // A top-k one entry into its buffer: 4-byte aligned, not 8 (the kernel must not use
        // its 8-byte loads on it).
        let shifted: Vec<i32> = std::iter::once(0).chain(topk.iter().copied()).collect();
        let topk_at = if misaligned && !(shifted.as_ptr() as u64 + 4).is_multiple_of(8) {
            shifted.as_ptr() as u64 + 4
        } else {
            topk.as_ptr() as u64
        };
        let mut ptrs: Vec<u64> = vec![
            req.as_ptr() as u64,
            topk_at,
            resident.as_ptr() as u64,
            host.as_ptr() as u64,
            hot.as_ptr() as u64,
            got.slot_host_rows.as_mut_ptr() as u64,
            got.lru.as_mut_ptr() as u64,
            got.indices.as_mut_ptr() as u64,
            got.valid.as_mut_ptr() as u64,
            got.hits.as_mut_ptr() as u64,
            got.misses.as_mut_ptr() as u64,
            got.src.as_mut_ptr() as u64,
            got.dst.as_mut_ptr() as u64,
            workspace.as_mut_ptr() as u64,
            counter.as_mut_ptr() as u64,
        ];
        let mut entries32 = entries as u32;
        let mut words = [table, t, k, r, pages, bs, n, stride, host_blocks];
        ptrs.push(if with_stats {
            stats.as_mut_ptr() as u64
        } else {
            0
        });
        ptrs.push(&raw mut fallbacks as u64);
        let mut params: Vec<*mut c_void> = Vec::new();
        for p in ptrs.iter_mut().take(15) {
            params.push((p as *mut u64).cast());
        }
        params.push((&raw mut entries32).cast());
        for w in words.iter_mut() {
            params.push((w as *mut u32).cast());
        }
        for p in ptrs.iter_mut().skip(15) {
            params.push((p as *mut u64).cast());
        }
        // SAFETY: `params` holds one pointer per parameter of lab_resolve_cluster in its order,
        // each to a value of its type; every buffer is a host vector of the size the reference
        // resolve of `d` checked (the workspace: workspace_entries of `d`), alive for the call
        // (the emulation is synchronous).
        let rc = unsafe { (emu.launch)(vi as u32, t, threads, smem, params.as_mut_ptr()) };
        if rc != 0 {
            return Err("the emulated launch failed".into());
        }
        got.stats = stats;
        launches += 1;
        handed += fallbacks;
        let ctx = format!(
            "{} at {threads} threads a block, step {step}, {t} rows {req:?}, top-k {k}, {n} slots, block size {bs}{}",
            v.symbol,
            if topk_at != topk.as_ptr() as u64 {
                ", top-k at an odd offset"
            } else {
                ""
            }
        );
        if counter[0] != 0 || counter[1] != 0 {
            return Err(format!(
                "{ctx}: the workspace counters were left at {counter:?}"
            ));
        }
        if got != want {
            let diff = |name: &str, a: &[i32], b: &[i32]| {
                a.iter()
                    .zip(b)
                    .position(|(x, y)| x != y)
                    .map(|i| format!("{name}[{i}] = {} (reference {})", a[i], b[i]))
            };
            let first = diff("indices", &got.indices, &want.indices)
                .or_else(|| diff("valid_counts", &got.valid, &want.valid))
                .or_else(|| diff("hit_counts", &got.hits, &want.hits))
                .or_else(|| diff("miss_counts", &got.misses, &want.misses))
                .or_else(|| diff("miss_src", &got.src, &want.src))
                .or_else(|| diff("miss_dst", &got.dst, &want.dst))
                .or_else(|| diff("slot_host_rows", &got.slot_host_rows, &want.slot_host_rows))
                .unwrap_or_else(|| {
                    if got.lru != want.lru {
                        "the LRU rows".into()
                    } else {
                        format!("stats {:?} (reference {:?})", got.stats, want.stats)
                    }
                });
            return Err(format!("{ctx}: {first} differs"));
        }
    }
    Ok((launches, handed))
}

fn main() {
    let check = Check::one("lab_kernels_match_reference_on_cpu");
    let emu = match build() {
        Ok(e) => e,
        Err(e @ EmulationBuildError::NoCompiler) => check.missing(REQUIRE_CXX_ENV, e),
        Err(e) => check.finish(Err(e)),
    };
    let seeds: u64 = std::env::var("HISPARSE_EMU_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut failures = Vec::new();
    let mut launches = 0;
    let mut handed = 0;
    for seed in 0..seeds {
        let mut rng = SplitMix64::new(0xc1a5 ^ seed);
        for walk in 0..6 {
            match check_walk(&emu, &mut rng) {
                Ok((n, h)) => {
                    launches += n;
                    handed += h;
                }
                Err(e) => failures.push(format!("seed {seed} walk {walk}: {e}")),
            }
        }
    }
    // The fallback must have been taken: otherwise nothing here checked it.
    if handed == 0 && failures.is_empty() {
        failures.push("no row was handed to the general body: the fallback went unchecked".into());
    }
    for f in &failures {
        println!("FAILED: {f}");
    }
    check.finish(if failures.is_empty() {
        println!(
            "ok: {launches} emulated resolves of the lab ({handed} rows through the general body) over {seeds} seeds match the reference"
        );
        Ok(())
    } else {
        Err(format!("{} checks differ", failures.len()))
    })
}
