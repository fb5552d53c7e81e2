//! The lab's probes compile with NVRTC for each architecture the CUDA backend targets. Needs
//! NVRTC, not a GPU; without it the check prints `SKIPPED` and succeeds, unless
//! `HISPARSE_REQUIRE_NVRTC=1` turns the skip into a failure.

use hisparse_kernel_lab::probes;

const ARCHES: &[&str] = &["compute_80", "compute_90"];

fn required() -> bool {
    std::env::var("HISPARSE_REQUIRE_NVRTC")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("probes_compile_with_nvrtc: test");
        return;
    }
    if let Err(e) = hisparse_backend_cuda::nvrtc::ensure() {
        if required() {
            eprintln!("FAILED: HISPARSE_REQUIRE_NVRTC=1 but {e}");
            std::process::exit(1);
        }
        println!("SKIPPED: probes_compile_with_nvrtc: {e}");
        println!("0 passed, 0 failed, 1 skipped");
        return;
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
    if failed > 0 {
        println!("0 passed, {failed} failed");
        std::process::exit(1);
    }
    println!("1 passed, 0 failed");
}
