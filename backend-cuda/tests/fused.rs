//! The fused swap-in launch on a GPU (`harness = false`): [`CudaDevice::resolve_and_gather`]
//! against the core's reference, over the scenarios of
//! `gpu-kernels/tests/support/fused_scenario.rs`.
//!
//! Without a GPU the test says `SKIPPED` and passes, unless `HISPARSE_REQUIRE_DEVICE=1`.

use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaError, CudaHostBuffer, CudaStream};
use hisparse_core::ops::{LayerPair, ResolveArgs, ResolveDesc};
use hisparse_core::{Device, Error as _, ErrorKind};

#[path = "../../gpu-kernels/tests/support/fused_scenario.rs"]
mod fused_scenario;

impl fused_scenario::Fused for CudaDevice {
    fn fused(
        &self,
        stream: &CudaStream,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, CudaBuffer>,
        layers: &[LayerPair],
        host: &CudaHostBuffer,
        device: &mut CudaBuffer,
    ) -> Result<(), CudaError> {
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
    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(err) if err.kind() == ErrorKind::NotFound && !required => {
            println!("SKIPPED: fused resolve-and-gather: no CUDA device: {err}");
            println!(
                "0 passed, 0 failed, {} skipped",
                fused_scenario::SCENARIOS.len()
            );
            return;
        }
        Err(err) => {
            println!("FAILED: fused resolve-and-gather: cannot open CUDA device 0: {err}");
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
    };
    println!("device: {}", dev.device_name());
    if !matches!(fused_scenario::run_all(&dev, filter), Ok(n) if n > 0) {
        std::process::exit(1);
    }
}
