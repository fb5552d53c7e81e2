//! The prefill side of `simulate --pd nixl`: a second process of this executable that prefills
//! each request on its own runtime and writes its pages into the host blocks the decode side
//! assigned (page by page, packed on the device, or packed into pinned host memory).

use std::io::{BufRead, Write};

use hisparse_core::Device;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_nixl::{MemoryKind, PdError, PrefillWriter, Region};
use hisparse_runtime::{AnyBuffer, AnyDevice, BackendKind, Runtime};

use super::super::forward::Forward;
use super::super::worker::{recv, send, serve_worker};
use super::protocol::{
    BulkSource, FromPrefill, Hello, SILENCE, ToPrefill, nixl_err, prompt, region, rt_err,
};
use super::{PREFILL_SUBCOMMAND, WriteLayout};
use crate::error::{CliError, CliResult};

/// The prefill process.
pub(super) fn prefill_main() -> CliResult<()> {
    serve_worker(
        &format!("{PREFILL_SUBCOMMAND} is started by `hisparse simulate --pd nixl`"),
        FromPrefill::Failed,
        |hello: Hello, input, output| serve(&hello, input, output),
    )
}

/// A refused staging buffer, with the flags that change it.
pub(super) fn staging_refusal(write: WriteLayout, e: PdError) -> CliError {
    match e {
        PdError::StagingBudget { .. } => CliError::usage(format!(
            "nixl: {e} (the {} staging of --pd-write {}; --pd-write pages writes without \
             staging; a shorter --context needs less)",
            if write == WriteLayout::PackedHost {
                "pinned host"
            } else {
                "device"
            },
            write.name()
        )),
        other => nixl_err(other),
    }
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
    let mut rt = Runtime::new(dev, kv.clone(), s.prefill_runtime_config())
        .map_err(|e| CliError::failed(format!("setting up the prefill runtime: {e}")))?;
    let name = format!("hisparse-prefill-{}", std::process::id());
    // The bulk writes' host and device sources: registered memory declared before `writer`,
    // so that it is dropped (freed) only after the writer (its registrations) is.
    let mut host_bulk: Vec<u64> = Vec::new();
    let mut device_bulk: Option<(AnyBuffer, Region)> = None;
    // SAFETY: the GPU pool belongs to `rt`, which outlives `writer` (dropped explicitly
    // before it below); a request's pages are not written, and its blocks not handed to
    // another request, until its write completed (one request at a time, the coordinator
    // not stepped while a write is in flight).
    let mut writer = unsafe {
        PrefillWriter::new(
            &name,
            &rt,
            ordinal,
            h.offer.clone(),
            h.write,
            s.context,
            SILENCE,
        )
    }
    .map_err(|e| staging_refusal(h.write, e))?;
    let (b, d) = (
        rt.device().backend().to_string(),
        rt.device().device_name().to_string(),
    );
    send(output, &FromPrefill::Ready(writer.name().to_string(), b, d)).map_err(io)?;

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
                            // SAFETY: `host_bulk` is dropped after `writer` and never written
                            // again (a later bulk write of more bytes is refused below).
                            unsafe { writer.side_mut().register(r) }.map_err(nixl_err)?;
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
                            let r = hisparse_nixl::device_region(rt.device(), &buf, ordinal)
                                .map_err(nixl_err)?;
                            // SAFETY: `device_bulk` is dropped after `writer`; nothing writes
                            // the buffer while it is registered.
                            unsafe { writer.side_mut().register(r) }.map_err(nixl_err)?;
                            device_bulk = Some((buf, r));
                            r
                        }
                    },
                };
                if bytes > src.len {
                    return Err(CliError::failed("bulk writes of growing sizes"));
                }
                let mut t = writer
                    .side_mut()
                    .bulk(&src, bytes, descriptor_bytes)
                    .map_err(nixl_err)?;
                writer.wait(&mut t, "the bulk write").map_err(nixl_err)?;
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
        let posted = writer.write(&rt, slot, &manifest).map_err(|e| match e {
            PdError::PageNotResident { .. } => CliError::failed(format!(
                "nixl: {e} (the prefill side's pool is too small for a request; lower \
                     --context)"
            )),
            e => nixl_err(e),
        })?;
        let (mut t, pack_seconds) = (posted.transfer, posted.pack_seconds);
        writer
            .wait(&mut t, &format!("the write of request {uid}"))
            .map_err(nixl_err)?;
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
    drop(writer);
    drop((host_bulk, device_bulk));
    rt.drain()
        .map_err(|e| CliError::failed(format!("prefill runtime: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::MemoryInfo;

    #[test]
    fn a_refused_staging_buffer_names_the_memory_and_the_flags() {
        let gib = 1u64 << 30;
        let info = |device_free: u64, host_available: u64| {
            Some(MemoryInfo {
                device_free,
                host_available,
                unified: false,
            })
        };
        let check = |write: WriteLayout, info: Option<MemoryInfo>| {
            hisparse_nixl::check_staging_budget(gib, write.staging_limit(info))
                .map_err(|e| staging_refusal(write, e))
        };
        // Plenty of host memory, little device memory: only host staging fits.
        let lean_gpu = info(gib, 64 * gib);
        check(WriteLayout::PackedHost, lean_gpu).unwrap();
        let e = check(WriteLayout::Packed, lean_gpu).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = e.to_string();
        assert!(e.contains("staging") && e.contains("device"), "{e}");
        // And the other way round.
        let lean_host = info(64 * gib, gib);
        check(WriteLayout::Packed, lean_host).unwrap();
        let e = check(WriteLayout::PackedHost, lean_host)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pinned host") && e.contains("packed-host"),
            "{e}"
        );
    }
}
