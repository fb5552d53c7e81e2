//! `hisparse bench`: device-level figures beside the ceilings measured in the same run.

use hisparse_core::Device;
use hisparse_device_bench::{BenchConfig, Report};
use serde_json::json;

use crate::args::{self, BenchArgs};
use crate::error::{CliError, CliResult};

/// Largest `--iters`: about a minute of measurements on the development machine.
pub const MAX_ITERS: usize = 1000;

/// Runs the benchmark on `dev` and prints the report.
pub fn bench_on<D: Device>(dev: &D, a: &BenchArgs) -> CliResult<()> {
    // Each figure takes `iters` samples of at least 2 ms (the memcpy ceiling, `iters` copies of
    // 256 MiB): the bound keeps a run within minutes.
    let iters: usize = args::whole_in("iters", &a.iters, 1, MAX_ITERS)?;
    let cfg = BenchConfig {
        iters,
        ..BenchConfig::default()
    };
    if !a.json {
        eprintln!(
            "measuring on {} ({}) — {iters} samples per figure...",
            dev.backend(),
            dev.device_name()
        );
    }
    // The figures run one after another without a hook to report them; a ticker shows the run
    // is alive (on a terminal only).
    let ticker = crate::progress::Ticker::start("measuring", a.json);
    let report = hisparse_device_bench::run(dev, &cfg)
        .map_err(|e| CliError::device(&format!("benchmark on {}", dev.backend()), e));
    drop(ticker);
    let report = report?;
    if a.json {
        crate::emit(&to_json(&report));
    } else {
        crate::emit(&to_text(&report));
    }
    Ok(())
}

fn gbs(bytes_per_s: f64) -> String {
    format!("{:.2} GB/s", bytes_per_s / 1e9)
}

/// The report as a table.
pub fn to_text(r: &Report) -> String {
    let mut s = format!(
        "backend {} — {}\n\nceilings (same run):\n",
        r.backend, r.device
    );
    for c in &r.ceilings {
        s += &format!("  {:<28} {:>12}\n", c.name, gbs(c.bytes_per_s));
    }
    s += "\noperations:\n";
    s += &format!(
        "  {:<64} {:>10} {:>17} {:>12}  {}\n",
        "operation", "µs/call", "items/s", "bandwidth", "share of ceiling"
    );
    for f in &r.figures {
        let ceiling = r.ceiling(f.ceiling);
        let share = ceiling
            .map(|c| {
                format!(
                    "{:.0}% of {}",
                    100.0 * f.bytes_per_s() / c.bytes_per_s,
                    c.name
                )
            })
            .unwrap_or_default();
        let memcpy = r
            .ceiling(hisparse_device_bench::MEMCPY)
            .filter(|_| f.ceiling != hisparse_device_bench::DEVICE)
            .map(|c| {
                format!(
                    ", {:.0}% of memcpy",
                    100.0 * f.bytes_per_s() / c.bytes_per_s
                )
            })
            .unwrap_or_default();
        s += &format!(
            "  {:<64} {:>10.1} {:>8.1} M {:<7} {:>12}  {share}{memcpy}\n",
            f.name,
            f.seconds * 1e6,
            f.items_per_s() / 1e6,
            f.item,
            gbs(f.bytes_per_s()),
        );
    }
    s
}

/// The report as JSON.
pub fn to_json(r: &Report) -> String {
    let ceilings: Vec<_> = r
        .ceilings
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "bytes_per_s": c.bytes_per_s,
                "seconds": c.seconds,
                "bytes": c.bytes,
            })
        })
        .collect();
    let figures: Vec<_> = r
        .figures
        .iter()
        .map(|f| {
            let c = r.ceiling(f.ceiling).map(|c| c.bytes_per_s);
            json!({
                "name": f.name,
                "seconds_per_call": f.seconds,
                "items": f.items,
                "item": f.item,
                "items_per_s": f.items_per_s(),
                "bytes": f.bytes,
                "bytes_per_s": f.bytes_per_s(),
                "ceiling": f.ceiling,
                "ceiling_bytes_per_s": c,
                "share_of_ceiling": c.map(|c| f.bytes_per_s() / c),
            })
        })
        .collect();
    serde_json::to_string_pretty(&json!({
        "backend": r.backend,
        "device": r.device,
        "ceilings": ceilings,
        "figures": figures,
    }))
    .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
