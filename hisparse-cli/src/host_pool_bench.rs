//! `hisparse bench --host-pool <sizes>`: host-pool set-up and release beside the same run's
//! memset bandwidth (`hisparse_device_bench::host_pool`).

use hisparse_device_bench::host_pool::{
    self, HostPoolPaths, HostPoolReport, MEMSET, PathOutcome, SizeReport,
};
use hisparse_runtime::host_memory::{AnonymousMapping, HostPoolConfig, HugePages, Registration};
// A build without a backend has no device to set a pool up on (`with_device!` says so).
#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
use hisparse_runtime::{AnyDevice, AnyHostBuffer, SharedHostPool, SharedSegment};
use serde_json::json;

use crate::args::BenchArgs;
use crate::error::{CliError, CliResult};
use crate::size::{human, parse_size};

/// What `--host-pool` and `--registration` ask for.
pub struct Plan {
    sizes: Vec<u64>,
    config: HostPoolConfig,
    json: bool,
}

/// Largest `--threads`.
const MAX_THREADS: usize = 4096;

/// Checks the flags before any device is opened.
pub fn plan(sizes: &str, a: &BenchArgs) -> CliResult<Plan> {
    let sizes = sizes
        .split(',')
        .map(|s| {
            let bytes = parse_size(s).map_err(|e| CliError::usage(format!("--host-pool: {e}")))?;
            if bytes == 0 {
                return Err(CliError::usage(
                    "--host-pool: a pool of 0 bytes; give sizes such as 8GiB,64GiB",
                ));
            }
            Ok(bytes)
        })
        .collect::<CliResult<Vec<u64>>>()?;
    let registration = match a.registration.trim() {
        "chunks" => Registration::Chunks,
        "whole" => Registration::Whole,
        other => {
            return Err(CliError::usage(format!(
                "--registration `{other}` is not a way to register a pool; use `chunks` or `whole`"
            )));
        }
    };
    let huge_pages = match a.huge_pages.trim() {
        "transparent" => HugePages::Transparent,
        "explicit" => HugePages::Explicit,
        "explicit-if-free" => HugePages::ExplicitIfFree,
        "off" => HugePages::Off,
        other => {
            return Err(CliError::usage(format!(
                "--huge-pages `{other}` is not a page choice; use `transparent`, `explicit`, \
                 `explicit-if-free` or `off`"
            )));
        }
    };
    let threads = a
        .threads
        .as_deref()
        .map(|t| crate::args::whole_in("threads", t, 1, MAX_THREADS))
        .transpose()?;
    Ok(Plan {
        sizes,
        config: HostPoolConfig {
            registration,
            huge_pages,
            threads,
            ..HostPoolConfig::default()
        },
        json: a.json,
    })
}

#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
/// Runs the host-pool benchmark on `dev` and prints the report.
pub fn run_on(dev: AnyDevice, plan: &Plan) -> CliResult<()> {
    let dev = dev.with_host_pool_config(plan.config);
    let lend = |array: &mut AnonymousMapping| {
        // SAFETY: the benchmark drops the buffer before the array and touches the array only
        // through the buffer meanwhile (`HostPoolPaths::lend`); the array is a live, readable
        // and writable, page-aligned mapping of `len` bytes.
        unsafe { dev.lend_host_memory(array.addr().as_ptr(), array.len()) }
    };
    let share = |segment: SharedSegment| dev.host_pool_from_shared(segment);
    let describe = |b: &AnyHostBuffer| b.setup().map(|s| s.to_string());
    let paths = HostPoolPaths {
        lend: Some(&lend),
        share: Some(&share),
        describe: Some(&describe),
    };
    if !plan.json {
        eprintln!(
            "measuring host pools of {} on {} ({}), one after another...",
            plan.sizes
                .iter()
                .map(|&b| human(b))
                .collect::<Vec<_>>()
                .join(", "),
            dev.kind(),
            hisparse_core::Device::device_name(&dev)
        );
    }
    let ticker = crate::progress::Ticker::start("measuring", plan.json);
    let report = host_pool::run(&dev, &plan.sizes, &paths);
    drop(ticker);
    let report = report.map_err(CliError::failed)?;
    if plan.json {
        crate::emit(&to_json(&report, &plan.config));
    } else {
        crate::emit(&to_text(&report, &plan.config));
    }
    Ok(())
}

