//! `hisparse conformance`: the shared conformance suite on one backend, opened through the
//! runtime ([`hisparse_runtime::AnyDevice`]) and run by the conformance crate's runner (one line
//! per case, then `N passed, M failed`).
//!
//! A GPU backend whose driver or device is missing reports every case as skipped, unless
//! `HISPARSE_REQUIRE_DEVICE=1` (then it is a failure), exactly as the per-backend test targets do.
//! The command itself exits non-zero when no case ran — every case skipped, or a filter that
//! matches nothing — because nothing was verified.

use hisparse_conformance::Report;

use crate::args::{self, ConformanceArgs};
use crate::error::{CliError, CliResult};

/// Runs the suite over the runtime's [`hisparse_runtime::AnyDevice`] and turns failures into a
/// non-zero exit.
pub fn run(a: &ConformanceArgs) -> CliResult<()> {
    let kind = args::backend(&a.backend.backend)?;
    let filter = a.filter.as_deref();
    let report = suite(kind, &a.backend.device, filter)?;
    verdict(kind.name(), filter, &report)
}

/// The suite's cases on backend `kind`: a device that does not open is the suite's to judge
/// (every case skipped when there is none, unless a device is required).
#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
fn suite(
    kind: crate::backend::BackendKind,
    selector: &str,
    filter: Option<&str>,
) -> CliResult<Report> {
    use hisparse_runtime::OpenError;
    let opened = match crate::backend::open(kind, selector)? {
        Ok(dev) => Ok(dev),
        Err(OpenError::Device { source, .. }) => Err(source),
        Err(e) => return Err(CliError::device("cannot open the device", e)),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let report = hisparse_conformance::run_opened_named(kind.name(), opened, filter, &mut out);
    let _ = std::io::Write::flush(&mut out);
    Ok(report)
}

/// Without any backend compiled in there is nothing to run the suite on.
#[cfg(not(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
)))]
fn suite(kind: crate::backend::BackendKind, _: &str, _: Option<&str>) -> CliResult<Report> {
    Err(CliError::NotCompiled(kind.name()))
}

/// A run succeeds only when nothing failed and at least one case ran: a filter that selects
/// nothing, or a run whose every case was skipped (no device), verified nothing and must not
/// look like success.
pub fn verdict(backend: &str, filter: Option<&str>, report: &Report) -> CliResult<()> {
    let total = report.passed + report.failed + report.skipped;
    if total == 0 {
        return Err(CliError::usage(format!(
            "the filter `{}` matches no conformance case; give part of a case name (`hisparse \
             conformance --backend {backend}` lists them all)",
            filter.unwrap_or("")
        )));
    }
    if report.failed > 0 {
        return Err(CliError::failed(format!(
            "conformance on {backend}: {} of {total} cases failed (first: {})",
            report.failed,
            report.failures.first().map(String::as_str).unwrap_or("?")
        )));
    }
    if report.passed == 0 {
        return Err(CliError::failed(format!(
            "conformance on {backend}: all {} cases were skipped, nothing was verified (see the \
             SKIPPED line above: no {backend} device or runtime was found)",
            report.skipped
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(passed: usize, failed: usize, skipped: usize) -> Report {
        Report {
            passed,
            failed,
            skipped,
            failures: vec!["case: why".into(); failed],
        }
    }

    #[test]
    fn nothing_verified_is_not_success() {
        assert!(verdict("cpu", None, &report(3, 0, 1)).is_ok());
        let e = verdict("cuda", None, &report(0, 0, 240)).unwrap_err();
        assert_eq!(e.exit_code(), 1);
        assert!(e.to_string().contains("all 240 cases were skipped"), "{e}");
        let e = verdict("cpu", Some("zzz"), &report(0, 0, 0)).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string().contains("`zzz` matches no conformance case"),
            "{e}"
        );
        let e = verdict("cpu", None, &report(2, 1, 0)).unwrap_err();
        assert!(e.to_string().contains("1 of 3 cases failed"), "{e}");
    }
}
