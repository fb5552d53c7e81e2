//! Real transfers through NIXL (UCX), host memory to host memory, between two agents: every byte
//! of every page written is checked in the decode pool, and every byte outside the assigned
//! blocks is checked untouched.
//!
//! Without NIXL's libraries these tests say so and count as skipped; with
//! `HISPARSE_REQUIRE_NIXL=1` (CI) they fail instead.
#![cfg(feature = "nixl")]

use std::time::{Duration, Instant};

use hisparse_core::config::HiSparseConfig;
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_core::presets;
use hisparse_nixl::{
    Arrival, DecodeSide, MemoryKind, PageManifest, PdError, PoolGeometry, PrefillSide, Region,
};

/// NIXL agents of one process are not used from several threads at once: one test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether NIXL is here; a missing NIXL is a loud skip, or a failure when it is required.
fn nixl_here(test: &str) -> bool {
    match hisparse_nixl::ffi::probe() {
        Ok(()) => true,
        Err(e) if std::env::var("HISPARSE_REQUIRE_NIXL").as_deref() == Ok("1") => {
            panic!("{test}: NIXL is required (HISPARSE_REQUIRE_NIXL=1) but: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            false
        }
    }
}

/// DeepSeek V3.2's first 4 layers: 4 pages of 41,984 B per block.
fn kv() -> KvCacheConfig {
    let model = presets::DEEPSEEK_V32;
    let four = hisparse_core::model::ModelSpec {
        layers: &model.layers[..4],
        ..model
    };
    let config = HiSparseConfig::new(model.top_k, 120 * 4 * 64 * 656);
    let mut input = LayoutInput::new(&four, &config, 0, 4096);
    input.num_gpu_blocks_override = Some(400);
    plan_layout(&input).expect("layout")
}

/// A pool's memory, 4096-aligned, filled with `fill`.
struct Memory(Vec<u64>);

impl Memory {
    fn new(bytes: u64, fill: u8) -> Self {
        Memory(vec![
            u64::from_ne_bytes([fill; 8]);
            bytes.div_ceil(8) as usize
        ])
    }
    fn bytes(&self) -> &[u8] {
        // Reading u64s as bytes: any bit pattern is a valid u8.
        let len = self.0.len() * 8;
        // SAFETY: the Vec's buffer is `len` initialised bytes, borrowed for the slice's life.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.0.len() * 8;
        // SAFETY: as in `bytes`, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), len) }
    }
    fn region(&self) -> Region {
        Region {
            address: self.0.as_ptr() as u64,
            len: (self.0.len() * 8) as u64,
            memory: MemoryKind::Host,
        }
    }
}

/// Byte `i` of page (request, layer, page): distinct for every page and offset.
fn page_byte(request: u64, layer: u32, page: u32, i: u64) -> u8 {
    let x = request
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(layer) << 40)
        .wrapping_add(u64::from(page) << 20)
        .wrapping_add(i);
    (x ^ (x >> 7) ^ (x >> 29)).wrapping_mul(0x2545_F491_4F6C_DD1D) as u8
}

/// Writes request `request`'s pages into `blocks` (one list per bucket) of the prefill pool.
fn fill_source(pool: &mut Memory, g: &PoolGeometry, request: u64, blocks: &[&[u32]]) {
    let mem = pool.bytes_mut();
    for l in &g.layers {
        for (p, &b) in blocks[l.bucket as usize].iter().enumerate() {
            let at = (l.base + u64::from(b) * l.block_stride) as usize;
            for i in 0..l.page_bytes {
                mem[at + i as usize] = page_byte(request, l.layer, p as u32, i);
            }
        }
    }
}

