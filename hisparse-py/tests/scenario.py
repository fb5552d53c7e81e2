"""A multi-request decode scenario driven from Python on the CPU backend: the coordinator plans,
the runtime executes, a forward pass writes a recognisable row per (request, token, layer) into
the resident pages, and every row attention reads is checked against what was written."""

from dataclasses import dataclass, field
import json

import numpy as np

import fcfs
import hisparse


@dataclass
class Shape:
    layers: int = 3
    row_bytes: int = 64
    block: int = 16
    top_k: int = 16
    hot: int = 32
    requests: int = 3
    prompt: int = 96
    decode: int = 24
    gpu_blocks: int = 32


def model_json(s: Shape) -> str:
    layer = {
        "sparse": {
            "row_bytes": s.row_bytes,
            "value_bytes": s.row_bytes,
            "compress_ratio": 1,
            "indexer_row_bytes": 16,
        }
    }
    return json.dumps(
        {"name": "tiny", "block_tokens": s.block, "top_k": s.top_k, "layers": [layer] * s.layers}
    )


def layout(s: Shape, shared_host_pool: bool = False) -> hisparse.Layout:
    max_len = s.prompt + s.decode + s.block
    pages = -(-max_len // s.block)
    # Per host block: every layer's page in the pool and its indexer keys (16 B a token) in the
    # indexer host cache; the host budget holds both.
    stride = (s.row_bytes + 16) * s.block * s.layers
    return hisparse.plan_layout(
        model_json=model_json(s),
        gpu_mem=0,
        # A shared pool aligns every layer's array to 4096 B: room for that too.
        host_mem=(s.requests * (pages + 1) + 4) * stride + (s.layers * 4096 if shared_host_pool else 0),
        max_model_len=max_len,
        device_buffer_size=s.hot,
        num_gpu_blocks=s.gpu_blocks,
        shared_host_pool=shared_host_pool,
    )


def rows_of(req: np.ndarray, pos: np.ndarray, layer: int, nbytes: int) -> np.ndarray:
    """The bytes the forward pass writes for each (request, token) of one layer: `[n, nbytes]`."""
    i = np.arange(nbytes, dtype=np.int64)
    req = np.asarray(req, dtype=np.int64)[:, None]
    pos = np.asarray(pos, dtype=np.int64)[:, None]
    return ((req * 131 + pos * 7 + layer * 31 + i[None, :] * 3) % 251).astype(np.uint8)


def row(req: int, pos: int, layer: int, nbytes: int) -> np.ndarray:
    """The bytes the forward pass writes for (request, token, layer)."""
    return rows_of(np.array([req]), np.array([pos]), layer, nbytes)[0]


def step_tokens(cmd: hisparse.Command) -> "tuple[np.ndarray, np.ndarray]":
    """The request and position of every token the step computes, in slot-mapping order (the
    engine's own batch bookkeeping: its positions tensor)."""
    sched = cmd.scheduled
    req = np.repeat([s["id"] for s in sched], [s["num_tokens"] for s in sched]).astype(np.int64)
    pos = np.concatenate(
        [np.arange(s["first_token"], s["first_token"] + s["num_tokens"]) for s in sched]
        or [np.zeros(0, dtype=np.int64)]
    )
    return req, pos


class SlotForward:
    """The forward pass's KV writes through the device slot mapping: per step and sparse layer,
    one vectorised write of every computed token's row (no per-request loop, no table read on
    the host)."""

    def __init__(self, rt: hisparse.Runtime, lay: hisparse.Layout, pool: "Pool"):
        self.rt, self.pool = rt, pool
        # A view (numpy on the CPU backend, a CUDA tensor on CUDA): begin_step rewrites it.
        self.slots = pool.ops.device(rt.slot_mapping())
        views = lay.gpu_views()
        # Sparse layers write their rows into their resident bucket's view.
        self.writes = [
            (w, [v for v in views if v["group"] == g and v["kind"] == "resident"])
            for w, g in enumerate(rt.slot_mapping_groups())
        ]

    def __call__(self, cmd: hisparse.Command) -> None:
        req, pos = step_tokens(cmd)
        t = self.rt.step_tokens
        assert t == len(pos), f"the slot mapping holds {t} tokens, the command {len(pos)}"
        for w, views in self.writes:
            slots = self.slots[w, :t]
            assert bool((slots >= 0).all()), f"a sparse token without a row: {slots}"
            for v in views:
                self.pool.write_rows(v, slots, rows_of(req, pos, v["layer"], v["row_bytes"]))


class NumpyOps:
    """Arrays of the CPU backend: numpy."""

    backend = "cpu"
    selector = ""  # the runtime's device selector: the CPU backend has one device

    def device(self, a):
        return np.asarray(a)

    def empty(self, shape, dtype=np.int32):
        return np.empty(shape, dtype=dtype)

    def pool(self, nbytes):
        return hisparse.aligned_empty(nbytes)

    def host(self, a) -> np.ndarray:
        return np.asarray(a)

    def put(self, dst, src: np.ndarray) -> None:
        dst[...] = src


class TorchOps:
    """Arrays of the CUDA backend: PyTorch CUDA tensors (`torch` is the module)."""

    backend = "cuda"
    selector = ""  # the runtime's CUDA device selector ("" = device 0; "1" = cuda:1)

    def __init__(self, torch):
        self.torch = torch

    def device(self, a):
        return self.torch.as_tensor(a, device="cuda")

    def empty(self, shape, dtype=np.int32):
        return self.torch.empty(shape, dtype=self.torch.int32, device="cuda")

    def pool(self, nbytes):
        return self.torch.zeros(nbytes, dtype=self.torch.uint8, device="cuda")

    def host(self, a) -> np.ndarray:
        return a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)

    def put(self, dst, src: np.ndarray) -> None:
        dst.copy_(self.torch.as_tensor(src))


