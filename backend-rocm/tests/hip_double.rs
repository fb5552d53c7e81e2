//! The ROCm backend's host plumbing against the HIP test double (`harness = false`): code-object
//! choice per architecture, the hiprtc fallback and its failure, error mapping (no device, ordinal,
//! out of memory), and cross-stream ordering through events.
//!
//! Each case runs in a child process of this binary with the double's environment knobs set
//! (`HISPARSE_HIP_DOUBLE_*`), because the runtime is loaded once per process. Without a HIP
//! runtime the cases report skipped (a failure under `HISPARSE_REQUIRE_DEVICE=1`); with a real ROCm
//! runtime they report skipped too, since they need the double's knobs (the conformance suite
//! runs on the real device instead).

use std::ffi::c_void;
use std::process::{Command, ExitCode};

use hisparse_backend_rocm::{KernelSource, RocmDevice, RocmError, RocmStream};
use hisparse_core::ops::copy::{copy_host_pages, copy_pages, copy_rows, gather_rows};
use hisparse_core::ops::remap::remap;
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, InvalidateArgs, InvalidateDesc, LayerPair,
    PageCopyDesc, PageLayout, RemapArgs, RemapDesc, ResolveArgs, ResolveDesc, RowCopyDesc, RowSpan,
    SlotMappingArgs, SlotMappingDesc,
};
use hisparse_core::{Device, Error, ErrorKind};

use hisparse_conformance::scenarios::{capture, lending};

type Env = &'static [(&'static str, &'static str)];

const ARCH: &str = "HISPARSE_HIP_DOUBLE_ARCH";