/// Polls both sides until the decode side saw `want` arrivals (never blocking either): the
/// writer's polls are what make its transfers progress.
fn pump(
    decode: &mut DecodeSide,
    prefill: &PrefillSide,
    transfers: &mut [hisparse_nixl::Transfer],
    want: usize,
) -> Result<Vec<Arrival>, PdError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < want {
        for t in transfers.iter_mut() {
            prefill.poll(t)?;
        }
        got.extend(decode.poll()?);
        assert!(
            Instant::now() < deadline,
            "no notification within 30 s ({} of {want})",
            got.len()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(got)
}

fn wait(prefill: &PrefillSide, t: &mut hisparse_nixl::Transfer) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !prefill.poll(t).expect("polling the write") {
        assert!(
            Instant::now() < deadline,
            "the write did not complete in 30 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A decode side and a prefill side over their own pools, connected: the pools are filled with
/// `host_fill` (decode) and `dev_fill` (prefill) and outlive both sides (fields drop in order).
struct Pair {
    decode: DecodeSide,
    prefill: PrefillSide,
    host: PoolGeometry,
    host_mem: Memory,
    dev_mem: Memory,
}

impl Pair {
    /// Agents named `{tag}-decode-{pid}` and `{tag}-prefill-{pid}`; `fill` writes the prefill
    /// pool's source pages before the prefill side registers it.
    fn new(
        tag: &str,
        host_fill: u8,
        dev_fill: u8,
        fill: impl FnOnce(&mut Memory, &PoolGeometry),
    ) -> Self {
        let kv = kv();
        let (host, dev) = (
            PoolGeometry::host(&kv).unwrap(),
            PoolGeometry::device(&kv).unwrap(),
        );
        let host_mem = Memory::new(host.pool_bytes, host_fill);
        let mut dev_mem = Memory::new(dev.pool_bytes, dev_fill);
        fill(&mut dev_mem, &dev);
        let pid = std::process::id();
        // SAFETY: both pools are fields of the returned `Pair`, declared after the sides, so they
        // outlive them; a Vec's heap buffer does not move when the `Pair` does. Only the issued
        // manifests' blocks are written, and read after their notices arrived; the source pages
        // are not changed while their writes run.
        let decode = unsafe {
            DecodeSide::new(
                &format!("{tag}-decode-{pid}"),
                host_mem.region(),
                host.clone(),
            )
        }
        .unwrap();
        // SAFETY: as above.
        let prefill = unsafe {
            PrefillSide::new(
                &format!("{tag}-prefill-{pid}"),
                dev_mem.region(),
                dev,
                decode.offer().unwrap(),
            )
        }
        .unwrap();
        let mut pair = Pair {
            decode,
            prefill,
            host,
            host_mem,
            dev_mem,
        };
        let name = pair.prefill.name().to_owned();
        pair.decode.accept_from(&name);
        pair
    }
}

/// The decode pool as it must be after `requests` landed in a pool filled with `fill`.
fn expected_pool(host: &PoolGeometry, fill: u8, requests: &[PageManifest]) -> Vec<u8> {
    let mut expected = vec![fill; host.pool_bytes as usize];
    for m in requests {
        for l in &host.layers {
            for (p, &b) in m.host_blocks.iter().enumerate() {
                let at = (l.base + u64::from(b) * l.block_stride) as usize;
                for i in 0..l.page_bytes {
                    expected[at + i as usize] = page_byte(m.request, l.layer, p as u32, i);
                }
            }
        }
    }
    expected
}

/// How many bytes of `pool` differ from `expected`.
fn bytes_differing(pool: &[u8], expected: &[u8]) -> usize {
    pool[..expected.len()]
        .iter()
        .zip(expected)
        .filter(|(a, b)| a != b)
        .count()
}

#[test]
fn pages_land_in_the_assigned_host_blocks_and_nowhere_else() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !nixl_here("pages_land_in_the_assigned_host_blocks_and_nowhere_else") {
        return;
    }
    let (host, dev) = (
        PoolGeometry::host(&kv()).unwrap(),
        PoolGeometry::device(&kv()).unwrap(),
    );
    // Two requests: 3 pages (the last one partial) and 1 page; scattered blocks on both sides.
    let requests = [
        PageManifest {
            request: 7,
            tokens: 130,
            host_blocks: vec![host.num_blocks - 1, 2, 40],
        },
        PageManifest {
            request: 8,
            tokens: 64,
            host_blocks: vec![1],
        },
    ];
    // Per request, per bucket: the GPU blocks of its pages (distinct across buckets too).
    let sources: Vec<Vec<Vec<u32>>> = vec![
        (0..dev.buckets)
            .map(|k| vec![150 - k, 3 + 10 * k, 77 + k])
            .collect(),
        (0..dev.buckets)
            .map(|k| vec![dev.num_blocks - 1 - k])
            .collect(),
    ];
    let lists = |r: usize| -> Vec<&[u32]> { sources[r].iter().map(|v| &v[..]).collect() };
    let mut pair = Pair::new("pages", 0xEE, 0x11, |mem, dev| {
        for (r, m) in requests.iter().enumerate() {
            fill_source(mem, dev, m.request, &lists(r));
        }
    });
    let (decode, prefill) = (&mut pair.decode, &pair.prefill);
    for m in &requests {
        decode.issue(m.clone()).unwrap();
    }
    let mut transfers: Vec<_> = requests
        .iter()
        .enumerate()
        .map(|(r, m)| prefill.send(m, &lists(r)).unwrap())
        .collect();
    assert_eq!(decode.outstanding(), 2);
    let mut arrived = pump(decode, prefill, &mut transfers, 2).unwrap();
    arrived.sort_by_key(|a| match a {
        Arrival::Import(m) => m.request,
        Arrival::Bulk { .. } => 0,
    });
    assert_eq!(
        arrived,
        requests
            .iter()
            .cloned()
            .map(Arrival::Import)
            .collect::<Vec<_>>()
    );
    for (t, m) in transfers.iter_mut().zip(&requests) {
        wait(prefill, t);
        assert_eq!(t.bytes(), host.request_bytes(m.pages()));
    }
    assert_eq!(decode.outstanding(), 0);
    // Every byte of the pool: the assigned pages hold the source pages, the rest is untouched.
    let expected = expected_pool(&host, 0xEE, &requests);
    let wrong = bytes_differing(pair.host_mem.bytes(), &expected);
    assert_eq!(wrong, 0, "{wrong} bytes of the decode pool differ");
    let written: u64 = requests.iter().map(|m| host.request_bytes(m.pages())).sum();
    assert_eq!(written, (3 + 1) * 4 * 64 * 656);
}

#[test]
fn a_bulk_write_is_announced_and_lands() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !nixl_here("a_bulk_write_is_announced_and_lands") {
        return;
    }
    let mut staging = Memory::new(1 << 20, 0);
    for (i, b) in staging.bytes_mut().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let mut pair = Pair::new("bulk", 0, 0, |_, _| {});
    // SAFETY: the staging memory outlives the sides (dropped after `pair`, declared before it);
    // it is not changed while a write from it runs.
    unsafe { pair.prefill.register(staging.region()).unwrap() };
    let Pair {
        decode,
        prefill,
        host_mem,
        ..
    } = &mut pair;
    // One descriptor, then descriptors of 100,000 bytes (the last one shorter).
    for (per, descriptors) in [(u64::MAX, 1), (100_000, 11)] {
        let mut t = prefill.bulk(&staging.region(), 1 << 20, per).unwrap();
        assert_eq!(t.descriptors(), descriptors);
        assert_eq!(
            pump(decode, prefill, std::slice::from_mut(&mut t), 1).unwrap(),
            vec![Arrival::Bulk { bytes: 1 << 20 }]
        );
        wait(prefill, &mut t);
        assert!(t.elapsed().is_some());
        assert_eq!(&host_mem.bytes()[..1 << 20], staging.bytes());
        host_mem.bytes_mut().fill(0);
        for (i, b) in staging.bytes_mut().iter_mut().enumerate() {
            *b = (i % 241) as u8 ^ 0x5A;
        }
    }
}

#[test]
fn a_packed_write_lands_as_the_page_by_page_write_does() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !nixl_here("a_packed_write_lands_as_the_page_by_page_write_does") {
        return;
    }
    let (host, dev) = (
        PoolGeometry::host(&kv()).unwrap(),
        PoolGeometry::device(&kv()).unwrap(),
    );
    // 5 pages, the last partial: host blocks 10..=12 one run per layer, then two single blocks.
    let m = PageManifest {
        request: 21,
        tokens: 4 * 64 + 5,
        host_blocks: vec![10, 11, 12, 3, host.num_blocks - 1],
    };
    let sources: Vec<Vec<u32>> = (0..dev.buckets)
        .map(|k| vec![200 + k, 17, 18 + 5 * k, 399 - k, 1])
        .collect();
    let lists: Vec<&[u32]> = sources.iter().map(|v| &v[..]).collect();
    let staging_len = hisparse_nixl::staging_bytes_for(&host, m.tokens);
    let mut staging = Memory::new(staging_len, 0);
    let mut pair = Pair::new("packed", 0xEE, 0x11, |mem, dev| {
        fill_source(mem, dev, m.request, &lists)
    });
    // SAFETY: the staging memory outlives the sides (dropped after `pair`, declared before it);
    // it is not changed while the write from it runs.
    unsafe { pair.prefill.register(staging.region()).unwrap() };
    let Pair {
        decode,
        prefill,
        host_mem,
        dev_mem,
        ..
    } = &mut pair;
    decode.issue(m.clone()).unwrap();
    let plan = prefill.plan_packed(&m, &lists, staging_len).unwrap();
    assert!(matches!(
        prefill.plan_packed(&m, &lists, staging_len - 1),
        Err(PdError::StagingBudget { .. })
    ));
    // The packing, as the prefill device's copies would do it.
    let (src, dst) = (dev_mem.bytes(), staging.bytes_mut());
    for c in &plan.copies {
        let (s, d, n) = (c.src as usize, c.dst as usize, c.len as usize);
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
    }
    let mut t = prefill.send_packed(&staging.region(), &plan).unwrap();
    assert_eq!(t.descriptors(), 3 * host.layers.len() as u64);
    assert_eq!(
        pump(decode, prefill, std::slice::from_mut(&mut t), 1).unwrap(),
        vec![Arrival::Import(m.clone())]
    );
    wait(prefill, &mut t);
    assert_eq!(t.bytes(), host.request_bytes(m.pages()));
    let expected = expected_pool(&host, 0xEE, std::slice::from_ref(&m));
    let wrong = bytes_differing(host_mem.bytes(), &expected);
    assert_eq!(wrong, 0, "{wrong} bytes of the decode pool differ");
}