@dataclass
class Pool:
    """Write and read access to the device pool, owned by the runtime or lent (numpy on the CPU
    backend, a CUDA tensor on CUDA)."""

    rt: hisparse.Runtime
    array: "np.ndarray | None" = None
    ops: object = field(default_factory=NumpyOps)

    def write_rows(self, view: dict, slots, data: np.ndarray) -> None:
        """Writes `data[i]` into row `slots[i]` of the layer's view."""
        if self.array is None:
            for r, d in zip(self.ops.host(slots).tolist(), data):
                self.rt.write_device_pool(view["offset"] + r * view["row_bytes"], d.tobytes())
        else:
            hisparse.pool_rows(self.array, view)[slots.long() if hasattr(slots, "long") else slots] = (
                self.ops.device(data)
            )

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        if self.array is None:
            return np.frombuffer(self.rt.read_device_pool(offset, nbytes), dtype=np.uint8)
        return self.ops.host(self.array[offset : offset + nbytes])


@dataclass
class Outcome:
    rows: list = field(default_factory=list)
    verified: int = 0
    steps: int = 0
    counters: dict = field(default_factory=dict)
    preemptions: int = 0


def coordinator(s: Shape, lay: hisparse.Layout, num_workers: int = 1) -> hisparse.Coordinator:
    return hisparse.Coordinator(
        lay, max_running=s.requests, max_batched_tokens=4096, reclaim_min_blocks=0,
        num_workers=num_workers,
    )


class Worker:
    """A worker's side of the scenario: a runtime on the CPU backend that executes each command
    — the forward pass writing synthetic rows through the slot mapping, the indexer's top-k
    (deterministic from the command), one per-layer call per index group — and checks every row
    attention reads against what was written."""

    def __init__(self, s: Shape, lay: hisparse.Layout, lend_pools: bool, prepared: bool = False,
                 worker: int = 0, ops=None, host_pool=None, writes_host: bool = True):
        self.s, self.lay, self.prepared = s, lay, prepared
        self.ops = ops = ops or NumpyOps()
        kwargs = dict(state_rows=s.requests, max_step_tokens=s.requests, max_batched_tokens=4096,
                      worker=worker, device=ops.selector, writes_host=writes_host)
        if lend_pools:
            device_pool = ops.pool(lay.gpu_pool_bytes)
            if host_pool is None:
                host_pool = hisparse.aligned_empty(lay.host_pool_bytes)
            self.rt = hisparse.Runtime(lay, ops.backend, device_pool=device_pool,
                                       host_pool=host_pool, **kwargs)
            self.pool = Pool(self.rt, device_pool, ops)
        else:
            self.rt = hisparse.Runtime(lay, ops.backend, **kwargs)
            self.pool = Pool(self.rt, None, ops)
        assert self.rt.lends_pools == lend_pools
        if not lend_pools:
            # The runtime's own host pool: set up by the backend, and reported.
            setup = self.rt.host_pool_setup
            assert setup is not None and "thread" in setup and "pages" in setup, setup
        self.host_topk = np.empty((s.requests, s.top_k), dtype=np.int32)
        self.topk = ops.empty((s.requests, s.top_k))
        self.rows = ops.empty((s.requests, s.top_k))
        self.counts = ops.empty(s.requests)
        groups = range(len(lay.index_groups))
        self.calls = [self.rt.layer_call(g, self.topk, self.rows, self.counts) for g in groups]
        self.forward = SlotForward(self.rt, lay, self.pool)
        self.row_log: list = []
        self.verified = 0

    def topk_of(self, cmd: hisparse.Command, g: int) -> None:
        """The indexer: top_k positions below each request's length, drifting with the step;
        one entry -1 (no token) and one duplicate."""
        for i, sr in enumerate(cmd.scheduled):
            n = sr["first_token"] + sr["num_tokens"]
            salt = cmd.step + 13 * g
            self.host_topk[i] = [(j * 7919 + salt * 31) % n for j in range(self.s.top_k)]
            self.host_topk[i, 0] = -1
            self.host_topk[i, 1] = self.host_topk[i, 2]
        self.ops.put(self.topk, self.host_topk)

    def execute(self, cmd: hisparse.Command) -> None:
        rt, rb = self.rt, self.lay.row_bytes
        rt.begin_step(cmd)
        scheduled = cmd.scheduled
        t = len(scheduled)
        if t == 0:
            # A step that computes nothing (a reclaim waiting for a backup still in flight on a
            # GPU): no forward, no attention; the step still opens and closes.
            rt.end_step(cmd)
            return
        self.forward(cmd)
        rt.set_batch(cmd.slots)
        for g, group in enumerate(self.lay.index_groups):
            self.topk_of(cmd, g)
            if self.prepared:
                self.calls[g](t)
            else:
                rt.resolve_index_group(g, self.topk[:t], self.rows[:t], self.counts[:t])
            rows = self.ops.host(self.rows[:t]).copy()
            counts = self.ops.host(self.counts[:t])
            self.row_log.append(rows)
            for i, sr in enumerate(scheduled):
                valid = 0
                for j in range(self.s.top_k):
                    pos, r = int(self.host_topk[i, j]), int(rows[i, j])
                    if pos < 0:
                        assert r == -1, f"entry {j} has no token but row {r}"
                        continue
                    assert r >= 0, f"request {sr['id']} token {pos}: no row"
                    valid += 1
                    for layer in group["layers"]:
                        offset = self.lay.layer_offset(layer)[1]
                        got = self.pool.read(offset + r * rb, rb)
                        assert np.array_equal(got, row(sr["id"], pos, layer, rb)), (
                            f"step {cmd.step} group {g} request {sr['id']} token {pos} layer "
                            f"{layer}: row {r} holds other bytes"
                        )
                        self.verified += 1
                assert counts[i] == valid, f"count {counts[i]} for {valid} valid entries"
        rt.end_step(cmd)


