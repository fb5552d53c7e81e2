//! The shared conformance suite on the Vulkan backend with every copy on the copy shader, the
//! `v2` gather kernel (the default on GPUs; lavapipe's own default is `v1`), the one-dispatch
//! resolver in global mode for every request (its state in device memory, as requests too large
//! for workgroup memory run) with its scans without subgroup arithmetic (the variant for devices
//! that lack it), and pools bound as
//! windows of 1 MiB with at most 28 storage buffers per dispatch
//! ([`VulkanDevice::open_shaped`]): the cases' pools of a few MiB then take the 12-window shader
//! variants, and pools above 12 MiB the one-dispatch-per-window-group path — the code a real
//! device runs for pools beyond `maxStorageBufferRange` (lavapipe: 128 MiB), checked bit-exactly
//! here without gigabyte pools.

use hisparse_backend_vulkan::{CopyEngine, GatherKernel, ResolveKernel, TestShape, VulkanDevice};

hisparse_conformance::conformance_main!(|| {
    let dev = VulkanDevice::open_shaped(
        "",
        TestShape {
            window: Some(1 << 20),
            storage_buffers: Some(28),
            no_subgroups: true,
            ..TestShape::default()
        },
    )?;
    dev.set_copy_engine(CopyEngine::Shader);
    dev.set_gather_kernel(GatherKernel::V2);
    dev.set_resolve_kernel(ResolveKernel::Global)?;
    Ok(dev)
});
