//! Executes the shared kernel source on the CPU (compiled as C++20 with `emu/vendor_cpu.h`, one OS
//! thread per GPU thread) and compares every kernel bit for bit with the core's reference on
//! random inputs, launched exactly as the CUDA backend launches them. The per-kernel launch
//! wrappers are generated from the ABI table, so a table that disagrees with the source fails to
//! compile here.
//!
//! Needs a C++20 compiler (`$CXX`, else `c++`, `g++` or `clang++`). Without one the check prints
//! `SKIPPED` and succeeds, unless `HISPARSE_REQUIRE_CXX=1`.

use std::ffi::c_void;
use std::path::PathBuf;
use std::process::Command;

use gk::{GatherLayers, Kernel, Param};
use hisparse_core::ops::copy::{copy_pages, copy_rows, gather_rows};
use hisparse_core::ops::invalidate::invalidate;
use hisparse_core::ops::remap::remap;
use hisparse_core::ops::resolve::resolve;
use hisparse_core::ops::slot_mapping::compressed_slot_mapping;
use hisparse_core::ops::table::{reset_hot_state, write_table};
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, HotResetDesc, InvalidateArgs, InvalidateDesc,
    LayerPair, PageCopyDesc, PageLayout, RemapArgs, RemapDesc, ResolveDesc, ResolveSlices,
    RowCopyDesc, RowSpan, SlotMappingArgs, SlotMappingDesc, TableWrite, TableWriteDesc,
};
use hisparse_gpu_kernels as gk;

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
        if n == 0 { 0 } else { self.next() % n }
    }
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

enum Arg<'a> {
    Ptr(*const c_void),
    U32(u32),
    U64(u64),
    Layers(&'a GatherLayers),
}

fn p<T>(v: &[T]) -> Arg<'static> {
    Arg::Ptr(v.as_ptr().cast())
}

/// An argument the kernel writes through.
fn pm<T>(v: &mut [T]) -> Arg<'static> {
    Arg::Ptr(v.as_mut_ptr().cast_const().cast())
}

type LaunchFn = unsafe extern "C" fn(u32, u32, u32, u32, u32, u32, *mut *mut c_void) -> i32;

struct Emu {
    _lib: libloading::Library,
    launch: LaunchFn,
}

