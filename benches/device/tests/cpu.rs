//! The benchmark routines on the CPU backend: every figure is measured, positive and finite, and
//! names a ceiling of the same run (a figure without its ceiling could not be judged).

use std::time::Duration;

use hisparse_backend_cpu::CpuDevice;
use hisparse_device_bench::{BenchConfig, run};

#[test]
fn every_figure_is_measured_beside_a_ceiling_of_the_same_run() {
    let cfg = BenchConfig {
        iters: 1,
        ceiling_bytes: 1 << 20,
        sample_time: Duration::from_micros(200),
    };
    let report = run(&CpuDevice::new(), &cfg).expect("the CPU backend runs every benchmark");
    assert_eq!(report.backend, "cpu");
    assert!(!report.ceilings.is_empty(), "no ceiling measured");
    for c in &report.ceilings {
        assert!(
            c.bytes_per_s.is_finite() && c.bytes_per_s > 0.0,
            "ceiling {} measured {} B/s",
            c.name,
            c.bytes_per_s
        );
    }
    assert!(
        report.figures.len() >= 5,
        "{} figures",
        report.figures.len()
    );
    for f in &report.figures {
        assert!(
            f.seconds.is_finite() && f.seconds > 0.0 && f.bytes > 0,
            "{}: {} s for {} bytes",
            f.name,
            f.seconds,
            f.bytes
        );
        assert!(
            report.ceiling(f.ceiling).is_some(),
            "{} is judged against '{}', which this run did not measure",
            f.name,
            f.ceiling
        );
    }
}
