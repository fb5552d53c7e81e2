//! The lab's probes compile with NVRTC for each architecture the CUDA backend targets, and its
//! resolver experiments (after the production source) for
//! sm_90, the first with clusters. Needs
//! NVRTC, not a GPU; without it the check prints `SKIPPED` and succeeds, unless
//! `HISPARSE_REQUIRE_NVRTC=1` turns the skip into a failure.

use hisparse_conformance::check::{Check, REQUIRE_NVRTC_ENV};
use hisparse_kernel_lab::{module, probes, resolve_cluster};

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
    let source = format!(
        "{}{}",
        hisparse_gpu_kernels::CUDA_SOURCE,
        resolve_cluster::SOURCE
    );
    match module::compile(&source, "resolve_cluster.cu", "compute_90") {
        Ok(ptx) => {
            for v in resolve_cluster::VARIANTS {
                let name = v.symbol;
                let cluster = format!(".reqnctapercluster {}, 1, 1", v.cluster);
                if !ptx.contains(&format!(".entry {name}(")) {
                    println!("FAILED: compute_90: {name} missing from the PTX");
                    failed += 1;
                } else if v.cluster > 1 && !ptx.contains(&cluster) {
                    println!(
                        "FAILED: compute_90: {name} is not a kernel of clusters of {}",
                        v.cluster
                    );
                    failed += 1;
                }
            }
            println!("ok: the cluster resolver compiled for compute_90");
        }
        Err(e) => {
            println!("FAILED: {e}");
            failed += 1;
        }
    }
    check.finish(if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} failures"))
    })
}
