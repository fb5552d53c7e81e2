//! `hisparse conformance`: the shared conformance suite on one backend, through the conformance
//! crate's runner (one line per case, then `N passed, M failed`).
//!
//! A GPU backend whose driver or device is missing reports every case as skipped, unless
//! `HISPARSE_REQUIRE_DEVICE=1` (then it is a failure), exactly as the per-backend test targets do.

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
    if report.success() {
        Ok(())
    } else {
        Err(CliError::failed(format!(
            "conformance on {kind}: {} of {} cases failed (first: {})",
            report.failed,
            report.passed + report.failed + report.skipped,
            report.failures.first().map(String::as_str).unwrap_or("?")
        )))
    }
}
