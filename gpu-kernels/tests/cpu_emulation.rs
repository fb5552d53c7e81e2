//! Executes the shared kernel source on the CPU (compiled as C++20 with `emu/vendor_cpu.h`) and
//! compares every kernel bit for bit with the core's reference on
//! random inputs, launched exactly as the backends launch them (the planners of `plan` decide every
//! grid, block, shared memory size, staged list and workspace). The per-kernel launch
//! wrappers are generated from the ABI table, so a table that disagrees with the source fails to
//! compile here.
//!
//! Accesses are alignment-checked (`-fsanitize=alignment`): a kernel access a GPU would fault on
//! aborts the check. Rows include scale parts of 8 and 4 bytes (DeepSeek V4's 584 = 576 + 8 in
//! padded pages, 132 = 128 + 4, 20 = 16 + 4 with odd row counts) for every copy kernel.
//!
//! Needs a C++20 compiler with UBSan (`$CXX`, else `c++`, `g++` or `clang++`). Without one the check prints
//! `SKIPPED` and succeeds, unless `HISPARSE_REQUIRE_CXX=1`. `HISPARSE_EMU_CASES=n` runs `n` random
//! seeds instead of 8 (about a second a seed). The emulation runs on one OS thread: each block's
//! GPU threads are fibers that park at every barrier, a warp runs on once its own lanes met, the
//! order between barriers is drawn per interval (threads forward, backward, shuffled, or warp
//! after warp), and a barrier some threads never reach aborts the check (`emu/driver.cpp`).

use std::ffi::c_void;
use std::path::PathBuf;

use gk::plan::{self, Plan, Target};
use gk::{Kernel, Param};
use hisparse_conformance::SplitMix64;
use hisparse_conformance::check::{Check, EmulationBuildError, REQUIRE_CXX_ENV, build_emulation};
use hisparse_core::ops::copy::{copy_host_pages, copy_pages, copy_rows, gather_rows};
use hisparse_core::ops::indexer_backup::indexer_backup;
use hisparse_core::ops::invalidate::invalidate;
use hisparse_core::ops::remap::{remap, remap_modes};
use hisparse_core::ops::resolve::resolve;
use hisparse_core::ops::slot_mapping::compressed_slot_mapping;
use hisparse_core::ops::table::{reset_hot_state, write_table};
use hisparse_core::ops::{
    BlockPair, DcpSplit, Direction, GatherArgs, GatherDesc, HotResetDesc, IndexerBackupArgs,
    IndexerBackupDesc, InvalidateArgs, InvalidateDesc, LayerPair, PageCopyDesc, PageLayout,
    RemapArgs, RemapDesc, RemapModesArgs, RemapModesDesc, ResolveDesc, ResolveSlices, RowCopyDesc,
    RowSpan, SlotMappingArgs, SlotMappingDesc, TableWrite, TableWriteDesc,
};
use hisparse_gpu_kernels as gk;

type LaunchFn = unsafe extern "C" fn(u32, u32, u32, u32, u32, u32, *mut *mut c_void) -> i32;

struct Emu {
    _lib: libloading::Library,
    launch: LaunchFn,
}

/// The device address of a host vector (the emulated device reads and writes host memory).
fn a<T>(v: &[T]) -> u64 {
    v.as_ptr() as u64
}

/// The device address of a host vector the kernel writes.
fn am<T>(v: &mut [T]) -> u64 {
    v.as_mut_ptr() as u64
}

/// Devices the planners are asked about: a large one (shared memory of an H200), and small ones
/// whose limits push the planners onto their other paths (tiny grids, small shared tables; two
/// resolver blocks per multiprocessor, so a launch of more rows than multiprocessors splits the
/// shared memory and its tables shrink further).
fn target(multiprocessors: u32, shared_per_block: u64) -> Target {
    Target {
        multiprocessors,
        shared_per_block,
        shared_per_multiprocessor: shared_per_block + 1024,
        resolve_blocks_per_multiprocessor: 2,
    }
}

const BIG: Target = Target {
    multiprocessors: 132,
    shared_per_block: 227 * 1024,
    shared_per_multiprocessor: 228 * 1024,
    resolve_blocks_per_multiprocessor: 1,
};

impl Emu {
    /// Executes `plan` as a backend would: stages its lists (16-byte aligned copies), places a
    /// workspace whose counter area is zero and whose rest is garbage (kernels must initialise
    /// what they read), resolves the symbolic pointers and runs the launches in order.
    /// Returns the stream's counter words after the launches: the launches must have left all
    /// but the third zero (the next launch finds them so), the third is the most entries one
    /// launch took.
    fn execute(&self, mut plan: Plan) -> Vec<u32> {
        let staged: Vec<Vec<u128>> = plan
            .staged
            .iter()
            .map(|p| {
                let b = &p.bytes;
                let mut v = vec![0u128; b.len().div_ceil(16).max(1)];
                bytemuck::cast_slice_mut::<u128, u8>(&mut v)[..b.len()].copy_from_slice(b);
                v
            })
            .collect();
        let addrs: Vec<u64> = staged.iter().map(|v| a(v)).collect();
        let mut workspace = vec![
            0xA5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5u128;
            (plan.workspace_bytes as usize).div_ceil(16) + 1
        ];
        let ws = if plan.workspace_bytes > 0 {
            am(&mut workspace)
        } else {
            0
        };
        // The stream's counters: zero before the launches (a stream made just now).
        let mut counters = vec![0u32; (gk::WORKSPACE_COUNTER_BYTES / 4) as usize];
        let ctr = am(&mut counters);
        for l in &mut plan.launches {
            let abi = l.kernel.abi();
            l.args.matches(&abi).unwrap();
            assert!(
                l.block == abi.block_threads
                    || (abi.variable_block && l.block <= abi.block_threads && l.block % 64 == 0),
                "{}: block {}",
                abi.name,
                l.block
            );
            l.args.resolve(&addrs, ws, ctr).unwrap();
            let mut ptrs = l.args.pointers().unwrap();
            let idx = Kernel::ALL
                .iter()
                .position(|x| *x == l.kernel)
                .expect("kernel") as u32;
            // SAFETY: the generated wrapper reads exactly one argument address per parameter with
            // the ABI table's types (checked above), and every pointer argument addresses a live
            // host vector (the test's buffers, the staged copies, the workspace) that the core's
            // `check` (run by the reference first) proved large enough.
            let rc = unsafe {
                (self.launch)(
                    idx,
                    l.grid[0],
                    l.grid[1],
                    l.grid[2],
                    l.block,
                    l.shared,
                    ptrs.as_mut_ptr(),
                )
            };
            assert_eq!(rc, 0);
        }
        drop(staged);
        drop(workspace);
        counters
    }
}

