#!/usr/bin/env python3
"""An engine that keeps its own scheduler, driving HiSparse.

The engine decides every step's batch itself — first come, first served within a token budget,
running requests before waiting ones, and, when the GPU pool is short with nothing in flight to
free it, the preemption of the request *it* picks (here: the one with the most tokens still to
generate) — and HiSparse places the KV: `Coordinator.start` / `schedule` say whether the blocks
are there (`Alloc`), `build_offload_command()` ends the step. The forward pass writes each
layer's new KV rows through the runtime's device slot mapping with one `index_copy_` per layer,
and every decode step's per-layer calls are prepared once (`Runtime.layer_call`). With
`--graph` (CUDA) the decode steps' per-layer calls are captured once into a CUDA graph and
replayed. With `--micro-batches N` each index group's call is cut into N micro-batch calls,
each over its own token rows and state rows (`layer_call(..., state_rows=...)`), run on a side
stream that forks from and joins the engine's stream through events (in the graph too): how an
engine lets one micro-batch's swap-in cross the bus while other work runs. Every row attention
reads is checked against the KV the forward pass wrote.

    python examples/engine_loop.py --backend cpu             # numpy arrays
    python examples/engine_loop.py --backend cuda --graph    # PyTorch tensors, a CUDA graph
    python examples/engine_loop.py --backend cuda --graph --micro-batches 2

Exits non-zero if any row differs or a pool is not empty at the end.
"""

import argparse
import json
import sys

import numpy as np

import hisparse

BLOCK = 16


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--graph", action="store_true", help="replay decode steps from a CUDA graph")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--running", type=int, default=4, help="state rows: requests running at once")
    p.add_argument("--prompt", type=int, default=160)
    p.add_argument("--generate", type=int, default=24, help="tokens each request generates")
    p.add_argument("--budget", type=int, default=96, help="tokens the engine computes per step")
    p.add_argument("--top-k", type=int, default=32)
    p.add_argument("--gpu-blocks", type=int, default=60)
    p.add_argument("--micro-batches", type=int, default=1,
                   help="micro-batch calls per index group, on a side stream (1: one call)")
    p.add_argument("--wait-before-poll", action="store_true",
                   help="wait for the GPU before each poll, so every copy issued is reported at "
                        "once and two runs' counters compare (an engine polls without waiting)")
    return p.parse_args(argv)


# ---- the engine's own scheduler -------------------------------------------------------------


class Scheduler:
    """FCFS within a token budget; when memory is short and nothing is in flight, preempts the
    running request with the most tokens left to compute."""

    def __init__(self, coord, budget, final_len):
        self.coord, self.budget, self.final_len = coord, budget, final_len
        self.waiting, self.running, self.preemptions = [], [], 0

    def add(self, rid, prompt):
        self.coord.admit(rid, prompt)
        self.waiting.append(rid)

    def finish(self, rid):
        self.coord.finish(rid)
        self.running.remove(rid)

    def preempt_one(self):
        victim = max(self.running, key=lambda r: self.final_len - self.coord.num_computed(r))
        self.coord.preempt(victim)  # its blocks go back; it is recomputed when it restarts
        self.running.remove(victim)
        self.waiting.insert(0, victim)
        self.preemptions += 1

    def step(self):
        """Picks this step's batch; returns its command."""
        coord, budget, pressed = self.coord, self.budget, False
        for rid in list(self.running):
            if rid not in self.running or budget == 0:
                continue  # preempted above, or out of budget
            todo = coord.num_tokens(rid) - coord.num_computed(rid)
            if todo == 0:
                continue
            n = min(todo, budget)
            got = coord.schedule(rid, n)
            while not got and got.outcome == "no_space" and n > 1:  # a smaller prefill chunk
                n //= 2
                got = coord.schedule(rid, n)
            if got:
                budget -= n
            elif got.outcome == "wait":
                pressed = True  # memory comes back once copies in flight complete
            else:
                pressed = True
                self.preempt_one()
        while self.waiting and budget > 0 and not pressed:
            rid = self.waiting[0]
            admission = coord.can_start(rid, budget)  # would it fit now, and with how many tokens
            if not admission or not coord.start(rid, budget):
                break
            self.waiting.pop(0)
            self.running.append(rid)
            budget -= admission.tokens
        return coord.build_offload_command()


# ---- arrays: numpy (CPU backend) or PyTorch (CUDA) ------------------------------------------


class Numpy:
    torch = None

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def pool(self, nbytes):
        return hisparse.aligned_empty(nbytes)

    def device(self, array):
        return np.asarray(array)

    def put(self, rows_view, slots, values):
        rows_view[slots] = values

    def take(self, rows_view, rows):
        return rows_view[np.maximum(rows, 0)]

    def asnumpy(self, x):
        return np.asarray(x)

    def copy_in(self, dst, src):
        dst[...] = src


