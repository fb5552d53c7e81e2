//! `hisparse simulate`: prefill and decode through the real coordinator and the real device
//! operations, generic over [`hisparse_core::Device`] so every backend runs the same code.
//!
//! * [`workload`]: top-k selections with realistic structure (sink, local window, drifting
//!   clusters, tunable adjacent-step overlap);
//! * [`kv`]: synthetic KV rows, deterministic from (request, layer, position);
//! * [`forward`]: the simulated forward pass, writing those rows into the resident pages;
//! * [`verify`]: byte-for-byte checks of every row attention reads;
//! * [`engine`]: the per-step loop: the coordinator plans, the `hisparse-runtime` executes;
//! * [`report`] and [`plot`]: what a run reports, as text, JSON and SVG.

pub mod engine;
pub mod forward;
pub mod kv;
pub mod micro;
pub mod pd;
pub mod plot;
pub mod rank;
pub mod report;
pub mod tp;
pub mod verify;
pub mod worker;
pub mod workload;

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::model::{LayerSpec, OwnedModel};

use crate::args::{self, SimulateArgs};
use crate::error::{CliError, CliResult};
use engine::SimSetup;
use report::SimReport;

/// The model of `--model` or `--preset`, keeping only its first `layers` layers when
/// `layers > 0`.
fn model(name: &str, file: Option<&std::path::Path>, layers: u32) -> CliResult<OwnedModel> {
    let mut m: OwnedModel = crate::layout::model(name, file)?;
    if layers > 0 {
        if layers as usize > m.layers.len() {
            return Err(CliError::usage(format!(
                "--layers {layers} exceeds the {} layers of {name}; give at most {} (0 = all)",
                m.layers.len(),
                m.layers.len()
            )));
        }
        m.layers.truncate(layers as usize);
        if !m.layers.iter().any(|l| matches!(l, LayerSpec::Sparse(_))) {
            return Err(CliError::usage(format!(
                "--layers {layers} keeps no sparse layer of {name}; give more layers"
            )));
        }
    }
    Ok(m)
}

