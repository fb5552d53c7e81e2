//! `hisparse simulate --preset deepseek-v4`: indexer keys backed up with the KV rows and read
//! back — from the host cache after every backup, on the GPU after a prefix hit (its keys
//! restored from host when the GPU copies are gone) and after an import — byte for byte
//! (CPU backend).
#![cfg(feature = "cpu")]

use std::process::Command;

fn simulate_v4(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "simulate",
        "--backend",
        "cpu",
        "--json",
        "--preset",
        "deepseek-v4",
        "--layers",
        "4",
        "--requests",
        "4",
        "--context",
        "2048",
        "--decode-steps",
        "8",
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
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    for zero in ["mismatched_rows", "indexer_mismatched_rows"] {
        assert_eq!(j[zero], 0, "simulate {extra:?}: {}", j["first_mismatch"]);
    }
    j
}

fn count(j: &serde_json::Value, what: &str) -> u64 {
    j[what].as_u64().unwrap_or_else(|| panic!("no {what}: {j}"))
}

#[test]
fn every_indexer_row_is_backed_up_and_checked_in_the_host_cache() {
    let j = simulate_v4(&[]);
    // 4 requests of 2048-token prompts and 8 decode steps: a row per 4 tokens, and each
    // backed-up row is checked.
    assert_eq!(count(&j, "indexer_rows_backed_up"), 4 * (2048 + 8) / 4);
    assert_eq!(count(&j, "indexer_rows_verified"), 4 * (2048 + 8) / 4);
    assert_eq!(count(&j, "indexer_d2h_bytes"), 4 * (2048 + 8) / 4 * 132);
    // Without eager mirroring a page's keys go with its spill.
    let j = simulate_v4(&["--no-eager-mirror"]);
    assert!(count(&j, "indexer_rows_backed_up") > 0 && count(&j, "spilled_pages") > 0);
}

#[test]
fn a_prefix_hit_and_an_import_read_their_keys_back() {
    // Hits on GPU copies: the shared prefix's keys are checked where the hit reads them.
    let j = simulate_v4(&["--shared-prefix", "1024"]);
    assert!(count(&j, "prefix_hit_tokens") > 0);
    assert!(count(&j, "indexer_rows_verified") > count(&j, "indexer_rows_backed_up"));
    // Hits from host: the indexer blocks were dropped with the resident copies, so the keys
    // come back from the indexer host cache.
    let j = simulate_v4(&["--prefix-on-host", "--shared-prefix", "1024"]);
    assert!(count(&j, "indexer_pages_restored") > 0, "{j}");
    assert!(count(&j, "indexer_h2d_bytes") > 0);
    // Imports: the prefill node wrote the keys into the host cache; each request's are
    // restored and checked on the GPU (2048 / 4 rows each).
    let j = simulate_v4(&["--import"]);
    assert_eq!(count(&j, "indexer_pages_restored"), 4 * 2048 / 256);
    assert!(count(&j, "indexer_rows_verified") >= 4 * 2048 / 4);
}