fn wrappers() -> String {
    let mut s = String::from(
        "extern \"C\" int hs_cpu_launch(unsigned k, unsigned gx, unsigned gy, unsigned gz, \
         unsigned bx, unsigned smem, void** a) {\n  switch (k) {\n",
    );
    for (i, k) in Kernel::ALL.iter().enumerate() {
        let abi = k.abi();
        let args: Vec<String> = abi
            .params
            .iter()
            .enumerate()
            .map(|(j, p)| match p.ty {
                Param::Ptr => format!("hs_cpu_ptr{{*(void**)a[{j}]}}"),
                Param::I32 => format!("*(i32*)a[{j}]"),
                Param::U32 => format!("*(u32*)a[{j}]"),
                Param::U64 => format!("*(u64*)a[{j}]"),
                Param::GatherLayers => format!("*(hs_gather_layers*)a[{j}]"),
            })
            .collect();
        s.push_str(&format!(
            "  case {i}: hs_cpu_run(gx, gy, gz, bx, smem, [a] {{ {}({}); }}); return 0;\n",
            abi.name,
            args.join(", ")
        ));
    }
    s.push_str("  }\n  return 1;\n}\n");
    s
}

fn build() -> Result<Emu, EmulationBuildError> {
    let src = format!(
        "{}{}{}{}",
        include_str!("../emu/vendor_cpu.h"),
        gk::COMMON_SOURCE,
        include_str!("../emu/driver.cpp"),
        wrappers()
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hisparse-cpu-emulation");
    let so = build_emulation(&dir, "hisparse_cpu", &src)?;
    let failed = |e: libloading::Error| EmulationBuildError::Failed(e.to_string());
    // SAFETY: the library was just built from the kernel source and the emulation driver; its
    // initialisers only construct empty globals.
    let lib = unsafe { libloading::Library::new(&so) }.map_err(failed)?;
    // SAFETY: `hs_cpu_launch` is defined by the generated wrappers with exactly this signature.
    let launch = unsafe { lib.get::<LaunchFn>(b"hs_cpu_launch") }
        .map(|f| *f)
        .map_err(failed)?;
    Ok(Emu { _lib: lib, launch })
}

/// Remaps drawn per seed and mode.
const REMAPS_PER_SEED: usize = 8;

/// A random remap through `hs_remap`, or with `modes` through `hs_remap_modes`: a
/// decode-context-parallel split (1 to 4 ranks, interleave 1 to 3), a prefill workspace (rows of
/// prefill requests, decode rows, requests beyond the workspace, negative starts, starts near
/// `i32::MAX`), or both.
fn check_remap(emu: &Emu, rng: &mut SplitMix64, modes: bool) -> Result<(), String> {
    // Now and then more rows than a small device holds at once (two vectors per thread).
    let t = if rng.percent(15) {
        rng.range_inclusive(33, 40)
    } else {
        rng.range_inclusive(0, 5)
    } as u32;
    let k = *[1u32, 3, 8, 64, 130, 2048, 2052]
        .get(rng.below(7) as usize)
        .unwrap_or(&8);
    let bs = *[1u32, 4, 5, 16, 64]
        .get(rng.below(5) as usize)
        .unwrap_or(&4);
    let m = if rng.percent(20) {
        4100
    } else {
        rng.range_inclusive(1, 40) as u32
    };
    let rows = rng.range_inclusive(1, 6) as u32;
    let stride = bs + rng.below(3) as u32 * if rng.percent(10) { 1 << 20 } else { 1 };
    let map_len = rng.percent(40).then(|| rng.range_inclusive(1, 8) as u32);
    let desc = RemapDesc {
        num_tokens: t,
        top_k: k,
        table_rows: rows,
        max_blocks: m,
        block_size: bs,
        block_stride_rows: stride,
        idx_mapping_len: map_len,
        write_counts: rng.percent(60),
        compact: rng.percent(40),
        stats_slot: 0,
    };
    let (mut want_stats, stats_slot) = maybe_stats(rng, 50);
    let mut got_stats = want_stats.clone();
    let desc = RemapDesc { stats_slot, ..desc };
    let (dcp, prefill_requests) = if modes {
        let which = rng.below(3);
        let size = rng.range_inclusive(1, 4) as u32;
        let dcp = (which != 1).then(|| DcpSplit {
            size,
            rank: rng.below(u64::from(size)) as u32,
            interleave: rng.range_inclusive(1, 3) as u32,
        });
        (dcp, (which != 0).then(|| rng.range_inclusive(1, 3) as u32))
    } else {
        (None, None)
    };
    let spread = dcp.map_or(1, |d| d.size * d.interleave);
    let req: Vec<i32> = (0..t)
        .map(|_| rng.range_inclusive(-1, rows as i64) as i32)
        .collect();
    let table: Vec<i32> = (0..rows * m)
        .map(|_| {
            if rng.percent(10) {
                -1
            } else {
                rng.range_inclusive(0, 5000) as i32
            }
        })
        .collect();
    let topk: Vec<i32> = (0..t * k)
        .map(|_| {
            if rng.percent(10) {
                -rng.range_inclusive(1, 9) as i32
            } else {
                rng.range_inclusive(0, i64::from(m * bs * spread) + 10) as i32
            }
        })
        .collect();
    let map: Vec<i32> = (0..map_len.unwrap_or(1))
        .map(|_| rng.range_inclusive(-1, rows as i64) as i32)
        .collect();
    let p = prefill_requests.unwrap_or(1);
    let prefill: Vec<i32> = (0..t.max(1))
        .map(|_| match rng.below(4) {
            0 => -1,
            1 => rng.range_inclusive(0, i64::from(p) + 2) as i32,
            _ => rng.below(u64::from(p)) as i32,
        })
        .collect();
    let starts: Vec<i32> = (0..p)
        .map(|_| match rng.below(5) {
            0 => -rng.range_inclusive(1, 3) as i32,
            1 => i32::MAX - rng.range_inclusive(0, 40) as i32,
            _ => rng.range_inclusive(0, 1 << 20) as i32,
        })
        .collect();
    let mdesc = RemapModesDesc {
        remap: desc,
        dcp,
        prefill_requests,
    };
    let mut want = vec![7i32; (t * k) as usize];
    let mut want_c = vec![7i32; t as usize];
    let remap_args = RemapArgs {
        req_id: &req[..],
        block_table: &table[..],
        topk: &topk[..],
        idx_mapping: map_len.map(|_| &map[..]),
        out: &mut want[..],
        counts: desc.write_counts.then_some(&mut want_c[..]),
        stats: want_stats.as_deref_mut(),
    };
    if modes {
        remap_modes(
            &mdesc,
            RemapModesArgs {
                remap: remap_args,
                prefill_req_id: prefill_requests.map(|_| &prefill[..t as usize]),
                workspace_starts: prefill_requests.map(|_| &starts[..]),
            },
        )
    } else {
        remap(&desc, remap_args)
    }
    .map_err(|e| e.to_string())?;
    let mut got = vec![7i32; (t * k) as usize];
    let mut got_c = vec![7i32; t as usize];
    let addrs = plan::RemapAddrs {
        req_id: a(&req),
        block_table: a(&table),
        topk: a(&topk),
        idx_mapping: if map_len.is_some() { a(&map) } else { 0 },
        out: am(&mut got),
        counts: if desc.write_counts { am(&mut got_c) } else { 0 },
        stats: am_opt(&mut got_stats),
    };
    // A small device now and then: fewer blocks than rows, each row's inputs loaded one row
    // ahead.
    let tgt = if rng.percent(50) {
        target(1, 48 * 1024)
    } else {
        BIG
    };
    let planned = if modes {
        let addrs = plan::RemapModesAddrs {
            remap: addrs,
            prefill_req_id: if prefill_requests.is_some() {
                a(&prefill)
            } else {
                0
            },
            workspace_starts: if prefill_requests.is_some() {
                a(&starts)
            } else {
                0
            },
        };
        let p = plan::remap_modes(&tgt, &mdesc, &addrs).map_err(|e| e.to_string())?;
        // (An empty batch without stats launches nothing.)
        if p.launches
            .first()
            .is_some_and(|l| l.kernel != Kernel::RemapModes)
        {
            return Err("a remap with modes must launch hs_remap_modes".into());
        }
        p
    } else {
        plan::remap(&tgt, &desc, &addrs).map_err(|e| e.to_string())?
    };
    emu.execute(planned);
    if got != want || got_c != want_c {
        return Err(format!("remap differs for {mdesc:?} on {tgt:?}"));
    }
    if got_stats != want_stats {
        return Err(format!(
            "remap stats differ for {mdesc:?} on {tgt:?}\n want {want_stats:?}\n  got {got_stats:?}"
        ));
    }
    Ok(())
}

#[allow(clippy::too_many_lines)]
/// How `check_resolve` has the planner launch `hs_resolve`: the shared table capacity the device
/// leaves room for (`None`: a large device), whether the per-request state is forced into the
/// workspace (global-state mode), a fixed `hot_slots` (`None`: random), and the multiprocessors
/// (fewer than rows halves a block's shared memory).
#[derive(Clone, Copy, Debug)]
struct ResolveMode {
    smem_table: Option<u32>,
    global: bool,
    hot_slots: Option<u32>,
    multiprocessors: u32,
}

fn check_resolve(emu: &Emu, rng: &mut SplitMix64, mode: ResolveMode) -> Result<(), String> {
    let smem_table = mode.smem_table;
    // Mostly short rows (one pass of the kernel's block); sometimes rows longer than one pass.
    let k = if rng.percent(10) {
        rng.range_inclusive(2049, 2200) as u32
    } else {
        rng.range_inclusive(1, 40) as u32
    };
    let bs = rng.range_inclusive(1, 8) as u32;
    let r = rng.range_inclusive(1, 3) as u32;
    let n = if let Some(n) = mode.hot_slots {
        n
    } else if rng.percent(15) {
        // At least top_k (the core refuses fewer slots than a row has entries).
        (rng.range_inclusive(2049, 2600) as u32).max(k)
    } else {
        k * rng.range_inclusive(1, 3) as u32
    };
    let pages = rng.range_inclusive(1, 12) as u32;
    let host_blocks = rng.range_inclusive(1, 40) as u32;
    let stride = bs + rng.below(3) as u32;
    // Half the sequences in batch-row order: `r` batch rows (host and hot tables) over `sr`
    // state rows (resident table, slot_host_rows, LRU), a fresh idx_mapping every step.
    let batch_order = rng.percent(50);
    let sr = if batch_order {
        r + rng.range_inclusive(0, 3) as u32
    } else {
        r
    };
    let desc = ResolveDesc {
        num_tokens: 0,
        top_k: k,
        num_requests: r,
        max_pages: pages,
        block_size: bs,
        hot_slots: n,
        attention_block_stride: stride,
        host_num_blocks: host_blocks,
        num_state_rows: batch_order.then_some(sr),
        stats_slot: 0,
    };
    let resident: Vec<i32> = (0..sr * pages)
        .map(|_| {
            if rng.percent(20) {
                rng.range_inclusive(1, 50) as i32
            } else {
                0
            }
        })
        .collect();
    let host: Vec<i32> = (0..r * pages)
        .map(|_| {
            if rng.percent(8) {
                -1
            } else {
                rng.range_inclusive(0, i64::from(host_blocks) + 3) as i32
            }
        })
        .collect();
    let w = desc.hot_table_width();
    let hot: Vec<i32> = (0..r * w)
        .map(|_| {
            if rng.percent(5) {
                -1
            } else {
                rng.range_inclusive(0, 60) as i32
            }
        })
        .collect();
    let mut slot_host_rows: Vec<i32> = vec![-1; (sr * n) as usize];
    let mut lru: Vec<u16> = (0..sr).flat_map(|_| 0..n as u16).collect();
    if rng.percent(40) {
        for d in slot_host_rows.iter_mut() {
            *d = rng.range_inclusive(-1, i64::from(host_blocks * bs) + 5) as i32;
        }
        for s in lru.iter_mut() {
            if rng.percent(5) {
                *s = rng.range_inclusive(0, i64::from(n) + 2) as u16;
            }
        }
    }
    let (mut gpu_slot_host_rows, mut glru) = (slot_host_rows.clone(), lru.clone());
    // Half the sequences count into a stats buffer, at a random slot each step.
    let (mut stats, _) = maybe_stats(rng, 50);
    let mut gstats = stats.clone();
    let mut fused_in = FusedInputs {
        resident: resident.clone(),
        host: host.clone(),
        hot: hot.clone(),
        slot_host_rows: slot_host_rows.clone(),
        lru: lru.clone(),
        idx_mapping: None,
        stats: stats.clone(),
    };
    for _step in 0..3 {
        // State rows -1..=sr+1: negative, out of range and repeated ones included.
        let map: Option<Vec<i32>> = batch_order.then(|| {
            (0..r)
                .map(|_| rng.range_inclusive(-1, i64::from(sr) + 1) as i32)
                .collect()
        });
        let t = rng.range_inclusive(0, 6) as u32;
        let d = ResolveDesc {
            num_tokens: t,
            stats_slot: rng.below(3) as u32,
            ..desc
        };
        let req: Vec<i32> = (0..t)
            .map(|_| rng.range_inclusive(-1, i64::from(r)) as i32)
            .collect();
        let topk: Vec<i32> = (0..t * k)
            .map(|_| {
                if rng.percent(5) {
                    -1
                } else {
                    rng.range_inclusive(0, i64::from(pages * bs) + 2) as i32
                }
            })
            .collect();
        let tk = (t * k) as usize;
        let (mut ind, mut src, mut dst) = (vec![9; tk], vec![9; tk], vec![9; tk]);
        let (mut vc, mut hc, mut mc) = (
            vec![9; t as usize],
            vec![9; t as usize],
            vec![9; t as usize],
        );
        resolve(
            &d,
            ResolveSlices {
                req_id: &req,
                topk: &topk,
                resident_table: &resident,
                host_table: &host,
                hot_table: &hot,
                slot_host_rows: &mut slot_host_rows,
                lru: &mut lru,
                indices: &mut ind,
                valid_counts: &mut vc,
                hit_counts: &mut hc,
                miss_counts: &mut mc,
                miss_src: &mut src,
                miss_dst: &mut dst,
                idx_mapping: map.as_deref(),
                stats: stats.as_deref_mut(),
            },
        )
        .map_err(|e| e.to_string())?;
        if t == 0 && stats.is_none() {
            continue;
        }
        let (mut gind, mut gsrc, mut gdst) = (vec![9; tk], vec![9; tk], vec![9; tk]);
        let (mut gvc, mut ghc, mut gmc) = (
            vec![9; t as usize],
            vec![9; t as usize],
            vec![9; t as usize],
        );
        // The device the planner sizes for: room for everything, or exactly enough shared memory
        // for a table of `x` entries (beside the state, unless global-state mode).
        let tgt = match smem_table {
            None => BIG,
            Some(x) => {
                let state = if mode.global {
                    gk::resolve_global_shared_bytes(0)
                } else {
                    gk::resolve_shared_bytes(n, 0)
                };
                target(
                    mode.multiprocessors,
                    gk::RESOLVE_STATIC_SHARED_BYTES + state + 16 * u64::from(x) + 8,
                )
            }
        };
        let shape = plan::resolve_shape(&tgt, &d, mode.global);
        // (With more rows than multiprocessors a block gets half as much: smaller tables.)
        if let Some(x) = smem_table.filter(|_| t <= tgt.multiprocessors) {
            let biggest = gk::resolve_table_goal(t, k) as u32;
            let want = if x >= 16 { x.min(biggest) } else { 0 };
            if shape.shared_table != want {
                return Err(format!(
                    "shared table {} instead of {want} ({mode:?})",
                    shape.shared_table
                ));
            }
        }
        let addrs = plan::ResolveAddrs {
            req_id: a(&req),
            topk: a(&topk),
            resident_table: a(&resident),
            host_table: a(&host),
            hot_table: a(&hot),
            slot_host_rows: am(&mut gpu_slot_host_rows),
            lru: am(&mut glru),
            indices: am(&mut gind),
            valid_counts: am(&mut gvc),
            hit_counts: am(&mut ghc),
            miss_counts: am(&mut gmc),
            miss_src: am(&mut gsrc),
            miss_dst: am(&mut gdst),
            idx_mapping: map.as_deref().map(a),
            stats: gstats.as_deref_mut().map(am),
        };
        let planned = plan::resolve(&tgt, &d, &addrs, mode.global).map_err(|e| e.to_string())?;
        let ws_entries = planned.workspace_bytes / 16;
        let counter = emu.execute(planned);
        check_counter(counter, ws_entries, &format!("resolve ({mode:?}, {d:?})"))?;
        for (name, a, b) in [
            ("indices", &ind, &gind),
            ("miss_src", &src, &gsrc),
            ("miss_dst", &dst, &gdst),
            ("valid_counts", &vc, &gvc),
            ("hit_counts", &hc, &ghc),
            ("miss_counts", &mc, &gmc),
            ("slot_host_rows", &slot_host_rows, &gpu_slot_host_rows),
        ] {
            if a != b {
                return Err(format!(
                    "resolve {name} differs ({shape:?}, {mode:?}) for {d:?} req {req:?} map {map:?}\n want {a:?}\n  got {b:?}"
                ));
            }
        }
        if lru != glru {
            return Err(format!("resolve lru differs ({mode:?}) for {d:?}"));
        }
        if stats != gstats {
            return Err(format!(
                "resolve stats differ ({mode:?}) for {d:?} req {req:?}\n want {stats:?}\n  got {gstats:?}"
            ));
        }
        if t == 0 {
            // Nothing to gather (plan::resolve_gather plans the same launch).
            fused_in.stats.clone_from(&stats);
            continue;
        }
        fused_in.idx_mapping.clone_from(&map);
        fused_step(
            emu,
            rng,
            &tgt,
            mode,
            &d,
            &fused_in,
            &req,
            &topk,
            (&ind, &vc, &hc, &mc, &src, &dst),
            (&slot_host_rows, &lru, &stats),
        )?;
        fused_in.slot_host_rows.clone_from(&slot_host_rows);
        fused_in.lru.clone_from(&lru);
        fused_in.stats.clone_from(&stats);
    }
    Ok(())
}

/// The inputs of a resolve step that stay the same for the fused launch.
struct FusedInputs {
    resident: Vec<i32>,
    host: Vec<i32>,
    hot: Vec<i32>,
    slot_host_rows: Vec<i32>,
    lru: Vec<u16>,
    /// The step's idx_mapping in batch-row order.
    idx_mapping: Option<Vec<i32>>,
    /// The stats words before the step, when the sequence counts.
    stats: Option<Vec<i32>>,
}

type ResolveOuts<'a> = (
    &'a Vec<i32>,
    &'a Vec<i32>,
    &'a Vec<i32>,
    &'a Vec<i32>,
    &'a Vec<i32>,
    &'a Vec<i32>,
);