class Torch:
    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--backend cuda needs PyTorch with CUDA")
        self.torch = torch

    def zeros(self, shape, dtype):
        return self.torch.zeros(shape, dtype=getattr(self.torch, np.dtype(dtype).name), device="cuda")

    def pool(self, nbytes):
        return self.torch.zeros(nbytes, dtype=self.torch.uint8, device="cuda")

    def device(self, array):
        return self.torch.as_tensor(array, device="cuda")

    def put(self, rows_view, slots, values):
        rows_view.index_copy_(0, slots.long(), self.torch.as_tensor(values, device="cuda"))

    def take(self, rows_view, rows):
        return rows_view[rows.long().clamp(min=0)]

    def asnumpy(self, x):
        return x.cpu().numpy()

    def copy_in(self, dst, src):
        dst.copy_(self.torch.as_tensor(src, device="cuda"))


# ---- the model: KV rows deterministic from (request, layer, position) -----------------------


def kv_rows(req, pos, layer, row_bytes):
    i = np.arange(row_bytes, dtype=np.int64)[None, :]
    return ((np.asarray(req)[:, None] * 131 + np.asarray(pos)[:, None] * 7 + layer * 31 + i * 3)
            % 251).astype(np.uint8)


def plan(a):
    layer = {"sparse": {"row_bytes": 64, "value_bytes": 64, "compress_ratio": 1, "indexer_row_bytes": 16}}
    model = json.dumps({"name": "engine-loop", "block_tokens": BLOCK, "top_k": a.top_k,
                        "layers": [layer] * a.layers})
    max_len = a.prompt + a.generate + BLOCK
    pages = -(-max_len // BLOCK)
    return hisparse.plan_layout(model_json=model, gpu_mem=0, max_model_len=max_len,
                                # each layer's 64-B row and 16-B indexer key per token
                                host_mem=(a.requests * (pages + 1) + 4) * (64 + 16) * BLOCK * a.layers,
                                device_buffer_size=2 * a.top_k, num_gpu_blocks=a.gpu_blocks)


class Engine:
    """The model side: KV pool views, the forward pass through the slot mapping, the decode
    path's static arrays and prepared per-layer calls (or their CUDA graph), verification."""

    def __init__(self, a, ops, layout, rt, device_pool):
        self.a, self.ops, self.layout, self.rt = a, ops, layout, rt
        R, K, G = a.running, layout.top_k, len(layout.index_groups)
        # Where each layer's rows live (its resident bucket's view, which the resolver's rows
        # index) and which slot-mapping row writes them.
        write_groups = rt.slot_mapping_groups()
        self.layers = {}
        for v in layout.gpu_views():
            if v["kind"] == "resident":
                rows = hisparse.pool_rows(device_pool, v)
                self.layers[v["layer"]] = (write_groups.index(v["group"]), rows)
        self.slot_mapping = ops.device(rt.slot_mapping())  # rewritten in place by begin_step
        # Per index group: its top-k input and its rows output, at fixed addresses.
        self.topk = ops.zeros((G, R, K), np.int32)
        self.rows = ops.zeros((G, R, K), np.int32)
        self.calls = [rt.layer_call(g, self.topk[g], self.rows[g]) for g in range(G)]
        # Micro-batches: token rows [a, b) of the arrays each, with their own state rows (a
        # 16-byte aligned array of their own, -1 = padding) rather than the batch set_batch gives.
        n = max(1, min(a.micro_batches, R))
        bounds = [R * i // n for i in range(n + 1)]
        self.parts = list(zip(bounds, bounds[1:])) if n > 1 else []
        self.part_state = [ops.zeros(b - a_, np.int32) for a_, b in self.parts]
        self.part_calls = [[rt.layer_call(g, self.topk[g, a_:b], self.rows[g, a_:b], state_rows=self.part_state[p])
                            for p, (a_, b) in enumerate(self.parts)] for g in range(G)]
        self.side = ops.torch.cuda.Stream() if ops.torch is not None and self.parts else None
        self.graph = None
        self.replays = self.verified = 0
        self.rng = np.random.default_rng(7)

    def forward(self, cmd):
        """Every computed token's KV row of every layer, written through the slot mapping: one
        `index_copy_` per layer. (The engine knows each token's request and position: they are
        its own batch.)"""
        s = cmd.scheduled
        req = np.repeat([x["id"] for x in s], [x["num_tokens"] for x in s])
        pos = np.concatenate([np.arange(x["first_token"], x["first_token"] + x["num_tokens"])
                              for x in s] or [np.zeros(0, np.int64)])
        t = self.rt.step_tokens
        for layer, (w, view) in self.layers.items():
            self.ops.put(view, self.slot_mapping[w, :t], kv_rows(req, pos, layer, view.shape[1]))

    def decode(self, decoding):
        """The per-layer calls of the decoding requests (each with one new token), eagerly or by
        replaying the captured graph; then checks every row attention would read."""
        a, ops, R, K = self.a, self.ops, self.a.running, self.layout.top_k
        # The indexer's top-k of each group (random positions of the request's context here).
        sel = np.full((len(self.calls), R, K), -1, np.int32)
        for g in range(len(self.calls)):
            for i, x in enumerate(decoding):
                n = x["first_token"] + 1
                sel[g, i, : min(K, n)] = self.rng.choice(n, size=min(K, n), replace=False)
        ops.copy_in(self.topk, sel)
        batch = [x["slot"] for x in decoding]
        if self.parts:
            # The micro-batch calls read their own state rows (no set_batch); rows past the
            # batch are padding.
            padded = batch + [-1] * (R - len(batch))
            for (a_, b), state in zip(self.parts, self.part_state):
                ops.copy_in(state, np.asarray(padded[a_:b], np.int32))
            if a.graph:
                if self.graph is None:
                    self.graph = capture(ops.torch, self.run_parts)
                self.graph.replay()
                self.replays += 1
            else:
                self.run_parts()
        elif a.graph:
            self.rt.set_batch(batch, pad_to=R)  # before-replay work: outside the graph
            if self.graph is None:
                self.graph = capture(ops.torch, lambda: [call() for call in self.calls])
            self.graph.replay()
            self.replays += 1
        else:
            self.rt.set_batch(batch)
            for call in self.calls:
                call(len(batch))
        got_rows = ops.asnumpy(self.rows)
        for g, group in enumerate(self.layout.index_groups):
            for layer in group["layers"]:
                got = ops.asnumpy(ops.take(self.layers[layer][1], self.rows[g, : len(batch)]))
                for i, x in enumerate(decoding):
                    valid = sel[g, i] >= 0
                    want = kv_rows(np.full(valid.sum(), x["id"]), sel[g, i][valid], layer, got.shape[2])
                    if not (got_rows[g, i][~valid] == -1).all() or not np.array_equal(got[i][valid], want):
                        raise SystemExit(f"layer {layer}, request {x['id']}: attention would read wrong rows")
                    self.verified += int(valid.sum())

    def run_parts(self):
        """Each group's micro-batch calls on the side stream, after the work queued on the
        current stream; the current stream's later work waits for each (inline on the CPU)."""
        torch = self.ops.torch
        for calls in self.part_calls:
            if torch is None:
                for call in calls:
                    call()
                continue
            main = torch.cuda.current_stream()
            done = []
            for call in calls:
                self.side.wait_stream(main)
                with torch.cuda.stream(self.side):
                    call()
                    done.append(torch.cuda.Event())
                    done[-1].record(self.side)
            for event in done:  # where an engine would start each micro-batch's attention
                main.wait_event(event)


def main(argv=None):
    a = parse_args(argv)
    if a.graph and a.backend != "cuda":
        raise SystemExit("--graph needs --backend cuda")
    ops = Torch() if a.backend == "cuda" else Numpy()
    layout = plan(a)
    final_len = a.prompt + a.generate
    coord = hisparse.Coordinator(layout, max_running=a.running, max_batched_tokens=a.budget,
                                 enable_prefix_caching=False)
    device_pool = ops.pool(layout.gpu_pool_bytes)
    rt = hisparse.Runtime(layout, a.backend, state_rows=a.running, max_step_tokens=a.running,
                          max_batched_tokens=a.budget, device_pool=device_pool)
    engine = Engine(a, ops, layout, rt, device_pool)
    sched = Scheduler(coord, a.budget, final_len)
    for rid in range(a.requests):
        sched.add(rid, [(rid * 7919 + t) % 50000 for t in range(a.prompt)])

    steps = 0
    while sched.running or sched.waiting:
        steps += 1
        if steps > 10_000:
            raise SystemExit("no progress in 10000 steps")
        cmd = sched.step()
        rt.begin_step(cmd)
        engine.forward(cmd)
        decoding = [x for x in cmd.scheduled if x["num_tokens"] == 1]
        if decoding:
            engine.decode(decoding)
        rt.end_step(cmd)
        if a.wait_before_poll and ops.torch is not None:
            # Which copies a poll finds done depends on timing, and the reclaims and schedule
            # follow from it; waiting makes the poll see all of them.
            ops.torch.cuda.synchronize()
        rt.poll_and_report(coord)
        for x in cmd.scheduled:  # sample a token once a request's computed tokens caught up
            rid = x["id"]
            if rid in sched.running and coord.num_computed(rid) == coord.num_tokens(rid):
                if coord.num_tokens(rid) >= final_len:
                    sched.finish(rid)
                else:
                    coord.append_tokens(rid, [int(engine.rng.integers(50000))])
    coord.report(rt.drain())
    c = rt.counters()
    print(f"{a.requests} requests on {a.backend}: {steps} steps, {sched.preemptions} preemptions, "
          f"{engine.replays} graph replays, {engine.verified} rows verified; {c['hot_hits']} hot "
          f"hits, {c['hot_misses']} misses, {c['reclaimed_pages']} pages reclaimed")
    try:
        coord.check_drained()  # every block back once every request finished and copies drained
    except hisparse.HiSparseError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def capture(torch, per_layer_calls):
    """Captures the per-layer calls ``per_layer_calls()`` makes into a CUDA graph (the runtime's
    calls go to PyTorch's current stream, the capture stream, or to a side stream joined to it).
    Before each replay the engine runs `begin_step` and `set_batch(pad_to=...)` (or writes the
    micro-batches' state rows) outside the capture, and writes the top-k into the static array."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        per_layer_calls()
    return graph


if __name__ == "__main__":
    sys.exit(main())
