//! The shared conformance suite on the Vulkan backend with streams spread over three compute
//! lanes and a transfer lane ([`VulkanDevice::open_shaped`]; lanes beyond the device's queues
//! share them): on a single-queue device such as lavapipe this runs the multi-queue routing —
//! copy-only batches on the transfer lane, a batch moving to a compute lane when compute work
//! follows, cross-lane semaphore waits — that a GPU with several queues takes. The resolver is the
//! one-dispatch workgroup kernel, the default on GPUs (lavapipe's own default is the portable
//! kernel).

use hisparse_backend_vulkan::{ResolveKernel, TestShape, VulkanDevice, VulkanOptions};

hisparse_conformance::conformance_main!(|| {
    VulkanDevice::open_shaped(
        "",
        &VulkanOptions {
            resolve_kernel: ResolveKernel::Workgroup,
            ..VulkanOptions::default()
        },
        TestShape {
            lanes: Some((3, true)),
            ..TestShape::default()
        },
    )
});
