//! The fused swap-in launch on a GPU (`harness = false`): [`CudaDevice::resolve_and_gather`]
//! against the core's reference, over the scenarios of
//! `hisparse_conformance::scenarios::fused`.
//!
//! Without a GPU the test says `SKIPPED` and passes, unless `HISPARSE_REQUIRE_DEVICE=1`.

use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaError, CudaHostBuffer, CudaStream};
use hisparse_conformance::scenarios::fused::Fused;
use hisparse_core::ops::{LayerPair, ResolveArgs, ResolveDesc};

/// The inherent, always fused, launch.
struct FusedLaunch;

impl Fused<CudaDevice> for FusedLaunch {
    fn resolve_and_gather(
        &self,
        dev: &CudaDevice,
        stream: &CudaStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, CudaBuffer>,
        layers: &[LayerPair],
        host: &CudaHostBuffer,
        device: &mut CudaBuffer,
    ) -> Result<(), CudaError> {
        dev.resolve_and_gather(stream, desc, args, layers, host, device)
    }
}

fn main() {
    hisparse_conformance::scenarios::fused::main_with(|| CudaDevice::open(0), FusedLaunch)
}
