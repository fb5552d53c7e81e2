//! Runs the `hisparse` binary as a user would (with the default CPU backend).
#![cfg(feature = "cpu")]

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
    // The host budget holds the pool and the indexer host cache (515,328 B per block).
    assert_eq!(j["host_num_blocks"], (512u64 << 30) / (2561024 + 515328));
    assert_eq!(
        j["indexer_host_cache_bytes"],
        j["host_num_blocks"].as_u64().unwrap() * 515328
    );
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
        "indexer host cache",
    ] {
        assert!(out.contains(needle), "missing {needle}:\n{out}");
    }
}

/// A GPU budget that holds a 128K request's HiSparse decode but not its prefill (which holds the
/// whole context on the GPU): the capacity table says so per context, the report names the
/// longest prompt that prefills, and the plan warns (a typed field in the JSON, a line naming
/// the flags in the text), exiting 0.
#[test]
fn layout_warns_when_max_model_len_cannot_be_prefilled() {
    let args = [
        "--preset",
        "deepseek-v3.2",
        "--gpu-mem",
        "4GiB",
        "--max-model-len",
        "131072",
    ];
    let j = layout_json(&args);
    let caps = j["capacity"].as_array().expect("capacity is a list");
    let fits: Vec<_> = caps
        .iter()
        .map(|c| (c["context_len"].clone(), c["prefill_fits"].clone()))
        .collect();
    assert_eq!(
        fits,
        [
            (8192.into(), true.into()),
            (32768.into(), true.into()),
            (131072.into(), false.into())
        ]
    );
    assert_eq!(caps[2]["prefill_gpu_blocks"], 7 * 2048);
    assert!(caps[2]["host_max"].as_u64().unwrap() >= 1);
    let longest = j["max_prefill_context"].as_u64().unwrap();
    assert!((32768..131072).contains(&longest), "{longest}");
    let w = &j["warnings"][0];
    assert_eq!(w["kind"], "max_model_len_prefill_never_fits", "{j}");
    assert_eq!(w["max_prefill_context"], longest);
    let mut text = vec!["layout"];
    text.extend(args);
    let o = hisparse(&text);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.starts_with("warning:"))
        .unwrap_or_else(|| panic!("no warning line:\n{out}"));
    assert!(
        line.contains("--gpu-mem") && line.contains(&format!("--max-model-len to {longest}")),
        "{line}"
    );
    assert!(out.contains(&format!(
        "longest prompt whose prefill fits: {longest} tokens"
    )));
    // The default 80 GiB holds the 128K prefill: no warning.
    let j = layout_json(&["--preset", "deepseek-v3.2"]);
    assert_eq!(j["warnings"].as_array().map(Vec::len), Some(0));
    assert_eq!(j["max_prefill_context"], 131072);
}

