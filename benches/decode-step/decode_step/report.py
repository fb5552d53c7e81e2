"""From the results JSON: the tax and gain figures, the table for docs/PERF.md and the plot."""

import json
from typing import Dict, List, Optional

#: The all-hit runs' overlap target (``driver.ALL_HIT``; not imported: this module runs alone).
ALL_HIT = 1.0


def runs_of(results: Dict):
    """(context, batch, run) for every measured run."""
    for ctx in results["contexts"]:
        for b in ctx["batches"]:
            for r in b.get("runs", []):
                yield ctx["context"], b["batch"], r


def find(results: Dict, context: int, batch: int, arm: str, mode: str = "step",
         overlap: Optional[float] = None) -> Optional[Dict]:
    overlap = results["config"]["overlaps"][0] if overlap is None else overlap
    for c, b, r in runs_of(results):
        if (c, b, r["arm"], r["mode"]) == (context, batch, arm, mode) and \
                abs(r["overlap_target"] - overlap) < 1e-9:
            return r
    return None


def best(results: Dict, context: int, batch: int, arm: str, standin: bool = True) -> Optional[Dict]:
    """The arm's faster step at the main overlap: the one-graph step or the pipelined one."""
    modes = ("step", "pipelined") if standin else ("step_no_standin", "pipelined_no_standin")
    runs = [r for r in (find(results, context, batch, arm, m) for m in modes) if r]
    return min(runs, key=lambda r: r["step_ms"]) if runs else None


def tax(results: Dict) -> List[Dict]:
    """HiSparse's step time over the all-resident arm's at equal batch (main overlap): the plain
    steps', the pipelined steps', and each arm's best step's (``tax_best``)."""
    rows = []
    for ctx in results["contexts"]:
        for b in ctx["batches"]:
            c, n = ctx["context"], b["batch"]
            row = {"context": c, "batch": n}
            for mode in ("step", "step_no_standin", "pipelined", "pipelined_no_standin"):
                ar, hs = find(results, c, n, "all_resident", mode), find(results, c, n, "hisparse", mode)
                fr = find(results, c, n, "hisparse_fully_resident", mode)
                if ar and hs:
                    row[f"tax_{mode}"] = hs["step_ms"] / ar["step_ms"]
                if ar and fr:
                    row[f"fully_resident_{mode}"] = fr["step_ms"] / ar["step_ms"]
            for standin, key in ((True, "tax_best"), (False, "tax_best_no_standin")):
                ar, hs = best(results, c, n, "all_resident", standin), best(results, c, n, "hisparse", standin)
                if ar and hs:
                    row[key] = hs["step_ms"] / ar["step_ms"]
                    row[key + "_modes"] = (hs["mode"], ar["mode"])
            if len(row) > 2:
                rows.append(row)
    return rows


def hidden(results: Dict) -> List[Dict]:
    """Per batch and HiSparse step mode (``step``, ``pipelined``), how much of the misses' bus
    time the step hides: its time at the main overlap less the same step's with no miss
    (``ALL_HIT``), against the bytes it brought in at the same run's bulk H2D rate;
    ``hidden_share`` = 1 − extra / bus time (1: all hidden; 0: the step grew by the whole
    transfer; below 0: by more)."""
    rate = (results.get("ceilings") or {}).get("h2d_gb_s")
    rows = []
    for ctx in results["contexts"]:
        for b in ctx["batches"]:
            c, n = ctx["context"], b["batch"]
            for mode in ("step", "pipelined"):
                miss, hit = find(results, c, n, "hisparse", mode), find(results, c, n, "hisparse", mode, ALL_HIT)
                if not (miss and hit):
                    continue
                row = {"context": c, "batch": n, "mode": mode, "step_ms": miss["step_ms"],
                       "all_hit_ms": hit["step_ms"], "extra_ms": miss["step_ms"] - hit["step_ms"],
                       "h2d_bytes": miss["per_step"]["h2d_bytes"],
                       "all_hit_misses": hit["per_step"]["hot_misses"], "bus_ms": None, "hidden_share": None}
                if rate and row["h2d_bytes"]:
                    row["bus_ms"] = row["h2d_bytes"] / (rate * 1e6)
                    row["hidden_share"] = 1 - row["extra_ms"] / row["bus_ms"]
                rows.append(row)
    return rows


