#!/usr/bin/env python3
"""Host-pool set-up and release from Python, beside PyTorch's own pinning and the same run's
memset of as many bytes: the figures `hisparse bench --host-pool` cannot take (PyTorch's), and the
paths as an engine in Python meets them.

For each size, one after another (each pool released before the next is made):

  memset       numpy: fill of a fresh array (first touch, one thread), then of the same, resident
               array (the plain memset ceiling), one thread
  runtime      hisparse.Runtime allocating its own host pool (plus a 256-block device pool)
  lent         hisparse.aligned_empty(size) (numpy.zeros: untouched pages) lent as the Runtime's
               host pool, registered by the backend
  torch-empty  torch.empty(size, dtype=uint8, pin_memory=True) (cudaHostAlloc)
  torch-pin    torch.empty(size, dtype=uint8).pin_memory() (a pinned copy of a pageable tensor)

Set-up is the call that makes the pool; release is `del` (and, for PyTorch, emptying its caching
host allocator), then the wait until MemAvailable has regained 90% of the pool (a release that
finishes on a thread of its own is timed to its end this way).

    python3 scripts/bench/host_pool.py --backend cuda --sizes 8GiB,32GiB,64GiB --json out.json

Needs the hisparse wheel (and numpy); torch for the torch rows and the cuda backend.
"""

import argparse
import gc
import json
import sys
import time

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text):
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz ")
    unit = t[len(num):].strip()
    if unit not in UNITS or not num:
        raise SystemExit(f"error: `{text}` is not a size; write e.g. 8GiB, 512MiB or plain bytes")
    return int(float(num) * UNITS[unit])


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def wait_released(before, size, timeout=300.0):
    """Seconds until MemAvailable is back within 10% of the pool of `before` (None: timed out)."""
    t = time.perf_counter()
    if before is None:
        return 0.0
    while time.perf_counter() - t < timeout:
        now = mem_available()
        if now is not None and now >= before - size // 10:
            return time.perf_counter() - t
        time.sleep(0.005)
    return None


def timed(make, release, size):
    """(set-up s, drop s, released s) of the pool `make()` returns; `release()` runs after the
    last reference to the pool is gone (freeing what the pool was made from)."""
    gc.collect()
    before = mem_available()
    box = {}
    t = time.perf_counter()
    box["pool"] = make()
    setup = time.perf_counter() - t
    t = time.perf_counter()
    box.clear()
    gc.collect()
    release()
    dropped = time.perf_counter() - t
    waited = wait_released(before, size)
    return {
        "setup_seconds": setup,
        "setup_gib_per_s": size / 2**30 / setup,
        "drop_seconds": dropped,
        "release_seconds": None if waited is None else dropped + waited,
    }


def memset_ceilings(size):
    import numpy as np

    t = time.perf_counter()
    a = np.empty(size, dtype=np.uint8)
    a.fill(1)
    first = time.perf_counter() - t
    t = time.perf_counter()
    a.fill(2)
    resident = time.perf_counter() - t
    del a
    gc.collect()
    return {"first_touch_one_thread_s": first, "memset_one_thread_s": resident}


def runtime_layout(hisparse, size):
    return hisparse.plan_layout(
        "deepseek-v3.2", layers=1, gpu_mem=1 << 30, host_mem=size, max_model_len=4096,
        num_gpu_blocks=256,
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--device", default="")
    p.add_argument("--sizes", default="8GiB,32GiB,64GiB")
    p.add_argument("--json", help="write the figures to this file too")
    a = p.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]

    import hisparse

    try:
        import torch
    except ImportError:
        torch = None
    results = []
    for size in sizes:
        row = {"bytes": size, "ceilings": memset_ceilings(size), "paths": {}}
        memset = size / row["ceilings"]["memset_one_thread_s"]
        layout = runtime_layout(hisparse, size)
        paths = row["paths"]

        def runtime(host_pool=None):
            return hisparse.Runtime(layout, a.backend, a.device, state_rows=1, max_step_tokens=1,
                                    host_pool=host_pool)

        paths["runtime"] = timed(runtime, lambda: None, layout.host_pool_bytes)

        # The engine's array, kept by the runtime while it lives; freed after it, by the engine.
        holder = {}

        def lent():
            holder["array"] = hisparse.aligned_empty(layout.host_pool_bytes)
            return runtime(holder["array"])

        paths["lent"] = timed(lent, holder.clear, layout.host_pool_bytes)
        if torch is not None and a.backend == "cuda":
            # PyTorch's caching host allocator keeps freed pinned blocks until it is emptied.
            torch_release = getattr(torch._C, "_host_emptyCache", lambda: None)
            paths["torch-empty"] = timed(
                lambda: torch.empty(size, dtype=torch.uint8, pin_memory=True), torch_release, size)
            paths["torch-pin"] = timed(
                lambda: torch.empty(size, dtype=torch.uint8).pin_memory(), torch_release, size)
        for fig in paths.values():
            fig["share_of_memset"] = fig["setup_gib_per_s"] * 2**30 / memset
        results.append(row)

        print(f"\n{size / 2**30:.2f} GiB: memset, one thread {memset / 2**30:.2f} GiB/s "
              f"(first touch {size / 2**30 / row['ceilings']['first_touch_one_thread_s']:.2f} GiB/s)")
        print(f"  {'path':<12} {'set-up':>9} {'GiB/s':>7} {'x memset':>9} {'drop':>9} {'released':>9}")
        for name, f in paths.items():
            rel = "-" if f["release_seconds"] is None else f"{f['release_seconds']:.2f} s"
            print(f"  {name:<12} {f['setup_seconds']:>7.2f} s {f['setup_gib_per_s']:>7.2f} "
                  f"{f['share_of_memset']:>9.2f} {f['drop_seconds']:>7.3f} s {rel:>9}")
        sys.stdout.flush()

    env = {"hisparse": hisparse.__version__, "backend": a.backend}
    if torch is not None:
        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name(0)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"environment": env, "sizes": results}, f, indent=2)


if __name__ == "__main__":
    main()