/// Parses and validates the arguments and plans the layout, choosing default memory sizes small
/// enough that pages are reclaimed and rows are swapped in. Every error names a flag
/// `simulate` has, and the one to change.
pub fn setup(a: &SimulateArgs) -> CliResult<SimSetup> {
    let m = model(
        &a.preset,
        a.model.as_deref(),
        args::number("layers", &a.layers)?,
    )?;
    // Rows of the data plane are `i32`, and every worker is polled each step.
    let requests: u32 = args::whole_in("requests", &a.requests, 1, i32::MAX as u32)?;
    let context: u32 = args::positive("context", &a.context)?;
    let decode_steps: u32 = args::positive("decode-steps", &a.decode_steps)?;
    let seed: u64 = args::number("seed", &a.seed)?;
    let overlap = args::decimal_in("overlap", &a.overlap, 0.0, 1.0)?;
    let chunk: u32 = args::positive("chunk", &a.chunk)?;
    let micro_batches: u32 = args::whole_in("micro-batches", &a.micro_batches, 1, 64)?;
    let mut shared_prefix: u32 = args::number("shared-prefix", &a.shared_prefix)?;
    let workers: u32 = args::whole_in(
        "workers",
        &a.workers,
        1,
        hisparse_core::coordinator::MAX_WORKERS,
    )?;
    if shared_prefix > context {
        return Err(CliError::usage(format!(
            "--shared-prefix {shared_prefix} exceeds --context {context}; give at most the prompt length"
        )));
    }
    if a.prefix_on_host {
        if a.import {
            return Err(CliError::usage(
                "--prefix-on-host and --import both set: imported requests do not prefill; drop one",
            ));
        }
        if shared_prefix == 0 {
            shared_prefix = context / 2;
        }
    }
    let tp: u32 = args::whole_in("tp", &a.tp, 1, 64)?;
    if tp > 1 && workers > 1 {
        return Err(CliError::usage(
            "--tp and --workers both set: with --tp every rank is a worker; drop --workers",
        ));
    }
    if a.import && tp > 1 {
        return Err(CliError::usage(
            "--import runs in one process (the prefill node writes one host pool); drop --tp or --import",
        ));
    }
    if a.shared_host_pool && tp == 1 {
        return Err(CliError::usage(
            "--shared-host-pool shares one host pool between ranks; give --tp 2 or more",
        ));
    }
    let dbs = a
        .device_buffer_size
        .as_deref()
        .map(|s| args::positive::<u32>("device-buffer-size", s))
        .transpose()?;
    let spec_tokens: u32 = args::whole_in("spec-tokens", &a.spec_tokens, 0, 15)?;
    let accept_rate = args::decimal_in("accept-rate", &a.accept_rate, 0.0, 1.0)?;
    // One step computes the sampled token and the drafts; a multi-process run plans its layout
    // for the host pool its ranks share.
    let options = hisparse_runtime::plan::LayoutRequest {
        device_buffer_size: dbs,
        max_query_len: 1 + spec_tokens,
        shared_host_pool: tp > 1 && a.shared_host_pool,
        ..crate::layout::request(0, 0, 0)
    };
    let spec = m.as_spec();
    let too_long = || {
        CliError::usage(format!(
            "--context {context} + --decode-steps {decode_steps} tokens exceed the {} a request \
             may hold; lower --context or --decode-steps",
            u32::MAX
        ))
    };
    let final_len = context.checked_add(decode_steps).ok_or_else(too_long)?;
    let max_len = final_len
        .checked_next_multiple_of(spec.block_tokens)
        .ok_or_else(too_long)?;
    let (length, shorten) = ("--context + --decode-steps", "--context or --decode-steps");
    // Provisional plan with ample memory, to learn block sizes and per-request needs: when even
    // that cannot hold one request, its length is what to change.
    let probe_request = hisparse_runtime::plan::LayoutRequest {
        gpu_mem: 1 << 36,
        host_mem: 1 << 40,
        max_model_len: max_len,
        ..options
    };
    let probe = hisparse_runtime::plan::plan_model(&spec, &probe_request).map_err(|e| match e {
        hisparse_core::layout::LayoutError::HostBudgetTooSmall { .. }
        | hisparse_core::layout::LayoutError::GpuPoolTooSmall { .. }
        | hisparse_core::layout::LayoutError::PoolTooLarge { .. }
        | hisparse_core::layout::LayoutError::Overflow { .. } => CliError::usage(format!(
            "--context {context} + --decode-steps {decode_steps} = {final_len} tokens per \
                 request are more than the simulation plans for (one request in 64 GiB of GPU \
                 memory and 1 TiB of host memory, block ids and rows within i32); lower {shorten}"
        )),
        other => crate::layout::layout_error(
            other,
            &crate::layout::PlanFlags {
                gpu: "--gpu-mem",
                host: "--host-mem",
                length,
                shorten,
                query: "--spec-tokens",
            },
        ),
    })?;
    // Budgets given on the command line are the flags to change; derived ones grow with
    // --requests and the request length.
    let derived = "--requests, --context or --decode-steps (the default budget grows with them)";
    let r = u64::from(requests);
    let (host, host_flag) = match &a.host_mem {
        Some(h) => (args::size("host-mem", h)?, "--host-mem"),
        None => {
            let pages = u64::from(probe.pages_for(final_len));
            let blocks = r.saturating_mul(pages + 1).saturating_add(2);
            // A shared pool aligns every layer's array to 4096 B: room for that too.
            let align = if options.shared_host_pool {
                probe.groups[0].layers.len() as u64 * 4096
            } else {
                0
            };
            (
                blocks
                    .saturating_mul(probe.host_bytes_per_block())
                    .saturating_add(align),
                derived,
            )
        }
    };
    let (gpu, gpu_flag) = match &a.gpu_mem {
        Some(g) => (args::size("gpu-mem", g)?, "--gpu-mem"),
        None => {
            // Room for every request's HiSparse needs plus a quarter of the extra pages an
            // all-resident cache would hold: reclaim and swap-in must happen.
            let per = probe.gpu_blocks_per_request(final_len);
            let extra = per.all_on_gpu.saturating_sub(per.hisparse);
            // At least one request's prefill (the layout's rule, the one admission applies): a
            // prefill chunk reads its whole context on the GPU (pages on host are staged
            // there), a restarted request's included.
            let blocks = r
                .saturating_mul(per.hisparse.min(per.all_on_gpu))
                .saturating_add(r.saturating_mul(extra) / 4)
                .max(probe.prefill_gpu_blocks(final_len))
                .saturating_add(1);
            (blocks.saturating_mul(probe.bytes_per_block), derived)
        }
    };
    let flags = crate::layout::PlanFlags {
        gpu: gpu_flag,
        host: host_flag,
        length,
        shorten,
        query: "--spec-tokens",
    };
    let req = hisparse_runtime::plan::LayoutRequest {
        gpu_mem: gpu,
        host_mem: host,
        max_model_len: max_len,
        ..options
    };
    let mut kv: KvCacheConfig = crate::layout::plan(&spec, &req, &flags)?;
    // Mirroring changes what the coordinator plans, not the layout.
    kv.config.eager_host_mirror = !a.no_eager_mirror;
    Ok(SimSetup {
        preset: m.name.clone(),
        kv,
        requests,
        context,
        decode_steps,
        seed,
        overlap,
        max_batched_tokens: chunk,
        shared_prefix,
        workers,
        tp,
        shared_host_pool: a.shared_host_pool,
        import: a.import,
        prefix_on_host: a.prefix_on_host,
        spec_tokens,
        accept_rate,
        micro_batches,
        quiet: a.json,
    })
}