def gain(results: Dict) -> List[Dict]:
    """Per budget and context: the largest batch of each arm (found by allocating), and the
    tokens/s of its best step (``best``) measured at it (stand-in on and off) where that batch
    was measured."""
    rows = []
    for cap in results.get("budgets", []):
        c = cap["context"]
        ar_n = max(cap["all_resident"]["requests"], cap["dense_all_resident_requests"])
        hs_n = cap["hisparse"]["requests"]
        row = {"context": c, "budget_gib": cap["budget_bytes"] / (1 << 30),
               "all_resident_batch": ar_n, "hisparse_batch": hs_n,
               "all_resident_batch_hisparse_layout": cap["all_resident"]["requests"],
               "dense_all_resident_batch": cap["dense_all_resident_requests"],
               "planner_all_on_gpu": cap["planner"]["all_on_gpu_max"],
               "planner_hisparse": cap["planner"]["hisparse_max"]}
        for mode, standin in (("step", True), ("step_no_standin", False)):
            ar = best(results, c, ar_n, "all_resident", standin)
            hs = best(results, c, hs_n, "hisparse", standin)
            row[f"all_resident_tok_s_{mode}"] = ar["tokens_per_s"] if ar else None
            row[f"hisparse_tok_s_{mode}"] = hs["tokens_per_s"] if hs else None
            if ar and hs:
                row[f"gain_{mode}"] = hs["tokens_per_s"] / ar["tokens_per_s"]
        rows.append(row)
    return rows


def _f(x, fmt="{:.2f}"):
    return "–" if x is None else fmt.format(x)


