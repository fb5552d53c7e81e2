//! With no Vulkan driver visible to the loader, opening fails with a typed `NotFound` error (a
//! test reports that as skipped), never a panic. Its own test binary: it changes the process
//! environment before the loader reads it.

use hisparse_backend_vulkan::VulkanDevice;
use hisparse_core::{Error, ErrorKind};

#[test]
fn no_driver_is_not_found() {
    // SAFETY: this binary holds this single test, so no other thread reads the environment.
    unsafe { std::env::set_var("VK_DRIVER_FILES", "/nonexistent/hisparse_icd.json") };
    // SAFETY: as above.
    unsafe { std::env::remove_var("VK_ICD_FILENAMES") };
    match VulkanDevice::open("") {
        Ok(d) => panic!("opened {d:?} with no driver"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
    }
}