/// Creates the plot's file before the run, so a path that cannot be written fails at once
/// instead of after the whole simulation.
fn check_plot(a: &SimulateArgs) -> CliResult<()> {
    if let Some(path) = &a.plot {
        std::fs::write(path, b"").map_err(|e| {
            CliError::usage(format!(
                "--plot {}: cannot create the file ({e}); give a path in an existing, writable folder",
                path.display()
            ))
        })?;
    }
    Ok(())
}

/// Runs the simulation on `dev` and prints the report (and the SVG, if asked).
pub fn simulate_on<D: Device>(dev: D, a: &SimulateArgs, s: &SimSetup) -> CliResult<()> {
    check_plot(a)?;
    publish(a, engine::run(dev, s)?)
}

/// Runs the simulation over `s.tp` rank processes on backend `kind` and prints the report.
pub fn simulate_tp(
    kind: hisparse_runtime::BackendKind,
    a: &SimulateArgs,
    s: &SimSetup,
) -> CliResult<()> {
    if !crate::backend::compiled(kind) {
        return Err(CliError::NotCompiled(kind.name()));
    }
    check_plot(a)?;
    let mut ranks = tp::Processes::start(kind, &a.backend.device, s)?;
    publish(a, engine::run_on(&mut ranks, s)?)
}

/// Prints the report (and writes the SVG), failing when any row mismatched.
fn publish(a: &SimulateArgs, report: SimReport) -> CliResult<()> {
    if let Some(path) = &a.plot {
        let (hit, bytes) = plot::by_decode_step(&report.steps);
        let title = format!(
            "hisparse simulate — {} on {}, {} requests × {} tokens",
            report.preset, report.backend, report.requests, report.context
        );
        std::fs::write(path, plot::render(&title, &hit, &bytes)).map_err(|e| {
            CliError::failed(format!("cannot write the plot to {}: {e}", path.display()))
        })?;
    }
    if a.json {
        crate::emit(&report.to_json());
    } else {
        crate::emit(&report.to_text());
    }
    for (bad, of, what) in [
        (
            report.mismatched_rows,
            report.verified_rows,
            "rows read by attention",
        ),
        (
            report.indexer_mismatched_rows,
            report.indexer_rows_verified,
            "indexer rows read back",
        ),
    ] {
        if bad > 0 {
            return Err(CliError::failed(format!(
                "{bad} of {of} {what} did not match their source (first: {})",
                report.first_mismatch.as_deref().unwrap_or("?")
            )));
        }
    }
    if report.verified_rows == 0 {
        return Err(CliError::failed(
            "no row was verified: the run decoded nothing; give it --decode-steps 1 or more",
        ));
    }
    Ok(())
}
