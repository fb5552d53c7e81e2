//! Compiles every kernel of the shared source with NVRTC, for each architecture this backend
//! targets. Needs NVRTC (the CUDA toolkit, or the `nvidia-cuda-nvrtc` wheel with its `lib`
//! directory on `LD_LIBRARY_PATH` or in `CUDA_PATH`), not a GPU.
//!
//! Without NVRTC the check prints `SKIPPED` and succeeds, unless `HISPARSE_REQUIRE_NVRTC=1`, which
//! turns the skip into a failure (CI sets it).

use hisparse_backend_cuda::nvrtc;
use hisparse_conformance::check::{Check, REQUIRE_NVRTC_ENV};
use hisparse_gpu_kernels::Kernel;

const ARCHES: &[&str] = &["compute_80", "compute_90"];

fn main() {
    let check = Check::one("kernels_compile_with_nvrtc");
    if let Err(e) = nvrtc::ensure() {
        check.missing(REQUIRE_NVRTC_ENV, e);
    }
    let (major, minor) = nvrtc::version().expect("NVRTC version");
    let mut failed = 0;
    for arch in ARCHES {
        match nvrtc::compile(arch) {
            Ok(ptx) => {
                let ptx = ptx.to_string_lossy();
                for name in Kernel::ALL.iter().map(|k| k.name()) {
                    let entry = format!(".entry {name}(");
                    if !ptx.contains(&entry) {
                        println!("FAILED: {arch}: kernel {name} missing from the PTX");
                        failed += 1;
                    }
                }
                if ptx.contains(".local") {
                    println!("note: {arch}: PTX uses local memory (register spill or stack array)");
                }
                println!(
                    "ok: NVRTC {major}.{minor} compiled {} kernels for {arch} ({} bytes of PTX)",
                    Kernel::ALL.len(),
                    ptx.len()
                );
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
