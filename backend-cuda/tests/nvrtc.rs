//! Compiles every kernel of the shared source with NVRTC, for each architecture this backend
//! targets. Needs NVRTC (the CUDA toolkit, or the `nvidia-cuda-nvrtc` wheel with its `lib`
//! directory on `LD_LIBRARY_PATH` or in `CUDA_PATH`), not a GPU.
//!
//! Without NVRTC the check prints `SKIPPED` and succeeds, unless `HISPARSE_REQUIRE_NVRTC=1`, which
//! turns the skip into a failure (CI sets it).

use hisparse_backend_cuda::nvrtc;
use hisparse_gpu_kernels::Kernel;

const ARCHES: &[&str] = &["compute_80", "compute_90"];

fn required() -> bool {
    std::env::var("HISPARSE_REQUIRE_NVRTC")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("kernels_compile_with_nvrtc: test");
        return;
    }
    if let Err(e) = nvrtc::ensure() {
        if required() {
            eprintln!("FAILED: HISPARSE_REQUIRE_NVRTC=1 but {e}");
            std::process::exit(1);
        }
        println!("SKIPPED: kernels_compile_with_nvrtc: {e}");
        println!("0 passed, 0 failed, 1 skipped");
        return;
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
    if failed > 0 {
        println!("0 passed, {failed} failed");
        std::process::exit(1);
    }
    println!("1 passed, 0 failed");
}