fn gibs(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / seconds
}

/// The report as tables, one per size.
pub fn to_text(r: &HostPoolReport, cfg: &HostPoolConfig) -> String {
    let mut s = format!(
        "host pools on {} — {} ({} CPUs; registration {:?}, pages {:?}, threads {})\n\
         set-up and release of each pool beside the same run's memset of as many bytes\n",
        r.backend,
        r.device,
        r.threads,
        cfg.registration,
        cfg.huge_pages,
        cfg.threads
            .map_or("one per CPU of the node".to_string(), |t| t.to_string())
    );
    for size in &r.sizes {
        s += &format!("\n{}:", human(size.bytes));
        for c in &size.ceilings {
            s += &format!(" {} {:.2} GiB/s ·", c.name, gibs(size.bytes, c.seconds));
        }
        if !size.ceilings.is_empty() {
            s.pop();
            s.pop();
        }
        s += "\n";
        s += &format!(
            "  {:<8} {:>10} {:>8} {:>9} {:>13} {:>10}  {}\n",
            "path", "set-up", "GiB/s", "× memset", "drop returns", "released", "how"
        );
        for p in &size.paths {
            s += &format!("  {:<8} ", p.path);
            s += &match &p.outcome {
                PathOutcome::Measured {
                    setup_s,
                    drop_s,
                    released_s,
                    setup,
                } => format!(
                    "{:>8.2} s {:>8.2} {:>9} {:>11.3} s {:>8.2} s  {}\n",
                    setup_s,
                    gibs(size.bytes, *setup_s),
                    share_of_memset(size, *setup_s).map_or("-".to_string(), |x| format!("{x:.2}")),
                    drop_s,
                    released_s,
                    setup.as_deref().unwrap_or("-")
                ),
                PathOutcome::Refused(m) => format!("refused: {m}\n"),
                PathOutcome::NotAvailable => "not available on this backend\n".to_string(),
            };
        }
    }
    s
}

/// Set-up bandwidth as a share of the one-thread memset of the same size.
fn share_of_memset(size: &SizeReport, setup_s: f64) -> Option<f64> {
    size.ceiling_bytes_per_s(MEMSET)
        .map(|m| size.bytes as f64 / setup_s / m)
}

/// The report as JSON.
pub fn to_json(r: &HostPoolReport, cfg: &HostPoolConfig) -> String {
    let sizes: Vec<_> = r
        .sizes
        .iter()
        .map(|size| {
            let ceilings: Vec<_> = size
                .ceilings
                .iter()
                .map(|c| {
                    json!({
                        "name": c.name,
                        "seconds": c.seconds,
                        "gib_per_s": gibs(size.bytes, c.seconds),
                    })
                })
                .collect();
            let paths: Vec<_> = size
                .paths
                .iter()
                .map(|p| match &p.outcome {
                    PathOutcome::Measured {
                        setup_s,
                        drop_s,
                        released_s,
                        setup,
                    } => json!({
                        "path": p.path,
                        "setup_seconds": setup_s,
                        "setup_gib_per_s": gibs(size.bytes, *setup_s),
                        "share_of_memset": share_of_memset(size, *setup_s),
                        "drop_seconds": drop_s,
                        "release_seconds": released_s,
                        "setup": setup,
                    }),
                    PathOutcome::Refused(m) => json!({ "path": p.path, "refused": m }),
                    PathOutcome::NotAvailable => json!({ "path": p.path, "available": false }),
                })
                .collect();
            json!({ "bytes": size.bytes, "ceilings": ceilings, "paths": paths })
        })
        .collect();
    serde_json::to_string_pretty(&json!({
        "backend": r.backend,
        "device": r.device,
        "cpus": r.threads,
        "registration": format!("{:?}", cfg.registration).to_lowercase(),
        "huge_pages": format!("{:?}", cfg.huge_pages).to_lowercase(),
        "threads": cfg.threads,
        "memset_ceiling": MEMSET,
        "sizes": sizes,
    }))
    .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
