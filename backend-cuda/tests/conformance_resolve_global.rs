//! The shared conformance suite on CUDA device 0 with the resolver's global-state mode forced
//! ([`CudaOptions::resolve_global_state`]): every request's LRU copy, partition and bitmap in the
//! global workspace, the mode the planner takes by itself only when they exceed shared memory,
//! so a GPU large enough never to need it still checks it. Skipped loudly without a GPU, unless
//! `HISPARSE_REQUIRE_DEVICE=1`.

use hisparse_backend_cuda::{CudaDevice, CudaOptions};

hisparse_conformance::conformance_main!(|| CudaDevice::open_with(
    0,
    CudaOptions {
        resolve_global_state: true,
        ..CudaOptions::default()
    }
));
