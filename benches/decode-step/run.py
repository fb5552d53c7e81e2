#!/usr/bin/env python3
"""An engine's decode step for DeepSeek V3.2 on one GPU, all-resident against HiSparse.

    python benches/decode-step/run.py --flashmla-lib DIR/_flashmla_C.abi3.so --out results/

runs the whole sweep on the GPU (CUDA, PyTorch, the hisparse wheel with the cuda backend,
FlashMLA's library from scripts/fetch-vllm-kernels.sh) and writes ``decode_step.json``,
``decode_step.md`` (the tables for docs/PERF.md) and ``decode_step.svg``/``.png``.
``--dry-run`` runs the same loop on HiSparse's CPU backend with numpy at small shapes (the
attention a plain numpy computation): the plumbing and the bit-identity checks, no figures.
See benches/decode-step/README.md.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from decode_step import capacity, config, driver, report  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="decode-step-results", help="directory for the results")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU backend, numpy, small shapes: checks the plumbing, measures nothing")
    p.add_argument("--smoke", action="store_true",
                   help="GPU, a few small configurations: catches errors before the full sweep")
    p.add_argument("--flashmla-lib", default=os.environ.get("HISPARSE_FLASHMLA_LIB"))
    p.add_argument("--contexts", type=int, nargs="+")
    p.add_argument("--batches", type=int, nargs="+")
    p.add_argument("--budgets-gib", type=float, nargs="+")
    p.add_argument("--overlaps", type=float, nargs="+")
    p.add_argument("--layers", type=int)
    p.add_argument("--top-k", type=int)
    p.add_argument("--indexer", choices=["triton", "torch"],
                   help="the indexer's logits: one Triton kernel (default) or PyTorch ops")
    p.add_argument("--standin-bytes", type=int, help="weight bytes per step (0: no stand-in)")
    p.add_argument("--micro-batches", type=int,
                   help="micro-batches of the pipelined step (default 2; 1: no pipelined step)")
    p.add_argument("--pipeline-split", choices=["batch", "swap"],
                   help="what the pipelined step cuts into micro-batches: every per-layer stage "
                        "(batch, the default) or only the per-layer call and the attention (swap)")
    p.add_argument("--gather-walk", choices=["auto", "all-rows", "in-order"],
                   help="the CUDA swap-in gather's walk (HISPARSE_CUDA_GATHER_WALK; default "
                        "auto, the production rule)")
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--timed-steps", type=int)
    p.add_argument("--host-limit-gib", type=float, help="host memory the pools may take")
    p.add_argument("--time-budget", type=float, help="seconds; later configurations are skipped")
    p.add_argument("--no-largest", action="store_true",
                   help="measure only the listed batches, not each arm's largest per budget")
    return p.parse_args(argv)


def make_config(a) -> config.Config:
    cfg = config.Config()
    if a.dry_run:
        cfg = config.Config(layers=3, top_k=64, contexts=[1024], batches=[1, 3],
                            budgets=[4 * MiB, 8 * MiB], standin_bytes=3 * 64 * 64 * 4,
                            standin_width=64, warmup_steps=2, timed_steps=3, prefill_chunk=512,
                            decode_reserve=256, host_limit=16 * MiB, gpu_pool_limit=48 * MiB,
                            kv_table_rows=1 << 10, indexer_table_rows=1 << 12,
                            resident_path_max_batch=3, settle_window=2, settle_max_steps=4)
        a.no_largest = True
    elif a.smoke:
        cfg = config.Config(contexts=[32768], batches=[1, 8], budgets=[16 * GiB],
                            overlaps=[0.9], warmup_steps=2, timed_steps=3, settle_max_steps=12)
    for field, value in (("contexts", a.contexts), ("batches", a.batches),
                         ("overlaps", a.overlaps), ("layers", a.layers), ("top_k", a.top_k),
                         ("standin_bytes", a.standin_bytes), ("warmup_steps", a.warmup_steps),
                         ("timed_steps", a.timed_steps), ("time_budget", a.time_budget),
                         ("indexer", a.indexer), ("micro_batches", a.micro_batches),
                         ("pipeline_split", a.pipeline_split), ("gather_walk", a.gather_walk)):
        if value is not None:
            setattr(cfg, field, value)
    if a.budgets_gib:
        cfg.budgets = [int(b * GiB) for b in a.budgets_gib]
    if a.host_limit_gib:
        cfg.host_limit = int(a.host_limit_gib * GiB)
    return cfg


def commit() -> str:
    """The commit measured: the wheel's (HISPARSE_COMMIT, from its MANIFEST) when given, else
    this checkout's."""
    if os.environ.get("HISPARSE_COMMIT"):
        return os.environ["HISPARSE_COMMIT"]
    try:
        c = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=HERE, capture_output=True,
                           text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True).stdout.strip()
        return c + (" (with local changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(out: pathlib.Path, results) -> None:
    tmp = out / "decode_step.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, default=float))
    tmp.replace(out / "decode_step.json")


def main(argv=None) -> int:
    a = parse_args(argv)
    cfg = make_config(a)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = driver.Clock(cfg.time_budget)
    # The CUDA backend reads the walk when the runtime opens it (every runtime of this process).
    os.environ["HISPARSE_CUDA_GATHER_WALK"] = cfg.gather_walk
    if a.dry_run:
        from decode_step.kernels_numpy import NumpyKernels as Kernels
        backend, device, ceilings = "cpu", f"{platform.machine()} CPU (dry run: no figures)", {}
    else:
        from decode_step import kernels_torch

        why = kernels_torch.unavailable(a.flashmla_lib)
        if why:
            print(f"decode-step: not run: {why}", file=sys.stderr)
            return 2
        kernels_torch.load_flashmla(a.flashmla_lib)
        Kernels = kernels_torch.TorchKernels
        backend, device = "cuda", kernels_torch.device_name()
        ceilings = kernels_torch.ceilings()
        print(f"ceilings: bulk H2D {ceilings['h2d_gb_s']:.1f} GB/s, device copy {ceilings['d2d_gb_s']:.0f} GB/s")
    results = {
        "meta": {"commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "device": device, "command": " ".join(["python", "benches/decode-step/run.py"] + (argv or sys.argv[1:])),
                 "dry_run": a.dry_run},
        "config": {k: v for k, v in vars(cfg).items()},
        "ceilings": ceilings,
        "host_limit_bytes": capacity.host_limit(cfg),
        "budgets": [],
        "contexts": [],
    }
    write(out, results)
    status = 0
    for context in cfg.contexts:
        probe = capacity.probe_layout(cfg, context)
        ceiling = capacity.host_max_requests(cfg, context, probe, results["host_limit_bytes"])
        t = time.perf_counter()
        caps = [capacity.budget_report(cfg, context, b, ceiling) for b in cfg.budgets]
        results["budgets"] += caps
        print(f"context {context}: host memory holds {ceiling} requests; per budget "
              + ", ".join(f"{c['budget_bytes'] / GiB:g} GiB: all-resident {c['all_resident']['requests']} "
                          f"(dense {c['dense_all_resident_requests']}), HiSparse {c['hisparse']['requests']}"
                          for c in caps) + f" ({time.perf_counter() - t:.1f} s)")
        batches = [b for b in cfg.batches]
        stops = [b for b in batches if b > ceiling]
        batches = [b for b in batches if b <= ceiling] + [ceiling]
        if not a.no_largest:
            for c in caps:
                batches += [c["all_resident"]["requests"], c["dense_all_resident_requests"],
                            c["hisparse"]["requests"]]
        entry = {"context": context, "host_max_requests": ceiling,
                 "batches_beyond_host_memory": stops, "batches": []}
        results["contexts"].append(entry)
        try:
            bench = driver.ContextBench(cfg, context, Kernels, backend, batches, ceiling, clock)
        except Exception as e:  # a pool that cannot be had: recorded, the next context runs
            entry["error"] = f"{type(e).__name__}: {e}"
            print(f"context {context}: {entry['error']}", file=sys.stderr)
            status = 1
            write(out, results)
            continue
        entry["all_resident_batches"] = bench.resident_batches
        for B in bench.batches:
            try:
                r = bench.run_one(B)
            except driver.BenchError as e:
                r = {"batch": B, "context": context, "error": str(e)}
                print(f"context {context} batch {B}: FAILED: {e}", file=sys.stderr)
                status = 1
            entry["batches"].append(r)
            write(out, results)
        bench.close()
    (out / "decode_step.md").write_text(report.markdown(results))
    try:
        paths = report.plot(results, str(out / "decode_step"))
        print("plot:", " ".join(paths))
    except ImportError as e:
        print(f"no plot: {e} (pip install matplotlib; or run decode_step/report.py on the JSON)")
    print(f"results in {out}/decode_step.json ({clock.elapsed():.0f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
