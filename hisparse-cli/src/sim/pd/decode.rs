//! The decode side of `simulate --pd nixl`: this process. It starts the prefill process, measures
//! the bulk figures, assigns host blocks to prefilled requests, verifies and imports what arrives
//! and decodes the imported requests.

use std::time::{Duration, Instant};

use hisparse_core::Device;
use hisparse_core::coordinator::{CoordError, Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::BufferLen;
use hisparse_nixl::{Arrival, DecodeSide, MemoryKind, PoolGeometry};
use hisparse_runtime::{AnyDevice, BackendKind, SharedHostPool, SharedSegment};

use super::super::engine::SimSetup;
use super::super::rank::{DecodeRow, Rank};
use super::super::worker::{Answer, WorkerProcess};
use super::protocol::{
    BULK_REPEATS, BulkSource, FromPrefill, Hello, SILENCE, ToPrefill, nixl_err, prompt, region,
};
use super::report::{BulkFigure, PdReport};
use super::{BULK_DESCRIPTOR_BYTES, ImportVerifier, PREFILL_SUBCOMMAND, PageManifest, WriteLayout};
use crate::error::{CliError, CliResult};

/// The prefill process, seen from the decode side.
pub(super) type PrefillProcess = WorkerProcess<FromPrefill>;

impl Answer for FromPrefill {
    fn failure(&self) -> Option<&str> {
        match self {
            FromPrefill::Failed(m) => Some(m),
            _ => None,
        }
    }
}

/// Starts the prefill process with `hello`.
fn start_prefill(hello: &Hello) -> CliResult<PrefillProcess> {
    // UCX logs to standard output unless told otherwise: there it would break the protocol on
    // the child's standard output.
    let log = std::env::var_os(hisparse_nixl::ffi::UCX_LOG_FILE)
        .filter(|v| v != "stdout")
        .unwrap_or_else(|| "stderr".into());
    WorkerProcess::start(
        PREFILL_SUBCOMMAND,
        "the prefill side".into(),
        &[(hisparse_nixl::ffi::UCX_LOG_FILE, log)],
        hello,
    )
}

pub(super) fn coord_err(e: impl std::fmt::Display) -> CliError {
    CliError::failed(e.to_string())
}

/// The decode side: this process. Its host pool is a shared-memory segment mapped twice:
/// once as the runtime's pinned host pool (registered with NIXL), once as a host view the
/// import verifier reads.
pub(super) fn run(
    kind: BackendKind,
    device: &str,
    s: &SimSetup,
    prefill_kv: KvCacheConfig,
    write: WriteLayout,
) -> CliResult<PdReport> {
    let wall = Instant::now();
    let kv = &s.kv;
    let ratio = kv.sparse_compress_ratio.max(1);
    let final_len = s.context + s.decode_steps;
    let pool_bytes = kv.host_pool_bytes() as usize;
    let segment_name = SharedSegment::unique_name("hisparse-pd-pool");
    let segment = SharedSegment::create(&segment_name, pool_bytes)
        .map_err(|e| CliError::failed(format!("creating the decode host pool: {e}")))?;
    let view = AnyDevice::open(BackendKind::Cpu, "")
        .map_err(|e| CliError::device("opening a host view of the decode host pool", e))?;
    let view_pool = view
        .host_pool_from_shared(
            SharedSegment::open(&segment_name, pool_bytes)
                .map_err(|e| CliError::failed(format!("mapping the decode host pool: {e}")))?,
        )
        .map_err(|e| CliError::device("mapping the decode host pool", e))?;
    let dev = AnyDevice::open(kind, device)
        .map_err(|e| CliError::device("opening the decode device", e))?;
    let (backend, device_name) = (dev.backend().to_string(), dev.device_name().to_string());
    let host = dev
        .host_pool_from_shared(segment)
        .map_err(|e| CliError::device("using the decode host pool", e))?;
    let pool = region(
        dev.pinned_address(&host) as u64,
        host.byte_len(),
        MemoryKind::Host,
    );
    let mut rank = Rank::with_host_pool(dev, s, 0, host, true)?;
    let host_geometry = PoolGeometry::host(kv).map_err(nixl_err)?;
    let name = format!("hisparse-decode-{}", std::process::id());
    // SAFETY: the host pool belongs to `rank`'s runtime, which outlives `decode` (declared
    // after it, so dropped first); the prefill side writes only the blocks of manifests
    // issued below, which the coordinator reserved for those imports alone, and this side
    // reads them only after their notification arrived.
    let mut decode =
        unsafe { DecodeSide::new(&name, pool, host_geometry.clone()) }.map_err(nixl_err)?;
    let offer = decode.offer().map_err(nixl_err)?;
    let mut prefill = start_prefill(&Hello {
        backend: kind.name().to_string(),
        device: (!device.trim().is_empty()).then(|| device.to_string()),
        setup: s.clone(),
        prefill_kv,
        offer,
        write,
    })?;
    let (agent, _, prefill_device) = match prefill.recv_within(SILENCE)? {
        FromPrefill::Ready(a, b, d) => (a, b, d),
        _ => return Err(CliError::failed("the prefill side answered out of turn")),
    };
    decode.accept_from(&agent);

    let pages = host_geometry.pages_for(s.context);
    let per_request = host_geometry.request_bytes(pages);
    let mut report = PdReport {
        backend,
        device: device_name,
        prefill_device,
        source_memory: if kind == BackendKind::Cpu {
            "host"
        } else {
            "gpu"
        }
        .into(),
        preset: s.preset.clone(),
        sparse_layers: host_geometry.layers.len() as u32,
        requests: s.requests,
        context: s.context,
        decode_steps: s.decode_steps,
        pages_per_request: pages,
        write_layout: write.name().into(),
        ..PdReport::default()
    };
    report.write_memory = write.write_memory(&report.source_memory).into();

    // The transport's own figures, before any block is assigned (they overwrite the pool):
    // from host memory, and from the prefill device's memory when that is GPU memory (the
    // transport of pages and packed writes; host staging writes from host memory); one
    // descriptor, then descriptors of BULK_DESCRIPTOR_BYTES.
    let bulk = (per_request * u64::from(s.requests)).min(host_geometry.pool_bytes);
    let mut sources = vec![(BulkSource::Host, "host")];
    if report.source_memory == "gpu" {
        sources.push((BulkSource::Device, "gpu"));
    }
    for (source, memory) in sources {
        for descriptor_bytes in [bulk, BULK_DESCRIPTOR_BYTES.min(bulk)] {
            let (secs, descriptors) =
                best_bulk(&mut prefill, &mut decode, bulk, source, descriptor_bytes)?;
            report.bulk.push(BulkFigure {
                source_memory: memory.into(),
                descriptors,
                descriptor_bytes,
                bytes: bulk,
                seconds: secs,
                gb_per_s: bulk as f64 / secs / 1e9,
            });
        }
    }
    report.bulk_bytes = bulk;
    report.bulk_seconds = report.bulk[0].seconds;
    report.bulk_gb_per_s = report.bulk[0].gb_per_s;
    if let Some(best) = report
        .bulk
        .iter()
        .filter(|f| f.source_memory == report.write_memory)
        .max_by(|a, b| a.gb_per_s.total_cmp(&b.gb_per_s))
    {
        report.same_transport_bulk_gb_per_s = best.gb_per_s;
        report.same_transport_bulk = format!(
            "{} → host pool, {} descriptor{}",
            best.source_memory,
            best.descriptors,
            if best.descriptors == 1 { "" } else { "s" }
        );
    }

    // The imports and the decode. The loop never waits on a notification: each turn it
    // takes what arrived (verified, then handed to the coordinator), answers the prefill
    // side (host blocks for a prefilled request), and runs a decode step when there is a
    // request to decode.
    let mut coord = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: s.requests,
            max_batched_tokens: s.max_batched_tokens,
            max_spill_pages_per_step: 64,
            num_workers: 1,
            ..CoordinatorConfig::default()
        },
    )
    .map_err(coord_err)?;
    let mut verifier = ImportVerifier::new(kv)?;
    // Prefilled requests the host pool had no room for yet: (request, tokens).
    let mut waiting: Vec<(u64, u32)> = Vec::new();
    let (mut sent, mut imported, mut finished, mut live) = (0u32, 0u32, 0u32, 0u32);
    let mut cmd = OffloadCommand::default();
    let mut last_news = Instant::now();
    let mut idle_steps = 0u32;
    prefill.send(&ToPrefill::Start)?;
    while finished < s.requests {
        let mut news = false;
        for a in decode.poll().map_err(nixl_err)? {
            news = true;
            let Arrival::Import(m) = a else {
                return Err(CliError::failed("a bulk notification during the imports"));
            };
            if coord.import_blocks(m.request) != Some(&m.host_blocks[..]) {
                return Err(CliError::failed(format!(
                    "request {} arrived in blocks the coordinator did not reserve for it",
                    m.request
                )));
            }
            verifier.check(&view, &view_pool, &m)?;
            coord.complete_import(m.request).map_err(coord_err)?;
            imported += 1;
            live += 1;
        }
        if let Some(msg) = prefill.try_recv()? {
            news = true;
            match msg {
                FromPrefill::Prefilled(request, tokens) => waiting.push((request, tokens)),
                FromPrefill::Sent {
                    bytes,
                    seconds,
                    descriptors,
                    pack_seconds,
                } => {
                    sent += 1;
                    report.add_write(bytes, seconds, descriptors, pack_seconds);
                }
                _ => return Err(CliError::failed("the prefill side answered out of turn")),
            }
        }
        // Host blocks for prefilled requests, as the host pool has room.
        while let Some(&(request, tokens)) = waiting.first() {
            let mut all = prompt(request, tokens);
            all.push(tokens); // the first sampled token: computed here, after the import
            match coord.reserve_import(request, &all, tokens) {
                Ok(host_blocks) => {
                    waiting.remove(0);
                    let manifest = PageManifest {
                        request,
                        tokens,
                        host_blocks,
                    };
                    decode.issue(manifest.clone()).map_err(nixl_err)?;
                    prefill.send(&ToPrefill::Manifest(manifest))?;
                    news = true;
                }
                Err(CoordError::Import { .. }) if live > 0 => break, // room comes back
                Err(e) => return Err(coord_err(e)),
            }
        }
        if live > 0 {
            news = true;
            let st = decode_step(&mut coord, &mut rank, &mut cmd, s, ratio)?;
            idle_steps = if st.0 { 0 } else { idle_steps + 1 };
            if idle_steps > 1000 {
                return Err(CliError::failed(
                    "the decode side stalled: 1000 steps scheduled nothing; give it more \
                     --gpu-mem",
                ));
            }
            report.decode_tokens += u64::from(st.1);
            // Sample or finish.
            let running: Vec<_> = coord.running_ids().collect();
            for id in running {
                let (n, c) = (
                    coord.num_tokens(id).unwrap_or(0),
                    coord.num_computed(id).unwrap_or(0),
                );
                if n == c {
                    if n >= final_len {
                        coord.finish(id).map_err(coord_err)?;
                        finished += 1;
                        live -= 1;
                    } else {
                        coord.append_tokens(id, &[n]).map_err(coord_err)?;
                    }
                }
            }
        }
        if news {
            last_news = Instant::now();
        } else if last_news.elapsed() > SILENCE {
            return Err(CliError::failed(format!(
                "nothing moved for {} s: {sent} of {} requests written, {imported} \
                 imported, {} outstanding",
                SILENCE.as_secs(),
                s.requests,
                decode.outstanding()
            )));
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // A write's completion may reach this side after its notification did.
    while sent < s.requests {
        match prefill.recv_within(SILENCE)? {
            FromPrefill::Sent {
                bytes,
                seconds,
                descriptors,
                pack_seconds,
            } => {
                sent += 1;
                report.add_write(bytes, seconds, descriptors, pack_seconds);
            }
            _ => return Err(CliError::failed("the prefill side answered out of turn")),
        }
    }
    prefill.send(&ToPrefill::Done)?;
    prefill.wait()?;
    // Drain: every block back in its pool.
    let drained = rank.drain()?;
    coord
        .report(0, &drained.report.enqueued, &drained.report.completed)
        .map_err(coord_err)?;
    coord
        .check_invariants()
        .map_err(|v| CliError::failed(format!("coordinator invariant violated: {v}")))?;
    if coord.gpu_pool().num_held() != 0 || coord.host_pool().num_held() != 0 {
        return Err(CliError::failed(format!(
            "the decode side leaked blocks: {} GPU and {} host blocks still held after every \
             request finished",
            coord.gpu_pool().num_held(),
            coord.host_pool().num_held()
        )));
    }
    let c = drained.counters;
    report.decoded = finished == s.requests && s.decode_steps > 0;
    report.hit_rate = c.hit_rate().unwrap_or(0.0);
    report.h2d_bytes = c.h2d_bytes;
    report.restored_pages = c.restored_pages;
    report.transfer_gb_per_s = report.transfer_bytes as f64 / report.transfer_seconds / 1e9;
    report.transfer_with_pack_gb_per_s =
        report.transfer_bytes as f64 / (report.transfer_seconds + report.pack_seconds) / 1e9;
    report.descriptors_per_write = report.descriptors / report.writes.max(1);
    if report.same_transport_bulk_gb_per_s > 0.0 {
        report.transfer_vs_same_transport =
            report.transfer_gb_per_s / report.same_transport_bulk_gb_per_s;
    }
    report.imported_rows_verified = verifier.verified.rows;
    report.decode_rows_verified = drained.verified.rows;
    report.verified_rows = verifier.verified.rows + drained.verified.rows;
    report.mismatched_rows = verifier.verified.mismatched + drained.verified.mismatched;
    report.first_mismatch = verifier
        .verified
        .first_mismatch
        .clone()
        .or(drained.verified.first_mismatch.clone());
    report.wall_seconds = wall.elapsed().as_secs_f64();
    drop(decode);
    drop(rank);
    Ok(report)
}

/// The best of [`BULK_REPEATS`] bulk writes of `bytes` from `source` in descriptors of
/// `descriptor_bytes`, each announced to the decode side: (seconds, descriptors).
pub(super) fn best_bulk(
    prefill: &mut PrefillProcess,
    decode: &mut DecodeSide,
    bytes: u64,
    source: BulkSource,
    descriptor_bytes: u64,
) -> CliResult<(f64, u64)> {
    let (mut best, mut count) = (f64::INFINITY, 0);
    for _ in 0..BULK_REPEATS {
        prefill.send(&ToPrefill::Bulk {
            bytes,
            source,
            descriptor_bytes,
        })?;
        let (mut sent, mut landed) = (None, false);
        let since = Instant::now();
        while sent.is_none() || !landed {
            if let Some(m) = prefill.try_recv()? {
                match m {
                    FromPrefill::BulkSent(secs, descriptors) => {
                        sent = Some(secs);
                        count = descriptors;
                    }
                    _ => return Err(CliError::failed("the prefill side answered out of turn")),
                }
            }
            for a in decode.poll().map_err(nixl_err)? {
                match a {
                    Arrival::Bulk { bytes: b } if b == bytes => landed = true,
                    other => {
                        return Err(CliError::failed(format!(
                            "an arrival out of turn during the bulk write: {other:?}"
                        )));
                    }
                }
            }
            if since.elapsed() > SILENCE {
                return Err(CliError::failed("the bulk write never arrived"));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        best = best.min(sent.unwrap_or(f64::INFINITY));
    }
    Ok((best, count))
}

/// One decode step of the decode side: plan, execute on the rank (the forward pass's writes,
/// every decode row's reads through the runtime, verified), report the copies. Returns
/// whether anything was scheduled and how many decode rows read.
pub(super) fn decode_step(
    coord: &mut Coordinator,
    rank: &mut Rank<AnyDevice>,
    cmd: &mut OffloadCommand,
    s: &SimSetup,
    ratio: u32,
) -> CliResult<(bool, u32)> {
    coord.schedule_step().map_err(coord_err)?;
    coord.build_offload_command_into(cmd);
    let decode: Vec<DecodeRow> = cmd
        .scheduled
        .iter()
        .filter(|sr| sr.first_token >= s.context && sr.num_tokens == 1)
        .map(|sr| DecodeRow {
            slot: sr.slot,
            uid: sr.id,
            seq_len: (sr.first_token + 1) / ratio,
            rejected: (0, 0),
        })
        .collect();
    rank.begin(cmd)?;
    let st = rank.finish(cmd, &decode)?;
    coord
        .report(0, &st.report.enqueued, &st.report.completed)
        .map_err(coord_err)?;
    Ok((!cmd.scheduled.is_empty(), decode.len() as u32))
}
