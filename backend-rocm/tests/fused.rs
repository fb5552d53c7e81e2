//! The fused swap-in launch on a HIP runtime (the HIP test double in CI) (`harness = false`):
//! `RocmDevice::resolve_and_gather` against the core's reference, over the scenarios of
//! `hisparse_conformance::scenarios::fused`.
//!
//! Without a HIP runtime the test says `SKIPPED` and passes, unless `HISPARSE_REQUIRE_DEVICE=1`.

use hisparse_backend_rocm::{RocmBuffer, RocmDevice, RocmError, RocmHostBuffer, RocmStream};
use hisparse_conformance::scenarios::fused::Fused;
use hisparse_core::ops::{LayerPair, ResolveArgs, ResolveDesc};

/// The inherent, always fused, launch.
struct FusedLaunch;

impl Fused<RocmDevice> for FusedLaunch {
    fn resolve_and_gather(
        &self,
        dev: &RocmDevice,
        stream: &RocmStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, RocmBuffer>,
        layers: &[LayerPair],
        host: &RocmHostBuffer,
        device: &mut RocmBuffer,
    ) -> Result<(), RocmError> {
        dev.resolve_and_gather(stream, desc, args, layers, host, device)
    }
}

fn main() {
    hisparse_conformance::scenarios::fused::main_with(|| RocmDevice::open(0), FusedLaunch)
}
