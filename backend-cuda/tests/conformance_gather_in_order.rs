//! The shared conformance suite on CUDA device 0 with the swap-in gather's in-order walk forced
//! ([`CudaOptions::gather_walk`] = [`GatherWalk::InOrder`]): a few token rows read at once, a
//! group of blocks per row, and the swap-in as the resolve then that gather, the walk the planner
//! takes by itself only over host pools spread beyond `plan::GATHER_LOCAL_SPAN`, which the
//! suite's pools mostly are not. Skipped loudly without a GPU, unless `HISPARSE_REQUIRE_DEVICE=1`.

use hisparse_backend_cuda::{CudaDevice, CudaOptions, GatherWalk};

hisparse_conformance::conformance_main!(|| CudaDevice::open_with(
    0,
    CudaOptions {
        gather_walk: GatherWalk::InOrder,
        ..CudaOptions::default()
    }
));
