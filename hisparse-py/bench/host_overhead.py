#!/usr/bin/env python3
"""Host time of one per-layer decode call from Python: a one-shot `Runtime.resolve_index_group`
(arrays read and lent at every call) beside a prepared `Runtime.layer_call` (arrays read once),
at 1 to 256 requests.

On a GPU backend a call only enqueues work, so the host time is the binding's and the runtime's
own cost; the GPU time is printed beside it (the mean over the same calls, from a synchronise
after each batch). On the CPU backend a call runs its work before it returns, so the figure
includes the resolve and the gather themselves.

    python hisparse-py/bench/host_overhead.py --backend cuda      # PyTorch CUDA tensors
    python hisparse-py/bench/host_overhead.py --backend cpu       # numpy arrays

A benchmark, not a test: it checks nothing but that the calls succeed.
"""

import argparse
import json
import os
import statistics
import sys
import time

# numpy's BLAS threads spin between calls and take cores from the thread being timed.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import hisparse

BLOCK = 64


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--requests", default="1,16,64,256", help="comma-separated request counts")
    p.add_argument("--top-k", type=int, default=None, help="default: 2048 on cuda, 64 on cpu")
    p.add_argument("--calls", type=int, default=2000, help="timed calls per variant")
    p.add_argument("--batch", type=int, default=50, help="calls between synchronisations")
    p.add_argument("--json", help="write the figures as JSON to this file")
    return p.parse_args(argv)


class Arrays:
    """int32 arrays on the backend's device: PyTorch CUDA tensors, or numpy arrays."""

    def __init__(self, backend):
        self.torch = None
        if backend == "cuda":
            try:
                import torch
            except ImportError:
                raise SystemExit("--backend cuda needs PyTorch (torch) installed")
            if not torch.cuda.is_available():
                raise SystemExit("torch.cuda is not available: run with --backend cpu")
            self.torch = torch

    def int32(self, shape, fill=0):
        if self.torch is not None:
            return self.torch.full(shape, fill, dtype=self.torch.int32, device="cuda")
        return np.full(shape, fill, dtype=np.int32)

    def uint8(self, n):
        if self.torch is not None:
            return self.torch.zeros(n, dtype=self.torch.uint8, device="cuda")
        return hisparse.aligned_empty(n)


def model_json(top_k):
    layer = {"sparse": {"row_bytes": 656, "value_bytes": 656, "compress_ratio": 1,
                        "indexer_row_bytes": 132}}
    return json.dumps({"name": "host-overhead", "block_tokens": BLOCK, "top_k": top_k,
                       "layers": [layer]})


def decode_step(backend, arrays, requests, top_k):
    """A runtime in an open decode step of `requests` requests of 2 × top_k tokens each, on a
    GPU pool of about half an all-resident cache (so the calls resolve and swap in)."""
    context = 2 * top_k
    max_len = context + 2 * BLOCK
    pages = -(-max_len // BLOCK)
    text = model_json(top_k)
    host = (requests * (pages + 1) + 8) * (656 + 132) * BLOCK  # pool rows and indexer keys
    probe = hisparse.plan_layout(model_json=text, gpu_mem=0, host_mem=host, max_model_len=max_len,
                                 num_gpu_blocks=1 << 20)
    per = probe.capacity(max_len)["gpu_blocks_per_request"]
    blocks = max(1 + (requests - 1) * per["hisparse"] + per["all_on_gpu"] + 4 * requests,
                 (1 + requests * per["all_on_gpu"]) // 2)
    layout = hisparse.plan_layout(model_json=text, gpu_mem=0, host_mem=host,
                                  max_model_len=max_len, num_gpu_blocks=blocks)
    budget = max(context, requests)
    coord = hisparse.Coordinator(layout, max_running=requests, max_batched_tokens=budget)
    rt = hisparse.Runtime(layout, backend, state_rows=requests, max_step_tokens=requests,
                          max_batched_tokens=budget, device_pool=arrays.uint8(layout.gpu_pool_bytes))
    for r in range(requests):
        coord.admit(r, [(r * 7919 + t) % 50000 for t in range(context)])
    while any(coord.num_computed(r) < coord.num_tokens(r) for r in range(requests)):
        cmd = coord.step()
        rt.begin_step(cmd)
        rt.end_step(cmd)
        rt.poll_and_report(coord)
        if not cmd.scheduled:
            time.sleep(0.0005)
    coord.report(rt.drain())
    for r in range(requests):
        coord.append_tokens(r, [1])
    cmd = coord.step()
    rt.begin_step(cmd)
    rt.set_batch(cmd.slots)
    return rt, coord, cmd, context


def timed(call, calls, batch, sync):
    """Host µs per call (median over batches of `batch` calls), and µs per call including the
    synchronise after each batch (the device's time when it is the longer one)."""
    host, total = [], []
    call()
    sync()
    for _ in range(max(1, calls // batch)):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            call()
        t1 = time.perf_counter_ns()
        sync()
        t2 = time.perf_counter_ns()
        host.append((t1 - t0) / batch / 1e3)
        total.append((t2 - t0) / batch / 1e3)
    return statistics.median(host), statistics.median(total)


def main(argv=None):
    a = parse_args(argv)
    top_k = a.top_k or (2048 if a.backend == "cuda" else 64)
    arrays = Arrays(a.backend)
    print(f"hisparse {hisparse.__version__}, backend {a.backend}, top-k {top_k}, "
          f"{a.calls} calls per figure (median of batches of {a.batch})")
    print(f"{'requests':>8}  {'one-shot host µs':>16}  {'prepared host µs':>16}  {'per call incl. sync µs':>22}")
    results = []
    for requests in [int(x) for x in a.requests.split(",")]:
        rt, coord, cmd, context = decode_step(a.backend, arrays, requests, top_k)
        topk = arrays.int32((requests, top_k))
        if arrays.torch is not None:
            topk.copy_(arrays.torch.randint(0, context, (requests, top_k), dtype=arrays.torch.int32))
        else:
            topk[...] = np.random.default_rng(1).integers(0, context, (requests, top_k))
        rows = arrays.int32((requests, top_k), -1)
        one_shot = timed(lambda: rt.resolve_index_group(0, topk, rows), a.calls, a.batch, rt.synchronize)
        call = rt.layer_call(0, topk, rows)
        prepared = timed(call, a.calls, a.batch, rt.synchronize)
        rt.end_step(cmd)
        print(f"{requests:>8}  {one_shot[0]:>16.2f}  {prepared[0]:>16.2f}  {prepared[1]:>22.2f}")
        results.append({"requests": requests, "one_shot_host_us": one_shot[0],
                        "prepared_host_us": prepared[0], "prepared_with_sync_us": prepared[1],
                        "one_shot_with_sync_us": one_shot[1]})
        del call, rt
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"backend": a.backend, "top_k": top_k, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
