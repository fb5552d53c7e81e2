//! The lab's probes compile with NVRTC for each architecture the CUDA backend targets. Needs
//! NVRTC, not a GPU; without it the check prints `SKIPPED` and succeeds, unless
//! `HISPARSE_REQUIRE_NVRTC=1` turns the skip into a failure.

use hisparse_conformance::check::{Check, REQUIRE_NVRTC_ENV};
use hisparse_kernel_lab::probes;

const ARCHES: &[&str] = &["compute_80", "compute_90"];

fn main() {
    let check = Check::one("probes_compile_with_nvrtc");
    if let Err(e) = hisparse_backend_cuda::nvrtc::ensure() {
        check.missing(REQUIRE_NVRTC_ENV, e);
    }
    let mut failed = 0;
    for arch in ARCHES {
        match probes::compile(arch) {
            Ok(ptx) => {
                for name in [probes::EMPTY, probes::CLOCK_PROBE] {
                    if !ptx.contains(&format!(".entry {name}(")) {
                        println!("FAILED: {arch}: probe {name} missing from the PTX");
                        failed += 1;
                    }
                }
                println!("ok: the probes compiled for {arch}");
            }
            Err(e) => {
                println!("FAILED: {e}");
                failed += 1;
            }
        }
    }
    check.finish(if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} failures"))
    })
}