def after_step(coord: hisparse.Coordinator, finish, final_len: int) -> None:
    """The engine's sampling: a request whose computed tokens caught up gets a token, or is
    finished (`finish(id)`) once it is `final_len` long."""
    coord.check_invariants()
    for req in coord.running_ids():
        if coord.num_computed(req) == coord.num_tokens(req):
            if coord.num_tokens(req) >= final_len:
                finish(req)
            else:
                coord.append_tokens(req, [7])


def run(
    s: Shape,
    lend_pools: bool,
    runner=None,
    prepared: bool = False,
    own_scheduler: "int | None" = None,
) -> Outcome:
    """Runs the scenario to the end; raises AssertionError on the first wrong row. `runner(f)`
    runs each step's body `f` (default: on the calling thread); `prepared` makes the per-layer
    calls through `Runtime.layer_call` objects built once; `own_scheduler` (a token budget)
    replaces the built-in `step()` with the engine's own scheduler (`fcfs.Fcfs`)."""
    lay = layout(s)
    coord = coordinator(s, lay)
    worker = Worker(s, lay, lend_pools, prepared)
    policy = fcfs.Fcfs(coord, own_scheduler) if own_scheduler else None
    for req in range(1, s.requests + 1):
        prompt = [1000 * req + t for t in range(s.prompt)]
        (policy or coord).admit(req, prompt)
    out = Outcome()

    def one_step():
        out.steps += 1
        cmd = policy.step() if policy else coord.step()
        worker.execute(cmd)
        worker.rt.poll_and_report(coord)
        after_step(coord, (policy or coord).finish, s.prompt + s.decode)

    runner = runner or (lambda f: f())
    while not coord.is_empty():
        assert out.steps < 10_000, "no progress in 10000 steps"
        runner(one_step)
    coord.report(worker.rt.drain())
    out.rows, out.verified = worker.row_log, worker.verified
    out.counters = worker.rt.counters()
    out.preemptions = policy.preemptions if policy else 0
    coord.check_drained()
    return out


@dataclass
class FirstStep:
    """A runtime in its first step (a prefill of `requests` prompts), batch set."""

    shape: Shape
    layout: hisparse.Layout
    coord: hisparse.Coordinator
    rt: hisparse.Runtime
    cmd: hisparse.Command


def first_step(requests: int = 1, prompt: int = 40) -> FirstStep:
    s = Shape(requests=requests, prompt=prompt)
    lay = layout(s)
    coord = hisparse.Coordinator(lay, max_running=requests)
    rt = hisparse.Runtime(lay, "cpu", state_rows=requests, max_step_tokens=requests)
    for req in range(1, requests + 1):
        coord.admit(req, list(range(prompt - req + 1)))
    cmd = coord.step()
    rt.begin_step(cmd)
    rt.set_batch(cmd.slots)
    return FirstStep(s, lay, coord, rt, cmd)
