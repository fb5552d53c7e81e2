//! The decode side of `simulate --pd nixl`: this process. It starts the prefill process, measures
//! the bulk figures, assigns host blocks to prefilled requests, verifies and imports what arrives
//! and decodes the imported requests.

use std::time::{Duration, Instant};

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::BufferLen;
use hisparse_nixl::{Arrival, DecodeSide, MemoryKind, PoolGeometry};
use hisparse_runtime::{AnyDevice, BackendKind, SharedHostPool, SharedSegment};

use super::super::engine::SimSetup;
use super::super::rank::Rank;
use super::super::worker::{Answer, WorkerProcess};
use super::imports::{HostView, Imports};
use super::protocol::{
    BULK_REPEATS, BulkSource, FromPrefill, Hello, SILENCE, ToPrefill, nixl_err, region,
};
use super::report::{BulkFigure, PdReport};
use super::{BULK_DESCRIPTOR_BYTES, PREFILL_SUBCOMMAND, WriteLayout};
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

/// The decode side: this process. Its host pool is a shared-memory segment mapped twice:
/// once as the runtime's pinned host pool (registered with NIXL), once as a host view the
/// import verifier reads.
pub(super) fn run(
    kind: BackendKind,
    device: &str,
    prefill_device: Option<&str>,
    s: &SimSetup,
    prefill_kv: KvCacheConfig,
    write: WriteLayout,
) -> CliResult<PdReport> {
    let wall = Instant::now();
    let kv = &s.kv;
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
        device: Some(prefill_device.unwrap_or(device))
            .filter(|d| !d.trim().is_empty())
            .map(str::to_string),
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

    let mut report = initial_report(kind, s, &host_geometry, write);
    report.backend = backend;
    report.device = device_name;
    report.prefill_device = prefill_device;
    bulk_figures(&mut prefill, &mut decode, &host_geometry, s, &mut report)?;

    // The imports and the decode.
    let mut imports = Imports::new(s)?;
    prefill.send(&ToPrefill::Start)?;
    let view = HostView {
        dev: &view,
        pool: &view_pool,
    };
    imports.run(s, &mut prefill, &mut decode, &mut rank, &view, &mut report)?;
    imports.await_writes(s, &mut prefill, &mut report)?;
    prefill.send(&ToPrefill::Done)?;
    prefill.wait()?;
    // Drain: every block back in its pool.
    let drained = rank.drain()?;
    imports.drain(&drained)?;
    let c = drained.counters;
    report.decoded = imports.all_finished(s) && s.decode_steps > 0;
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
    let imported = imports.verified();
    report.imported_rows_verified = imported.rows;
    report.decode_rows_verified = drained.verified.rows;
    report.verified_rows = imported.rows + drained.verified.rows;
    report.mismatched_rows = imported.mismatched + drained.verified.mismatched;
    report.first_mismatch = imported
        .first_mismatch
        .clone()
        .or(drained.verified.first_mismatch.clone());
    report.wall_seconds = wall.elapsed().as_secs_f64();
    drop(decode);
    drop(rank);
    Ok(report)
}

/// The report's description of the run, before anything moved.
fn initial_report(
    kind: BackendKind,
    s: &SimSetup,
    host_geometry: &PoolGeometry,
    write: WriteLayout,
) -> PdReport {
    let source_memory = if kind == BackendKind::Cpu {
        "host"
    } else {
        "gpu"
    };
    PdReport {
        source_memory: source_memory.into(),
        write_memory: write.write_memory(source_memory).into(),
        preset: s.preset.clone(),
        sparse_layers: host_geometry.layers.len() as u32,
        requests: s.requests,
        context: s.context,
        decode_steps: s.decode_steps,
        pages_per_request: host_geometry.pages_for(s.context),
        write_layout: write.name().into(),
        ..PdReport::default()
    }
}

/// The transport's own figures, before any block is assigned (they overwrite the pool): from
/// host memory, and from the prefill device's memory when that is GPU memory (the transport of
/// pages and packed writes; host staging writes from host memory); one descriptor, then
/// descriptors of [`BULK_DESCRIPTOR_BYTES`].
fn bulk_figures(
    prefill: &mut PrefillProcess,
    decode: &mut DecodeSide,
    host_geometry: &PoolGeometry,
    s: &SimSetup,
    report: &mut PdReport,
) -> CliResult<()> {
    let per_request = host_geometry.request_bytes(report.pages_per_request);
    let bulk = (per_request * u64::from(s.requests)).min(host_geometry.pool_bytes);
    let mut sources = vec![(BulkSource::Host, "host")];
    if report.source_memory == "gpu" {
        sources.push((BulkSource::Device, "gpu"));
    }
    for (source, memory) in sources {
        for descriptor_bytes in [bulk, BULK_DESCRIPTOR_BYTES.min(bulk)] {
            let (secs, descriptors) = best_bulk(prefill, decode, bulk, source, descriptor_bytes)?;
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
    Ok(())
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
