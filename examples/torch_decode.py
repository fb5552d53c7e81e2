#!/usr/bin/env python3
"""A PyTorch decode loop over HiSparse: a small sparse-attention model's KV cache lives in
HiSparse's pinned host pool, with only a share of it on the GPU.

Several layers and requests; a context larger than the GPU share the pool is given, so pages are
reclaimed once their host copies are durable and each step's top-k rows are swapped into
per-request hot buffers. Per decode step and layer, PyTorch computes the layer's top-k (an
indexer: query · per-token indexer keys), HiSparse resolves it and gathers the misses on
PyTorch's own stream into the PyTorch-owned device pool, and PyTorch runs sparse attention over
the returned row indices. Each layer's attention output is checked against the same attention
computed from the full KV (kept on the GPU only for this check): they must be identical, bit for
bit. Per-step times are printed with HiSparse and without it (attention over the full KV, all on
the GPU).

    python examples/torch_decode.py                       # CUDA: PyTorch tensors and stream
    python examples/torch_decode.py --backend cpu --requests 2 --context 1024 --decode-steps 4
                                                          # a dry run on the CPU backend (numpy)

Exits non-zero if any row or output differs.
"""

import argparse
import json
import math
import sys
import time

import numpy as np

import hisparse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["cuda", "cpu"], default="cuda",
                   help="cuda: PyTorch CUDA tensors and stream; cpu: numpy arrays (dry run)")
    p.add_argument("--layers", type=int, default=4, help="sparse layers (one index group each)")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--context", type=int, default=8192, help="prompt tokens per request")
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--top-k", type=int, default=256)
    p.add_argument("--dim", type=int, default=128, help="fp16 values per KV row")
    p.add_argument("--gpu-share", type=float, default=0.4,
                   help="GPU pool as a share of an all-resident cache's blocks")
    p.add_argument("--host-pool", choices=["lent", "runtime"], default="lent",
                   help="lent: a pinned PyTorch tensor (numpy array on cpu); runtime: HiSparse allocates it")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the summary as JSON to this file")
    return p.parse_args(argv)


BLOCK = 64
INDEX_DIM = 16


