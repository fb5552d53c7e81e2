//! `hisparse bench --host-pool`: the three paths beside the three ceilings of each size, as JSON
//! and text, and one-line refusals of bad flags.
#![cfg(feature = "cpu")]

use std::process::{Command, Output};

fn hisparse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hisparse"))
        .args(args)
        .env_remove("HISPARSE_REQUIRE_DEVICE")
        .output()
        .expect("run hisparse")
}

#[test]
fn host_pool_json_has_every_path_beside_its_ceilings() {
    let o = hisparse(&[
        "bench",
        "--backend",
        "cpu",
        "--host-pool",
        "8MiB,72MiB",
        "--threads",
        "2",
        "--json",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(j["backend"], "cpu");
    assert_eq!(j["threads"], 2);
    assert_eq!(j["memset_ceiling"], "memset, one thread");
    let sizes = j["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 2);
    assert_eq!(sizes[1]["bytes"], 72u64 << 20);
    for size in sizes {
        assert_eq!(size["ceilings"].as_array().unwrap().len(), 3);
        let paths: Vec<&str> = size["paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, ["runtime", "lent", "shared"]);
        for p in size["paths"].as_array().unwrap() {
            assert!(p["setup_gib_per_s"].as_f64().unwrap() > 0.0, "{p}");
            assert!(p["share_of_memset"].as_f64().unwrap() > 0.0, "{p}");
            assert!(p["release_seconds"].as_f64().unwrap() >= 0.0, "{p}");
        }
    }
    let runtime = &sizes[1]["paths"][0];
    assert!(
        runtime["setup"].as_str().unwrap().starts_with("2 threads"),
        "{runtime}"
    );
}

#[test]
fn host_pool_text_and_bad_flags() {
    let o = hisparse(&["bench", "--backend", "cpu", "--host-pool", "4MiB"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    for needle in [
        "memset, one thread",
        "runtime",
        "lent",
        "shared",
        "× memset",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    for (args, mention) in [
        (&["--host-pool", "0"][..], "--host-pool"),
        (&["--host-pool", "8XB"][..], "unknown unit"),
        (
            &["--host-pool", "8MiB", "--registration", "some"][..],
            "--registration",
        ),
        (
            &["--host-pool", "8MiB", "--huge-pages", "1G"][..],
            "--huge-pages",
        ),
        (&["--host-pool", "8MiB", "--threads", "0"][..], "--threads"),
    ] {
        let mut all = vec!["bench", "--backend", "cpu"];
        all.extend_from_slice(args);
        let o = hisparse(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(mention), "{mention}: {err}");
    }
}
