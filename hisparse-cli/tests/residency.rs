//! `hisparse simulate` with the residency policy's paths: imported requests, prefix hits that
//! read the shared prefix's GPU copies, and prefill over a prefix that lives only on host
//! (CPU backend).
#![cfg(feature = "cpu")]

use std::process::Command;

fn simulate(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "simulate",
        "--backend",
        "cpu",
        "--json",
        "--layers",
        "8",
        "--requests",
        "3",
        "--context",
        "1536",
        "--decode-steps",
        "6",
    ];
    args.extend_from_slice(extra);
    let o = Command::new(env!("CARGO_BIN_EXE_hisparse"))
        .args(&args)
        .env_remove("HISPARSE_REQUIRE_DEVICE")
        .output()
        .expect("the hisparse binary runs");
    assert!(
        o.status.success(),
        "simulate {extra:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

/// Every request arrives with its prompt's KV written into the host blocks the coordinator
/// named: it decodes from host (a hot region each) and every row it reads matches.
#[test]
fn imported_requests_decode_from_their_host_pages() {
    let j = simulate(&["--import"]);
    assert_eq!(j["mismatched_rows"], 0, "{}", j["first_mismatch"]);
    assert!(j["verified_rows"].as_u64().unwrap() > 0);
    assert_eq!(j["imported_requests"], 3);
    assert_eq!(j["hot_regions_allocated"], 3);
    assert!(j["h2d_bytes_per_step"].as_f64().unwrap() > 0.0);
}

/// With a shared prefix, later requests hit the first one's pages; their GPU copies are still
/// in the pool, so they are read there: no hot region, nothing from host.
#[test]
fn prefix_hits_read_the_shared_pages_on_the_gpu() {
    let j = simulate(&["--shared-prefix", "1024"]);
    assert_eq!(j["mismatched_rows"], 0, "{}", j["first_mismatch"]);
    assert!(j["prefix_hit_tokens"].as_u64().unwrap() > 0);
    assert_eq!(j["hot_regions_allocated"], 0);
    assert_eq!(j["h2d_bytes_per_step"].as_f64(), Some(0.0));
}

/// Imported requests with prompts shorter than their hot region, on the default GPU budget (a
/// pool the size of an all-resident cache): a hot region could never fit beside their pages, so
/// every imported page is restored to the GPU and both requests finish (they once waited
/// forever: "stalled: 1000 steps scheduled nothing").
#[test]
fn short_imported_requests_finish_on_the_default_gpu_budget() {
    let o = Command::new(env!("CARGO_BIN_EXE_hisparse"))
        .args([
            "simulate",
            "--import",
            "--layers",
            "4",
            "--requests",
            "2",
            "--context",
            "1000",
            "--decode-steps",
            "2",
            "--backend",
            "cpu",
            "--json",
        ])
        .env_remove("HISPARSE_REQUIRE_DEVICE")
        .output()
        .expect("the hisparse binary runs");
    assert!(
        o.status.success(),
        "simulate --import --context 1000: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    assert_eq!(j["mismatched_rows"], 0, "{}", j["first_mismatch"]);
    assert!(j["verified_rows"].as_u64().unwrap() > 0);
    assert_eq!(j["imported_requests"], 2);
    assert_eq!(j["hot_regions_allocated"], 0);
    // Every imported page (16 per request, the partial one among them) came back from host,
    // one restore per bucket (4 index groups).
    assert_eq!(j["restored_pages"], 2 * 16 * 4);
}

/// `--prefix-on-host`: the first request prefills the shared prefix and finishes, the GPU
/// copies of its pages are dropped, then the others hit the prefix on host: their first
/// prefill chunks read it staged back on the GPU (restored host → device, no hot region), and
/// every row the prefill chunks read — each chunk's last token's top-k over its whole earlier
/// context — matches, as does every decode row.
#[test]
fn prefill_over_a_prefix_on_host_reads_it_staged_on_the_gpu() {
    let j = simulate(&["--prefix-on-host", "--shared-prefix", "1024"]);
    assert_eq!(j["mismatched_rows"], 0, "{}", j["first_mismatch"]);
    assert_eq!(j["prefill_mismatched_rows"], 0);
    assert!(j["prefill_rows_checked"].as_u64().unwrap() > 0);
    assert!(j["gpu_copies_dropped"].as_u64().unwrap() > 0);
    // Two requests hit the 1024-token prefix (16 pages of 64 tokens) on host.
    assert!(j["prefix_hit_tokens"].as_u64().unwrap() >= 2 * 1024);
    assert!(
        j["pages_staged"].as_u64().unwrap() >= 2 * 16,
        "{}",
        j["pages_staged"]
    );
    assert_eq!(j["hot_regions_allocated"], 0);
}

/// Prefill reads are verified in the default simulation too (every prefill chunk's last token).
#[test]
fn prefill_reads_are_verified_by_default() {
    let j = simulate(&[]);
    assert_eq!(j["mismatched_rows"], 0, "{}", j["first_mismatch"]);
    assert!(j["prefill_rows_checked"].as_u64().unwrap() > 0);
    assert_eq!(j["prefill_mismatched_rows"], 0);
}