def markdown(results: Dict) -> str:
    """The tables docs/PERF.md carries, with the run's commit, date and command."""
    m = results["meta"]
    out = [f"Commit `{m['commit']}`, {m['date']}, {m.get('device', '?')}; command `{m['command']}`.",
           ""]
    ceil = results.get("ceilings") or {}
    if ceil:
        out.append(f"Same-run ceilings: bulk pinned H2D {ceil['h2d_gb_s']:.1f} GB/s, device copy "
                   f"{ceil['d2d_gb_s']:.0f} GB/s (read + write).")
        out.append("")
    settle = sorted({r["settle_steps"] for _, _, r in runs_of(results) if r.get("settle_steps")})
    if settle:
        keep = 1 - results["config"].get("settle_tolerance", 0.05)
        out.append(f"HiSparse's modes at each overlap timed after {settle[0]}–{settle[-1]} settling steps "
                   f"(until a window of steps missed at least {keep:.0%} as many rows as the one before).")
        out.append("")
    out += ["| context | batch | arm | overlap (measured) | step ms (stand-in) | step ms (no stand-in) | "
            "tok/s (stand-in) | tok/s (none) | host ms | writes | indexer | top-k | resolve + swap-in | "
            "attention | stand-in | H2D MB/step | missed rows/step |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    main = results["config"]["overlaps"][0]
    split = "split: " + results["config"].get("pipeline_split", "batch")
    for ctx in results["contexts"]:
        for b in ctx["batches"]:
            if "skipped" in b:
                out.append(f"| {ctx['context']} | {b['batch']} | skipped: {b['skipped']} |" + " |" * 14)
                continue
            rows = [(arm, ov, step) for arm in ("all_resident", "hisparse_fully_resident", "hisparse")
                    for step in ("step", "pipelined")
                    for ov in results["config"]["overlaps"] + [ALL_HIT]
                    if arm == "hisparse" or ov == main]
            for arm, ov, step in rows:
                s = find(results, ctx["context"], b["batch"], arm, step, ov)
                if s is None:
                    continue
                n = find(results, ctx["context"], b["batch"], arm, f"{step}_no_standin", ov)
                g = find(results, ctx["context"], b["batch"], arm, "segments", ov) if step == "step" else None
                seg = g["device_ms"] if g else {}
                label = arm if step == "step" else f"{arm}, pipelined ({split})"
                out.append(
                    f"| {ctx['context']} | {b['batch']} | {label} | {ov:.2f} ({_f(s['overlap_measured'], '{:.3f}')}) | "
                    f"{s['step_ms']:.2f} | {_f(n and n['step_ms'])} | {s['tokens_per_s']:.0f} | "
                    f"{_f(n and n['tokens_per_s'], '{:.0f}')} | {s['host_ms']:.2f} | "
                    + " | ".join(_f(seg.get(k)) for k in ("write", "indexer", "topk", "resolve",
                                                           "attention", "standin"))
                    + f" | {s['per_step']['h2d_bytes'] / 1e6:.2f} | {s['per_step']['hot_misses']:.0f} |")
    out += ["", "Tax at equal batch (HiSparse step time / all-resident step time; best: each arm's "
            "faster of its one-graph and pipelined steps):", "",
            "| context | batch | with stand-in | without | pipelined, with stand-in | without | best, with "
            "stand-in (HiSparse / all-resident step) | without | fully-resident path, with stand-in | without |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for t in tax(results):
        modes = t.get("tax_best_modes")
        out.append(f"| {t['context']} | {t['batch']} | {_f(t.get('tax_step'), '{:.3f}')} | "
                   f"{_f(t.get('tax_step_no_standin'), '{:.3f}')} | "
                   f"{_f(t.get('tax_pipelined'), '{:.3f}')} | "
                   f"{_f(t.get('tax_pipelined_no_standin'), '{:.3f}')} | "
                   f"{_f(t.get('tax_best'), '{:.3f}')}" + (f" ({modes[0]} / {modes[1]})" if modes else "") + " | "
                   f"{_f(t.get('tax_best_no_standin'), '{:.3f}')} | "
                   f"{_f(t.get('fully_resident_step'), '{:.3f}')} | "
                   f"{_f(t.get('fully_resident_step_no_standin'), '{:.3f}')} |")
    out += ["", "The misses' transfer hidden (HiSparse, stand-in on: the step at the main overlap less "
            "the same step with no miss, against the bytes brought in at the same run's bulk H2D rate):", "",
            "| context | batch | step | ms | all-hit ms (its misses) | extra ms | H2D MB | bus ms | hidden |",
            "|---|---|---|---|---|---|---|---|---|"]
    for h in hidden(results):
        out.append(f"| {h['context']} | {h['batch']} | {h['mode']} | {h['step_ms']:.2f} | "
                   f"{h['all_hit_ms']:.2f} ({h['all_hit_misses']:.0f}) | {h['extra_ms']:.2f} | "
                   f"{h['h2d_bytes'] / 1e6:.2f} | {_f(h['bus_ms'])} | "
                   f"{_f(h['hidden_share'] and 100 * h['hidden_share'], '{:.0f}%')} |")
    out += ["", "Gain at equal GPU memory (largest batch found by allocating; all-resident: the "
            "larger of HiSparse's layout and a dense cache):", "",
            "| context | KV budget | all-resident batch (HiSparse layout / dense / planner) | HiSparse batch "
            "(planner) | all-resident tok/s | HiSparse tok/s | gain (stand-in) | gain (none) |",
            "|---|---|---|---|---|---|---|---|"]
    for g in gain(results):
        out.append(f"| {g['context']} | {g['budget_gib']:.0f} GiB | {g['all_resident_batch_hisparse_layout']} / "
                   f"{g['dense_all_resident_batch']} / {g['planner_all_on_gpu']} | {g['hisparse_batch']} "
                   f"({g['planner_hisparse']}) | {_f(g['all_resident_tok_s_step'], '{:.0f}')} | "
                   f"{_f(g['hisparse_tok_s_step'], '{:.0f}')} | {_f(g.get('gain_step'))} | "
                   f"{_f(g.get('gain_step_no_standin'))} |")
    return "\n".join(out) + "\n"


def plot(results: Dict, stem: str) -> List[str]:
    """tokens/s against batch per arm and context, and the step-time breakdown; writes
    ``stem.svg`` and ``stem.png`` and returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    arms = {"all_resident": "all-resident", "hisparse": "HiSparse"}
    for ctx in results["contexts"]:
        c = ctx["context"]
        for arm, label in arms.items():
            for mode, style in (("step", "-"), ("step_no_standin", ":")):
                pts = sorted((bb, r["tokens_per_s"]) for cc, bb, r in runs_of(results)
                             if cc == c and r["arm"] == arm and r["mode"] == mode
                             and abs(r["overlap_target"] - results["config"]["overlaps"][0]) < 1e-9)
                if pts:
                    x, y = zip(*pts)
                    left.plot(x, y, style, marker="o",
                              label=f"{label}, {c // 1024}K{'' if mode == 'step' else ', no stand-in'}")
    left.set_xlabel("batch (requests decoding)")
    left.set_ylabel("decode tokens/s")
    left.set_xscale("log", base=2)
    left.set_title("Decode throughput (stand-in on: solid)")
    left.legend(fontsize=7)
    bars = [(c, b, r) for c, b, r in runs_of(results) if r["mode"] == "segments"]
    names = ["write", "indexer", "topk", "resolve", "attention", "standin"]
    bottom = [0.0] * len(bars)
    for name in names:
        vals = [r["device_ms"][name] for _, _, r in bars]
        right.bar(range(len(bars)), vals, bottom=bottom, label=name)
        bottom = [a + v for a, v in zip(bottom, vals)]
    host = [r_host(results, c, b, r["arm"]) for c, b, r in bars]
    right.bar(range(len(bars)), host, bottom=bottom, label="host", color="grey")
    right.set_xticks(range(len(bars)))
    right.set_xticklabels([f"{c // 1024}K×{b}\n{'AR' if r['arm'] == 'all_resident' else 'HS'}"
                           for c, b, r in bars], fontsize=6)
    right.set_ylabel("ms per step")
    right.set_title("Step time breakdown (segments timed apart)")
    right.legend(fontsize=7)
    fig.tight_layout()
    paths = [f"{stem}.svg", f"{stem}.png"]
    fig.savefig(paths[0])
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def r_host(results, c, b, arm):
    s = find(results, c, b, arm, "segments")
    return s["host_ms"] if s else 0.0


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description="Tables and plot from a decode-step results JSON.")
    p.add_argument("results")
    p.add_argument("--plot", help="stem of the SVG and PNG to write")
    a = p.parse_args(argv)
    with open(a.results) as f:
        results = json.load(f)
    print(markdown(results))
    if a.plot:
        print("\n".join(plot(results, a.plot)))


if __name__ == "__main__":
    main()
