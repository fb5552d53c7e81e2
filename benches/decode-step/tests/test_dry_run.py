"""The decode-step benchmark's CPU dry run: HiSparse's CPU backend, numpy, small shapes.

It runs the benchmark's whole loop — capacity search by allocation, prefill through the slot
mapping, both arms' decode steps with the host side in the loop, the overlap calibration, the
bit-identity checks (each arm against the attention over the rows the forward wrote, HiSparse
against the all-resident arm for the same top-k) — and the report built from its JSON. The
timings of a dry run mean nothing and are not looked at."""

import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from decode_step import report  # noqa: E402


def test_dry_run(tmp_path):
    out = subprocess.run([sys.executable, str(HERE / "run.py"), "--dry-run", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads((tmp_path / "decode_step.json").read_text())
    assert results["meta"]["dry_run"]
    # The gather walk the run asked the CUDA backend for (the production rule by default).
    assert results["config"]["gather_walk"] == "auto"
    [ctx] = results["contexts"]
    batches = {b["batch"]: b for b in ctx["batches"]}
    assert set(batches) >= {1, 3}, batches.keys()
    for b in batches.values():
        assert "error" not in b and "skipped" not in b, b
        assert b["check_hisparse"]["reference_layers_identical"] == 3
        arms = {(r["arm"], r["mode"], r["overlap_target"]) for r in b["runs"]}
        for ov in (0.9, 0.8, 0.95):
            assert ("hisparse", "step", ov) in arms and ("hisparse", "step_no_standin", ov) in arms
        assert ("hisparse", "segments", 0.9) in arms
        # The same step with nothing to swap in, beside which the misses' transfer is measured.
        assert ("hisparse", "step", 1.0) in arms
        all_hit = [r for r in b["runs"] if r["overlap_target"] == 1.0]
        assert all_hit and all(r["per_step"]["hot_misses"] == 0 for r in all_hit), all_hit
        # Beyond one request the step is also pipelined (two micro-batches), checked row for row.
        if b["batch"] > 1:
            for ov in (0.9, 0.8, 0.95):
                assert ("hisparse", "pipelined", ov) in arms and ("hisparse", "pipelined_no_standin", ov) in arms
            assert ("hisparse", "pipelined", 1.0) in arms
            assert b["check_hisparse"]["pipelined_reference_layers_identical"] == 3
            piped = [r for r in b["runs"] if r["arm"] == "hisparse" and r["mode"] == "pipelined"]
            # One call per micro-batch per index group: twice the one-graph step's.
            step = [r for r in b["runs"] if r["arm"] == "hisparse" and r["mode"] == "step"]
            assert piped[0]["per_step"]["resolve_calls"] == 2 * step[0]["per_step"]["resolve_calls"]
        else:
            assert not any(r["mode"].startswith("pipelined") for r in b["runs"])
    # Batches the all-resident pool holds whole: both arms ran, HiSparse matched it bit for bit.
    both = [b for b in batches.values() if "check_all_resident" in b]
    assert both, "no batch ran the all-resident arm"
    for b in both:
        assert b["check_hisparse"]["all_resident_layers_identical"] == 3
        ar = [r for r in b["runs"] if r["arm"] == "all_resident"]
        assert ar and all(r["per_step"]["resolve_calls"] == 0 and r["per_step"]["hot_misses"] == 0
                          for r in ar)
        assert all(r["per_step"]["prefill_remap_calls"] > 0 for r in ar)
        if b["batch"] > 1:
            assert b["check_all_resident"]["pipelined_reference_layers_identical"] == 3
    # Beyond one request the HiSparse pool is tight: rows were swapped in from host.
    assert batches[3]["hisparse_swapped"]
    hs = [r for r in batches[3]["runs"] if r["arm"] == "hisparse"]
    assert sum(r["per_step"]["hot_misses"] for r in hs) > 0
    # Each overlap's modes were timed after its settling steps (at least one window of them).
    assert all(r["settle_steps"] >= results["config"]["settle_window"] for r in hs), hs
    # The drift gives the overlap asked for, within a few points at these shapes.
    for r in hs:
        assert abs(r["overlap_measured"] - r["overlap_target"]) < 0.08, r
    # Capacity found by allocating: HiSparse fits more requests than the all-resident arm.
    for cap in results["budgets"]:
        assert cap["hisparse"]["requests"] > cap["all_resident"]["requests"], cap
    table = (tmp_path / "decode_step.md").read_text()
    assert "Tax at equal batch" in table and "Gain at equal GPU memory" in table
    assert "The misses' transfer hidden" in table
    assert table == report.markdown(results)
    for row in report.tax(results):
        assert row["tax_step"] > 0 and row["tax_best"] > 0
    modes = {(h["batch"], h["mode"]) for h in report.hidden(results)}
    assert {(3, "step"), (3, "pipelined")} <= modes, modes


def test_plot_from_json(tmp_path):
    """The plot is made from the JSON alone (matplotlib, as on the GPU machine)."""
    import pytest

    pytest.importorskip("matplotlib", reason="matplotlib is not installed: the plot is not checked")
    results = {"config": {"overlaps": [0.9]}, "meta": {}, "budgets": [], "contexts": [
        {"context": 32768, "batches": [{"batch": b, "runs": [
            {"arm": arm, "mode": mode, "overlap_target": 0.9, "tokens_per_s": 10.0 * b,
             "host_ms": 0.1, "device_ms": {s: 1.0 for s in ("write", "indexer", "topk", "resolve",
                                                           "attention", "standin")}}
            for arm in ("all_resident", "hisparse") for mode in ("step", "step_no_standin", "segments")]}
            for b in (1, 8)]}]}
    paths = report.plot(results, str(tmp_path / "p"))
    for p in paths:
        assert pathlib.Path(p).stat().st_size > 1000


def test_dry_run_pipelined_at_the_swap_only(tmp_path):
    """``--pipeline-split swap``: the whole batch's indexer and top-k, then one per-layer call per
    micro-batch on the side stream, each micro-batch's attention after its own call."""
    out = subprocess.run([sys.executable, str(HERE / "run.py"), "--dry-run", "--out", str(tmp_path),
                          "--batches", "3", "--overlaps", "0.9", "--pipeline-split", "swap"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads((tmp_path / "decode_step.json").read_text())
    assert results["config"]["pipeline_split"] == "swap"
    [b] = [b for b in results["contexts"][0]["batches"] if b["batch"] == 3]
    assert b["check_hisparse"]["pipelined_reference_layers_identical"] == 3
    runs = {r["mode"]: r for r in b["runs"] if r["arm"] == "hisparse" and r["overlap_target"] == 0.9}
    assert runs["pipelined"]["per_step"]["resolve_calls"] == 2 * runs["step"]["per_step"]["resolve_calls"]
    assert "hisparse, pipelined (split: swap)" in (tmp_path / "decode_step.md").read_text()