class TorchOps:
    """Array operations on PyTorch CUDA tensors, timed with CUDA events."""

    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("torch.cuda is not available: run with --backend cpu for a dry run")
        self.torch = torch
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.name = torch.cuda.get_device_name(self.dev)

    def stream(self):
        return self.torch.cuda.current_stream().cuda_stream

    def device_bytes(self, n):
        return self.torch.zeros(n, dtype=self.torch.uint8, device=self.dev)

    def host_bytes(self, n):
        return self.torch.zeros(n, dtype=self.torch.uint8, pin_memory=True)

    def fp16_rows(self, rows):
        return rows.view(self.torch.float16)

    def device_array(self, a):
        return self.torch.as_tensor(a, device=self.dev)

    def randn(self, shape, seed, dtype="float32"):
        g = self.torch.Generator(device=self.dev)
        g.manual_seed(seed)
        x = self.torch.randn(shape, generator=g, device=self.dev, dtype=self.torch.float32)
        return x.half() if dtype == "float16" else x

    def int32(self, shape):
        return self.torch.empty(shape, dtype=self.torch.int32, device=self.dev)

    def index(self, values):
        return self.torch.as_tensor(values, dtype=self.torch.int64).to(self.dev, non_blocking=True)

    def put_rows(self, view, rows, values):
        view.index_copy_(0, rows.long(), values)

    def topk(self, scores, k, out):
        out.copy_(self.torch.topk(scores, k, dim=1).indices.to(self.torch.int32))

    def scores(self, q, keys, lengths):
        s = self.torch.einsum("rd,rtd->rt", q, keys)
        t = self.torch.arange(keys.shape[1], device=self.dev)
        return s.masked_fill(t[None, :] >= self.index(lengths)[:, None], float("-inf"))

    def gather(self, view, rows):
        return view[rows.long()]

    def gather_ref(self, ref, req, pos):
        return ref[self.index(req)[:, None], pos.long()]

    def attention(self, q, k):
        kf = k.float()
        p = self.torch.softmax(self.torch.einsum("rd,rkd->rk", q, kf) / math.sqrt(q.shape[1]), dim=1)
        return self.torch.einsum("rk,rkd->rd", p, kf)

    def equal(self, a, b):
        return bool(self.torch.equal(a, b))

    def all_nonneg(self, x):
        return bool((x >= 0).all())

    def copy(self, x):
        return x.clone()

    def timer(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def elapsed_ms(self, start, end):
        end.synchronize()
        return start.elapsed_time(end)

    def sync(self):
        self.torch.cuda.synchronize()


class NumpyOps:
    """The same operations on numpy arrays (the CPU backend's device data)."""

    name = "host CPU (numpy)"

    def stream(self):
        return None

    def device_bytes(self, n):
        return hisparse.aligned_empty(n)

    host_bytes = device_bytes

    def fp16_rows(self, rows):
        return rows.view(np.float16)

    def device_array(self, a):
        return np.asarray(a)

    def randn(self, shape, seed, dtype="float32"):
        x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        return x.astype(np.float16) if dtype == "float16" else x

    def int32(self, shape):
        return np.empty(shape, dtype=np.int32)

    def index(self, values):
        return np.asarray(values, dtype=np.int64)

    def put_rows(self, view, rows, values):
        view[rows] = values

    def topk(self, scores, k, out):
        out[...] = np.argpartition(-scores, k - 1, axis=1)[:, :k]

    def scores(self, q, keys, lengths):
        s = np.einsum("rd,rtd->rt", q, keys)
        t = np.arange(keys.shape[1])
        s[t[None, :] >= np.asarray(lengths)[:, None]] = -np.inf
        return s

    def gather(self, view, rows):
        return view[rows]

    def gather_ref(self, ref, req, pos):
        return ref[np.asarray(req)[:, None], pos]

    def attention(self, q, k):
        kf = k.astype(np.float32)
        s = np.einsum("rd,rkd->rk", q, kf) / math.sqrt(q.shape[1])
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return np.einsum("rk,rkd->rd", p, kf)

    def equal(self, a, b):
        return bool(np.array_equal(a, b))

    def all_nonneg(self, x):
        return bool((x >= 0).all())

    def copy(self, x):
        return x.copy()

    def timer(self):
        return time.perf_counter()

    def elapsed_ms(self, start, end):
        return (end - start) * 1e3

    def sync(self):
        pass


def model_json(layers, row_bytes, top_k):
    layer = {"sparse": {"row_bytes": row_bytes, "value_bytes": row_bytes, "compress_ratio": 1,
                        "indexer_row_bytes": INDEX_DIM}}
    return json.dumps({"name": "torch-decode", "block_tokens": BLOCK, "top_k": top_k,
                       "layers": [layer] * layers})


def plan(a):
    row_bytes = 2 * a.dim
    max_len = a.context + a.decode_steps + BLOCK
    pages = -(-max_len // BLOCK)
    host = (a.requests * (pages + 1) + 4) * row_bytes * BLOCK * a.layers
    text = model_json(a.layers, row_bytes, a.top_k)
    common = dict(model_json=text, gpu_mem=0, host_mem=host, max_model_len=max_len)
    probe = hisparse.plan_layout(**common, num_gpu_blocks=1 << 20)
    per = probe.capacity(max_len)["gpu_blocks_per_request"]
    all_resident = 1 + a.requests * per["all_on_gpu"]
    # This loop prefills every prompt before any decode step, so requests that finished their
    # prefill hold their HiSparse footprint while the next one prefills, and a prefill reads its
    # whole earlier context on the GPU: the pool must hold one request all on the GPU beside the
    # others' footprints, or the last prefill waits for memory that nothing will free.
    needed = 1 + (a.requests - 1) * per["hisparse"] + per["all_on_gpu"]
    blocks = max(needed + a.requests * 4, int(a.gpu_share * all_resident))
    if blocks >= all_resident:
        raise SystemExit(f"--gpu-share {a.gpu_share} gives an all-resident pool; lower it")
    return hisparse.plan_layout(**common, num_gpu_blocks=blocks), all_resident


def main(argv=None):
    a = parse_args(argv)
    if a.top_k > a.context:
        raise SystemExit("--top-k must not exceed --context")
    ops = TorchOps() if a.backend == "cuda" else NumpyOps()
    layout, all_resident_blocks = plan(a)
    R, L, D, K = a.requests, a.layers, a.dim, a.top_k
    rb = layout.row_bytes
    T = a.context + a.decode_steps
    print(f"hisparse {hisparse.__version__} on {a.backend} ({ops.name}): {L} layers, {R} requests "
          f"x {a.context} tokens + {a.decode_steps} decode steps, top-k {K}, rows of {D} fp16")
    print(f"GPU pool {layout.num_gpu_blocks} blocks x {layout.bytes_per_block} B = "
          f"{layout.gpu_pool_bytes / 2**20:.1f} MiB vs {all_resident_blocks} blocks for an "
          f"all-resident cache ({layout.num_gpu_blocks / all_resident_blocks:.0%}); host pool "
          f"{layout.host_pool_bytes / 2**20:.1f} MiB")

    # PyTorch owns the device pool (attention reads it directly) and, by default, the pinned host
    # pool; HiSparse enqueues on PyTorch's current stream.
    device_pool = ops.device_bytes(layout.gpu_pool_bytes)
    host_pool = ops.host_bytes(layout.host_pool_bytes) if a.host_pool == "lent" else None
    step_budget = max(a.context, R)
    rt = hisparse.Runtime(layout, a.backend, state_rows=R, max_step_tokens=R,
                          max_batched_tokens=step_budget, device_pool=device_pool,
                          host_pool=host_pool, stream=ops.stream())
    coord = hisparse.Coordinator(layout, max_running=R, max_batched_tokens=step_budget)
    # Each sparse layer's rows in its resident bucket's view of the pool (the flat attention
    # view: row r of the view is the row the resolver returns as r), and the slot-mapping row
    # of that bucket.
    slot_groups = rt.slot_mapping_groups()
    views = {}
    for v in layout.gpu_views():
        if v["kind"] == "resident":
            views[v["layer"]] = (slot_groups.index(v["group"]),
                                 ops.fp16_rows(hisparse.pool_rows(device_pool, v)))
    slot_mapping = ops.device_array(rt.slot_mapping())  # a view: begin_step rewrites it

    # The model's KV rows and indexer keys (the full KV is the reference only).
    ref_kv = [ops.randn((R, T, D), a.seed * 1000 + l, "float16") for l in range(L)]
    index_keys = [ops.randn((R, T, INDEX_DIM), a.seed * 1000 + 500 + l) for l in range(L)]
    index_query = [ops.randn((R, INDEX_DIM), a.seed * 1000 + 900 + l) for l in range(L)]
    attn_query = [ops.randn((R, D), a.seed * 1000 + 950 + l) for l in range(L)]

    def forward(cmd):
        """Writes every scheduled token's KV row of every layer through the step's slot
        mapping: one index_copy_ per layer, no per-request loop."""
        sched = cmd.scheduled
        req = ops.index(np.repeat([s["id"] - 1 for s in sched], [s["num_tokens"] for s in sched]))
        pos = ops.index(np.concatenate([np.arange(s["first_token"], s["first_token"] + s["num_tokens"])
                                        for s in sched] or [np.zeros(0, np.int64)]))
        t = rt.step_tokens
        for layer, (w, view) in views.items():
            ops.put_rows(view, slot_mapping[w, :t], ref_kv[layer][req, pos])

    for req in range(1, R + 1):
        coord.admit(req, [(req * 7919 + t) % 50000 for t in range(a.context)])

    # Prefill: chunks of whole prompts, rows mirrored to the host pool as they are written.
    t0 = time.perf_counter()
    steps = 0
    while any(coord.num_computed(r) < coord.num_tokens(r) for r in range(1, R + 1)):
        steps += 1
        if steps > 100_000:
            raise SystemExit("prefill made no progress")
        cmd = coord.step()
        rt.begin_step(cmd)
        forward(cmd)
        rt.end_step(cmd)
        rt.poll_and_report(coord)
        if not cmd.scheduled:
            time.sleep(0.0005)  # waiting for host copies in flight
    ops.sync()
    print(f"prefill: {steps} steps in {time.perf_counter() - t0:.2f} s")

    topk = ops.int32((R, K))
    rows = ops.int32((R, K))
    per_step = []
    checked_rows = checked_outputs = 0
    ok = True
    for step in range(a.decode_steps):
        for r in range(1, R + 1):
            coord.append_tokens(r, [(step * 31 + r) % 50000])
        start = ops.timer()
        cmd = coord.step()
        rt.begin_step(cmd)
        forward(cmd)
        sched = cmd.scheduled
        req = [s["id"] - 1 for s in sched]
        lengths = [s["first_token"] + s["num_tokens"] for s in sched]
        rt.set_batch(cmd.slots)
        t = len(sched)
        layers_done = []
        for g, group in enumerate(layout.index_groups):
            (layer,) = group["layers"]
            _, view = views[layer]
            # The indexer: a query drifting slowly across steps against per-token keys.
            q_idx = index_query[layer][req] + 0.05 * ops.randn((t, INDEX_DIM), step * 100 + layer)
            scores = ops.scores(q_idx, index_keys[layer][req, : max(lengths)], lengths)
            ops.topk(scores, K, topk[:t])
            q = attn_query[layer][req]
            # With HiSparse: resolve + swap-in on PyTorch's stream, attention over the pool.
            t_a = ops.timer()
            rt.resolve_index_group(g, topk[:t], rows[:t])
            t_b = ops.timer()
            k_sparse = ops.gather(view, rows[:t])
            out_sparse = ops.attention(q, k_sparse)
            t_c = ops.timer()
            # Without: the same attention over the full KV, all on the GPU.
            k_full = ops.gather_ref(ref_kv[layer], req, topk[:t])
            out_full = ops.attention(q, k_full)
            t_d = ops.timer()
            # Checked after the step, so that the step runs without host synchronisation.
            layers_done.append((layer, (t_a, t_b, t_c, t_d), ops.copy(rows[:t]), k_sparse,
                                out_sparse, k_full, out_full))
        rt.end_step(cmd)
        rt.poll_and_report(coord)
        end = ops.timer()
        step_ms = ops.elapsed_ms(start, end)
        with_ms = without_ms = resolve_ms = 0.0
        for layer, (t_a, t_b, t_c, t_d), got_rows, k_sparse, out_sparse, k_full, out_full in layers_done:
            resolve_ms += ops.elapsed_ms(t_a, t_b)
            with_ms += ops.elapsed_ms(t_a, t_c)
            without_ms += ops.elapsed_ms(t_c, t_d)
            if not ops.all_nonneg(got_rows):
                print(f"step {step} layer {layer}: a selected token has no row", file=sys.stderr)
                ok = False
            if not ops.equal(k_sparse, k_full):
                print(f"step {step} layer {layer}: gathered rows differ from the full KV",
                      file=sys.stderr)
                ok = False
            if not ops.equal(out_sparse, out_full):
                print(f"step {step} layer {layer}: attention output differs", file=sys.stderr)
                ok = False
            checked_rows += t * K
            checked_outputs += t
        per_step.append({"step": step, "step_ms": step_ms, "with_hisparse_ms": with_ms,
                         "resolve_ms": resolve_ms, "without_hisparse_ms": without_ms})
        print(f"decode step {step:3d}: {step_ms:8.3f} ms whole step; attention path "
              f"{with_ms:7.3f} ms with hisparse ({resolve_ms:6.3f} ms resolve + swap-in), "
              f"{without_ms:7.3f} ms without (the full KV resident)")
    coord.report(rt.drain())
    c = rt.counters()
    # Release the runtime (it finishes its work, then lets go of the lent tensors and stream)
    # while PyTorch's CUDA context is certainly alive, not at interpreter exit.
    del rt
    ops.sync()
    timed = per_step[1:] or per_step  # the first step includes one-time warm-up
    mean = lambda key: sum(s[key] for s in timed) / len(timed)
    summary = {
        "backend": a.backend,
        "device": ops.name,
        "layers": L, "requests": R, "context": a.context, "decode_steps": a.decode_steps,
        "top_k": K, "dim": D, "host_pool": a.host_pool,
        "gpu_pool_bytes": layout.gpu_pool_bytes,
        "all_resident_gpu_bytes": all_resident_blocks * layout.bytes_per_block,
        "host_pool_bytes": layout.host_pool_bytes,
        "rows_checked": checked_rows, "outputs_checked": checked_outputs, "identical": ok,
        "mean_step_ms": mean("step_ms"),
        "mean_with_hisparse_ms": mean("with_hisparse_ms"),
        "mean_resolve_ms": mean("resolve_ms"),
        "mean_without_hisparse_ms": mean("without_hisparse_ms"),
        "counters": c,
        "per_step": per_step,
    }
    print(f"counters: hit rate {c['hit_rate']}, {c['hot_hits']} hits, {c['hot_misses']} misses, "
          f"{c['reclaimed_pages']} pages reclaimed, {c['h2d_bytes']} B host->device, "
          f"{c['d2h_bytes']} B device->host, {c['resolve_calls']} resolve / {c['remap_calls']} "
          f"remap calls")
    print(f"mean over decode steps 1..: whole step {summary['mean_step_ms']:.3f} ms; attention "
          f"path {summary['mean_with_hisparse_ms']:.3f} ms with hisparse "
          f"({summary['mean_resolve_ms']:.3f} ms resolve + swap-in) vs "
          f"{summary['mean_without_hisparse_ms']:.3f} ms without")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    if c["reclaimed_pages"] == 0 or c["hot_misses"] == 0:
        print("FAILED: the GPU share was large enough that nothing was swapped in", file=sys.stderr)
        ok = False
    print(f"{'IDENTICAL' if ok else 'MISMATCH'}: {checked_rows} rows and {checked_outputs} "
          f"attention outputs checked against the full KV")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
