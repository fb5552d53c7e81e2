//! The fused swap-in launch on a HIP runtime (the HIP test double in CI) (`harness = false`): `RocmDevice::resolve_and_gather`
//! against the core's reference, over the scenarios of
//! `gpu-kernels/tests/support/fused_scenario.rs`.
//!
//! Without a HIP runtime the test says `SKIPPED` and passes, unless `HISPARSE_REQUIRE_DEVICE=1`.

use hisparse_backend_rocm::{RocmBuffer, RocmDevice, RocmError, RocmHostBuffer, RocmStream};
use hisparse_core::ops::{LayerPair, ResolveArgs, ResolveDesc};
use hisparse_core::{Device, Error as _, ErrorKind};

#[path = "../../gpu-kernels/tests/support/fused_scenario.rs"]
mod fused_scenario;

impl fused_scenario::Fused for RocmDevice {
    fn fused(
        &self,
        stream: &RocmStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, RocmBuffer>,
        layers: &[LayerPair],
        host: &RocmHostBuffer,
        device: &mut RocmBuffer,
    ) -> Result<(), RocmError> {
        self.resolve_and_gather(stream, desc, args, layers, host, device)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for sc in fused_scenario::SCENARIOS {
            println!("fused/{}: test", sc.name);
        }
        return;
    }
    let filter = args
        .iter()
        .find(|a| !a.starts_with('-'))
        .map(String::as_str);
    let required = std::env::var("HISPARSE_REQUIRE_DEVICE")
        .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"));
    let dev = match RocmDevice::open(0) {
        Ok(d) => d,
        Err(err) if err.kind() == ErrorKind::NotFound && !required => {
            println!("SKIPPED: fused resolve-and-gather: no HIP runtime: {err}");
            println!(
                "0 passed, 0 failed, {} skipped",
                fused_scenario::SCENARIOS.len()
            );
            return;
        }
        Err(err) => {
            println!("FAILED: fused resolve-and-gather: cannot open HIP device 0: {err}");
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
    };
    println!("device: {}", dev.device_name());
    if !matches!(fused_scenario::run_all(&dev, filter), Ok(n) if n > 0) {
        std::process::exit(1);
    }
}
