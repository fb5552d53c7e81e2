//! The host-pool benchmark on the CPU backend, at small sizes: every path is measured beside the
//! three ceilings of its size, and a size this host cannot hold is refused for every path,
//! naming the limit, without stopping the sizes after it.

use hisparse_backend_cpu::{CpuBuffer, CpuDevice, CpuError};
use hisparse_device_bench::host_pool::{
    self, FIRST_TOUCH, HostPoolPaths, MEMSET, MEMSET_ALL, PathOutcome,
};
use hisparse_host_memory::{AnonymousMapping, SharedSegment};

#[test]
fn every_path_is_measured_beside_its_ceilings_and_impossible_sizes_are_refused() {
    let dev = CpuDevice::new();
    let lend = |array: &mut AnonymousMapping| -> Result<CpuBuffer, CpuError> {
        // SAFETY: the benchmark drops the buffer before the array and touches the array only
        // through it meanwhile; the mapping is live, zero-initialised and writable.
        unsafe { CpuBuffer::from_raw_parts(array.addr().as_ptr(), array.len()) }
    };
    let share = |segment: SharedSegment| CpuBuffer::from_shared(segment);
    let describe = |b: &CpuBuffer| b.setup().map(|s| s.to_string());
    let paths = HostPoolPaths {
        lend: Some(&lend),
        share: Some(&share),
        describe: Some(&describe),
    };
    let too_large = 1u64 << 50;
    let report = host_pool::run(&dev, &[8 << 20, too_large, 96 << 20], &paths).unwrap();
    assert_eq!(report.sizes.len(), 3);
    for (i, size) in report.sizes.iter().enumerate() {
        let names: Vec<&str> = size.ceilings.iter().map(|c| c.name).collect();
        if size.bytes == too_large {
            assert!(names.is_empty());
            for p in &size.paths {
                assert!(
                    matches!(&p.outcome, PathOutcome::Refused(m) if m.contains("MemAvailable")),
                    "{:?}",
                    p.outcome
                );
            }
            continue;
        }
        assert_eq!(names, [FIRST_TOUCH, MEMSET, MEMSET_ALL], "size {i}");
        assert!(size.ceiling_bytes_per_s(MEMSET).is_some_and(|b| b > 0.0));
        let paths: Vec<&str> = size.paths.iter().map(|p| p.path).collect();
        assert_eq!(paths, ["runtime", "lent", "shared"]);
        for p in &size.paths {
            let PathOutcome::Measured {
                setup_s,
                drop_s,
                released_s,
                setup,
            } = &p.outcome
            else {
                panic!("{} at {} bytes: {:?}", p.path, size.bytes, p.outcome);
            };
            assert!(*setup_s > 0.0 && drop_s.is_finite() && released_s >= drop_s);
            assert_eq!(
                setup.is_some(),
                p.path == "runtime",
                "{}: {setup:?}",
                p.path
            );
        }
    }
}
