//! The `hisparse` command: plan a KV-cache layout, simulate decoding on a backend with every read
//! row verified, run a backend's conformance suite, and benchmark its operations.
//!
//! Every failure is reported as one line on stderr (`error: ...`) with a non-zero exit code:
//! 2 for arguments to change, 1 for a failed run.

// A build without any backend feature still compiles (every device command then says which
// feature to enable); the device code paths are unused there.
#![cfg_attr(
    not(any(
        feature = "cpu",
        feature = "cuda",
        feature = "vulkan",
        feature = "rocm"
    )),
    allow(
        unused_imports,
        unreachable_code,
        dead_code,
        unused_variables,
        unused_mut
    )
)]

mod args;
mod backend;
mod bench;
mod conformance;
mod error;
mod host_pool_bench;
mod layout;
mod progress;
mod sim;
mod size;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::args::{Cli, Command};
use crate::error::CliResult;

/// Writes `text` to stdout (with a final newline if it lacks one). A closed pipe (`| head`) ends
/// the output quietly instead of panicking.
pub fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let nl = if text.ends_with('\n') { "" } else { "\n" };
    let _ = out
        .write_all(text.as_bytes())
        .and_then(|()| out.write_all(nl.as_bytes()));
    let _ = out.flush();
}

fn run(cli: Cli) -> CliResult<()> {
    match cli.command {
        Command::Bench(a) => {
            let kind = args::backend(&a.backend.backend)?;
            match &a.host_pool {
                Some(sizes) => {
                    let plan = host_pool_bench::plan(sizes, &a)?;
                    with_device!(kind, &a.backend.device, |dev| host_pool_bench::run_on(
                        hisparse_runtime::AnyDevice::from(dev),
                        &plan
                    ))
                }
                None => with_device!(kind, &a.backend.device, |dev| bench::bench_on(&dev, &a)),
            }
        }
        Command::Layout(a) => layout::run(&a),
        Command::Conformance(a) => conformance::run(&a),
        Command::Simulate(a) => {
            let kind = args::backend(&a.backend.backend)?;
            let setup = sim::setup(&a)?;
            if sim::pd::transport(&a, &setup)?.is_some() {
                return sim::pd::simulate_pd(kind, &a, &setup);
            }
            if setup.tp > 1 {
                return sim::simulate_tp(kind, &a, &setup);
            }
            with_device!(kind, &a.backend.device, |dev| sim::simulate_on(
                dev, &a, &setup
            ))
        }
        Command::SimulateRank => sim::tp::rank_main(),
        Command::SimulatePrefill => sim::pd::prefill_main(),
    }
}

/// The subcommands a user sees (hidden internal ones left out), for suggestions and for
/// pointing at the right `--help`.
fn visible_subcommands() -> Vec<String> {
    Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .collect()
}

/// A clap error as one line: clap's first line, clap's "did you mean" suggestion (a mistyped
/// subcommand, flag or value; never a hidden subcommand), and the help to read.
fn usage_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid arguments").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let visible = visible_subcommands();
    let suggestion = [
        ContextKind::SuggestedSubcommand,
        ContextKind::SuggestedArg,
        ContextKind::SuggestedValue,
    ]
    .into_iter()
    .find_map(|kind| {
        let shown = |s: &String| kind != ContextKind::SuggestedSubcommand || visible.contains(s);
        match e.get(kind) {
            Some(ContextValue::String(s)) => Some(s.clone()).filter(shown),
            Some(ContextValue::Strings(v)) => v.iter().find(|s| shown(s)).cloned(),
            _ => None,
        }
    });
    let command = std::env::args().nth(1).filter(|a| visible.contains(a));
    let help = match command {
        Some(c) => format!("hisparse {c} --help"),
        None => "hisparse --help".to_string(),
    };
    match suggestion {
        Some(s) => format!("{first}; did you mean `{s}`? (see `{help}`)"),
        None => format!("{first}; see `{help}`"),
    }
}

fn main() -> ExitCode {
    // A panic is a bug; report it on one line (with its location) rather than a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("internal error: {}", info.to_string().replace('\n', " "));
    }));
    let parsed = Cli::command().try_get_matches().and_then(|m| {
        let cli = Cli::from_arg_matches(&m)?;
        Ok((cli, m))
    });
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(e.kind(), K::DisplayHelp | K::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == K::DisplayHelpOnMissingArgumentOrSubcommand {
                eprintln!(
                    "error: no command given; use one of {} (see `hisparse --help`)",
                    visible_subcommands().join(", ")
                );
                return ExitCode::from(2);
            }
            eprintln!("error: {}", usage_line(&e));
            return ExitCode::from(2);
        }
    };
    if let Err(e) = args::refuse_idle_flags(&matches) {
        eprintln!("error: {e}");
        return ExitCode::from(e.exit_code() as u8);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
