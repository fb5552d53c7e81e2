//! `simulate --tp N`: N rank processes with their own runtimes, one coordinator; with
//! `--shared-host-pool` the node pins one host pool that every rank maps, rank 0 writes and every
//! rank reads. Every rank verifies every row it reads.
#![cfg(feature = "cpu")]

use std::process::Command;

/// Runs a 3-request simulation whose whole prompt is a shared prefix (prefix hits, host and GPU
/// copy-on-write, restores) over `tp` ranks.
fn simulate(tp: &str, shared: bool) -> serde_json::Value {
    simulate_with(tp, shared, "4096", "4096")
}

/// [`simulate`] with another prompt length and shared prefix.
fn simulate_with(tp: &str, shared: bool, context: &str, prefix: &str) -> serde_json::Value {
    let mut args = vec![
        "simulate",
        "--backend",
        "cpu",
        "--layers",
        "4",
        "--requests",
        "3",
        "--context",
        context,
        "--decode-steps",
        "8",
        "--shared-prefix",
        prefix,
        "--tp",
        tp,
        "--json",
    ];
    if shared {
        args.push("--shared-host-pool");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_hisparse"))
        .args(&args)
        .output()
        .expect("the hisparse binary runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

#[test]
fn two_ranks_share_one_host_pool_and_verify_every_row_in_each() {
    let j = simulate("2", true);
    assert_eq!(j["tp"], 2);
    assert_eq!(j["shared_host_pool"], true);
    assert_eq!(j["mismatched_rows"], 0);
    // The pool is counted once: the node pins one pool, and each rank its indexer host cache.
    let cache = j["indexer_host_cache_bytes"].as_u64().unwrap();
    assert!(cache > 0, "V3.2 has an indexer");
    assert_eq!(
        j["host_memory_bytes"].as_u64().unwrap(),
        j["host_pool_bytes"].as_u64().unwrap() + 2 * cache
    );
    let ranks = j["ranks"].as_array().expect("per-rank figures");
    assert_eq!(ranks.len(), 2);
    for r in ranks {
        assert!(r["verified_rows"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["mismatched_rows"], 0, "{r}");
    }
    // Rank 0 writes the pool; rank 1 only reads it.
    assert!(ranks[0]["d2h_bytes"].as_u64().unwrap() > 0);
    assert_eq!(ranks[1]["d2h_bytes"], 0);
    // The run exercised what a shared pool must get right across processes: copy-on-write by
    // rank 0 read by every rank's restores (the hits read the shared pages' GPU copies, so they
    // need no host reads)...
    for what in ["host_cow_pages", "restored_pages"] {
        assert!(j[what].as_u64().unwrap() > 0, "no {what}: {j}");
    }
    // ... and, with longer prompts and no shared prefix, pages rank 0 wrote to host that every
    // rank reclaims and swaps back in.
    let j = simulate_with("2", true, "8192", "0");
    assert_eq!(j["mismatched_rows"], 0);
    for r in j["ranks"].as_array().expect("per-rank figures") {
        assert_eq!(r["mismatched_rows"], 0, "{r}");
    }
    for what in ["reclaimed_pages", "misses"] {
        assert!(j[what].as_u64().unwrap() > 0, "no {what}: {j}");
    }
}

#[test]
fn ranks_without_a_shared_pool_pin_one_pool_each_and_each_writes_its_own() {
    let j = simulate("2", false);
    assert_eq!(j["shared_host_pool"], false);
    assert_eq!(j["mismatched_rows"], 0);
    assert_eq!(
        j["host_memory_bytes"].as_u64().unwrap(),
        2 * (j["host_pool_bytes"].as_u64().unwrap()
            + j["indexer_host_cache_bytes"].as_u64().unwrap())
    );
    for r in j["ranks"].as_array().unwrap() {
        assert!(r["d2h_bytes"].as_u64().unwrap() > 0, "{r}");
    }
}

#[test]
fn a_shared_pool_needs_ranks_and_tp_excludes_workers() {
    for (args, needle) in [
        (&["--shared-host-pool"][..], "--tp 2"),
        (&["--tp", "2", "--workers", "2"][..], "--workers"),
        (&["--tp", "0"][..], "--tp"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_hisparse"))
            .arg("simulate")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(needle) && err.lines().count() == 1, "{err}");
    }
}