#[test]
fn a_write_nobody_assigned_is_refused_on_arrival() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !nixl_here("a_write_nobody_assigned_is_refused_on_arrival") {
        return;
    }
    let mut pair = Pair::new("strict", 0, 0, |_, _| {});
    let kv = kv();
    let Pair {
        decode,
        prefill,
        host,
        ..
    } = &mut pair;
    let issued = PageManifest {
        request: 1,
        tokens: 10,
        host_blocks: vec![5],
    };
    decode.issue(issued.clone()).unwrap();
    // A manifest the pool cannot hold is refused before anything moves.
    let outside = PageManifest {
        host_blocks: vec![host.num_blocks],
        ..issued.clone()
    };
    let three: Vec<&[u32]> = vec![&[3]; kv.num_buckets as usize];
    let null: Vec<&[u32]> = vec![&[0]; kv.num_buckets as usize];
    assert!(matches!(
        prefill.send(&outside, &three),
        Err(PdError::ManifestBlock { .. })
    ));
    assert!(matches!(
        prefill.send(&issued, &null),
        Err(PdError::Geometry { .. })
    ));
    // A request the decode side never assigned: its notice is an error there.
    let stray = PageManifest {
        request: 2,
        ..issued
    };
    let mut t = prefill.send(&stray, &three).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let err = loop {
        prefill.poll(&mut t).unwrap();
        match decode.poll() {
            Err(e) => break e,
            Ok(a) => assert!(a.is_empty(), "{a:?}"),
        }
        assert!(Instant::now() < deadline, "no notification within 30 s");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(err, PdError::UnexpectedNotice { request: 2 });
    wait(prefill, &mut t);
    assert_eq!(decode.outstanding(), 1);
}