impl Emu {
    fn run(&self, k: Kernel, grid: (u32, u32, u32), block: u32, smem: u64, args: &[Arg<'_>]) {
        assert_eq!(args.len(), k.abi().params.len(), "{}", k.name());
        let mut ptrs: Vec<*mut c_void> = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(p) => (p as *const *const c_void).cast_mut().cast(),
                Arg::U32(v) => (v as *const u32).cast_mut().cast(),
                Arg::U64(v) => (v as *const u64).cast_mut().cast(),
                Arg::Layers(l) => (*l as *const GatherLayers).cast_mut().cast(),
            })
            .collect();
        let idx = Kernel::ALL.iter().position(|x| *x == k).expect("kernel") as u32;
        // SAFETY: the generated wrapper reads exactly `args.len()` argument addresses with the
        // ABI table's types (asserted above), and every pointer argument addresses a live Vec
        // that the descriptor's `check` (run by the reference first) proved large enough.
        let rc = unsafe {
            (self.launch)(
                idx,
                grid.0,
                grid.1,
                grid.2,
                block,
                smem as u32,
                ptrs.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
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

fn build() -> Result<Emu, String> {
    let cxx = std::env::var("CXX")
        .ok()
        .into_iter()
        .chain(["c++", "g++", "clang++"].map(String::from))
        .find(|c| Command::new(c).arg("--version").output().is_ok())
        .ok_or("no C++ compiler found ($CXX, c++, g++, clang++)")?;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hisparse-cpu-emulation");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = format!(
        "{}{}{}{}",
        include_str!("../emu/vendor_cpu.h"),
        gk::COMMON_SOURCE,
        include_str!("../emu/driver.cpp"),
        wrappers()
    );
    let cpp = dir.join("hisparse_cpu.cpp");
    let so = dir.join("libhisparse_cpu.so");
    std::fs::write(&cpp, src).map_err(|e| e.to_string())?;
    let out = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O1",
            "-shared",
            "-fPIC",
            "-pthread",
            "-fno-strict-aliasing",
        ])
        .args(["-Wno-unknown-pragmas", "-o"])
        .arg(&so)
        .arg(&cpp)
        .output()
        .map_err(|e| format!("{cxx}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cxx} failed to compile the kernel source for the CPU:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // SAFETY: the library was just built from the kernel source and the emulation driver; its
    // initialisers only construct empty globals.
    let lib = unsafe { libloading::Library::new(&so) }.map_err(|e| e.to_string())?;
    // SAFETY: `hs_cpu_launch` is defined by the generated wrappers with exactly this signature.
    let launch = unsafe { lib.get::<LaunchFn>(b"hs_cpu_launch") }
        .map(|f| *f)
        .map_err(|e| e.to_string())?;
    Ok(Emu { _lib: lib, launch })
}

fn check_remap(emu: &Emu, rng: &mut Rng) -> Result<(), String> {
    let t = rng.int(0, 5) as u32;
    let k = *[1u32, 3, 8, 64, 130, 2048, 2052]
        .get(rng.below(7) as usize)
        .unwrap_or(&8);
    let bs = *[1u32, 4, 5, 16, 64]
        .get(rng.below(5) as usize)
        .unwrap_or(&4);
    let m = if rng.pct(20) {
        4100
    } else {
        rng.int(1, 40) as u32
    };
    let rows = rng.int(1, 6) as u32;
    let stride = bs + rng.below(3) as u32 * if rng.pct(10) { 1 << 20 } else { 1 };
    let map_len = rng.pct(40).then(|| rng.int(1, 8) as u32);
    let desc = RemapDesc {
        num_tokens: t,
        top_k: k,
        table_rows: rows,
        max_blocks: m,
        block_size: bs,
        block_stride_rows: stride,
        idx_mapping_len: map_len,
        write_counts: rng.pct(60),
        compact: rng.pct(40),
    };
    let req: Vec<i32> = (0..t).map(|_| rng.int(-1, rows as i64) as i32).collect();
    let table: Vec<i32> = (0..rows * m)
        .map(|_| {
            if rng.pct(10) {
                -1
            } else {
                rng.int(0, 5000) as i32
            }
        })
        .collect();
    let topk: Vec<i32> = (0..t * k)
        .map(|_| {
            if rng.pct(10) {
                -rng.int(1, 9) as i32
            } else {
                rng.int(0, i64::from(m * bs) + 10) as i32
            }
        })
        .collect();
    let map: Vec<i32> = (0..map_len.unwrap_or(1))
        .map(|_| rng.int(-1, rows as i64) as i32)
        .collect();
    let mut want = vec![7i32; (t * k) as usize];
    let mut want_c = vec![7i32; t as usize];
    remap(
        &desc,
        RemapArgs {
            req_id: &req,
            block_table: &table,
            topk: &topk,
            idx_mapping: map_len.map(|_| &map[..]),
            out: &mut want,
            counts: desc.write_counts.then_some(&mut want_c[..]),
        },
    )
    .map_err(|e| e.to_string())?;
    if t == 0 {
        return Ok(());
    }
    let mut got = vec![7i32; (t * k) as usize];
    let mut got_c = vec![7i32; t as usize];
    let flags = (u32::from(map_len.is_some()) * gk::REMAP_HAS_MAP)
        | (u32::from(desc.write_counts) * gk::REMAP_COUNTS)
        | (u32::from(desc.compact) * gk::REMAP_COMPACT);
    emu.run(
        Kernel::Remap,
        (t, 1, 1),
        gk::REMAP_THREADS,
        0,
        &[
            p(&req),
            p(&table),
            p(&topk),
            if map_len.is_some() {
                p(&map)
            } else {
                Arg::Ptr(std::ptr::null())
            },
            pm(&mut got),
            if desc.write_counts {
                pm(&mut got_c)
            } else {
                Arg::Ptr(std::ptr::null())
            },
            Arg::U32(t),
            Arg::U32(k),
            Arg::U32(rows),
            Arg::U32(m),
            Arg::U32(bs),
            Arg::U32(stride),
            Arg::U32(map_len.unwrap_or(0)),
            Arg::U32(flags),
        ],
    );
    if got != want || got_c != want_c {
        return Err(format!("remap differs for {desc:?}"));
    }
    Ok(())
}

#[allow(clippy::too_many_lines)]
/// How `check_resolve` launches `hs_resolve`: the shared table capacity (`None`: sized for two
/// rows), whether the per-request state is forced into the workspace (global-state mode), and a
/// fixed `hot_slots` (`None`: random).
#[derive(Clone, Copy, Debug)]
struct ResolveMode {
    smem_table: Option<u32>,
    global: bool,
    hot_slots: Option<u32>,
}

fn check_resolve(emu: &Emu, rng: &mut Rng, mode: ResolveMode) -> Result<(), String> {
    let smem_table = mode.smem_table;
    let k = rng.int(1, 40) as u32;
    let bs = rng.int(1, 8) as u32;
    let r = rng.int(1, 3) as u32;
    let n = if let Some(n) = mode.hot_slots {
        n
    } else if rng.pct(15) {
        rng.int(2049, 2600) as u32
    } else {
        k * rng.int(1, 3) as u32
    };
    let pages = rng.int(1, 12) as u32;
    let host_blocks = rng.int(1, 40) as u32;
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
    };
    let resident: Vec<i32> = (0..r * pages)
        .map(|_| {
            if rng.pct(20) {
                rng.int(1, 50) as i32
            } else {
                0
            }
        })
        .collect();
    let host: Vec<i32> = (0..r * pages)
        .map(|_| {
            if rng.pct(8) {
                -1
            } else {
                rng.int(0, i64::from(host_blocks) + 3) as i32
            }
        })
        .collect();
    let w = desc.hot_table_width();
    let hot: Vec<i32> = (0..r * w)
        .map(|_| {
            if rng.pct(5) {
                -1
            } else {
                rng.int(0, 60) as i32
            }
        })
        .collect();
    let mut dgi: Vec<i32> = vec![-1; (r * n) as usize];
    let mut lru: Vec<u16> = (0..r).flat_map(|_| 0..n as u16).collect();
    if rng.pct(40) {
        for d in dgi.iter_mut() {
            *d = rng.int(-1, i64::from(host_blocks * bs) + 5) as i32;
        }
        for s in lru.iter_mut() {
            if rng.pct(5) {
                *s = rng.int(0, i64::from(n) + 2) as u16;
            }
        }
    }
    let (mut gdgi, mut glru) = (dgi.clone(), lru.clone());
    for _step in 0..3 {
        let t = rng.int(0, 6) as u32;
        let d = ResolveDesc {
            num_tokens: t,
            ..desc
        };
        let req: Vec<i32> = (0..t).map(|_| rng.int(-1, i64::from(r)) as i32).collect();
        let topk: Vec<i32> = (0..t * k)
            .map(|_| {
                if rng.pct(5) {
                    -1
                } else {
                    rng.int(0, i64::from(pages * bs) + 2) as i32
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
                dgi: &mut dgi,
                lru: &mut lru,
                indices: &mut ind,
                valid_counts: &mut vc,
                hit_counts: &mut hc,
                miss_counts: &mut mc,
                miss_src: &mut src,
                miss_dst: &mut dst,
            },
        )
        .map_err(|e| e.to_string())?;
        if t == 0 {
            continue;
        }
        let (mut gind, mut gsrc, mut gdst) = (vec![9; tk], vec![9; tk], vec![9; tk]);
        let (mut gvc, mut ghc, mut gmc) = (
            vec![9; t as usize],
            vec![9; t as usize],
            vec![9; t as usize],
        );
        let table = smem_table.unwrap_or_else(|| {
            gk::resolve_table_entries(u64::from(k) * u64::from(t.min(2))) as u32
        });
        let (ws_entries, shared, table_arg) = if mode.global {
            (
                gk::resolve_global_workspace_entries(t, k, r, n, true),
                gk::resolve_global_shared_bytes(table),
                table | gk::RESOLVE_GLOBAL_STATE,
            )
        } else {
            (
                gk::resolve_workspace_entries(t, k),
                gk::resolve_shared_bytes(n, table),
                table,
            )
        };
        let mut ws = vec![0u8; 16 * ws_entries as usize + 16];
        let mut counter = vec![0u32; 4];
        emu.run(
            Kernel::Resolve,
            (t, 1, 1),
            gk::RESOLVE_THREADS,
            shared,
            &[
                p(&req),
                p(&topk),
                p(&resident),
                p(&host),
                p(&hot),
                pm(&mut gdgi),
                pm(&mut glru),
                pm(&mut gind),
                pm(&mut gvc),
                pm(&mut ghc),
                pm(&mut gmc),
                pm(&mut gsrc),
                pm(&mut gdst),
                Arg::Ptr(ws.as_mut_ptr().wrapping_add(16).cast_const().cast()),
                pm(&mut counter),
                Arg::U32(ws_entries as u32),
                Arg::U32(table_arg),
                Arg::U32(t),
                Arg::U32(k),
                Arg::U32(r),
                Arg::U32(pages),
                Arg::U32(bs),
                Arg::U32(n),
                Arg::U32(stride),
                Arg::U32(host_blocks),
            ],
        );
        if u64::from(counter[0]) > ws_entries {
            return Err(format!(
                "resolve took {} workspace entries, the host sized {ws_entries} ({mode:?}, {d:?})",
                counter[0]
            ));
        }
        for (name, a, b) in [
            ("indices", &ind, &gind),
            ("miss_src", &src, &gsrc),
            ("miss_dst", &dst, &gdst),
            ("valid_counts", &vc, &gvc),
            ("hit_counts", &hc, &ghc),
            ("miss_counts", &mc, &gmc),
            ("dgi", &dgi, &gdgi),
        ] {
            if a != b {
                return Err(format!(
                    "resolve {name} differs (table {table}, {mode:?}) for {d:?} req {req:?}\n want {a:?}\n  got {b:?}"
                ));
            }
        }
        if lru != glru {
            return Err(format!("resolve lru differs ({mode:?}) for {d:?}"));
        }
    }
    Ok(())
}

fn pair_layers(rng: &mut Rng, n: u32) -> (Vec<LayerPair>, usize, usize) {
    let bs = rng.int(1, 6) as u32;
    let split = rng.pct(50);
    let (hb, db) = (rng.int(2, 9) as u32, rng.int(2, 9) as u32);
    let row = 16 * rng.int(1, 4) as u32;
    let value = if split && row > 16 { row - 16 } else { row };
    let mut layers = Vec::new();
    let (mut hoff, mut doff) = (0u64, 0u64);
    for _ in 0..n {
        let host = PageLayout {
            base: hoff,
            block_stride: u64::from(bs * row),
            num_blocks: hb,
            block_size: bs,
            row_bytes: row,
            value_bytes: value,
            index_stride_rows: bs,
        };
        let dstride = u64::from(bs * row) * u64::from(n) + 32;
        let device = PageLayout {
            base: doff,
            block_stride: dstride,
            num_blocks: db,
            block_size: bs,
            row_bytes: row,
            value_bytes: value,
            index_stride_rows: bs + rng.below(2) as u32,
        };
        hoff += u64::from(hb) * u64::from(bs * row);
        doff += u64::from(bs * row);
        layers.push(LayerPair { host, device });
    }
    let host_len = hoff as usize;
    let dev_len = (layers[0].device.block_stride * u64::from(db) + 64) as usize;
    (layers, host_len, dev_len)
}

fn fill(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next() as u8).collect()
}

fn check_copies(emu: &Emu, rng: &mut Rng) -> Result<(), String> {
    let nl = rng.int(1, 3) as u32;
    let (layers, hl, dl) = pair_layers(rng, nl);
    let l0 = layers[0];
    // gather
    let t = rng.int(1, 3) as u32;
    let k = rng.int(1, 40) as u32;
    let host_rows = i64::from(l0.host.num_blocks * l0.host.block_size);
    let dev_rows = i64::from(l0.device.num_blocks * l0.device.index_stride_rows);
    let mut used = std::collections::HashSet::new();
    let src: Vec<i32> = (0..t * k)
        .map(|_| rng.int(-1, host_rows + 2) as i32)
        .collect();
    let dst: Vec<i32> = (0..t * k)
        .map(|_| {
            loop {
                let v = rng.int(-1, dev_rows + 2) as i32;
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
        .map(|_| rng.int(-1, i64::from(k) + 2) as i32)
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
    let mut got = dev0.clone();
    let table = GatherLayers::new(&layers);
    emu.run(
        Kernel::GatherRows,
        (k.div_ceil(gk::GATHER_ROWS), t, nl),
        gk::GATHER_THREADS,
        0,
        &[
            p(&src),
            p(&dst),
            p(&counts),
            p(&host),
            pm(&mut got),
            Arg::U32(t),
            Arg::U32(k),
            Arg::Layers(&table),
        ],
    );
    if got != want {
        return Err("gather differs".into());
    }
    // page copies, both directions (distinct destinations)
    for dir in [Direction::DeviceToHost, Direction::HostToDevice] {
        let (sb, db) = match dir {
            Direction::DeviceToHost => (l0.device.num_blocks, l0.host.num_blocks),
            Direction::HostToDevice => (l0.host.num_blocks, l0.device.num_blocks),
        };
        let mut dsts: Vec<u32> = (0..db).collect();
        for i in (1..dsts.len()).rev() {
            dsts.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let pairs: Vec<BlockPair> = dsts
            .iter()
            .take(rng.int(1, i64::from(db)) as usize)
            .map(|&d| BlockPair {
                src: rng.below(u64::from(sb)) as u32,
                dst: d,
            })
            .collect();
        let (mut wh, mut wd) = (fill(rng, hl), fill(rng, dl));
        let (mut gh, mut gd) = (wh.clone(), wd.clone());
        copy_pages(
            &PageCopyDesc {
                direction: dir,
                layers: &layers,
            },
            &pairs,
            &mut wh,
            &mut wd,
        )
        .map_err(|e| e.to_string())?;
        let jobs: Vec<gk::PageJob> = layers
            .iter()
            .map(|l| {
                let (s, d) = match dir {
                    Direction::DeviceToHost => (l.device, l.host),
                    Direction::HostToDevice => (l.host, l.device),
                };
                gk::PageJob {
                    src_base: s.base,
                    src_stride: s.block_stride,
                    dst_base: d.base,
                    dst_stride: d.block_stride,
                    page_bytes: s.page_bytes(),
                }
            })
            .collect();
        let kp: Vec<gk::Pair> = pairs
            .iter()
            .map(|q| gk::Pair {
                src: q.src,
                dst: q.dst,
            })
            .collect();
        let (sp, dp) = match dir {
            Direction::DeviceToHost => (p(&gd), pm(&mut gh)),
            Direction::HostToDevice => (p(&gh), pm(&mut gd)),
        };
        emu.run(
            Kernel::CopyPages,
            (3, 1, 1),
            gk::COPY_THREADS,
            0,
            &[
                p(&jobs),
                Arg::U32(nl),
                p(&kp),
                Arg::U32(kp.len() as u32),
                sp,
                dp,
            ],
        );
        if gh != wh || gd != wd {
            return Err(format!("copy_pages {dir:?} differs"));
        }
        // row spans, one per distinct destination block
        let spans: Vec<RowSpan> = dsts
            .iter()
            .take(rng.int(1, i64::from(db)) as usize)
            .map(|&d| {
                let first = rng.below(u64::from(l0.host.block_size)) as u32;
                let num = rng.int(0, i64::from(l0.host.block_size - first)) as u32;
                let other = rng.below(u64::from(sb)) as u32;
                let (device_block, host_block) = match dir {
                    Direction::DeviceToHost => (other, d),
                    Direction::HostToDevice => (d, other),
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
        copy_rows(
            &RowCopyDesc {
                direction: dir,
                layers: &layers,
            },
            &spans,
            &mut wh,
            &mut wd,
        )
        .map_err(|e| e.to_string())?;
        let kl: Vec<gk::LayerPairAbi> = layers.iter().map(gk::LayerPairAbi::from).collect();
        let ks: Vec<gk::Span> = spans
            .iter()
            .map(|s| gk::Span {
                device_block: s.device_block,
                host_block: s.host_block,
                first_row: s.first_row,
                num_rows: s.num_rows,
            })
            .collect();
        let direction = match dir {
            Direction::DeviceToHost => gk::DIRECTION_DEVICE_TO_HOST,
            Direction::HostToDevice => gk::DIRECTION_HOST_TO_DEVICE,
        };
        emu.run(
            Kernel::CopyRows,
            (2, 1, 1),
            gk::COPY_THREADS,
            0,
            &[
                p(&kl),
                Arg::U32(nl),
                p(&ks),
                Arg::U32(ks.len() as u32),
                Arg::U32(direction),
                pm(&mut gh),
                pm(&mut gd),
            ],
        );
        if gh != wh || gd != wd {
            return Err(format!("copy_rows {dir:?} differs"));
        }
    }
    Ok(())
}

fn check_small_ops(emu: &Emu, rng: &mut Rng) -> Result<(), String> {
    // invalidate
    let (r, n, nr) = (
        rng.int(1, 3) as u32,
        rng.int(1, 300) as u32,
        rng.int(1, 600) as u32,
    );
    let ranges: Vec<i32> = (0..2 * nr).map(|_| rng.int(-2, 100) as i32).collect();
    let mut want: Vec<i32> = (0..r * n).map(|_| rng.int(-1, 100) as i32).collect();
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
            dgi: &mut want,
        },
    )
    .map_err(|e| e.to_string())?;
    emu.run(
        Kernel::Invalidate,
        (2, 1, 1),
        gk::INVALIDATE_THREADS,
        0,
        &[
            p(&ranges),
            Arg::U32(nr),
            pm(&mut got),
            Arg::U64(u64::from(r * n)),
        ],
    );
    if got != want {
        return Err("invalidate differs".into());
    }
    // compressed slot mapping
    let t = rng.int(1, 600) as u32;
    let ratio = rng.int(1, 4) as u32;
    let bs = ratio * rng.int(1, 8) as u32;
    let (rows, m) = (rng.int(1, 3) as u32, rng.int(1, 6) as u32);
    let pos: Vec<i32> = (0..t)
        .map(|_| rng.int(-2, i64::from(bs * m) + 8) as i32)
        .collect();
    let slots: Vec<i32> = (0..t).map(|_| rng.int(-1, 50) as i32).collect();
    let trow: Vec<i32> = (0..t)
        .map(|_| rng.int(-1, i64::from(rows)) as i32)
        .collect();
    let table: Vec<i32> = (0..rows * m).map(|_| rng.int(-1, 1 << 28) as i32).collect();
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
    emu.run(
        Kernel::CompressedSlotMapping,
        (t.div_ceil(gk::SLOT_THREADS), 1, 1),
        gk::SLOT_THREADS,
        0,
        &[
            p(&pos),
            p(&slots),
            p(&trow),
            p(&table),
            pm(&mut got),
            Arg::U32(t),
            Arg::U32(ratio),
            Arg::U32(bs),
            Arg::U32(rows),
            Arg::U32(m),
        ],
    );
    if got != want {
        return Err("compressed_slot_mapping differs".into());
    }
    Ok(())
}

/// Sparse table writes (random sorted unique indices, extreme values) and hot-state resets
/// (rows listed more than once), launched with grids smaller than the work (grid-stride).
fn check_tables(emu: &Emu, rng: &mut Rng) -> Result<(), String> {
    let len = rng.int(1, 3000) as u32;
    let density = *[1u64, 30, 100].get(rng.below(3) as usize).unwrap_or(&30);
    let mut writes = Vec::new();
    for index in 0..len {
        if rng.pct(density) {
            let value = match rng.below(4) {
                0 => -1,
                1 => i32::MIN,
                2 => i32::MAX,
                _ => rng.int(-1000, 1000) as i32,
            };
            writes.push(TableWrite { index, value });
        }
    }
    // Slack beyond the table: the kernel must not touch it.
    let table: Vec<i32> = (0..len + 8).map(|_| rng.int(-5, 5) as i32).collect();
    let desc = TableWriteDesc { table_len: len };
    let mut want = table.clone();
    write_table(&desc, &writes, &mut want[..len as usize]).map_err(|e| e.to_string())?;
    let mut got = table.clone();
    let abi: Vec<gk::TableWriteAbi> = writes.iter().map(gk::TableWriteAbi::from).collect();
    if !abi.is_empty() {
        emu.run(
            Kernel::WriteTable,
            (rng.int(1, 3) as u32, 1, 1),
            gk::TABLE_THREADS,
            0,
            &[
                p(&abi),
                Arg::U32(abi.len() as u32),
                pm(&mut got),
                Arg::U32(len),
            ],
        );
    }
    if got != want {
        return Err(format!(
            "write_table differs ({} writes over {len})",
            writes.len()
        ));
    }

    let (r, n) = (rng.int(1, 5) as u32, rng.int(1, 700) as u32);
    let rows: Vec<u32> = (0..rng.int(1, 8))
        .map(|_| rng.below(u64::from(r)) as u32)
        .collect();
    let desc = HotResetDesc {
        num_requests: r,
        hot_slots: n,
    };
    let dgi: Vec<i32> = (0..r * n).map(|_| rng.int(-1, 99) as i32).collect();
    let lru: Vec<u16> = (0..r * n).map(|_| rng.below(u64::from(n)) as u16).collect();
    let (mut want_dgi, mut want_lru) = (dgi.clone(), lru.clone());
    reset_hot_state(&desc, &rows, &mut want_dgi, &mut want_lru).map_err(|e| e.to_string())?;
    let (mut got_dgi, mut got_lru) = (dgi, lru);
    emu.run(
        Kernel::ResetHotState,
        (rng.int(1, 3) as u32, 1, 1),
        gk::TABLE_THREADS,
        0,
        &[
            p(&rows),
            Arg::U32(rows.len() as u32),
            pm(&mut got_dgi),
            pm(&mut got_lru),
            Arg::U32(r),
            Arg::U32(n),
        ],
    );
    if got_dgi != want_dgi || got_lru != want_lru {
        return Err(format!(
            "reset_hot_state differs (rows {rows:?}, {n} slots)"
        ));
    }
    Ok(())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("kernels_match_reference_on_cpu: test");
        return;
    }
    let required = std::env::var("HISPARSE_REQUIRE_CXX")
        .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"));
    let emu = match build() {
        Ok(e) => e,
        Err(e) if !required && e.starts_with("no C++ compiler") => {
            println!("SKIPPED: kernels_match_reference_on_cpu: {e}");
            println!("0 passed, 0 failed, 1 skipped");
            return;
        }
        Err(e) => {
            println!("FAILED: {e}");
            std::process::exit(1);
        }
    };
    let cases: u64 = std::env::var("HISPARSE_EMU_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let mut failures = Vec::new();
    for seed in 0..cases {
        let mut rng = Rng(0xC0FFEE ^ seed.wrapping_mul(0x9E37_79B9));
        let smem = match seed % 3 {
            0 => None,
            1 => Some(0),
            _ => Some(64),
        };
        let shared = ResolveMode {
            smem_table: smem,
            global: false,
            hot_slots: None,
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
            ("remap", check_remap(&emu, &mut rng)),
            ("resolve", check_resolve(&emu, &mut rng, shared)),
            (
                "resolve (global state)",
                check_resolve(&emu, &mut rng, global),
            ),
            (
                "resolve (global state, max hot slots)",
                check_resolve(&emu, &mut rng, global_max),
            ),
            ("copies", check_copies(&emu, &mut rng)),
            ("small ops", check_small_ops(&emu, &mut rng)),
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
    if failures.is_empty() {
        println!("ok: {cases} random seeds of every kernel match the reference on the CPU");
        println!("1 passed, 0 failed");
    } else {
        println!("0 passed, {} failed", failures.len());
        std::process::exit(1);
    }
}
