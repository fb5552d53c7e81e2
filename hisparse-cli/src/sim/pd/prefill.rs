//! The prefill side of `simulate --pd nixl`: a second process of this executable that prefills
//! each request on its own runtime and writes its pages into the host blocks the decode side
//! assigned (page by page, packed on the device, or packed into pinned host memory).

use std::io::{BufRead, BufWriter, Write};
use std::time::Instant;

use hisparse_core::Device;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_core::ops::BufferLen;
use hisparse_nixl::{MemoryKind, PackedWrite, PoolGeometry, PrefillSide, Region, Transfer};
use hisparse_runtime::{AnyBuffer, AnyDevice, AnyHostBuffer, BackendKind, Runtime, RuntimeConfig};

use super::super::forward::Forward;
use super::super::tp::{recv, send};
use super::protocol::{
    BulkSource, FromPrefill, Hello, SILENCE, ToPrefill, nixl_err, prompt, region, rt_err,
};
use super::{PREFILL_SUBCOMMAND, WriteLayout, check_staging};
use crate::error::{CliError, CliResult};

/// The prefill process.
pub(super) fn prefill_main() -> CliResult<()> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut output = BufWriter::new(stdout.lock());
    let mut line = String::new();
    let hello: Hello = recv(&mut input, &mut line).map_err(|e| {
        CliError::failed(format!(
            "{PREFILL_SUBCOMMAND} is started by `hisparse simulate --pd nixl`, not by hand ({e})"
        ))
    })?;
    let result = serve(&hello, &mut input, &mut output);
    if let Err(e) = &result {
        let _ = send(&mut output, &FromPrefill::Failed(e.to_string()));
    }
    result
}

/// The prefill pool as a NIXL region: GPU memory on CUDA, host memory on the CPU backend.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub(super) fn pool_region(pool: &AnyBuffer, ordinal: u32) -> CliResult<Region> {
    match pool {
        #[cfg(feature = "cpu")]
        AnyBuffer::Cpu(b) => Ok(region(b.address() as u64, b.byte_len(), MemoryKind::Host)),
        #[cfg(feature = "cuda")]
        AnyBuffer::Cuda(b) => Ok(region(
            b.device_address(),
            b.byte_len(),
            MemoryKind::Device { ordinal },
        )),
        #[allow(unreachable_patterns)]
        _ => Err(CliError::usage(
            "--pd nixl writes from the prefill pool through NIXL, which reaches host memory \
             (--backend cpu) and CUDA memory (--backend cuda); give one of those",
        )),
    }
}

