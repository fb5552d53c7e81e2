//! A host pool in a shared-memory segment: what one process's backend writes through its mapping
//! the other mapping reads, and the buffer keeps the mapping alive.

use hisparse_backend_cpu::{CpuBuffer, CpuDevice, CpuStream};
use hisparse_core::Device;
use hisparse_host_memory::SharedSegment;

#[test]
fn two_mappings_of_one_segment_see_each_others_writes_through_backend_calls() {
    let dev = CpuDevice::new();
    let name = SharedSegment::unique_name("hisparse-cpu-test");
    let a = CpuBuffer::from_shared(SharedSegment::create(&name, 1 << 16).unwrap()).unwrap();
    let mut b = CpuBuffer::from_shared(SharedSegment::open(&name, 1 << 16).unwrap()).unwrap();
    assert!(a.is_shared() && b.is_shared());
    assert_eq!(a.address() % 4096, 0);
    // A device→host copy into one mapping is read back through the other.
    let mut src = dev.alloc(4096).unwrap();
    dev.upload(&mut src, 0, &[7u8; 4096]).unwrap();
    let mut a = a;
    dev.copy_to_host(&CpuStream, &src, 0, &mut a, 8192, 4096)
        .unwrap();
    let mut back = vec![0u8; 4096];
    dev.read_pinned(&b, 8192, &mut back).unwrap();
    assert_eq!(back, vec![7u8; 4096]);
    // And the other way round; the creator's mapping outlives the opener's.
    dev.write_pinned(&mut b, 0, &[9u8; 16]).unwrap();
    drop(b);
    let mut head = [0u8; 16];
    dev.read_pinned(&a, 0, &mut head).unwrap();
    assert_eq!(head, [9u8; 16]);
}
