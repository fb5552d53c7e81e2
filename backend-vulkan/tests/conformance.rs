//! The shared conformance suite on the Vulkan backend (`harness = false`; see
//! `hisparse-conformance`). Validation messages (with `VK_INSTANCE_LAYERS=
//! VK_LAYER_KHRONOS_validation`) make the operation that caused them fail.

hisparse_conformance::conformance_main!(|| hisparse_backend_vulkan::VulkanDevice::open_strict(""));