/// Polls `t` until it completed (its polls are what make it progress), at most [`SILENCE`].
pub(super) fn wait_for(side: &PrefillSide, t: &mut Transfer, what: &str) -> CliResult<()> {
    let since = Instant::now();
    while !side.poll(t).map_err(nixl_err)? {
        if since.elapsed() > SILENCE {
            return Err(CliError::failed(format!(
                "{what} did not complete in {} s",
                SILENCE.as_secs()
            )));
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// A packed write's staging buffer: on the prefill device, or pinned host memory.
pub(super) enum Staging {
    /// Device memory (`--pd-write packed`).
    Device(AnyBuffer),
    /// Pinned host memory (`--pd-write packed-host`).
    Host(AnyHostBuffer),
}

/// Fills `staging` with request `uid`'s pages as `plan` lays them out, on the runtime's
/// copy stream, and returns once the copies completed: the seconds they took. Device
/// staging waits for the stream; host staging records one event after the device → host
/// copies and polls it (at most [`SILENCE`]).
pub(super) fn pack(
    rt: &Runtime<AnyDevice>,
    plan: &PackedWrite,
    staging: &mut Staging,
    uid: u64,
) -> CliResult<f64> {
    let what = "packing a request's pages";
    let packing = Instant::now();
    let (dev, pool, stream) = (rt.device(), &rt.pools().device, rt.copy_stream());
    match staging {
        Staging::Device(buf) => {
            for c in &plan.copies {
                dev.copy_on_device(
                    stream,
                    pool,
                    c.src as usize,
                    buf,
                    c.dst as usize,
                    c.len as usize,
                )
                .map_err(|e| CliError::device(what, e))?;
            }
            dev.synchronize(stream)
                .map_err(|e| CliError::device(what, e))?;
        }
        Staging::Host(buf) => {
            for c in &plan.copies {
                dev.copy_to_host(
                    stream,
                    pool,
                    c.src as usize,
                    buf,
                    c.dst as usize,
                    c.len as usize,
                )
                .map_err(|e| CliError::device(what, e))?;
            }
            let copied = dev
                .record_event(stream)
                .map_err(|e| CliError::device(what, e))?;
            while !dev
                .query_event(&copied)
                .map_err(|e| CliError::device(what, e))?
            {
                if packing.elapsed() > SILENCE {
                    return Err(CliError::failed(format!(
                        "the device → host staging copies of request {uid} did not complete \
                         in {} s",
                        SILENCE.as_secs()
                    )));
                }
                std::hint::spin_loop();
            }
        }
    }
    Ok(packing.elapsed().as_secs_f64())
}

pub(super) fn serve(h: &Hello, input: &mut impl BufRead, output: &mut impl Write) -> CliResult<()> {
    let io = |e: std::io::Error| CliError::failed(format!("writing to the decode side: {e}"));
    let kind: BackendKind = h
        .backend
        .parse()
        .map_err(|e: hisparse_runtime::UnknownBackend| CliError::usage(e.to_string()))?;
    let selector = h.device.clone().unwrap_or_default();
    let ordinal: u32 = selector.trim().parse().unwrap_or(0);
    let dev = AnyDevice::open(kind, &selector)
        .map_err(|e| CliError::device("opening the prefill device", e))?;
    let s = &h.setup;
    let kv = h.prefill_kv.clone();
    // One request at a time, its prefill chunks as large as the coordinator's token budget.
    let mut runtime_config = RuntimeConfig::new(1, 1);
    runtime_config.max_batched_tokens = runtime_config.max_batched_tokens.max(s.max_batched_tokens);
    let mut rt = Runtime::new(dev, kv.clone(), runtime_config)
        .map_err(|e| CliError::failed(format!("setting up the prefill runtime: {e}")))?;
    let geometry = PoolGeometry::device(&kv).map_err(nixl_err)?;
    let local = pool_region(&rt.pools().device, ordinal)?;
    let name = format!("hisparse-prefill-{}", std::process::id());
    // Registered memory besides the pool, declared before `side` so that it is dropped
    // (freed) only after the side (its registrations) is: the bulk writes' host and device
    // sources, and the packed writes' staging buffer.
    let mut host_bulk: Vec<u64> = Vec::new();
    let mut device_bulk: Option<(AnyBuffer, Region)> = None;
    let mut staging: Option<(Staging, Region)> = None;
    let staging_needed = match h.write {
        WriteLayout::Packed | WriteLayout::PackedHost => {
            // The budget is checked before any staging memory is taken: the device's free
            // memory for device staging, the host's available memory for pinned host
            // staging (alloc_pinned then also checks the pinned share of RAM).
            let needed = hisparse_nixl::staging_bytes_for(&h.offer.geometry, s.context);
            check_staging(h.write, needed, rt.device().memory_info())?;
            needed
        }
        WriteLayout::Pages => 0,
    };
    // SAFETY: the GPU pool belongs to `rt`, which outlives `side` (dropped explicitly
    // before it below); a request's pages are not written, and its blocks not handed to
    // another request, until its write completed (one request at a time, the coordinator
    // not stepped while a write is in flight).
    let mut side =
        unsafe { PrefillSide::new(&name, local, geometry, h.offer.clone()) }.map_err(nixl_err)?;
    if staging_needed > 0 {
        let (buf, r) = if h.write == WriteLayout::PackedHost {
            let buf = rt
                .device()
                .alloc_pinned(staging_needed as usize)
                .map_err(|e| CliError::device("allocating the host staging buffer", e))?;
            let r = region(
                rt.device().pinned_address(&buf) as u64,
                buf.byte_len(),
                MemoryKind::Host,
            );
            (Staging::Host(buf), r)
        } else {
            let buf = rt
                .device()
                .alloc(staging_needed as usize)
                .map_err(|e| CliError::device("allocating the staging buffer", e))?;
            let r = pool_region(&buf, ordinal)?;
            (Staging::Device(buf), r)
        };
        // SAFETY: `staging` outlives `side` (declared before it); the buffer is written only
        // by the packing copies of a request before its write is posted, and not again until
        // that write completed.
        unsafe { side.register(r) }.map_err(nixl_err)?;
        staging = Some((buf, r));
    }
    let (b, d) = (
        rt.device().backend().to_string(),
        rt.device().device_name().to_string(),
    );
    send(output, &FromPrefill::Ready(side.name().to_string(), b, d)).map_err(io)?;

    let mut line = String::new();
    // Bulk writes until the decode side starts the imports.
    loop {
        match recv::<ToPrefill>(input, &mut line).map_err(rt_err("reading from the decode side"))? {
            ToPrefill::Bulk {
                bytes,
                source,
                descriptor_bytes,
            } => {
                let src = match source {
                    BulkSource::Host => {
                        if host_bulk.is_empty() {
                            host_bulk = (0..bytes.div_ceil(8))
                                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                                .collect();
                            let r = region(
                                host_bulk.as_ptr() as u64,
                                host_bulk.len() as u64 * 8,
                                MemoryKind::Host,
                            );
                            // SAFETY: `host_bulk` is dropped after `side` and never written
                            // again (a later bulk write of more bytes is refused below).
                            unsafe { side.register(r) }.map_err(nixl_err)?;
                        }
                        region(
                            host_bulk.as_ptr() as u64,
                            host_bulk.len() as u64 * 8,
                            MemoryKind::Host,
                        )
                    }
                    BulkSource::Device => match &device_bulk {
                        Some((_, r)) => *r,
                        None => {
                            // Its bytes are the allocation's zeros: the figure measures the
                            // transport, nothing reads what it wrote.
                            let buf = rt.device().alloc(bytes as usize).map_err(|e| {
                                CliError::device("allocating the bulk write's source", e)
                            })?;
                            let r = pool_region(&buf, ordinal)?;
                            // SAFETY: `device_bulk` is dropped after `side`; nothing writes
                            // the buffer while it is registered.
                            unsafe { side.register(r) }.map_err(nixl_err)?;
                            device_bulk = Some((buf, r));
                            r
                        }
                    },
                };
                if bytes > src.len {
                    return Err(CliError::failed("bulk writes of growing sizes"));
                }
                let mut t = side.bulk(&src, bytes, descriptor_bytes).map_err(nixl_err)?;
                wait_for(&side, &mut t, "the bulk write")?;
                let secs = t.elapsed().map_or(f64::INFINITY, |e| e.as_secs_f64());
                send(output, &FromPrefill::BulkSent(secs, t.descriptors())).map_err(io)?;
            }
            ToPrefill::Start => break,
            _ => return Err(CliError::failed("the decode side spoke out of turn")),
        }
    }

    let mut coord = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: 1,
            max_batched_tokens: s.max_batched_tokens,
            max_spill_pages_per_step: 64,
            num_workers: 1,
            ..CoordinatorConfig::default()
        },
    )
    .map_err(|e| CliError::failed(e.to_string()))?;
    let mut forward = Forward::new(&kv, 0)?;
    let ratio = kv.sparse_compress_ratio.max(1);
    let nb = kv.num_buckets;
    let mut cmd = OffloadCommand::default();
    for uid in 1..=u64::from(s.requests) {
        coord
            .admit(uid, &prompt(uid, s.context))
            .map_err(|e| CliError::failed(e.to_string()))?;
        // Prefill, step by step: the forward pass writes the rows into the resident pages.
        let mut slot = None;
        let mut idle = 0u32;
        while coord.num_computed(uid).unwrap_or(0) < s.context {
            coord
                .schedule_step()
                .map_err(|e| CliError::failed(e.to_string()))?;
            coord.build_offload_command_into(&mut cmd);
            idle = if cmd.scheduled.is_empty() {
                idle + 1
            } else {
                0
            };
            if idle > 1000 {
                return Err(CliError::failed(
                    "the prefill side stalled: 1000 steps scheduled nothing",
                ));
            }
            rt.begin_step(&cmd)
                .map_err(|e| CliError::failed(format!("prefill runtime: {e}")))?;
            for sr in &cmd.scheduled {
                slot = Some(sr.slot);
                let end = sr.first_token + sr.num_tokens;
                let resident: Vec<Vec<i32>> = (0..nb)
                    .map(|b| {
                        rt.resident_row(b, sr.slot)
                            .map(<[i32]>::to_vec)
                            .unwrap_or_default()
                    })
                    .collect();
                let (dev, pools) = rt.device_and_pools_mut();
                forward.write(
                    dev,
                    &mut pools.device,
                    sr.id,
                    sr.first_token / ratio..end / ratio,
                    0..0,
                    |b, p| {
                        resident
                            .get(b as usize)
                            .and_then(|r| r.get(p as usize).copied())
                    },
                )?;
            }
            rt.end_step(&cmd)
                .map_err(|e| CliError::failed(format!("prefill runtime: {e}")))?;
            for stream in [rt.compute_stream(), rt.copy_stream()] {
                rt.device()
                    .synchronize(stream)
                    .map_err(|e| CliError::device("synchronising", e))?;
            }
            rt.poll_and_report(&mut coord)
                .map_err(|e| CliError::failed(format!("prefill runtime: {e}")))?;
        }
        let slot =
            slot.ok_or_else(|| CliError::failed("a prefilled request was never scheduled"))?;
        send(output, &FromPrefill::Prefilled(uid, s.context)).map_err(io)?;
        let manifest = match recv::<ToPrefill>(input, &mut line)
            .map_err(rt_err("reading from the decode side"))?
        {
            ToPrefill::Manifest(m) if m.request == uid => m,
            _ => return Err(CliError::failed("the decode side spoke out of turn")),
        };
        // The GPU block of every page, per bucket; all must be resident.
        let pages = manifest.pages() as usize;
        let mut sources: Vec<Vec<u32>> = Vec::with_capacity(nb as usize);
        for b in 0..nb {
            let row = rt.resident_row(b, slot).unwrap_or_default();
            let mut list = Vec::with_capacity(pages);
            for p in 0..pages {
                match row.get(p).copied() {
                    Some(block) if block > 0 => list.push(block as u32),
                    _ => {
                        return Err(CliError::failed(format!(
                            "page {p} of request {uid} (bucket {b}) is not on the prefill \
                             side's GPU: its pool is too small for a request; lower \
                             --context"
                        )));
                    }
                }
            }
            sources.push(list);
        }
        let lists: Vec<&[u32]> = sources.iter().map(|v| &v[..]).collect();
        let (mut t, pack_seconds) = match &mut staging {
            None => (side.send(&manifest, &lists).map_err(nixl_err)?, 0.0),
            Some((buf, r)) => {
                let plan = side
                    .plan_packed(&manifest, &lists, r.len)
                    .map_err(nixl_err)?;
                let pack_seconds = pack(&rt, &plan, buf, uid)?;
                (side.send_packed(r, &plan).map_err(nixl_err)?, pack_seconds)
            }
        };
        wait_for(&side, &mut t, &format!("the write of request {uid}"))?;
        let secs = t.elapsed().map_or(f64::INFINITY, |e| e.as_secs_f64());
        send(
            output,
            &FromPrefill::Sent {
                bytes: t.bytes(),
                seconds: secs,
                descriptors: t.descriptors(),
                pack_seconds,
            },
        )
        .map_err(io)?;
        coord
            .finish(uid)
            .map_err(|e| CliError::failed(e.to_string()))?;
    }
    match recv::<ToPrefill>(input, &mut line).map_err(rt_err("reading from the decode side"))? {
        ToPrefill::Done => {}
        _ => return Err(CliError::failed("the decode side spoke out of turn")),
    }
    drop(side);
    drop((host_bulk, device_bulk, staging));
    rt.drain()
        .map_err(|e| CliError::failed(format!("prefill runtime: {e}")))?;
    Ok(())
}
