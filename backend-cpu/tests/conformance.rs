//! The shared conformance suite on the CPU backend (`harness = false`; see `hisparse-conformance`).

hisparse_conformance::conformance_main!(hisparse_backend_cpu::CpuDevice::open);
