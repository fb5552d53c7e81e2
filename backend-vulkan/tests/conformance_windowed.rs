//! The shared conformance suite on the Vulkan backend with every copy on the copy shader, the
//! pipelined gather kernel (the default on GPUs; lavapipe's own default is the per-entry
//! kernel), the one-dispatch resolver in global mode for every request (its state in device
//! memory, as requests too large for workgroup memory run) with its scans without subgroup
//! arithmetic (the form for devices that lack it), barriers covering every stage and access
//! ([`Barriers::All`], the comparison setting), and pools bound as windows of 1 MiB with at most
//! 28 storage buffers per dispatch ([`VulkanDevice::open_shaped`]): the cases' pools of a few MiB
//! then take the 12-window shaders, and pools above 12 MiB the one-dispatch-per-window-group
//! path — the code a real device runs for pools beyond `maxStorageBufferRange` (lavapipe:
//! 128 MiB), checked bit-exactly here without gigabyte pools.

use hisparse_backend_vulkan::{
    Barriers, CopyEngine, GatherKernel, ResolveKernel, TestShape, VulkanDevice, VulkanOptions,
};

hisparse_conformance::conformance_main!(|| {
    VulkanDevice::open_shaped(
        "",
        &VulkanOptions {
            copy_engine: CopyEngine::Shader,
            gather_kernel: GatherKernel::Pipelined,
            resolve_kernel: ResolveKernel::Global,
            barriers: Barriers::All,
            ..VulkanOptions::default()
        },
        TestShape {
            window: Some(1 << 20),
            storage_buffers: Some(28),
            no_subgroups: true,
            ..TestShape::default()
        },
    )
});
