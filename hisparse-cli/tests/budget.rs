//! Budgets are checked before memory is taken: a GPU pool the machine cannot hold fails at once
//! with one line naming the flags to change, instead of filling RAM first.
#![cfg(feature = "cpu")]

use std::process::Command;
use std::time::Instant;

#[test]
fn simulate_with_a_gpu_pool_beyond_ram_fails_at_once_with_one_line() {
    // Twice this machine's RAM (the CPU backend's device memory is RAM).
    let total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(32 << 20);
    let gpu = format!("{}GiB", (2 * total_kib).div_ceil(1 << 20));
    let t = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_hisparse"))
        .args(["simulate", "--backend", "cpu", "--gpu-mem", &gpu])
        .output()
        .expect("the hisparse binary runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--gpu-mem") && err.contains("free"), "{err}");
    assert!(t.elapsed().as_secs() < 5, "took {:?}", t.elapsed());
}