/// A preset written with `--print-model` and read back with `--model` plans the same layout; a
/// malformed model file is one line naming the file.
#[test]
fn model_files_round_trip_and_bad_ones_are_one_line() {
    let dir = std::env::temp_dir();
    let good = dir.join(format!("hisparse-model-{}.json", std::process::id()));
    let bad = dir.join(format!("hisparse-bad-model-{}.json", std::process::id()));
    let o = hisparse(&["layout", "--preset", "glm-5", "--print-model"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(&good, &o.stdout).expect("write model");
    let text = stdout(&o).replace("\"row_bytes\": 656", "\"row_bytes\": 650");
    std::fs::write(&bad, text).expect("write model");
    let args = |m: &str| {
        [
            "layout",
            "--model",
            m,
            "--gpu-mem",
            "80GiB",
            "--host-mem",
            "512GiB",
            "--json",
        ]
        .map(String::from)
    };
    let from_file = hisparse(&args(good.to_str().unwrap()).each_ref().map(String::as_str));
    let from_preset = hisparse(&[
        "layout",
        "--preset",
        "glm-5",
        "--gpu-mem",
        "80GiB",
        "--host-mem",
        "512GiB",
        "--json",
    ]);
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    assert_eq!(from_file.stdout, from_preset.stdout);
    let e = hisparse(&args(bad.to_str().unwrap()).each_ref().map(String::as_str));
    let _ = (std::fs::remove_file(&good), std::fs::remove_file(&bad));
    assert!(!e.status.success());
    let err = stderr(&e);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("--model") && err.contains("row_bytes"),
        "{err}"
    );
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
        (&["layout", "--model", "/nonexistent/model.json"], "--model"),
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

fn simulate_json(args: &[&str]) -> serde_json::Value {
    let o = hisparse(args);
    assert!(
        o.status.success(),
        "{args:?}: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    serde_json::from_str(&stdout(&o)).expect("valid JSON")
}

fn check_run(j: &serde_json::Value) {
    let verified = j["verified_rows"].as_u64().expect("verified_rows");
    let hit = j["hit_rate"].as_f64().expect("hit_rate");
    assert!(verified > 0, "{j}");
    assert_eq!(j["mismatched_rows"], 0, "{}", j["first_mismatch"]);
    assert!(hit > 0.0 && hit < 1.0, "hit rate {hit}");
    assert!(j["reclaimed_pages"].as_u64().expect("reclaimed_pages") > 0);
    assert!(
        j["h2d_bytes_per_step"]
            .as_f64()
            .expect("h2d_bytes_per_step")
            > 0.0
    );
    assert!(j["resolve_calls"].as_u64().unwrap_or(0) > 0);
    assert!(j["gpu_pool_bytes"].as_u64() < j["all_resident_gpu_bytes"].as_u64());
}

/// A small DeepSeek V3.2 run (4 of its 61 layers): every read row matches, pages are reclaimed,
/// rows are swapped in and the hot buffer hits; the plot is written.
#[test]
fn simulate_small_run_verifies_every_row_and_reclaims() {
    let svg = std::env::temp_dir().join(format!("hisparse-test-{}.svg", std::process::id()));
    let svg_arg = svg.to_str().expect("utf-8 temp path");
    let j = simulate_json(&[
        "simulate",
        "--backend",
        "cpu",
        "--layers",
        "4",
        "--requests",
        "2",
        "--context",
        "8192",
        "--decode-steps",
        "8",
        "--json",
        "--plot",
        svg_arg,
    ]);
    check_run(&j);
    assert_eq!(j["preset"], "deepseek-v3.2");
    let plot = std::fs::read_to_string(&svg).expect("plot written");
    let _ = std::fs::remove_file(&svg);
    assert!(plot.starts_with("<svg") && plot.contains("<polyline"));
}

/// Followers (GLM-5: one indexer per 4 layers) and split rows with compressed positions
/// (DeepSeek V4) go through the same engine.
#[test]
fn simulate_followers_and_split_rows() {
    for preset in ["glm-5", "deepseek-v4"] {
        let j = simulate_json(&[
            "simulate",
            "--preset",
            preset,
            "--layers",
            "8",
            "--requests",
            "3",
            "--context",
            "8192",
            "--decode-steps",
            "16",
            "--json",
        ]);
        check_run(&j);
    }
}

/// Without eager row mirroring, sealed pages reach host as whole-page spills (page backups);
/// three workers report each batch complete one, two and three steps late.
#[test]
fn simulate_with_page_spills_instead_of_row_mirrors() {
    let j = simulate_json(&[
        "simulate",
        "--layers",
        "4",
        "--requests",
        "2",
        "--context",
        "8192",
        "--decode-steps",
        "8",
        "--no-eager-mirror",
        "--workers",
        "3",
        "--json",
    ]);
    check_run(&j);
    assert_eq!(j["workers"], 3);
    assert!(j["spilled_pages"].as_u64().expect("spilled_pages") > 0);
    assert_eq!(j["mirror_spans"], 0);
}

/// Requests sharing their whole prompt: later ones find it in the host prefix cache, read it
/// through the hot path, and the shared tail page goes through copy-on-write and a restore.
#[test]
fn simulate_shared_prefix_reuses_host_pages_with_copy_on_write() {
    let j = simulate_json(&[
        "simulate",
        "--layers",
        "4",
        "--requests",
        "3",
        "--context",
        "8192",
        "--decode-steps",
        "8",
        "--shared-prefix",
        "8192",
        "--json",
    ]);
    // The hits read the shared pages' GPU copies (adopted, not reclaimed), so nothing need come
    // from host here: only the verification checks of `check_run` apply.
    assert!(
        j["verified_rows"].as_u64().expect("verified_rows") > 0,
        "{j}"
    );
    assert_eq!(j["mismatched_rows"], 0, "{}", j["first_mismatch"]);
    assert_eq!(j["hot_regions_allocated"], 0);
    assert!(j["prefix_hit_tokens"].as_u64().expect("prefix_hit_tokens") > 8192);
    assert!(j["host_cow_pages"].as_u64().expect("host_cow_pages") > 0);
    assert!(j["restored_pages"].as_u64().expect("restored_pages") > 0);
}

#[test]
fn simulate_text_report_names_its_figures() {
    let o = hisparse(&[
        "simulate",
        "--layers",
        "2",
        "--requests",
        "1",
        "--context",
        "4096",
        "--decode-steps",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "hot hit rate",
        "host→device per step",
        "pages reclaimed",
        "planning",
        "device ops",
        "rows verified byte for byte, 0 mismatched",
        "all-resident",
    ] {
        assert!(out.contains(needle), "missing {needle}:\n{out}");
    }
}

/// Runs a command expected to fail with a usage error: one `error:` line, nothing on stdout, no
/// panic; returns the line.
fn usage_error(args: &[&str]) -> String {
    let o = hisparse(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: not one line:\n{err}"
    );
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{err}"
    );
    err
}

/// A message names only flags the command has, and the one the user can change.
#[test]
fn messages_name_only_flags_the_command_has() {
    let e = usage_error(&["simulate", "--host-mem", "1MiB"]);
    assert!(e.contains("--host-mem") && e.contains("--context"), "{e}");
    assert!(
        !e.contains("--max-model-len"),
        "simulate has no --max-model-len: {e}"
    );
    let e = usage_error(&["simulate", "--requests", "100000000"]);
    assert!(
        e.contains("--requests"),
        "the derived budget grows with --requests: {e}"
    );
    assert!(!e.contains("its budget"), "{e}");
    let e = usage_error(&["simulate", "--gpu-mem", "1MiB"]);
    assert!(e.contains("raise --gpu-mem"), "{e}");
    assert!(!e.contains("--max-model-len"), "{e}");
    let e = usage_error(&["layout", "--host-mem", "1MiB"]);
    assert!(
        e.contains("--host-mem") && e.contains("--max-model-len"),
        "{e}"
    );
}

/// Negative numbers reach the validation (not "unexpected argument"), and a number out of its
/// range says the range.
#[test]
fn negative_and_huge_values_say_what_is_allowed() {
    for (args, needles) in [
        (
            &["simulate", "--gpu-mem", "-5"][..],
            &["--gpu-mem", "negative"][..],
        ),
        (
            &["layout", "--host-mem", "-1GiB"],
            &["--host-mem", "negative"],
        ),
        (
            &["simulate", "--overlap", "-1"],
            &["--overlap", "from 0 to 1"],
        ),
        (
            &["simulate", "--context", "99999999999"],
            &["--context", "from 1 to 4294967295"],
        ),
        (
            &["simulate", "--context", "-3"],
            &["--context", "from 1 to"],
        ),
        (&["simulate", "--seed", "-1"], &["--seed", "from 0 to"]),
        (
            &["layout", "--max-model-len", "1.5"],
            &["--max-model-len", "whole number"],
        ),
        (
            &["layout", "--gpu-mem", "340282366920938463463374607.9TB"],
            &["--gpu-mem", "larger than 16 EiB"],
        ),
        (
            &["simulate", "--context", "4294967290"],
            &["--context", "--decode-steps"],
        ),
        (
            &["simulate", "--workers", "4294967295"],
            &["--workers", "from 1 to 1024"],
        ),
        (
            &["simulate", "--requests", "4294967295"],
            &["--requests", "from 1 to"],
        ),
        (
            &["bench", "--iters", "99999999999"],
            &["--iters", "from 1 to 1000"],
        ),
    ] {
        let e = usage_error(args);
        for n in needles {
            assert!(e.contains(n), "{args:?}: `{n}` missing in {e}");
        }
    }
}

/// A mistyped subcommand or flag gets clap's "did you mean" on the one line.
#[test]
fn mistyped_subcommands_and_flags_get_a_suggestion() {
    let e = usage_error(&["simulat"]);
    assert!(e.contains("did you mean `simulate`"), "{e}");
    let e = usage_error(&["simulate", "--contxt", "5"]);
    assert!(e.contains("did you mean `--context`"), "{e}");
    assert!(e.contains("hisparse simulate --help"), "{e}");
    let e = usage_error(&["layout", "--gpu-meme", "80GiB"]);
    assert!(e.contains("did you mean `--gpu-mem`"), "{e}");
}

/// A conformance run that verifies nothing is not a success: a filter matching no case exits
/// non-zero (and so does a run whose every case is skipped, checked where the verdict is made).
#[test]
fn conformance_with_a_filter_matching_nothing_fails() {
    let o = hisparse(&["conformance", "--backend", "cpu", "zzz"]);
    assert!(!o.status.success(), "nothing ran, yet it succeeded");
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("`zzz` matches no conformance case"), "{err}");
}

fn layout_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["layout"];
    all.extend_from_slice(args);
    all.push("--json");
    let o = hisparse(&all);
    assert!(o.status.success(), "{all:?}: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("valid JSON")
}

/// DeepSeek V4's caches as vLLM declares them: 37,440-B C4A pages (584-B split rows padded to a
/// multiple of 576 B), 8,640-B indexer pages, 1,728-B C128A pages, sliding-window (64-token
/// blocks) and compressor-state (4- and 8-token blocks) groups beside the 256-token pages, and
/// a host stride of 21 × 37,440 = 786,240.
#[test]
fn layout_json_reports_the_deepseek_v4_vectors() {
    let j = layout_json(&[
        "--preset",
        "deepseek-v4",
        "--gpu-mem",
        "80GiB",
        "--host-mem",
        "512GiB",
        "--max-model-len",
        "131072",
    ]);
    assert_eq!(j["host_block_stride"], 786240);
    assert_eq!(
        (j["row_bytes"].clone(), j["value_bytes"].clone()),
        (584.into(), 576.into())
    );
    let groups = j["groups"].as_array().expect("groups");
    let pages = |g: &serde_json::Value| -> Vec<u64> {
        g["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["page_bytes"].as_u64().unwrap())
            .collect()
    };
    let of_kind = |kind: &'static str| groups.iter().filter(move |g| g["kind"] == kind);
    assert!(pages(&groups[0]).iter().all(|&p| p == 37440));
    assert_eq!(pages(&groups[1]), vec![8640; 21]);
    assert!(of_kind("resident").all(|g| pages(g).iter().all(|&p| p == 37440)));
    let regular: Vec<&serde_json::Value> = of_kind("regular").collect();
    let with = |cache: &str, block: u64| -> Vec<&&serde_json::Value> {
        regular
            .iter()
            .filter(|g| g["cache"] == cache && g["block_tokens"] == block)
            .collect()
    };
    let layers = |gs: &[&&serde_json::Value]| -> usize {
        gs.iter()
            .map(|g| g["layers"].as_array().unwrap().len())
            .sum()
    };
    let swa = with("sliding_window", 64);
    assert_eq!(layers(&swa), 43);
    assert!(swa.iter().all(|g| g["sliding_window"] == 128));
    let c128a = with("attention", 256);
    assert_eq!(layers(&c128a), 20);
    assert!(c128a.iter().all(|g| pages(g).iter().all(|&p| p == 1728)));
    let c4_states = with("compressor_state", 4);
    assert_eq!(layers(&c4_states), 42);
    assert!(c4_states.iter().all(|g| g["sliding_window"] == 8));
    let c128_states = with("compressor_state", 8);
    assert_eq!(layers(&c128_states), 20);
    assert!(
        c128_states
            .iter()
            .all(|g| g["sliding_window"] == 128 && pages(g).iter().all(|&p| p == 32832))
    );
    // Each group fits the shared block.
    let bpb = j["bytes_per_block"].as_u64().unwrap();
    assert!(
        groups[1..]
            .iter()
            .all(|g| g["page_bytes"].as_u64().unwrap() <= bpb)
    );
}

/// GLM-5's index_topk_freq = 4 and index_skip_topk_offset = 3: 21 index groups, leaders at
/// 0, 1, 2, 6, 10, …, 74; its model file states the rule instead of every layer's role.
#[test]
fn glm5_has_21_index_groups_and_its_model_file_states_the_rule() {
    let j = layout_json(&["--preset", "glm-5"]);
    let leaders: Vec<u64> = j["index_groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["leader"].as_u64().unwrap())
        .collect();
    let mut want = vec![0, 1, 2];
    want.extend((6..=74).step_by(4));
    assert_eq!(leaders, want);
    let o = hisparse(&["layout", "--preset", "glm-5", "--print-model"]);
    let m: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (
            m["index_topk_freq"].clone(),
            m["index_skip_topk_offset"].clone()
        ),
        (4.into(), 3.into())
    );
    assert_eq!(m["layers"].as_array().unwrap().len(), 1);
    assert_eq!(m["layers"][0]["repeat"], 78);
}

/// A model file with a misspelled field is refused with a message naming the field (it must not
/// silently change the layout).
#[test]
fn a_model_file_with_an_unknown_field_is_refused_naming_it() {
    let path = std::env::temp_dir().join(format!("hisparse-typo-{}.json", std::process::id()));
    let o = hisparse(&["layout", "--preset", "deepseek-v4", "--print-model"]);
    let text = stdout(&o).replacen("\"sliding_window\"", "\"sliding_windw\"", 1);
    assert!(text.contains("sliding_windw"));
    std::fs::write(&path, text).unwrap();
    let e = hisparse(&["layout", "--model", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    assert!(!e.status.success());
    let err = stderr(&e);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("unknown field `sliding_windw`"), "{err}");
    assert!(err.contains("--model"), "{err}");
}

/// `--tp N --shared-host-pool`: one pool for the node (stride and layer arrays aligned to 4096 B)
/// against one pool per rank without the flag.
#[test]
fn layout_tp_shows_host_memory_per_node_against_per_rank() {
    let base = [
        "--preset",
        "deepseek-v4",
        "--host-mem",
        "64GiB",
        "--tp",
        "4",
    ];
    let per_rank = layout_json(&base);
    let mut args = base.to_vec();
    args.push("--shared-host-pool");
    let shared = layout_json(&args);
    let hm = |j: &serde_json::Value, k: &str| j["host_memory"][k].as_u64().unwrap();
    assert_eq!(hm(&per_rank, "pools"), 4);
    assert_eq!(
        hm(&per_rank, "per_node_bytes"),
        4 * hm(&per_rank, "per_rank_bytes")
    );
    assert_eq!(hm(&shared, "pools"), 1);
    // One pool for the node; each rank pins its own indexer host cache beside it.
    let pool = shared["host_pool_bytes"].as_u64().unwrap();
    let cache = shared["indexer_host_cache_bytes"].as_u64().unwrap();
    assert!(cache > 0, "V4 has an indexer");
    assert_eq!(hm(&shared, "per_rank_bytes"), pool + cache);
    assert_eq!(hm(&shared, "per_node_bytes"), pool + 4 * cache);
    assert_eq!(shared["shared_host_pool"], true);
    assert_eq!(shared["host_block_stride"].as_u64().unwrap() % 4096, 0);
    assert_eq!(shared["host_block_stride"], 786432);
    assert!(
        shared["groups"][0]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["offset"].as_u64().unwrap() % 4096 == 0)
    );
    let o = hisparse(&[
        "layout",
        "--preset",
        "deepseek-v4",
        "--tp",
        "4",
        "--shared-host-pool",
    ]);
    let text = stdout(&o);
    assert!(
        text.contains("per rank") && text.contains("per node") && text.contains("one shared pool"),
        "{text}"
    );
    let e = hisparse(&["layout", "--shared-host-pool"]);
    assert!(!e.status.success() && stderr(&e).contains("--tp"));
}

/// DeepSeek V4 with a shared prompt prefix: later requests hit the prefix although every layer
/// has a sliding-window cache (only the window's last blocks must still be on the GPU); every
/// row read matches.
///
/// A whole shared prompt (the issue's `--shared-prefix 8192` with its 8192-token prompts, at
/// half the size) is reused but for its last token, which is always recomputed. A prefix that
/// ends mid-prompt needs the window blocks of its last page still cached when the next request
/// starts; V4's 22 sliding-window and compressor-state groups (4-, 8- and 64-token blocks) turn
/// over about 590 GPU blocks per 256-token page, so in the default pool (766 blocks here) those
/// blocks are reused before the first request ends, and the run gets 1 GiB.
#[test]
fn simulate_deepseek_v4_shared_prefix_gets_prefix_hits() {
    let run = |shared: &str, extra: &[&str]| {
        let mut args = vec![
            "simulate",
            "--preset",
            "deepseek-v4",
            "--requests",
            "3",
            "--context",
            "4096",
            "--shared-prefix",
            shared,
            "--decode-steps",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        let j = simulate_json(&args);
        assert_eq!(j["mismatched_rows"], 0, "{}", j["first_mismatch"]);
        assert!(j["verified_rows"].as_u64().unwrap() > 0);
        j
    };
    let whole = run("4096", &[]);
    assert_eq!(whole["prefix_hit_tokens"], 2 * 4095);
    assert!(whole["host_cow_pages"].as_u64().unwrap() > 0);
    // Two later requests reuse the 8 full pages of the shared prefix.
    let half = run("2048", &["--gpu-mem", "1GiB"]);
    assert_eq!(half["prefix_hit_tokens"], 2 * 2048);
}

/// Speculative decoding: each step computes the sampled token and a draft; rejected drafts are
/// rolled back (their rows, written and read in that step, are rewritten by the tokens that
/// replace them); every row read matches.
#[test]
fn simulate_spec_tokens_rolls_back_rejected_drafts() {
    let j = simulate_json(&[
        "simulate",
        "--layers",
        "4",
        "--requests",
        "2",
        "--context",
        "8192",
        "--decode-steps",
        "40",
        "--spec-tokens",
        "1",
        "--accept-rate",
        "0.7",
        "--json",
    ]);
    check_run(&j);
    let (drafted, accepted, rolled) = (
        j["draft_tokens"].as_u64().unwrap(),
        j["accepted_tokens"].as_u64().unwrap(),
        j["rolled_back_tokens"].as_u64().unwrap(),
    );
    assert!(rolled > 0 && accepted > 0, "{drafted} {accepted} {rolled}");
    assert_eq!(drafted, accepted + rolled);
    // The default hot buffer for 2 tokens per step: (2 + 1) × 2048.
    assert_eq!(j["device_buffer_size"], 6144);
    let err = usage_error(&["simulate", "--spec-tokens", "15"]);
    assert!(err.contains("--spec-tokens"), "{err}");
}

/// Each decode step's per-layer calls cut into micro-batches (whole requests, their own state
/// rows, on a side stream the runtime orders end_step after): every row read matches and the
/// step's hits, misses, bytes and reclaimed pages are those of one call per group, with more
/// calls.
#[test]
fn simulate_micro_batches_read_what_one_call_reads() {
    let run = |micro: &str| {
        simulate_json(&[
            "simulate",
            "--layers",
            "4",
            "--requests",
            "4",
            "--context",
            "8192",
            "--decode-steps",
            "8",
            "--spec-tokens",
            "1",
            "--gpu-mem",
            "60MiB",
            "--micro-batches",
            micro,
            "--json",
        ])
    };
    let whole = run("1");
    check_run(&whole);
    assert_eq!(whole["micro_batches"], 1);
    for micro in ["2", "3"] {
        let j = run(micro);
        check_run(&j);
        assert_eq!(j["micro_batches"].to_string(), micro);
        for key in [
            "verified_rows",
            "hot_hits",
            "misses",
            "h2d_bytes",
            "reclaimed_pages",
            "prefill_rows_checked",
        ] {
            assert_eq!(j[key], whole[key], "{key} with --micro-batches {micro}");
        }
        assert!(
            j["resolve_calls"].as_u64() > whole["resolve_calls"].as_u64(),
            "--micro-batches {micro} made no more calls: {} against {}",
            j["resolve_calls"],
            whole["resolve_calls"]
        );
    }
    let err = usage_error(&["simulate", "--micro-batches", "0"]);
    assert!(err.contains("--micro-batches"), "{err}");
}

/// Three drafts per step on DeepSeek V4 (compressed positions, split rows, sliding windows): a
/// rejection rolls back up to three tokens, and the next step's rows start before the last
/// row of the step before; every row read, from resident pages and from host, matches.
#[test]
fn simulate_deepseek_v4_rolls_back_several_drafts() {
    let j = simulate_json(&[
        "simulate",
        "--preset",
        "deepseek-v4",
        "--layers",
        "12",
        "--requests",
        "2",
        "--context",
        "32768",
        "--decode-steps",
        "24",
        "--spec-tokens",
        "3",
        "--accept-rate",
        "0.5",
        "--json",
    ]);
    check_run(&j);
    let rolled = j["rolled_back_tokens"].as_u64().unwrap();
    assert!(rolled > j["draft_tokens"].as_u64().unwrap() / 2, "{rolled}");
    // (3 + 1 + 1) × top-k 512.
    assert_eq!(j["device_buffer_size"], 2560);
}

/// A flag that would do nothing with the rest of the command line is refused with one line
/// saying what to change, before anything runs: `--pd-write` or `--pd-prefill-device` without
/// `--pd` (which ran the
/// default simulation), `--accept-rate` without drafts, `--preset` beside `--model` (the model
/// silently won), `--print-model` beside the planning flags it ignores, and `--device` for the
/// CPU backend, which has one.
#[test]
fn flags_that_would_do_nothing_are_refused() {
    for (args, needles) in [
        (
            &["simulate", "--pd-write", "pages"][..],
            &["--pd-write", "--pd nixl"][..],
        ),
        (
            &["simulate", "--pd-prefill-device", "0"],
            &["--pd-prefill-device", "--pd nixl"],
        ),
        (
            &["simulate", "--accept-rate", "0.5"],
            &["--accept-rate", "--spec-tokens"],
        ),
        (
            &["simulate", "--spec-tokens", "0", "--accept-rate", "0.5"],
            &["--accept-rate", "--spec-tokens"],
        ),
        (
            &["simulate", "--preset", "glm-5", "--model", "m.json"],
            &["--preset", "--model"],
        ),
        (
            &["layout", "--preset", "glm-5", "--model", "m.json"],
            &["--preset", "--model"],
        ),
        (
            &["layout", "--print-model", "--gpu-mem", "40GiB"],
            &["--print-model", "--gpu-mem"],
        ),
        (
            &["layout", "--print-model", "--json"],
            &["--print-model", "--json"],
        ),
        (&["bench", "--device", "1"], &["--device", "cpu"]),
        (&["conformance", "--device", "1"], &["--device", "cpu"]),
        (
            &["simulate", "--backend", "cpu", "--device", "0"],
            &["--device", "cpu"],
        ),
        (
            &["simulate", "--import", "--tp", "2"],
            &["--import", "--tp"],
        ),
        (
            &["simulate", "--pd", "nixl", "--import"],
            &["--pd", "--import"],
        ),
        (
            &["simulate", "--pd", "nixl", "--prefix-on-host"],
            &["--pd", "--prefix-on-host"],
        ),
    ] {
        let e = usage_error(args);
        for n in needles {
            assert!(e.contains(n), "{args:?}: {e}");
        }
        assert!(e.contains("drop") || e.contains("give"), "{args:?}: {e}");
    }
    // The same flags where they mean something still run.
    let o = hisparse(&["layout", "--preset", "glm-5", "--print-model"]);
    assert!(o.status.success(), "{}", stderr(&o));
}