/// The same step through `hs_resolve_gather` (plan::resolve_gather) from the state before it:
/// every resolve output must equal the reference's (`want`, `want_state`), and the device pool
/// must equal the reference gather of the reference's miss plan, over 1 to 3 layers (17 now and
/// then, so one gather launch follows the fused one).
#[allow(clippy::too_many_arguments)]
fn fused_step(
    emu: &Emu,
    rng: &mut SplitMix64,
    tgt: &Target,
    mode: ResolveMode,
    d: &ResolveDesc,
    before: &FusedInputs,
    req: &[i32],
    topk: &[i32],
    want: ResolveOuts<'_>,
    want_state: (&Vec<i32>, &Vec<u16>, &Option<Vec<i32>>),
) -> Result<(), String> {
    let (ind, vc, hc, mc, src, dst) = want;
    let nl = if rng.percent(10) {
        17
    } else {
        rng.range_inclusive(1, 3) as u32
    };
    let k = d.top_k;
    // 16-byte rows (contiguous or split), or rows with 8- and 4-byte scale words, pages padded.
    // The host pool holds every flat row the resolve may name, the device pool (62 blocks) every
    // hot row.
    let (row, value, align) = if rng.percent(60) {
        let row = 16 * rng.range_inclusive(1, 3) as u32;
        let split = row > 16 && rng.percent(30);
        (row, if split { row - 16 } else { row }, 16)
    } else {
        WORD_GEOMETRIES[rng.below(WORD_GEOMETRIES.len() as u64) as usize]
    };
    let split = row != value;
    let host_page = u64::from(d.block_size * row).next_multiple_of(align);
    let device_block = u64::from(d.attention_block_stride * row).next_multiple_of(align);
    let host_layer = u64::from(d.host_num_blocks) * host_page;
    let device_layer = 62 * device_block;
    let layers: Vec<LayerPair> = (0..nl)
        .map(|l| LayerPair {
            host: PageLayout {
                base: u64::from(l) * host_layer,
                block_stride: host_page,
                num_blocks: d.host_num_blocks,
                block_size: d.block_size,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows: d.block_size,
            },
            device: PageLayout {
                base: u64::from(l) * device_layer,
                block_stride: device_block,
                num_blocks: 62,
                block_size: d.block_size,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows: d.attention_block_stride,
            },
        })
        .collect();
    let host_pool = fill(rng, (u64::from(nl) * host_layer) as usize);
    let dev0 = fill(rng, (u64::from(nl) * device_layer) as usize);
    let mut want_dev = dev0.clone();
    gather_rows(
        &GatherDesc {
            num_tokens: d.num_tokens,
            top_k: k,
            layers: &layers,
        },
        GatherArgs {
            plan_src: src,
            plan_dst: dst,
            plan_counts: mc,
            host: &host_pool,
            device: &mut want_dev,
        },
    )
    .map_err(|e| e.to_string())?;
    let tk = (d.num_tokens * k) as usize;
    let t = d.num_tokens as usize;
    let (mut gpu_slot_host_rows, mut glru) = (before.slot_host_rows.clone(), before.lru.clone());
    let (mut gind, mut gsrc, mut gdst) = (vec![9; tk], vec![9; tk], vec![9; tk]);
    let (mut gvc, mut ghc, mut gmc) = (vec![9; t], vec![9; t], vec![9; t]);
    let mut gstats = before.stats.clone();
    let mut gdev = dev0;
    let addrs = plan::ResolveAddrs {
        req_id: a(req),
        topk: a(topk),
        resident_table: a(&before.resident),
        host_table: a(&before.host),
        hot_table: a(&before.hot),
        slot_host_rows: am(&mut gpu_slot_host_rows),
        lru: am(&mut glru),
        indices: am(&mut gind),
        valid_counts: am(&mut gvc),
        hit_counts: am(&mut ghc),
        miss_counts: am(&mut gmc),
        miss_src: am(&mut gsrc),
        miss_dst: am(&mut gdst),
        idx_mapping: before.idx_mapping.as_deref().map(a),
        stats: gstats.as_deref_mut().map(am),
    };
    let planned = plan::resolve_gather(
        tgt,
        d,
        &addrs,
        &layers,
        a(&host_pool),
        am(&mut gdev),
        mode.global,
    )
    .map_err(|e| e.to_string())?;
    if planned.launches.first().map(|l| l.kernel) != Some(Kernel::ResolveGather) {
        return Err("the fused plan does not start with hs_resolve_gather".into());
    }
    let ws_entries = planned.workspace_bytes / 16;
    let counter = emu.execute(planned);
    check_counter(
        counter,
        ws_entries,
        &format!("resolve_gather ({mode:?}, {d:?})"),
    )?;
    for (name, w, g) in [
        ("indices", ind, &gind),
        ("miss_src", src, &gsrc),
        ("miss_dst", dst, &gdst),
        ("valid_counts", vc, &gvc),
        ("hit_counts", hc, &ghc),
        ("miss_counts", mc, &gmc),
        ("slot_host_rows", want_state.0, &gpu_slot_host_rows),
    ] {
        if w != g {
            return Err(format!(
                "resolve_gather {name} differs ({mode:?}) for {d:?}"
            ));
        }
    }
    if *want_state.1 != glru {
        return Err(format!("resolve_gather lru differs ({mode:?}) for {d:?}"));
    }
    if *want_state.2 != gstats {
        return Err(format!("resolve_gather stats differ ({mode:?}) for {d:?}"));
    }
    // Plan destinations of different requests may coincide here (random hot tables share
    // blocks; real ones never do): which source lands there is unspecified, so those rows are
    // not compared.
    let mut seen = std::collections::HashMap::new();
    for (ti, &m) in mc.iter().enumerate() {
        for &row in &dst[ti * k as usize..ti * k as usize + m.max(0) as usize] {
            *seen.entry(row).or_insert(0u32) += 1;
        }
    }
    for (&row, _) in seen.iter().filter(|&(_, &n)| n > 1) {
        for l in &layers {
            if let Some((b, o)) = l.device.locate(i64::from(row)) {
                for (at, len) in l.device.row_parts(b, o) {
                    let r = at as usize..(at + len) as usize;
                    gdev[r.clone()].copy_from_slice(&want_dev[r]);
                }
            }
        }
    }
    if gdev != want_dev {
        return Err(format!(
            "resolve_gather's device pool differs from the reference gather ({nl} layers, {row} B rows, split {split}, {mode:?}) for {d:?}"
        ));
    }
    Ok(())
}