/// `(case, environment of the child)`.
const CASES: &[(&str, Env)] = &[
    ("code-object-gfx90a", &[(ARCH, "gfx90a:sramecc+:xnack-")]),
    ("code-object-gfx942", &[(ARCH, "gfx942:sramecc+:xnack-")]),
    ("code-object-gfx1100", &[(ARCH, "gfx1100")]),
    ("code-object-gfx1201", &[(ARCH, "gfx1201")]),
    ("hiprtc-gfx908", &[(ARCH, "gfx908:sramecc+:xnack-")]),
    (
        "hiprtc-failure-is-compilation",
        &[(ARCH, "gfx908"), ("HISPARSE_HIP_DOUBLE_RTC_FAIL", "1")],
    ),
    (
        "no-device-is-not-found",
        &[("HISPARSE_HIP_DOUBLE_DEVICES", "0")],
    ),
    ("ordinal-beyond-devices-is-not-found", &[]),
    (
        "out-of-device-memory",
        &[("HISPARSE_HIP_DOUBLE_MEMORY", "1048576")],
    ),
    ("events-order-streams", &[]),
    ("decode-path-never-blocks", &[]),
    ("split-launches-match-reference", &[]),
    ("engine-owned-memory-and-streams", &[]),
    ("query-event-reports-not-ready-then-completes", &[]),
    ("shared-host-pool-seen-through-two-mappings", &[]),
    ("decode-path-in-a-global-mode-graph", &[]),
    ("constant-layer-tables-placed-once", &[]),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let name = args.get(i + 1).map(String::as_str).unwrap_or_default();
        return match child(name) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.iter().any(|a| a == "--list") {
        for (name, _) in CASES {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let filter = args.iter().find(|a| !a.starts_with('-'));
    let selected: Vec<_> = CASES
        .iter()
        .filter(|(n, _)| filter.is_none_or(|f| n.contains(f.as_str())))
        .collect();

    // Only the double has the knobs these cases turn. A real runtime skips them (its device runs
    // the conformance suite instead); no runtime at all fails under HISPARSE_REQUIRE_DEVICE=1.
    let (skip_reason, missing) = match RocmDevice::open(0) {
        Ok(dev) if dev.device_name().contains("HIP test double") => (None, false),
        Ok(dev) => (
            Some(format!("{} is not the HIP test double", dev.device_name())),
            false,
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => (Some(format!("no HIP runtime: {e}")), true),
        Err(e) => {
            println!("FAIL open: {e} [{}]", e.kind());
            return ExitCode::FAILURE;
        }
    };
    if let Some(why) = skip_reason {
        println!("SKIPPED: {why}");
        for (name, _) in &selected {
            println!("skip {name}");
        }
        if missing && hisparse_conformance::device_required() {
            println!("0 passed, 1 failed (HISPARSE_REQUIRE_DEVICE=1 demands a HIP runtime)");
            return ExitCode::FAILURE;
        }
        println!("0 passed, 0 failed, {} skipped", selected.len());
        return ExitCode::SUCCESS;
    }

    let exe = std::env::current_exe().expect("test binary path");
    let (mut passed, mut failed) = (0, 0);
    for (name, env) in selected {
        let mut cmd = Command::new(&exe);
        cmd.arg("--child").arg(name);
        for (k, v) in env.iter() {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("spawn the test binary");
        if out.status.success() {
            passed += 1;
            println!("ok   {name}");
        } else {
            failed += 1;
            println!(
                "FAIL {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn child(name: &str) -> Result<(), String> {
    match name {
        "code-object-gfx90a" => kernels_from(KernelSource::CodeObject("gfx90a")),
        "code-object-gfx942" => kernels_from(KernelSource::CodeObject("gfx942")),
        "code-object-gfx1100" => kernels_from(KernelSource::CodeObject("gfx1100")),
        "code-object-gfx1201" => kernels_from(KernelSource::CodeObject("gfx1201")),
        "hiprtc-gfx908" => kernels_from(KernelSource::Hiprtc("gfx908:sramecc+:xnack-".into())),
        "hiprtc-failure-is-compilation" => {
            let e = open_err(0)?;
            expect_kind(&e, ErrorKind::Compilation)?;
            let msg = e.to_string();
            if !msg.contains("injected failure") {
                return Err(format!("the compiler log is missing from `{msg}`"));
            }
            Ok(())
        }
        "no-device-is-not-found" => expect_kind(&open_err(0)?, ErrorKind::NotFound),
        "ordinal-beyond-devices-is-not-found" => expect_kind(&open_err(1)?, ErrorKind::NotFound),
        "out-of-device-memory" => {
            let dev = open()?;
            let e = dev.alloc(2 << 20).err().ok_or("2 MiB fit a 1 MiB device")?;
            expect_kind(&e, ErrorKind::OutOfDeviceMemory)?;
            dev.alloc(1 << 19).map(drop).map_err(|e| e.to_string())
        }
        "events-order-streams" => events_order_streams(),
        "decode-path-never-blocks" => decode_path_never_blocks(),
        "split-launches-match-reference" => split_launches_match_reference(),
        "engine-owned-memory-and-streams" => engine_owned_memory_and_streams(),
        "query-event-reports-not-ready-then-completes" => query_event_not_ready_then_complete(),
        "shared-host-pool-seen-through-two-mappings" => shared_host_pool_two_mappings(),
        "decode-path-in-a-global-mode-graph" => decode_path_in_a_global_mode_graph(),
        "constant-layer-tables-placed-once" => constant_layer_tables_placed_once(),
        other => Err(format!("unknown case {other}")),
    }
}

fn open() -> Result<RocmDevice, String> {
    RocmDevice::open(0).map_err(|e| format!("open: {e} [{}]", e.kind()))
}

fn open_err(ordinal: usize) -> Result<RocmError, String> {
    match RocmDevice::open(ordinal) {
        Ok(d) => Err(format!("opened {}", d.device_name())),
        Err(e) => Ok(e),
    }
}

fn expect_kind(e: &RocmError, kind: ErrorKind) -> Result<(), String> {
    if e.kind() == kind {
        Ok(())
    } else {
        Err(format!("`{e}` is {:?}, expected {kind:?}", e.kind()))
    }
}

fn bytes_of(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// Opens the device, checks where the kernels came from, and runs a remap bit-exactly.
fn kernels_from(expected: KernelSource) -> Result<(), String> {
    let dev = open()?;
    if *dev.kernel_source() != expected {
        return Err(format!(
            "kernels from {}, expected {expected}",
            dev.kernel_source()
        ));
    }
    let desc = RemapDesc {
        num_tokens: 2,
        top_k: 5,
        table_rows: 2,
        max_blocks: 2,
        block_size: 4,
        block_stride_rows: 10,
        idx_mapping_len: None,
        write_counts: true,
        compact: true,
        stats_slot: 0,
    };
    let (req, table, topk) = ([1, 0], [3, 5, 7, -1], [0, 5, -1, 8, 3, 1, 4, 2, 3, 9]);
    let mut want = [0i32; 10];
    let mut want_counts = [0i32; 2];
    remap(
        &desc,
        RemapArgs {
            req_id: &req[..],
            block_table: &table[..],
            topk: &topk[..],
            idx_mapping: None,
            out: &mut want[..],
            counts: Some(&mut want_counts[..]),
            stats: None,
        },
    )
    .map_err(|e| e.to_string())?;
    let e = |e: RocmError| e.to_string();
    let upload = |v: &[i32]| -> Result<_, String> {
        let mut b = dev.alloc(v.len() * 4).map_err(e)?;
        dev.upload(&mut b, 0, &bytes_of(v)).map_err(e)?;
        Ok(b)
    };
    let (r, t, k) = (upload(&req)?, upload(&table)?, upload(&topk)?);
    let mut out = upload(&[7; 10])?;
    let mut counts = upload(&[7; 2])?;
    let stream = dev.create_stream().map_err(e)?;
    dev.remap(
        &stream,
        &desc,
        RemapArgs {
            req_id: &r,
            block_table: &t,
            topk: &k,
            idx_mapping: None,
            out: &mut out,
            counts: Some(&mut counts),
            stats: None,
        },
    )
    .map_err(e)?;
    dev.synchronize(&stream).map_err(e)?;
    let mut got = vec![0u8; 40];
    dev.download(&out, 0, &mut got).map_err(e)?;
    let mut got_counts = vec![0u8; 8];
    dev.download(&counts, 0, &mut got_counts).map_err(e)?;
    // 64 KiB of shared memory per block (the double, like current AMD GPUs): the staged hot-table
    // row and the resolve state of up to 9736 hot slots fit it (4096 + 3 x 19472 + 2 x 1232 bytes
    // of 64992), larger ones (up to the contract's 32768) live in global memory.
    if dev.max_shared_hot_slots() != 9_736 {
        return Err(format!(
            "max_shared_hot_slots() = {}, expected 9736",
            dev.max_shared_hot_slots()
        ));
    }
    if dev.max_hot_slots() != hisparse_core::ops::MAX_HOT_SLOTS {
        return Err(format!(
            "max_hot_slots() = {}, expected {}",
            dev.max_hot_slots(),
            hisparse_core::ops::MAX_HOT_SLOTS
        ));
    }
    let launches = double_launches(dev.runtime_path(), c"hs_remap")?;
    if launches != 1 {
        return Err(format!(
            "the double ran hs_remap {launches} times, expected once"
        ));
    }
    if got != bytes_of(&want) || got_counts != bytes_of(&want_counts) {
        return Err(format!(
            "remap differs from the reference: {got:?} / {got_counts:?}, want {want:?} / {want_counts:?}"
        ));
    }
    Ok(())
}

/// Calls the double counts as blocking or allocating (its `hisparse_hip_double_blocking_calls`).
fn double_blocking_calls(library: &str) -> Result<u64, String> {
    // SAFETY: as in `double_launches`: the already loaded double.
    let lib = unsafe { libloading::Library::new(library) }.map_err(|e| e.to_string())?;
    // SAFETY: the double exports this symbol with exactly this signature.
    let f = unsafe {
        lib.get::<unsafe extern "C" fn() -> u64>(b"hisparse_hip_double_blocking_calls\0")
    }
    .map_err(|e| e.to_string())?;
    // SAFETY: no arguments.
    Ok(unsafe { f() })
}

/// Every decode-path operation (remap, resolve — with the wanted-row table in the workspace —,
/// gather, invalidate, compressed slot mapping), once the stream is warm, makes no call that
/// blocks the host or allocates: contract §5 requires them to be capturable.
fn decode_path_never_blocks() -> Result<(), String> {
    let dev = open()?;
    let e = |e: RocmError| e.to_string();
    let zeroed = |bytes: usize| dev.alloc(bytes).map_err(e);
    let (t, k, n, bs, pages) = (2u32, 2048u32, 4096u32, 64u32, 64u32);
    let tk = (t * k) as usize;
    let resolve_desc = ResolveDesc {
        num_tokens: t,
        top_k: k,
        num_requests: 1,
        max_pages: pages,
        block_size: bs,
        hot_slots: n,
        attention_block_stride: bs,
        host_num_blocks: pages,
        num_state_rows: None,
        stats_slot: 0,
    };
    let mut req = zeroed(t as usize * 4)?;
    dev.upload(&mut req, 0, &bytes_of(&[0, 0])).map_err(e)?;
    let mut topk = zeroed(tk * 4)?;
    let toks: Vec<i32> = (0..tk as i32)
        .map(|i| (i * 3) % (pages * bs) as i32)
        .collect();
    dev.upload(&mut topk, 0, &bytes_of(&toks)).map_err(e)?;
    let resident = zeroed(pages as usize * 4)?;
    let mut host_table = zeroed(pages as usize * 4)?;
    dev.upload(
        &mut host_table,
        0,
        &bytes_of(&(0..pages as i32).collect::<Vec<_>>()),
    )
    .map_err(e)?;
    let mut hot_table = zeroed(resolve_desc.hot_table_width() as usize * 4)?;
    let hot: Vec<i32> = (0..resolve_desc.hot_table_width() as i32).collect();
    dev.upload(&mut hot_table, 0, &bytes_of(&hot)).map_err(e)?;
    let mut slot_host_rows = zeroed(n as usize * 4)?;
    let mut lru = zeroed(n as usize * 2)?;
    let mut outs = Vec::new();
    for len in [tk, t as usize, t as usize, t as usize, tk, tk] {
        outs.push(zeroed(len * 4)?);
    }
    let row = PageLayout::contiguous(0, u64::from(bs) * 16, pages, bs, 16);
    let layer = LayerPair {
        host: row,
        device: row,
    };
    let host_pool = dev
        .alloc_pinned(pages as usize * bs as usize * 16)
        .map_err(e)?;
    let mut device_pool = zeroed(pages as usize * bs as usize * 16)?;
    let mut ranges = zeroed(8)?;
    dev.upload(&mut ranges, 0, &bytes_of(&[0, 64])).map_err(e)?;
    let mut slot_out = zeroed(t as usize * 4)?;
    let mut remap_out = zeroed(tk * 4)?;
    let remap_desc = RemapDesc {
        num_tokens: t,
        top_k: k,
        table_rows: 1,
        max_blocks: pages,
        block_size: bs,
        block_stride_rows: bs,
        idx_mapping_len: None,
        write_counts: false,
        compact: true,
        stats_slot: 0,
    };
    let stream = dev.create_stream().map_err(e)?;
    let mut round = || -> Result<(), String> {
        dev.remap(
            &stream,
            &remap_desc,
            RemapArgs {
                req_id: &req,
                block_table: &host_table,
                topk: &topk,
                idx_mapping: None,
                out: &mut remap_out,
                counts: None,
                stats: None,
            },
        )
        .map_err(e)?;
        let [indices, valid, hits, misses, src, dst] = &mut outs[..] else {
            unreachable!("six outputs")
        };
        dev.resolve(
            &stream,
            &resolve_desc,
            ResolveArgs {
                req_id: &req,
                topk: &topk,
                resident_table: &resident,
                host_table: &host_table,
                hot_table: &hot_table,
                slot_host_rows: &mut slot_host_rows,
                lru: &mut lru,
                indices,
                valid_counts: valid,
                hit_counts: hits,
                miss_counts: misses,
                miss_src: src,
                miss_dst: dst,
                idx_mapping: None,
                stats: None,
            },
        )
        .map_err(e)?;
        dev.gather_rows(
            &stream,
            &GatherDesc {
                num_tokens: t,
                top_k: k,
                layers: &[layer],
            },
            GatherArgs {
                plan_src: &outs[4],
                plan_dst: &outs[5],
                plan_counts: &outs[3],
                host: &host_pool,
                device: &mut device_pool,
            },
        )
        .map_err(e)?;
        dev.invalidate(
            &stream,
            &InvalidateDesc {
                num_requests: 1,
                hot_slots: n,
                num_ranges: 1,
            },
            InvalidateArgs {
                ranges: &ranges,
                slot_host_rows: &mut slot_host_rows,
            },
        )
        .map_err(e)?;
        dev.compressed_slot_mapping(
            &stream,
            &SlotMappingDesc {
                num_tokens: t,
                ratio: 4,
                block_size: bs,
                table_rows: 1,
                max_blocks: pages,
            },
            SlotMappingArgs {
                positions: &req,
                slot_mapping: &req,
                table_row: &req,
                block_table: &host_table,
                out: &mut slot_out,
            },
        )
        .map_err(e)
    };
    // Warm-up: the stream's resolve scratch is allocated here.
    round()?;
    dev.synchronize(&stream).map_err(e)?;
    let before = double_blocking_calls(dev.runtime_path())?;
    for _ in 0..3 {
        round()?;
    }
    let after = double_blocking_calls(dev.runtime_path())?;
    dev.synchronize(&stream).map_err(e)?;
    if after != before {
        return Err(format!(
            "{} blocking or allocating HIP calls during three warm decode rounds",
            after - before
        ));
    }
    let launches = double_launches(dev.runtime_path(), c"hs_resolve")?;
    if launches != 4 {
        return Err(format!("hs_resolve ran {launches} times, expected 4"));
    }
    Ok(())
}

/// Operations the backend must split over several launches — a gather of more layers than one
/// launch carries, page copies whose destinations repeat or overlap a source (copy-on-write
/// chains), row copies whose destinations repeat — still equal the reference, which applies them
/// in order.
fn split_launches_match_reference() -> Result<(), String> {
    let dev = open()?;
    let e = |e: RocmError| e.to_string();
    let (bs, row, blocks, nl) = (4u32, 32u32, 6u32, 20usize);
    let page = u64::from(bs * row);
    // Layer-major pools: layer l's pages at l * blocks * page.
    let layers: Vec<LayerPair> = (0..nl as u64)
        .map(|l| {
            let host = PageLayout {
                base: l * u64::from(blocks) * page,
                block_stride: page,
                num_blocks: blocks,
                block_size: bs,
                row_bytes: row,
                value_bytes: 16,
                index_stride_rows: bs,
            };
            LayerPair { host, device: host }
        })
        .collect();
    let len = nl * blocks as usize * page as usize;
    let pattern = |seed: u8| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    };
    let stream = dev.create_stream().map_err(e)?;

    let check = |what: &str, host: &[u8], dev_bytes: &[u8], h: &_, d: &_| -> Result<(), String> {
        let mut got_h = vec![0u8; len];
        dev.read_pinned(h, 0, &mut got_h).map_err(e)?;
        let mut got_d = vec![0u8; len];
        dev.download(d, 0, &mut got_d).map_err(e)?;
        if got_h != host || got_d != dev_bytes {
            return Err(format!("{what} differs from the reference"));
        }
        Ok(())
    };
    let mut ref_host = pattern(1);
    let mut ref_dev = pattern(2);
    let mut h = dev.alloc_pinned(len).map_err(e)?;
    dev.write_pinned(&mut h, 0, &ref_host).map_err(e)?;
    let mut d = dev.alloc(len).map_err(e)?;
    dev.upload(&mut d, 0, &ref_dev).map_err(e)?;

    // Gather over 20 layers (two launches), plan rows 0..8 of the pool with one zero-fill.
    let plan_src = [0, 5, -1, 9, 13, 2, 22, 7];
    let plan_dst = [3, 4, 5, 6, 7, 8, 9, 10];
    let counts = [8];
    let up = |v: &[i32]| -> Result<_, String> {
        let mut b = dev.alloc(v.len() * 4).map_err(e)?;
        dev.upload(&mut b, 0, &bytes_of(v)).map_err(e)?;
        Ok(b)
    };
    let (ps, pd, pc) = (up(&plan_src)?, up(&plan_dst)?, up(&counts)?);
    let desc = GatherDesc {
        num_tokens: 1,
        top_k: 8,
        layers: &layers,
    };
    gather_rows(
        &desc,
        GatherArgs {
            plan_src: &plan_src[..],
            plan_dst: &plan_dst[..],
            plan_counts: &counts[..],
            host: &ref_host[..],
            device: &mut ref_dev[..],
        },
    )
    .map_err(|e| e.to_string())?;
    dev.gather_rows(
        &stream,
        &desc,
        GatherArgs {
            plan_src: &ps,
            plan_dst: &pd,
            plan_counts: &pc,
            host: &h,
            device: &mut d,
        },
    )
    .map_err(e)?;
    dev.synchronize(&stream).map_err(e)?;
    check("gather over 20 layers", &ref_host, &ref_dev, &h, &d)?;

    // Copy-on-write chain 1 -> 2 -> 3 and a repeated destination: order matters.
    let chain = [
        BlockPair { src: 1, dst: 2 },
        BlockPair { src: 2, dst: 3 },
        BlockPair { src: 0, dst: 4 },
        BlockPair { src: 5, dst: 4 },
    ];
    let host_layers: Vec<PageLayout> = layers.iter().map(|l| l.host).collect();
    copy_host_pages(&host_layers, &chain, &mut ref_host).map_err(|e| e.to_string())?;
    dev.copy_host_pages(&stream, &host_layers, &chain, &mut h)
        .map_err(e)?;
    dev.synchronize(&stream).map_err(e)?;
    check("copy_host_pages chain", &ref_host, &ref_dev, &h, &d)?;

    // Page restores with a repeated destination: the later pair wins.
    let dup = [BlockPair { src: 1, dst: 0 }, BlockPair { src: 3, dst: 0 }];
    let pd_desc = PageCopyDesc {
        direction: Direction::HostToDevice,
        layers: &layers,
    };
    copy_pages(&pd_desc, &dup, &mut ref_host, &mut ref_dev).map_err(|e| e.to_string())?;
    dev.copy_pages(&stream, &pd_desc, &dup, &mut h, &mut d)
        .map_err(e)?;
    dev.synchronize(&stream).map_err(e)?;
    check(
        "copy_pages with a repeated destination",
        &ref_host,
        &ref_dev,
        &h,
        &d,
    )?;

    // Row mirrors writing the same host rows twice from different device blocks.
    let spans = [
        RowSpan {
            device_block: 1,
            host_block: 5,
            first_row: 0,
            num_rows: 3,
        },
        RowSpan {
            device_block: 2,
            host_block: 5,
            first_row: 2,
            num_rows: 2,
        },
    ];
    let rd = RowCopyDesc {
        direction: Direction::DeviceToHost,
        layers: &layers,
    };
    copy_rows(&rd, &spans, &mut ref_host, &mut ref_dev).map_err(|e| e.to_string())?;
    dev.copy_rows(&stream, &rd, &spans, &mut h, &mut d)
        .map_err(e)?;
    dev.synchronize(&stream).map_err(e)?;
    check("copy_rows with repeated rows", &ref_host, &ref_dev, &h, &d)?;
    let launches = double_launches(dev.runtime_path(), c"hs_gather_rows")?;
    if launches != 2 {
        return Err(format!(
            "hs_gather_rows ran {launches} times, expected 2 (20 layers)"
        ));
    }
    Ok(())
}

/// Kernel launches of `name` the double executed (its `hisparse_hip_double_launches` export).
fn double_launches(library: &str, name: &std::ffi::CStr) -> Result<u64, String> {
    // SAFETY: the library is the HIP test double the backend already loaded (the dynamic loader
    // returns the same instance); loading runs no new initialisers.
    let lib = unsafe { libloading::Library::new(library) }.map_err(|e| e.to_string())?;
    // SAFETY: the double exports this symbol with exactly this signature.
    let f = unsafe {
        lib.get::<unsafe extern "C" fn(*const std::ffi::c_char) -> u64>(
            b"hisparse_hip_double_launches\0",
        )
    }
    .map_err(|e| e.to_string())?;
    // SAFETY: `name` is NUL-terminated.
    Ok(unsafe { f(name.as_ptr()) })
}

/// Stream B copies out what stream A copied in. With an event between them the data arrives;
/// without, the double (which runs queued work only when waited for) shows the stale bytes, so
/// the first half proves the backend's event plumbing orders the streams.
fn events_order_streams() -> Result<(), String> {
    let dev = open()?;
    let e = |e: RocmError| e.to_string();
    let n = 4096;
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8 + 1).collect();
    for with_event in [true, false] {
        let mut src = dev.alloc_pinned(n).map_err(e)?;
        dev.write_pinned(&mut src, 0, &data).map_err(e)?;
        let mut dst = dev.alloc_pinned(n).map_err(e)?;
        let mut buf = dev.alloc(n).map_err(e)?;
        let (a, b) = (
            dev.create_stream().map_err(e)?,
            dev.create_stream().map_err(e)?,
        );
        dev.copy_to_device(&a, &src, 0, &mut buf, 0, n).map_err(e)?;
        if with_event {
            let ev = dev.record_event(&a).map_err(e)?;
            dev.wait_event(&b, &ev).map_err(e)?;
        }
        dev.copy_to_host(&b, &buf, 0, &mut dst, 0, n).map_err(e)?;
        dev.synchronize(&b).map_err(e)?;
        let mut got = vec![0u8; n];
        dev.read_pinned(&dst, 0, &mut got).map_err(e)?;
        match (with_event, got == data) {
            (true, false) => {
                return Err("stream B ran before stream A's copy despite the event".into());
            }
            (false, true) => {
                return Err(
                    "without an event stream B still saw A's data: the double does not \
                            model stream order"
                        .into(),
                );
            }
            _ => {}
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Engine-owned memory and streams
// ------------------------------------------------------------------------------------------------

type HipStatus = u32;

/// The HIP entry points an engine would call itself, from the runtime the backend loaded.
struct EngineHip {
    _lib: libloading::Library,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipStatus,
    free: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> HipStatus,
    host_free: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    memset: unsafe extern "C" fn(*mut c_void, i32, usize) -> HipStatus,
    memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, u32, *mut c_void) -> HipStatus,
    stream_create: unsafe extern "C" fn(*mut *mut c_void, u32) -> HipStatus,
    stream_destroy: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    pointer_attributes: unsafe extern "C" fn(*mut c_void, *const c_void) -> HipStatus,
}

impl EngineHip {
    fn load(path: &str) -> Result<EngineHip, String> {
        // SAFETY: the HIP runtime (here the test double) the backend already loaded.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the runtime exports the symbol with the signature of the field it is
                // stored in (HIP's C API); the library is kept loaded beside the pointers.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{}: {e}", $name))?
            };
        }
        Ok(EngineHip {
            malloc: sym!("hipMalloc"),
            free: sym!("hipFree"),
            host_malloc: sym!("hipHostMalloc"),
            host_free: sym!("hipHostFree"),
            memset: sym!("hipMemset"),
            memcpy_async: sym!("hipMemcpyAsync"),
            stream_create: sym!("hipStreamCreateWithFlags"),
            stream_destroy: sym!("hipStreamDestroy"),
            stream_synchronize: sym!("hipStreamSynchronize"),
            pointer_attributes: sym!("hipPointerGetAttributes"),
            _lib: lib,
        })
    }

    /// The memory type `hipPointerGetAttributes` reports (HIP 6: 0 unregistered, 1 host, 2
    /// device).
    fn memory_type(&self, p: *const c_void) -> u32 {
        let mut attrs = [0u64; 8];
        // SAFETY: 64 writable, 8-aligned bytes, more than hipPointerAttribute_t.
        let s = unsafe { (self.pointer_attributes)(attrs.as_mut_ptr().cast(), p) };
        if s != 0 { 0 } else { attrs[0] as u32 }
    }
}

fn hip_ok(call: &str, s: HipStatus) -> Result<(), String> {
    if s == 0 {
        Ok(())
    } else {
        Err(format!("{call}: hipError {s}"))
    }
}

/// Memory and streams the engine allocated; freed by the engine at the end.
struct Engine {
    hip: EngineHip,
    device: Vec<*mut c_void>,
    pinned: Vec<*mut c_void>,
    plain: Vec<(*mut u8, std::alloc::Layout)>,
    streams: Vec<*mut c_void>,
}

impl Engine {
    fn device(&mut self, len: usize) -> Result<*mut c_void, String> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is an out-pointer.
        hip_ok("hipMalloc", unsafe { (self.hip.malloc)(&mut p, len) })?;
        self.device.push(p);
        // SAFETY: `p` addresses `len` bytes just allocated.
        hip_ok("hipMemset", unsafe { (self.hip.memset)(p, 0, len) })?;
        Ok(p)
    }

    fn pinned(&mut self, len: usize) -> Result<*mut u8, String> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is an out-pointer; mapped | portable.
        hip_ok("hipHostMalloc", unsafe {
            (self.hip.host_malloc)(&mut p, len, 3)
        })?;
        self.pinned.push(p);
        // SAFETY: `p` addresses `len` bytes of host memory just allocated.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
        Ok(p.cast())
    }

    fn plain(&mut self, len: usize) -> Result<*mut u8, String> {
        let layout = std::alloc::Layout::from_size_align(len, 4096).map_err(|e| e.to_string())?;
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err("host allocation failed".into());
        }
        self.plain.push((p, layout));
        Ok(p)
    }

    fn release(self) -> Result<(), String> {
        for s in &self.streams {
            let what = "hipStreamSynchronize after the lent stream dropped";
            // SAFETY: the engine's stream; a stream the backend destroyed would be refused.
            hip_ok(what, unsafe { (self.hip.stream_synchronize)(*s) })?;
            // SAFETY: destroyed once, here.
            hip_ok("hipStreamDestroy", unsafe { (self.hip.stream_destroy)(*s) })?;
        }
        for p in &self.device {
            // SAFETY: from hipMalloc above, freed once; memory the backend freed would be refused.
            hip_ok("hipFree after the lent buffers dropped", unsafe {
                (self.hip.free)(*p)
            })?;
        }
        for p in &self.pinned {
            // SAFETY: from hipHostMalloc above, freed once.
            hip_ok("hipHostFree after the lent buffers dropped", unsafe {
                (self.hip.host_free)(*p)
            })?;
        }
        for &(p, layout) in &self.plain {
            // SAFETY: allocated above with this layout, unregistered by the backend, freed once.
            unsafe { std::alloc::dealloc(p, layout) };
        }
        Ok(())
    }
}

impl lending::Lender<RocmDevice> for Engine {
    fn buffer(
        &mut self,
        dev: &RocmDevice,
        len: usize,
    ) -> Result<hisparse_backend_rocm::RocmBuffer, String> {
        let base = self.device(len + 512)?;
        // SAFETY: the engine frees the allocation only in `release`, after the lent buffers dropped.
        unsafe { dev.lend_device_memory(base.wrapping_byte_add(256), len) }
            .map_err(|e| e.to_string())
    }

    fn host(
        &mut self,
        dev: &RocmDevice,
        len: usize,
        second: bool,
    ) -> Result<hisparse_backend_rocm::RocmHostBuffer, String> {
        let p = if second {
            self.plain(len)?
        } else {
            self.pinned(len)?
        };
        // SAFETY: freed only in `release`, after the lent buffers dropped.
        let buf = unsafe { dev.lend_host_memory(p, len) }.map_err(|e| e.to_string())?;
        if dev.registered_here(&buf) != second {
            return Err("registration does not match the memory's origin".into());
        }
        Ok(buf)
    }

    fn stream(&mut self, dev: &RocmDevice) -> Result<hisparse_backend_rocm::RocmStream, String> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is an out-pointer; non-blocking.
        hip_ok("hipStreamCreateWithFlags", unsafe {
            (self.hip.stream_create)(&mut raw, 1)
        })?;
        self.streams.push(raw);
        // SAFETY: destroyed only in `release`, after the lent stream dropped.
        unsafe { dev.lend_stream(raw) }.map_err(|e| e.to_string())
    }

    fn engine_copy(
        &mut self,
        dev: &RocmDevice,
        stream: &hisparse_backend_rocm::RocmStream,
        src: &hisparse_backend_rocm::RocmHostBuffer,
        dst: &mut hisparse_backend_rocm::RocmBuffer,
        bytes: usize,
    ) -> Result<(), String> {
        let raw = stream.raw_handle();
        if !self.streams.contains(&raw) {
            return Err("the lent stream's handle is not the engine's".into());
        }
        let src = dev.pinned_address(src) as *const c_void;
        // SAFETY: pinned source and device destination of at least `bytes`, alive until the
        // stream's work completed.
        hip_ok("hipMemcpyAsync", unsafe {
            (self.hip.memcpy_async)(dst.device_address() as *mut c_void, src, bytes, 1, raw)
        })
    }
}

/// The engine allocates device memory, pinned and plain host memory and a stream through the
/// runtime and lends them to the backend, which runs the shared scenario on them and on its own
/// buffers, and the results must be identical; afterwards the engine's memory and stream are
/// still alive, registered memory is unregistered, and bad arguments are refused.
fn engine_owned_memory_and_streams() -> Result<(), String> {
    let dev = open()?;
    let owned = lending::scenario(&dev, &mut lending::Owned)?;
    let mut engine = Engine {
        hip: EngineHip::load(dev.runtime_path())?,
        device: Vec::new(),
        pinned: Vec::new(),
        plain: Vec::new(),
        streams: Vec::new(),
    };
    let lent = lending::scenario(&dev, &mut engine)?;
    lending::compare(&owned, &lent)?;
    for &(p, _) in &engine.plain {
        if engine.hip.memory_type(p.cast()) != 0 {
            return Err("memory the backend registered is still pinned after drop".into());
        }
    }
    for &p in &engine.pinned {
        if engine.hip.memory_type(p) != 1 {
            return Err("the engine's pinned memory was unpinned by the backend".into());
        }
    }
    let d = engine.device(4096)?;
    let pinned = engine.pinned(8192)?;
    let plain = engine.plain(8192)?;
    let refused = |what: &str, r: Result<(), RocmError>| -> Result<(), String> {
        match r {
            Err(err) if err.kind() == ErrorKind::InvalidArgument => Ok(()),
            Err(err) => Err(format!("{what}: `{err}` is {:?}", err.kind())),
            Ok(()) => Err(format!("{what}: accepted")),
        }
    };
    // SAFETY: every call is refused before anything is kept (one accepted by mistake is dropped
    // at once, before the engine frees the memory); the bogus stream handle goes to the HIP test
    // double (these cases run only on it), which looks handles up instead of dereferencing them.
    unsafe {
        refused(
            "device range past its allocation",
            dev.lend_device_memory(d, 4097).map(drop),
        )?;
        refused(
            "misaligned device pointer",
            dev.lend_device_memory(d.wrapping_byte_add(8), 64).map(drop),
        )?;
        refused(
            "host memory as device memory",
            dev.lend_device_memory(pinned.cast(), 64).map(drop),
        )?;
        refused(
            "plain memory as device memory",
            dev.lend_device_memory(plain.cast(), 64).map(drop),
        )?;
        refused(
            "device memory as host memory",
            dev.lend_host_memory(d.cast(), 4096).map(drop),
        )?;
        // Far past its allocation, into memory nobody mapped (an adjacent pinned allocation
        // would look like one pinned, linearly mapped range).
        refused(
            "pinned range far past its allocation",
            dev.lend_host_memory(pinned, 8192 + (1 << 40)).map(drop),
        )?;
        refused(
            "misaligned host memory",
            dev.lend_host_memory(plain.add(16), 4096).map(drop),
        )?;
        refused("empty host range", dev.lend_host_memory(plain, 0).map(drop))?;
        refused(
            "a destroyed-looking stream handle",
            dev.lend_stream(0x12345 as *mut c_void).map(drop),
        )?;
    }
    if engine.hip.memory_type(plain.cast()) != 0 {
        return Err("a refused registration left the memory pinned".into());
    }
    engine.release()
}

/// `query_event` on work still queued answers false first, then true once the work ran, and
/// the work's result is visible then, without any synchronisation.
fn query_event_not_ready_then_complete() -> Result<(), String> {
    let dev = open()?;
    let e = |e: RocmError| e.to_string();
    let n: usize = 1 << 16;
    let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let src = {
        let mut b = dev.alloc(n).map_err(e)?;
        dev.upload(&mut b, 0, &data).map_err(e)?;
        b
    };
    let mut dst = dev.alloc_pinned(n).map_err(e)?;
    let s = dev.create_stream().map_err(e)?;
    dev.copy_to_host(&s, &src, 0, &mut dst, 0, n).map_err(e)?;
    let ev = dev.record_event(&s).map_err(e)?;
    if dev.query_event(&ev).map_err(e)? {
        return Err("the event of queued work was complete before the work ran".into());
    }
    let mut polls = 0;
    while !dev.query_event(&ev).map_err(e)? {
        polls += 1;
        if polls > 1000 {
            return Err("query_event never answered true".into());
        }
    }
    // Read the pinned memory directly, without the synchronising read_pinned.
    let got = {
        let mut v = vec![0u8; n];
        // SAFETY: the event completed, so the copy into the pinned buffer has finished; nothing
        // else writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(dev.pinned_address(&dst) as *const u8, v.as_mut_ptr(), n)
        };
        v
    };
    if got != data {
        return Err("the copy's result is not visible once query_event answered true".into());
    }
    Ok(())
}

/// One shared-memory segment mapped twice (as two ranks of a node would), each mapping a host
/// buffer of the device: a device→host copy into one is read back by a host→device copy from the
/// other; the opener's buffer drops first and the creator's still works; registering a mapping
/// the runtime already knows is refused.
fn shared_host_pool_two_mappings() -> Result<(), String> {
    use hisparse_host_memory::SharedSegment;
    let dev = open()?;
    let e = |e: RocmError| e.to_string();
    let n: usize = 1 << 16;
    let name = SharedSegment::unique_name("hisparse-rocm-test");
    let seg_a = SharedSegment::create(&name, n).map_err(|e| e.to_string())?;
    let seg_b = SharedSegment::open(&name, n).map_err(|e| e.to_string())?;
    let mut a = dev.host_buffer_from_shared(seg_a).map_err(e)?;
    let b = dev.host_buffer_from_shared(seg_b).map_err(e)?;
    if !(a.is_shared() && b.is_shared() && dev.registered_here(&a)) {
        return Err("a shared buffer is not marked as a registered shared segment".into());
    }
    if dev.pinned_address(&a) == dev.pinned_address(&b) {
        return Err("the two mappings have one address".into());
    }
    let data: Vec<u8> = (0..4096).map(|i| (i * 7 % 251) as u8).collect();
    let s = dev.create_stream().map_err(e)?;
    let mut src = dev.alloc(4096).map_err(e)?;
    dev.upload(&mut src, 0, &data).map_err(e)?;
    dev.copy_to_host(&s, &src, 0, &mut a, 8192, 4096)
        .map_err(e)?;
    dev.synchronize(&s).map_err(e)?;
    let mut back = dev.alloc(4096).map_err(e)?;
    dev.copy_to_device(&s, &b, 8192, &mut back, 0, 4096)
        .map_err(e)?;
    dev.synchronize(&s).map_err(e)?;
    let mut got = vec![0u8; 4096];
    dev.download(&back, 0, &mut got).map_err(e)?;
    if got != data {
        return Err("the second mapping did not see the first one's device→host copy".into());
    }
    drop(b);
    let mut head = [0u8; 16];
    dev.read_pinned(&a, 8192, &mut head).map_err(e)?;
    if head[..] != data[..16] {
        return Err("the creator's mapping lost its contents when the opener's dropped".into());
    }
    // The same range again (a second registration of one mapping) is refused, not undefined.
    let seg_c = SharedSegment::open(&name, n).map_err(|e| e.to_string())?;
    let c = dev.host_buffer_from_shared(seg_c).map_err(e)?;
    // SAFETY: refused before anything is kept (an acceptance is dropped at once, before `c`).
    let again = unsafe { dev.lend_host_memory(dev.pinned_address(&c) as *mut u8, n) };
    if let Ok(buf) = again
        && dev.registered_here(&buf)
    {
        return Err("a registered shared mapping was registered a second time".into());
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Graph capture
// ------------------------------------------------------------------------------------------------

/// The HIP graph API an engine (PyTorch on ROCm) calls itself, from the runtime the backend
/// loaded (the double implements capture: `hip-double/src/graph.rs`).
struct HipGraphs {
    _lib: libloading::Library,
    stream_create: unsafe extern "C" fn(*mut *mut c_void, u32) -> HipStatus,
    stream_destroy: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    begin_capture: unsafe extern "C" fn(*mut c_void, i32) -> HipStatus,
    end_capture: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> HipStatus,
    instantiate: unsafe extern "C" fn(
        *mut *mut c_void,
        *mut c_void,
        *mut *mut c_void,
        *mut std::ffi::c_char,
        usize,
    ) -> HipStatus,
    launch: unsafe extern "C" fn(*mut c_void, *mut c_void) -> HipStatus,
    exec_destroy: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    destroy: unsafe extern "C" fn(*mut c_void) -> HipStatus,
}

impl HipGraphs {
    fn load(path: &str) -> Result<HipGraphs, String> {
        // SAFETY: the HIP runtime (here the test double) the backend already loaded.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the runtime exports the symbol with the signature of the field it is
                // stored in (HIP's C API); the library is kept loaded beside the pointers.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{}: {e}", $name))?
            };
        }
        Ok(HipGraphs {
            stream_create: sym!("hipStreamCreateWithFlags"),
            stream_destroy: sym!("hipStreamDestroy"),
            stream_synchronize: sym!("hipStreamSynchronize"),
            begin_capture: sym!("hipStreamBeginCapture"),
            end_capture: sym!("hipStreamEndCapture"),
            instantiate: sym!("hipGraphInstantiate"),
            launch: sym!("hipGraphLaunch"),
            exec_destroy: sym!("hipGraphExecDestroy"),
            destroy: sym!("hipGraphDestroy"),
            _lib: lib,
        })
    }
}

impl capture::Engine<RocmDevice> for HipGraphs {
    type Stream = *mut c_void;
    /// `(graph, executable graph)`.
    type Graph = (*mut c_void, *mut c_void);

    fn prepare(&mut self, _dev: &RocmDevice) -> Result<(), String> {
        Ok(())
    }

    fn stream(&mut self) -> Result<*mut c_void, String> {
        let mut s = std::ptr::null_mut();
        // SAFETY: `s` is an out-pointer; flag 1 is hipStreamNonBlocking.
        hip_ok("hipStreamCreateWithFlags", unsafe {
            (self.stream_create)(&mut s, 1)
        })?;
        Ok(s)
    }

    fn begin_global(&mut self, s: *mut c_void) -> Result<(), String> {
        // SAFETY: `s` is a live stream; mode 0 is hipStreamCaptureModeGlobal.
        hip_ok("hipStreamBeginCapture(global)", unsafe {
            (self.begin_capture)(s, 0)
        })
    }

    fn end(&mut self, s: *mut c_void) -> Result<Self::Graph, String> {
        let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: `s` is capturing; `graph` is an out-pointer.
        hip_ok("hipStreamEndCapture", unsafe {
            (self.end_capture)(s, &mut graph)
        })?;
        // SAFETY: `graph` was just captured; `exec` is an out-pointer; no log is asked for.
        hip_ok("hipGraphInstantiate", unsafe {
            (self.instantiate)(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        })?;
        Ok((graph, exec))
    }

    fn replay(&mut self, g: &Self::Graph, s: *mut c_void) -> Result<(), String> {
        // SAFETY: both handles are live.
        hip_ok("hipGraphLaunch", unsafe { (self.launch)(g.1, s) })?;
        // SAFETY: `s` is a live stream.
        hip_ok("hipStreamSynchronize", unsafe {
            (self.stream_synchronize)(s)
        })
    }

    fn lend(&mut self, dev: &RocmDevice, s: *mut c_void) -> Result<RocmStream, String> {
        // SAFETY: `s` is a live stream of this device that outlives the lent stream (destroyed in
        // `release`, after the scenario dropped it).
        unsafe { dev.lend_stream(s) }.map_err(|e| format!("{e} [{}]", e.kind()))
    }

    fn arena_lists(&mut self, dev: &RocmDevice) -> usize {
        dev.list_arena_use().0
    }

    fn release(&mut self, g: Self::Graph, s: *mut c_void) -> Result<(), String> {
        // SAFETY: the graphs and the stream were created above and are destroyed once, after
        // the replays completed (each replay waited for its stream).
        unsafe {
            hip_ok("hipGraphExecDestroy", (self.exec_destroy)(g.1))?;
            hip_ok("hipGraphDestroy", (self.destroy)(g.0))?;
            hip_ok("hipStreamDestroy", (self.stream_destroy)(s))
        }
    }
}

/// `capture::run` on the ROCm backend, the double as the runtime: a lent stream, a staged list, a
/// fused resolve-and-gather with a workspace and a remap captured in global mode (the double
/// refuses every unsafe call of a thread not in relaxed mode, and invalidates the capture),
/// then an eager step and six replays, bit-exact against the reference.
fn decode_path_in_a_global_mode_graph() -> Result<(), String> {
    let dev = open()?;
    let mut engine = HipGraphs::load(dev.runtime_path())?;
    capture::run(&dev, &mut engine)
}

/// A copy's layer table is the same on every call of its group: the backend places it in its
/// list arena once and later calls pass its address (only their spans are staged); the copies
/// still equal the reference.
fn constant_layer_tables_placed_once() -> Result<(), String> {
    let dev = open()?;
    let e = |e: RocmError| e.to_string();
    let (bs, row, blocks) = (4u32, 32u32, 8u32);
    let page = u64::from(bs * row);
    let layers: Vec<LayerPair> = (0..3u64)
        .map(|l| {
            let host = PageLayout::contiguous(l * u64::from(blocks) * page, page, blocks, bs, row);
            LayerPair { host, device: host }
        })
        .collect();
    let len = 3 * blocks as usize * page as usize;
    let device_bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7)).collect();
    let mut want_host = vec![0u8; len];
    let mut want_device = device_bytes.clone();
    let mut host = dev.alloc_pinned(len).map_err(e)?;
    let mut device = dev.alloc(len).map_err(e)?;
    dev.upload(&mut device, 0, &device_bytes).map_err(e)?;
    let stream = dev.create_stream().map_err(e)?;
    let desc = RowCopyDesc {
        direction: Direction::DeviceToHost,
        layers: &layers,
    };
    let before = dev.list_arena_use().0;
    for call in 0..3u32 {
        let spans = [RowSpan {
            device_block: call + 1,
            host_block: call + 2,
            first_row: call % bs,
            num_rows: bs - call % bs,
        }];
        copy_rows(&desc, &spans, &mut want_host, &mut want_device).map_err(|x| x.to_string())?;
        dev.copy_rows(&stream, &desc, &spans, &mut host, &mut device)
            .map_err(e)?;
        let placed = dev.list_arena_use().0 - before;
        if placed != 1 {
            return Err(format!(
                "after copy {call}: {placed} lists in the arena, expected the one layer table"
            ));
        }
    }
    dev.synchronize(&stream).map_err(e)?;
    let mut got = vec![0u8; len];
    dev.read_pinned(&host, 0, &mut got).map_err(e)?;
    if got != want_host {
        return Err("the host pool differs from the reference copies".into());
    }
    Ok(())
}
