//! The CPU backend's host pool (`Device::alloc_pinned`): set up in parallel (zeroed, 2 MiB
//! aligned, of the exact size), usable through the backend's calls, released in the background
//! after a drop, and refused before anything is reserved when it cannot fit the available RAM.

use std::time::Duration;

use hisparse_backend_cpu::CpuDevice;
use hisparse_core::{Device, Error as _, ErrorKind};
use hisparse_host_memory::{
    HUGE_PAGE, HostPoolConfig, PARALLEL_FROM, available_ram, is_mapped, wait_for_releases,
};

#[test]
fn a_large_pool_is_zeroed_aligned_usable_and_released_after_the_drop() {
    let dev = CpuDevice::new().with_host_pool_config(HostPoolConfig {
        threads: Some(3),
        ..HostPoolConfig::default()
    });
    let len = PARALLEL_FROM + (5 << 20) + 16;
    let mut pool = dev.alloc_pinned(len).unwrap();
    let addr = dev.pinned_address(&pool);
    assert_eq!(pool.len(), len);
    assert_eq!(addr % HUGE_PAGE, 0);
    assert!(pool.as_slice().iter().all(|&b| b == 0), "not zeroed");
    dev.write_pinned(&mut pool, len - 16, &[7; 16]).unwrap();
    let mut back = [0u8; 16];
    dev.read_pinned(&pool, len - 16, &mut back).unwrap();
    assert_eq!(back, [7; 16]);
    drop(pool);
    assert!(wait_for_releases(Duration::from_secs(60)));
    assert!(
        !is_mapped(addr, len),
        "the pool is still mapped after its release"
    );
}

#[test]
fn a_pool_beyond_the_available_ram_is_refused_naming_the_limit() {
    let dev = CpuDevice::new();
    let available = available_ram().expect("Linux reports MemAvailable");
    let e = dev
        .alloc_pinned(usize::try_from(available / 100 * 96).unwrap())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfPinnedMemory);
    let msg = e.to_string();
    for needle in [
        "MemAvailable",
        "--host-mem",
        "host_mem=",
        "host_budget_bytes",
    ] {
        assert!(msg.contains(needle), "{msg}");
    }
    assert_eq!(
        dev.alloc_pinned(0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}