/// A request prefilled on a CPU runtime (its pages resident, filled with its page bytes), as an
/// engine's prefill node has it: the runtime and the request's state row.
fn prefilled_runtime(
    request: u64,
    tokens: u32,
) -> (
    hisparse_runtime::Runtime<hisparse_runtime::AnyDevice>,
    hisparse_core::coordinator::Coordinator,
    u32,
) {
    use hisparse_core::Device;
    use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
    use hisparse_runtime::{AnyDevice, BackendKind, Runtime, RuntimeConfig};
    let kv = kv();
    let dev = AnyDevice::open(BackendKind::Cpu, "").unwrap();
    let mut cfg = RuntimeConfig::new(1, 1);
    cfg.max_batched_tokens = cfg.max_batched_tokens.max(tokens);
    let mut rt = Runtime::new(dev, kv.clone(), cfg).unwrap();
    let mut coord = Coordinator::new(
        kv,
        CoordinatorConfig {
            max_running: 1,
            max_batched_tokens: tokens,
            ..CoordinatorConfig::default()
        },
    )
    .unwrap();
    coord.admit(request, &vec![1; tokens as usize]).unwrap();
    let mut cmd = OffloadCommand::default();
    let mut slot = None;
    while coord.num_computed(request).unwrap_or(0) < tokens {
        coord.schedule_step().unwrap();
        coord.build_offload_command_into(&mut cmd);
        rt.begin_step(&cmd).unwrap();
        slot = slot.or(cmd.scheduled.first().map(|sr| sr.slot));
        rt.end_step(&cmd).unwrap();
        rt.poll_and_report(&mut coord).unwrap();
    }
    let slot = slot.expect("the request was scheduled");
    // The forward pass's rows: each page's bytes, in the block the resident table names.
    let geometry = PoolGeometry::device(rt.layout()).unwrap();
    let pages = geometry.pages_for(tokens);
    let blocks: Vec<Vec<u32>> = (0..geometry.buckets)
        .map(|k| {
            let row = rt.resident_row(k, slot).unwrap();
            row[..pages as usize].iter().map(|&b| b as u32).collect()
        })
        .collect();
    let mut image = Memory::new(geometry.pool_bytes, 0);
    let lists: Vec<&[u32]> = blocks.iter().map(|v| &v[..]).collect();
    fill_source(&mut image, &geometry, request, &lists);
    let (dev, pools) = rt.device_and_pools_mut();
    dev.upload(
        &mut pools.device,
        0,
        &image.bytes()[..geometry.pool_bytes as usize],
    )
    .unwrap();
    (rt, coord, slot)
}

