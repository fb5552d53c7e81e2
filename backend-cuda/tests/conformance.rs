//! The shared conformance suite on CUDA device 0 (skipped loudly without a GPU, unless
//! `HISPARSE_REQUIRE_DEVICE=1`).
hisparse_conformance::conformance_main!(|| hisparse_backend_cuda::CudaDevice::open(0));
