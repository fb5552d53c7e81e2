//! Device selection: by index, by case-insensitive name substring, and typed `NotFound` errors
//! for selectors that match nothing.

use hisparse_backend_vulkan::VulkanDevice;
use hisparse_conformance::check::device_or_skip;
use hisparse_core::{Device, Error, ErrorKind};

#[test]
fn selectors_pick_devices_or_report_not_found() {
    let Some(first) = device_or_skip(VulkanDevice::open("")).expect("open(\"\")") else {
        return;
    };
    let name = first.device_name().to_owned();
    // The model name before any " (driver, version)" suffix, in another case.
    let word = name.split_whitespace().next().unwrap_or("").to_uppercase();
    drop(first);
    let by_name = VulkanDevice::open(&word).expect("open by name");
    assert_eq!(by_name.device_name(), name);
    drop(by_name);
    let by_index = VulkanDevice::open("0").expect("open by index");
    assert!(!by_index.device_name().is_empty());
    drop(by_index);
    for bad in ["no-such-gpu-anywhere", "999"] {
        let e = VulkanDevice::open(bad).expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::NotFound, "{bad}: {e}");
        assert!(e.to_string().contains("devices:"), "lists the devices: {e}");
    }
}
