//! `hisparse conformance`: the shared conformance suite on one backend, through the conformance
//! crate's runner (one line per case, then `N passed, M failed`).
//!
//! A GPU backend whose driver or device is missing reports every case as skipped, unless
//! `HISPARSE_REQUIRE_DEVICE=1` (then it is a failure), exactly as the per-backend test targets do.
//! The command itself exits non-zero when no case ran — every case skipped, or a filter that
//! matches nothing — because nothing was verified.

use std::io::Write;

use hisparse_conformance::{Report, run_opened};

use crate::args::{self, ConformanceArgs};
use crate::backend::BackendKind;
use crate::error::{CliError, CliResult};

/// Runs the suite and turns failures into a non-zero exit.
pub fn run(a: &ConformanceArgs) -> CliResult<()> {
    let kind = args::backend(&a.backend.backend)?;
    #[allow(unused_variables)]
    let sel = a.backend.device.as_str();
    let filter = a.filter.as_deref();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let report: Report = match kind {
        #[cfg(feature = "cpu")]
        BackendKind::Cpu => run_opened(hisparse_backend_cpu::CpuDevice::open(), filter, &mut out),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let ord = crate::backend::ordinal(sel, kind)?;
            run_opened(
                hisparse_backend_cuda::CudaDevice::open(ord),
                filter,
                &mut out,
            )
        }
        #[cfg(feature = "vulkan")]
        BackendKind::Vulkan => run_opened(
            hisparse_backend_vulkan::VulkanDevice::open(sel),
            filter,
            &mut out,
        ),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => {
            let ord = crate::backend::ordinal(sel, kind)?;
            run_opened(
                hisparse_backend_rocm::RocmDevice::open(ord),
                filter,
                &mut out,
            )
        }
        #[allow(unreachable_patterns)]
        other => return Err(CliError::NotCompiled(other.name())),
    };
    let _ = out.flush();
    verdict(kind.name(), filter, &report)
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
