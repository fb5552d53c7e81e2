//! The lab's probes and remap experiments compile with NVRTC for each architecture the CUDA
//! backend targets, every kernel `cuda_bench` launches present in the PTX. Needs
//! NVRTC, not a GPU; without it the check prints `SKIPPED` and succeeds, unless
//! `HISPARSE_REQUIRE_NVRTC=1` turns the skip into a failure.

use hisparse_conformance::check::{Check, REQUIRE_NVRTC_ENV};
use hisparse_kernel_lab::{probes, remap_lab};

const ARCHES: &[&str] = &["compute_80", "compute_90"];

fn main() {
    let check = Check::one("lab_kernels_compile_with_nvrtc");
    if let Err(e) = hisparse_backend_cuda::nvrtc::ensure() {
        check.missing(REQUIRE_NVRTC_ENV, e);
    }
    let mut failed = 0;
    let remap_kernels: Vec<&str> = remap_lab::WIDE
        .iter()
        .copied()
        .chain(remap_lab::COUNTS.iter().map(|&(name, _)| name))
        .collect();
    type Compile = fn(&str) -> Result<String, hisparse_kernel_lab::module::LabError>;
    let sources: [(&str, Compile, Vec<&str>); 2] = [
        (
            "probes",
            probes::compile,
            vec![probes::EMPTY, probes::CLOCK_PROBE],
        ),
        ("remap experiments", remap_lab::compile, remap_kernels),
    ];
    for arch in ARCHES {
        for (what, compile, kernels) in &sources {
            match compile(arch) {
                Ok(ptx) => {
                    for name in kernels {
                        if !ptx.contains(&format!(".entry {name}(")) {
                            println!("FAILED: {arch}: {what}: {name} missing from the PTX");
                            failed += 1;
                        }
                    }
                    println!("ok: the {what} compiled for {arch}");
                }
                Err(e) => {
                    println!("FAILED: {what}: {e}");
                    failed += 1;
                }
            }
        }
    }
    check.finish(if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} failures"))
    })
}