#[test]
fn the_prefill_writer_writes_a_runtime_request_in_every_layout() {
    use hisparse_nixl::{PrefillWriter, WriteLayout};
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !nixl_here("the_prefill_writer_writes_a_runtime_request_in_every_layout") {
        return;
    }
    let host = PoolGeometry::host(&kv()).unwrap();
    // 3 pages, the last one partial, into scattered host blocks (two runs).
    let m = PageManifest {
        request: 5,
        tokens: 2 * 64 + 9,
        host_blocks: vec![4, 5, host.num_blocks - 1],
    };
    let (rt, _coord, slot) = prefilled_runtime(m.request, m.tokens);
    let pid = std::process::id();
    for layout in [
        WriteLayout::Pages,
        WriteLayout::Packed,
        WriteLayout::PackedHost,
    ] {
        let host_mem = Memory::new(host.pool_bytes, 0xAB);
        // SAFETY: `host_mem` outlives `decode` (dropped at the end of the iteration, after
        // it); only the issued manifest's blocks are written, read after its notice arrived.
        let mut decode = unsafe {
            DecodeSide::new(
                &format!("writer-{}-decode-{pid}", layout.name()),
                host_mem.region(),
                host.clone(),
            )
        }
        .unwrap();
        // SAFETY: `rt` outlives the writer; the request's pages do not change while it runs.
        let mut writer = unsafe {
            PrefillWriter::new(
                &format!("writer-{}-prefill-{pid}", layout.name()),
                &rt,
                0,
                decode.offer().unwrap(),
                layout,
                m.tokens,
                Duration::from_secs(30),
            )
        }
        .unwrap();
        decode.accept_from(writer.name());
        decode.issue(m.clone()).unwrap();
        let mut posted = writer.write(&rt, slot, &m).unwrap();
        assert_eq!(posted.pack_seconds > 0.0, layout.stages(), "{layout:?}");
        let per_page = m.pages() as u64 * host.layers.len() as u64;
        let runs = 2 * host.layers.len() as u64;
        assert_eq!(
            posted.transfer.descriptors(),
            if layout.stages() { runs } else { per_page },
            "{layout:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut arrived = Vec::new();
        while arrived.is_empty() {
            writer.poll(&mut posted.transfer).unwrap();
            arrived.extend(decode.poll().unwrap());
            assert!(
                Instant::now() < deadline,
                "{layout:?}: no notification in 30 s"
            );
        }
        assert_eq!(arrived, vec![Arrival::Import(m.clone())], "{layout:?}");
        writer.wait(&mut posted.transfer, "the write").unwrap();
        let expected = expected_pool(&host, 0xAB, std::slice::from_ref(&m));
        let wrong = bytes_differing(host_mem.bytes(), &expected);
        assert_eq!(
            wrong, 0,
            "{layout:?}: {wrong} bytes of the decode pool differ"
        );
        drop(writer);
        drop(decode);
    }
    // A page the runtime does not hold is refused before anything moves.
    let beyond = PageManifest {
        tokens: 5 * 64,
        host_blocks: vec![6, 7, 8, 9, 10],
        ..m
    };
    assert!(matches!(
        PrefillWriter::source_blocks(&rt, beyond.request, slot, beyond.pages()),
        Err(PdError::PageNotResident { page: 3, .. })
    ));
}