/// The workspace counters after a resolve: the allocator and the finished-blocks count back to
/// zero, the most entries taken within what the host sized.
fn check_counter(words: Vec<u32>, sized: u64, what: &str) -> Result<(), String> {
    if let Some((at, w)) = words
        .iter()
        .enumerate()
        .find(|&(i, &w)| i != gk::WORKSPACE_HIGH_WATER_WORD && w != 0)
    {
        return Err(format!(
            "{what} left counter word {at} at {w}: the next launch would not find it zero"
        ));
    }
    if u64::from(words[gk::WORKSPACE_HIGH_WATER_WORD]) > sized {
        return Err(format!(
            "{what} took {} workspace entries, the host sized {sized}",
            words[gk::WORKSPACE_HIGH_WATER_WORD]
        ));
    }
    Ok(())
}

/// A row geometry of the copy checks: `(row_bytes, value_bytes, page alignment)`.
type RowGeometry = (u32, u32, u64);

/// Rows whose scale parts are not multiples of 16 (scale words of 8 and 4 bytes), as the
/// conformance suite has them: DeepSeek V4's 584-B rows (576 + 8) in pages padded to a multiple
/// of 576 B, its indexer's 132-B rows (128 + 4), and 20-B rows (16 + 4) in pages padded to 16 B.
const WORD_GEOMETRIES: [RowGeometry; 3] = [(584, 576, 576), (132, 128, 576), (20, 16, 16)];

