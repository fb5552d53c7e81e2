//! Runs the `hisparse` binary as a user would.

use std::process::{Command, Output};

fn hisparse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hisparse"))
        .args(args)
        .env_remove("HISPARSE_REQUIRE_DEVICE")
        .output()
        .expect("the hisparse binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn layout_json_reports_the_deepseek_v32_vector() {
    let o = hisparse(&[
        "layout",
        "--preset",
        "deepseek-v3.2",
        "--gpu-mem",
        "80GiB",
        "--host-mem",
        "512GiB",
        "--max-model-len",
        "131072",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    assert_eq!(j["bytes_per_block"], 545792);
    assert_eq!(j["host_block_stride"], 2561024);
    assert_eq!(j["hot_blocks_per_request"], 64);
    assert_eq!(j["num_gpu_blocks"], (80u64 << 30) / 545792);
    assert_eq!(j["host_num_blocks"], (512u64 << 30) / 2561024);
    let groups = j["groups"].as_array().expect("groups is a list");
    // source, indexer, 6 resident, 6 hot.
    assert_eq!(groups.len(), 14);
    let layers: Vec<usize> = groups[2..8]
        .iter()
        .map(|g| g["layers"].as_array().unwrap().len())
        .collect();
    assert_eq!(layers, [12, 12, 12, 12, 12, 1]);
    assert_eq!(j["capacity"].as_array().map(Vec::len), Some(3));
}

#[test]
fn layout_text_has_groups_and_a_capacity_table() {
    let o = hisparse(&["layout", "--preset", "glm-5", "--gpu-mem", "80GiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "bytes_per_block",
        "host_block_stride",
        "resident",
        "hot",
        "capacity",
        "128K",
    ] {
        assert!(out.contains(needle), "missing {needle}:\n{out}");
    }
}

/// Every bad argument: a single `error:` line on stderr, nothing on stdout, a non-zero exit, no
/// panic and no backtrace.
#[test]
fn bad_arguments_give_one_line_and_a_non_zero_exit() {
    let cases: &[(&[&str], &str)] = &[
        (&["layout", "--preset", "llama-3"], "--preset"),
        (&["layout", "--gpu-mem", "0"], "--gpu-mem"),
        (&["layout", "--host-mem", "0GiB"], "--host-mem"),
        (&["layout", "--host-mem", "1GiB"], "--host-mem"),
        (&["layout", "--gpu-mem", "1MiB"], "--gpu-mem"),
        (&["layout", "--gpu-mem", "lots"], "--gpu-mem"),
        (&["layout", "--max-model-len", "0"], "--max-model-len"),
        (
            &["layout", "--device-buffer-size", "100"],
            "--device-buffer-size",
        ),
        (&["layout", "--frobnicate"], "--frobnicate"),
        (&["simulate", "--backend", "metal"], "backend"),
        (&["simulate", "--preset", "nope"], "--preset"),
        (&["simulate", "--gpu-mem", "0"], "--gpu-mem"),
        (&["simulate", "--requests", "0"], "--requests"),
        (&["simulate", "--host-mem", "1MiB"], "--host-mem"),
        (&["simulate", "--overlap", "1.5"], "--overlap"),
        (&["bench", "--backend", "cpu", "--iters", "0"], "--iters"),
        (&["conformance", "--backend", "opengl"], "backend"),
        (&[], "hisparse"),
    ];
    for (args, mention) in cases {
        let o = hisparse(args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: not one line:\n{err}"
        );
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(
            err.contains(mention),
            "{args:?}: `{mention}` not named in: {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{err}"
        );
        assert!(stdout(&o).is_empty(), "{args:?}: stdout not empty");
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn a_backend_not_compiled_in_names_its_feature() {
    let o = hisparse(&["bench", "--backend", "cuda"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--features cuda"), "{err}");
}

#[test]
fn conformance_on_cpu_ends_with_zero_failures() {
    let o = hisparse(&["conformance", "--backend", "cpu"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}\n{out}", stderr(&o));
    let last = out.trim_end().lines().last().unwrap_or_default();
    let (passed, rest) = last.split_once(" passed, ").expect("summary line");
    assert!(passed.parse::<u32>().expect("a count") >= 100, "{last}");
    assert_eq!(rest, "0 failed", "{last}");
}

#[test]
fn conformance_filter_selects_cases() {
    let o = hisparse(&["conformance", "--backend", "cpu", "remap/"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.lines()
            .filter(|l| l.starts_with("ok "))
            .all(|l| l.contains("remap/"))
    );
}
