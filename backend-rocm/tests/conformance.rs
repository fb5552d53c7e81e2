//! The shared conformance suite on the ROCm backend (`harness = false`; see
//! `hisparse-conformance`). Without a HIP runtime every case reports skipped (a failure under
//! `HISPARSE_REQUIRE_DEVICE=1`); with `ROCM_PATH` pointing at the HIP test double
//! (`scripts/hip-double-root.sh`), the real backend code runs every case on host memory.

hisparse_conformance::conformance_main!(|| hisparse_backend_rocm::RocmDevice::open(0));