/// A random geometry: half the time 16-byte multiples (contiguous, or split with a 16-byte
/// scale part), else one of [`WORD_GEOMETRIES`].
fn row_geometry(rng: &mut SplitMix64) -> RowGeometry {
    if rng.percent(50) {
        let row = 16 * rng.range_inclusive(1, 4) as u32;
        let split = rng.percent(50) && row > 16;
        (row, if split { row - 16 } else { row }, 16)
    } else {
        WORD_GEOMETRIES[rng.below(WORD_GEOMETRIES.len() as u64) as usize]
    }
}

/// `n` layers of geometry `g`: host pages layer-major, each padded to `g.2` bytes; device
/// pages side by side in a block (each padded), blocks 32 bytes apart beyond them, flat device
/// rows sometimes with a row of another layer's part per block. Rows per page are odd more often
/// than not (page tails past the last 16-byte chunk).
fn pair_layers(rng: &mut SplitMix64, n: u32, g: RowGeometry) -> (Vec<LayerPair>, usize, usize) {
    let (row, value, align) = g;
    let bs = [1u32, 3, 5, 2, 4, 6][rng.below(6) as usize];
    let (hb, db) = (
        rng.range_inclusive(2, 9) as u32,
        rng.range_inclusive(2, 9) as u32,
    );
    let page = u64::from(bs * row).next_multiple_of(align);
    let mut layers = Vec::new();
    let (mut hoff, mut doff) = (0u64, 0u64);
    let dstride = page * u64::from(n) + 32;
    let index_stride_rows = bs + rng.below(2) as u32;
    for _ in 0..n {
        let host = PageLayout {
            base: hoff,
            block_stride: page,
            num_blocks: hb,
            block_size: bs,
            row_bytes: row,
            value_bytes: value,
            index_stride_rows: bs,
        };
        let device = PageLayout {
            base: doff,
            block_stride: dstride,
            num_blocks: db,
            block_size: bs,
            row_bytes: row,
            value_bytes: value,
            index_stride_rows,
        };
        hoff += u64::from(hb) * page;
        doff += page;
        layers.push(LayerPair { host, device });
    }
    let host_len = hoff as usize;
    let dev_len = (dstride * u64::from(db) + 64) as usize;
    (layers, host_len, dev_len)
}

/// A stats buffer of three slots (`hisparse_core::ops::stats`) for a call that adds to one of
/// them, or `None` for a call without stats (`pct` percent of calls have them): random words,
/// half within a few thousand of `u32::MAX` so the kernels' sums wrap; and the slot.
fn maybe_stats(rng: &mut SplitMix64, pct: u64) -> (Option<Vec<i32>>, u32) {
    if !rng.percent(pct) {
        return (None, 0);
    }
    let words = (0..12)
        .map(|_| {
            if rng.percent(50) {
                (u32::MAX - rng.below(5000) as u32) as i32
            } else {
                rng.next_u64() as i32
            }
        })
        .collect();
    (Some(words), rng.below(3) as u32)
}

/// The device address of an optional buffer the kernel writes (0: none).
fn am_opt(v: &mut Option<Vec<i32>>) -> u64 {
    v.as_deref_mut().map_or(0, am)
}

fn fill(rng: &mut SplitMix64, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

/// Indexer rows of every kind `indexer_backup` takes: contiguous 132-byte rows (DeepSeek V3.2,
/// 4-byte words), contiguous 16-byte multiples (16-byte chunks), split 128 + 4 (DeepSeek V4) and
/// contiguous 20-byte rows, pages on 16-byte boundaries; slots that are -1, beyond a pool or in
/// another layer's part of a block.
fn check_indexer_backup(emu: &Emu, rng: &mut SplitMix64) -> Result<(), String> {
    let (row, value) = [(132u32, 132u32), (64, 64), (132, 128), (20, 20)][rng.below(4) as usize];
    let nl = rng.range_inclusive(1, 4) as u32;
    let bs = [1u32, 3, 4, 64][rng.below(4) as usize];
    let (hb, db) = (
        rng.range_inclusive(2, 9) as u32,
        rng.range_inclusive(2, 9) as u32,
    );
    let page = u64::from(bs * row).next_multiple_of(16);
    // Device blocks hold every layer's page side by side and one more page of another group.
    let dstride = page * u64::from(nl + 1);
    let index_stride_rows = bs * (nl + 1);
    let layers: Vec<LayerPair> = (0..u64::from(nl))
        .map(|l| LayerPair {
            host: PageLayout {
                base: l * u64::from(hb) * page,
                block_stride: page,
                num_blocks: hb,
                block_size: bs,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows: bs,
            },
            device: PageLayout {
                base: l * page,
                block_stride: dstride,
                num_blocks: db,
                block_size: bs,
                row_bytes: row,
                value_bytes: value,
                index_stride_rows,
            },
        })
        .collect();
    let (hl, dl) = (
        (u64::from(nl * hb) * page) as usize,
        (dstride * u64::from(db)) as usize,
    );
    let t = rng.range_inclusive(0, 40) as u32;
    let host_rows = i64::from(hb * bs);
    let mut free: Vec<i32> = (0..host_rows as i32).collect();
    rng.shuffle(&mut free);
    let mut free = free.into_iter();
    let device_slots: Vec<i32> = (0..t)
        .map(|_| match rng.below(10) {
            0 => -1,
            1 => rng.range_inclusive(
                i64::from(db * index_stride_rows),
                i64::from(db * index_stride_rows) + 9,
            ) as i32,
            _ => rng.range_inclusive(0, i64::from(db * index_stride_rows) - 1) as i32,
        })
        .collect();
    let host_slots: Vec<i32> = (0..t)
        .map(|_| match rng.below(10) {
            0 => -1,
            1 => rng.range_inclusive(host_rows, host_rows + 9) as i32,
            _ => free.next().unwrap_or(-1),
        })
        .collect();
    let device = fill(rng, dl);
    let host0 = fill(rng, hl);
    let mut want = host0.clone();
    let desc = IndexerBackupDesc {
        num_tokens: t,
        layers: &layers,
    };
    indexer_backup(
        &desc,
        IndexerBackupArgs {
            device_slots: &device_slots,
            host_slots: &host_slots,
            device: &device,
            host: &mut want,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut got = host0;
    let addrs = plan::IndexerBackupAddrs {
        device_slots: a(&device_slots),
        host_slots: a(&host_slots),
        device: a(&device),
        host: am(&mut got),
    };
    let tgt = target(if rng.percent(50) { 1 } else { 132 }, 48 * 1024);
    emu.execute(plan::indexer_backup(&tgt, &desc, &addrs).map_err(|e| e.to_string())?);
    if got != want {
        return Err(format!(
            "indexer_backup differs ({row}-byte rows, {value} value bytes, {nl} layers, {bs} rows per page)"
        ));
    }
    Ok(())
}

fn check_copies(emu: &Emu, rng: &mut SplitMix64, g: RowGeometry) -> Result<(), String> {
    let nl = rng.range_inclusive(1, 3) as u32;
    let (layers, hl, dl) = pair_layers(rng, nl, g);
    let l0 = layers[0];
    // A small device sometimes, so the persistent gather grid is smaller than its work.
    let tgt = target(if rng.percent(50) { 1 } else { 132 }, 48 * 1024);
    // gather (more token rows than an in-order walk reads at once, sometimes)
    let t = rng.range_inclusive(1, 6) as u32;
    let k = rng.range_inclusive(1, 40) as u32;
    let host_rows = i64::from(l0.host.num_blocks * l0.host.block_size);
    let dev_rows = i64::from(l0.device.num_blocks * l0.device.index_stride_rows);
    let mut used = std::collections::HashSet::new();
    let src: Vec<i32> = (0..t * k)
        .map(|_| rng.range_inclusive(-1, host_rows + 2) as i32)
        .collect();
    let dst: Vec<i32> = (0..t * k)
        .map(|_| {
            loop {
                let v = rng.range_inclusive(-1, dev_rows + 2) as i32;
                if v < 0 || used.insert(v) {
                    break v;
                }
                if used.len() as i64 > dev_rows {
                    break -1;
                }
            }
        })
        .collect();
    let counts: Vec<i32> = (0..t)
        .map(|_| rng.range_inclusive(-1, i64::from(k) + 2) as i32)
        .collect();
    let host = fill(rng, hl);
    let dev0 = fill(rng, dl);
    let mut want = dev0.clone();
    let desc = GatherDesc {
        num_tokens: t,
        top_k: k,
        layers: &layers,
    };
    gather_rows(
        &desc,
        GatherArgs {
            plan_src: &src,
            plan_dst: &dst,
            plan_counts: &counts,
            host: &host,
            device: &mut want,
        },
    )
    .map_err(|e| e.to_string())?;
    // Both walks of the plan (every row at once; rows in order, a group of blocks per row).
    for walk in [plan::GatherWalk::AllRows, plan::GatherWalk::InOrder] {
        let mut got = dev0.clone();
        let addrs = plan::GatherAddrs {
            plan_src: a(&src),
            plan_dst: a(&dst),
            plan_counts: a(&counts),
            host: a(&host),
            device: am(&mut got),
        };
        emu.execute(plan::gather(&tgt, &desc, &addrs, walk).map_err(|e| e.to_string())?);
        if got != want {
            return Err(format!(
                "gather ({walk:?}) differs ({g:?} rows, {nl} layers, {t} token rows)"
            ));
        }
    }
    // Page copies both ways, destinations sometimes repeated (the later pair wins: the planner
    // must split the launch).
    for dir in [Direction::DeviceToHost, Direction::HostToDevice] {
        let (sb, db) = match dir {
            Direction::DeviceToHost => (l0.device.num_blocks, l0.host.num_blocks),
            Direction::HostToDevice => (l0.host.num_blocks, l0.device.num_blocks),
        };
        let pairs: Vec<BlockPair> = (0..rng.range_inclusive(1, i64::from(db) + 2))
            .map(|_| BlockPair {
                src: rng.below(u64::from(sb)) as u32,
                dst: rng.below(u64::from(db)) as u32,
            })
            .collect();
        let (mut wh, mut wd) = (fill(rng, hl), fill(rng, dl));
        let (mut gh, mut gd) = (wh.clone(), wd.clone());
        let pdesc = PageCopyDesc {
            direction: dir,
            layers: &layers,
        };
        copy_pages(&pdesc, &pairs, &mut wh, &mut wd).map_err(|e| e.to_string())?;
        let jobs: Vec<(PageLayout, PageLayout)> = layers
            .iter()
            .map(|l| match dir {
                Direction::DeviceToHost => (l.device, l.host),
                Direction::HostToDevice => (l.host, l.device),
            })
            .collect();
        let (sp, dp) = match dir {
            Direction::DeviceToHost => (a(&gd), am(&mut gh)),
            Direction::HostToDevice => (a(&gh), am(&mut gd)),
        };
        emu.execute(
            plan::copy_pages(&tgt, &jobs, &pairs, sp, dp, false).map_err(|e| e.to_string())?,
        );
        if gh != wh || gd != wd {
            return Err(format!(
                "copy_pages {dir:?} differs for {pairs:?} ({g:?} rows, {nl} layers)"
            ));
        }
        // Row spans, destination rows sometimes repeated.
        let spans: Vec<RowSpan> = (0..rng.range_inclusive(1, i64::from(db) + 2))
            .map(|_| {
                let first = rng.below(u64::from(l0.host.block_size)) as u32;
                let num = rng.range_inclusive(0, i64::from(l0.host.block_size - first)) as u32;
                let (d, o) = (
                    rng.below(u64::from(db)) as u32,
                    rng.below(u64::from(sb)) as u32,
                );
                let (device_block, host_block) = match dir {
                    Direction::DeviceToHost => (o, d),
                    Direction::HostToDevice => (d, o),
                };
                RowSpan {
                    device_block,
                    host_block,
                    first_row: first,
                    num_rows: num,
                }
            })
            .collect();
        let (mut wh, mut wd) = (fill(rng, hl), fill(rng, dl));
        let (mut gh, mut gd) = (wh.clone(), wd.clone());
        let rdesc = RowCopyDesc {
            direction: dir,
            layers: &layers,
        };
        copy_rows(&rdesc, &spans, &mut wh, &mut wd).map_err(|e| e.to_string())?;
        let (h, d) = (am(&mut gh), am(&mut gd));
        emu.execute(plan::copy_rows(&tgt, &rdesc, &spans, h, d).map_err(|e| e.to_string())?);
        if gh != wh || gd != wd {
            return Err(format!(
                "copy_rows {dir:?} differs for {spans:?} ({g:?} rows, {nl} layers)"
            ));
        }
    }
    // Host copy-on-write in one buffer: chains (a destination read by a later pair) and repeats.
    let host_layers: Vec<PageLayout> = layers.iter().map(|l| l.host).collect();
    let hb = l0.host.num_blocks;
    let pairs: Vec<BlockPair> = (0..rng.range_inclusive(1, 6))
        .filter_map(|_| {
            let (s, d) = (
                rng.below(u64::from(hb)) as u32,
                rng.below(u64::from(hb)) as u32,
            );
            (s != d).then_some(BlockPair { src: s, dst: d })
        })
        .collect();
    let mut wh = fill(rng, hl);
    let mut gh = wh.clone();
    copy_host_pages(&host_layers, &pairs, &mut wh).map_err(|e| e.to_string())?;
    let jobs: Vec<(PageLayout, PageLayout)> = host_layers.iter().map(|l| (*l, *l)).collect();
    let h = am(&mut gh);
    emu.execute(plan::copy_pages(&tgt, &jobs, &pairs, h, h, true).map_err(|e| e.to_string())?);
    if gh != wh {
        return Err(format!(
            "copy_host_pages differs for {pairs:?} ({g:?} rows, {nl} layers)"
        ));
    }
    Ok(())
}

fn check_small_ops(emu: &Emu, rng: &mut SplitMix64) -> Result<(), String> {
    let tgt = target(if rng.percent(50) { 1 } else { 132 }, 48 * 1024);
    // invalidate
    let (r, n, nr) = (
        rng.range_inclusive(1, 3) as u32,
        rng.range_inclusive(1, 300) as u32,
        rng.range_inclusive(1, 600) as u32,
    );
    let ranges: Vec<i32> = (0..2 * nr)
        .map(|_| rng.range_inclusive(-2, 100) as i32)
        .collect();
    let mut want: Vec<i32> = (0..r * n)
        .map(|_| rng.range_inclusive(-1, 100) as i32)
        .collect();
    let mut got = want.clone();
    let desc = InvalidateDesc {
        num_requests: r,
        hot_slots: n,
        num_ranges: nr,
    };
    invalidate(
        &desc,
        InvalidateArgs {
            ranges: &ranges,
            slot_host_rows: &mut want,
        },
    )
    .map_err(|e| e.to_string())?;
    emu.execute(plan::invalidate(&tgt, &desc, a(&ranges), am(&mut got)));
    if got != want {
        return Err("invalidate differs".into());
    }
    // compressed slot mapping
    let t = rng.range_inclusive(1, 600) as u32;
    let ratio = rng.range_inclusive(1, 4) as u32;
    let bs = ratio * rng.range_inclusive(1, 8) as u32;
    let (rows, m) = (
        rng.range_inclusive(1, 3) as u32,
        rng.range_inclusive(1, 6) as u32,
    );
    let pos: Vec<i32> = (0..t)
        .map(|_| rng.range_inclusive(-2, i64::from(bs * m) + 8) as i32)
        .collect();
    let slots: Vec<i32> = (0..t).map(|_| rng.range_inclusive(-1, 50) as i32).collect();
    let trow: Vec<i32> = (0..t)
        .map(|_| rng.range_inclusive(-1, i64::from(rows)) as i32)
        .collect();
    let table: Vec<i32> = (0..rows * m)
        .map(|_| rng.range_inclusive(-1, 1 << 28) as i32)
        .collect();
    let mut want = vec![5i32; t as usize];
    let mut got = want.clone();
    let d = SlotMappingDesc {
        num_tokens: t,
        ratio,
        block_size: bs,
        table_rows: rows,
        max_blocks: m,
    };
    compressed_slot_mapping(
        &d,
        SlotMappingArgs {
            positions: &pos,
            slot_mapping: &slots,
            table_row: &trow,
            block_table: &table,
            out: &mut want,
        },
    )
    .map_err(|e| e.to_string())?;
    let addrs = plan::SlotMappingAddrs {
        positions: a(&pos),
        slot_mapping: a(&slots),
        table_row: a(&trow),
        block_table: a(&table),
        out: am(&mut got),
    };
    emu.execute(plan::slot_mapping(&d, &addrs));
    if got != want {
        return Err("compressed_slot_mapping differs".into());
    }
    Ok(())
}

/// Sparse table writes (random sorted unique indices, extreme values) and hot-state resets
/// (rows listed more than once), with grids smaller than the work on a small device.
fn check_tables(emu: &Emu, rng: &mut SplitMix64) -> Result<(), String> {
    let tgt = target(1, 48 * 1024);
    let len = rng.range_inclusive(1, 3000) as u32;
    let density = *[1u64, 30, 100].get(rng.below(3) as usize).unwrap_or(&30);
    let mut writes = Vec::new();
    for index in 0..len {
        if rng.percent(density) {
            let value = match rng.below(4) {
                0 => -1,
                1 => i32::MIN,
                2 => i32::MAX,
                _ => rng.range_inclusive(-1000, 1000) as i32,
            };
            writes.push(TableWrite { index, value });
        }
    }
    // Slack beyond the table: the kernel must not touch it.
    let table: Vec<i32> = (0..len + 8)
        .map(|_| rng.range_inclusive(-5, 5) as i32)
        .collect();
    let desc = TableWriteDesc { table_len: len };
    let mut want = table.clone();
    write_table(&desc, &writes, &mut want[..len as usize]).map_err(|e| e.to_string())?;
    let mut got = table.clone();
    let planned =
        plan::write_table(&tgt, &desc, &writes, am(&mut got)).map_err(|e| e.to_string())?;
    if writes.is_empty() != planned.launches.is_empty() {
        return Err("an empty write list must enqueue nothing, any other list one launch".into());
    }
    emu.execute(planned);
    if got != want {
        return Err(format!(
            "write_table differs ({} writes over {len})",
            writes.len()
        ));
    }

    let (r, n) = (
        rng.range_inclusive(1, 5) as u32,
        rng.range_inclusive(1, 700) as u32,
    );
    let rows: Vec<u32> = (0..rng.range_inclusive(1, 8))
        .map(|_| rng.below(u64::from(r)) as u32)
        .collect();
    let desc = HotResetDesc {
        num_requests: r,
        hot_slots: n,
    };
    let slot_host_rows: Vec<i32> = (0..r * n)
        .map(|_| rng.range_inclusive(-1, 99) as i32)
        .collect();
    let lru: Vec<u16> = (0..r * n).map(|_| rng.below(u64::from(n)) as u16).collect();
    let (mut want_slot_host_rows, mut want_lru) = (slot_host_rows.clone(), lru.clone());
    reset_hot_state(&desc, &rows, &mut want_slot_host_rows, &mut want_lru)
        .map_err(|e| e.to_string())?;
    let (mut got_slot_host_rows, mut got_lru) = (slot_host_rows, lru);
    let planned = plan::reset_hot_state(
        &tgt,
        &desc,
        &rows,
        am(&mut got_slot_host_rows),
        am(&mut got_lru),
    )
    .map_err(|e| e.to_string())?;
    emu.execute(planned);
    if got_slot_host_rows != want_slot_host_rows || got_lru != want_lru {
        return Err(format!(
            "reset_hot_state differs (rows {rows:?}, {n} slots)"
        ));
    }
    Ok(())
}

fn main() {
    let check = Check::one("kernels_match_reference_on_cpu");
    let emu = match build() {
        Ok(e) => e,
        Err(e @ EmulationBuildError::NoCompiler) => check.missing(REQUIRE_CXX_ENV, e),
        Err(e) => check.finish(Err(e)),
    };
    let cases: u64 = std::env::var("HISPARSE_EMU_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let mut failures = Vec::new();
    for seed in 0..cases {
        let mut rng = SplitMix64::new(0xC0FFEE ^ seed.wrapping_mul(0x9E37_79B9));
        let smem = match seed % 3 {
            0 => None,
            1 => Some(0),
            _ => Some(64),
        };
        let shared = ResolveMode {
            smem_table: smem,
            global: false,
            hot_slots: None,
            multiprocessors: if seed % 2 == 0 { 132 } else { 2 },
        };
        // The same launches with the per-request state in the workspace, and the largest
        // hot-slot count (32768, beyond any AMD GPU's shared memory) in global-state mode.
        let global = ResolveMode {
            global: true,
            ..shared
        };
        let global_max = ResolveMode {
            global: true,
            hot_slots: Some(hisparse_core::ops::MAX_HOT_SLOTS),
            ..shared
        };
        for (name, r) in [
            // Several remaps a seed: one call draws one mode, one batch and one device, and the
            // column tiles of a few plain rows (with or without stats) are one draw of many.
            (
                "remap",
                (0..REMAPS_PER_SEED).try_for_each(|_| check_remap(&emu, &mut rng, false)),
            ),
            (
                "remap with modes",
                (0..REMAPS_PER_SEED).try_for_each(|_| check_remap(&emu, &mut rng, true)),
            ),
            ("resolve", check_resolve(&emu, &mut rng, shared)),
            (
                "resolve (global state)",
                check_resolve(&emu, &mut rng, global),
            ),
            (
                "resolve (global state, max hot slots)",
                check_resolve(&emu, &mut rng, global_max),
            ),
            ("copies", {
                let g = row_geometry(&mut rng);
                check_copies(&emu, &mut rng, g)
            }),
            // Every geometry with 8- and 4-byte scale words, every seed.
            (
                "copies (584 = 576 + 8)",
                check_copies(&emu, &mut rng, WORD_GEOMETRIES[0]),
            ),
            (
                "copies (132 = 128 + 4)",
                check_copies(&emu, &mut rng, WORD_GEOMETRIES[1]),
            ),
            (
                "copies (20 = 16 + 4)",
                check_copies(&emu, &mut rng, WORD_GEOMETRIES[2]),
            ),
            ("small ops", check_small_ops(&emu, &mut rng)),
            ("indexer backup", check_indexer_backup(&emu, &mut rng)),
            ("tables", check_tables(&emu, &mut rng)),
        ] {
            if let Err(e) = r {
                failures.push(format!("seed {seed} {name}: {e}"));
            }
        }
    }
    for f in &failures {
        println!("FAILED: {f}");
    }
    let result = if failures.is_empty() {
        println!("ok: {cases} random seeds of every kernel match the reference on the CPU");
        Ok(())
    } else {
        Err(format!("{} failures", failures.len()))
    };
    check.finish(result)
}
