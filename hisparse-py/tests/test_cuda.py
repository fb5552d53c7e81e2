"""On a CUDA device with PyTorch: the runtime's calls follow PyTorch's current stream, the device
step metadata are CUDA tensors without a copy, and a whole decode step captured with
`torch.cuda.graph` replays bit-exactly, with counters equal to an eager run. Skipped (loudly)
without a device; failed under HISPARSE_REQUIRE_DEVICE=1."""

import numpy as np
import pytest

import device
import hisparse
import scenario


class CudaDecode:
    """A decode loop on the CUDA backend with PyTorch-owned pools: prefill eagerly, then decode
    steps whose per-layer calls run eagerly or from one captured graph; every row read is
    checked against what the forward pass wrote."""

    def __init__(self, torch, s: scenario.Shape, host_pool: str = "torch-pinned"):
        self.torch, self.s = torch, s
        self.layout = lay = scenario.layout(s)
        self.coord = hisparse.Coordinator(
            lay, max_running=s.requests, max_batched_tokens=4096, reclaim_min_blocks=0
        )
        self.device_pool = torch.zeros(lay.gpu_pool_bytes, dtype=torch.uint8, device="cuda")
        # The host pool: a pinned PyTorch tensor lent to the runtime, or the runtime's own.
        self.host_pool = None
        if host_pool == "torch-pinned":
            self.host_pool = torch.zeros(lay.host_pool_bytes, dtype=torch.uint8, pin_memory=True)
        self.rt = hisparse.Runtime(
            lay, "cuda", state_rows=s.requests, max_step_tokens=s.requests,
            max_batched_tokens=4096, device_pool=self.device_pool, host_pool=self.host_pool,
        )
        groups = self.rt.slot_mapping_groups()
        self.views = {
            v["layer"]: (groups.index(v["group"]), hisparse.pool_rows(self.device_pool, v))
            for v in lay.gpu_views()
            if v["kind"] == "resident"
        }
        self.slot_mapping = torch.as_tensor(self.rt.slot_mapping(), device="cuda")
        g, r, k = len(lay.index_groups), s.requests, s.top_k
        self.topk = torch.full((g, r, k), -1, dtype=torch.int32, device="cuda")
        self.rows = torch.full((g, r, k), -1, dtype=torch.int32, device="cuda")
        self.calls = [self.rt.layer_call(i, self.topk[i], self.rows[i]) for i in range(g)]
        self.graph = None
        self.verified = 0
        self.row_log = []
        for req in range(1, r + 1):
            self.coord.admit(req, [1000 * req + t for t in range(s.prompt)])

    def forward(self, cmd):
        req, pos = scenario.step_tokens(cmd)
        t = self.rt.step_tokens
        for layer, (w, view) in self.views.items():
            data = self.torch.from_numpy(scenario.rows_of(req, pos, layer, view.shape[1])).cuda()
            view.index_copy_(0, self.slot_mapping[w, :t].long(), data)

    def finish_step(self, cmd):
        self.rt.end_step(cmd)
        self.rt.poll_and_report(self.coord)

    def prefill(self):
        idle = 0
        while any(self.coord.num_computed(r) < self.coord.num_tokens(r) for r in self.coord.running_ids()) \
                or self.coord.num_waiting:
            cmd = self.coord.step()
            # A step may schedule nothing while a reclaim waits for a backup in flight; steps that
            # keep scheduling nothing would repeat forever (every request must be running at once
            # for the decode steps, so the shape must hold them).
            idle = 0 if cmd.scheduled else idle + 1
            assert idle < 100, f"prefill stalled: {self.coord.pool_usage()}; raise gpu_blocks"
            if idle:
                self.torch.cuda.synchronize()
            self.rt.begin_step(cmd)
            self.forward(cmd)
            self.finish_step(cmd)

    def decode(self, step: int, graph: bool):
        for req in self.coord.running_ids():
            self.coord.append_tokens(req, [step % 50000])
        cmd = self.coord.step()
        self.rt.begin_step(cmd)
        self.forward(cmd)
        sched = cmd.scheduled
        t = len(sched)
        rng = np.random.default_rng(step)
        sel = np.full((len(self.calls), self.s.requests, self.s.top_k), -1, np.int32)
        for g in range(len(self.calls)):
            for i, x in enumerate(sched):
                n = x["first_token"] + x["num_tokens"]
                sel[g, i] = rng.integers(0, n, self.s.top_k)
                sel[g, i, 0] = -1
        self.topk.copy_(self.torch.from_numpy(sel))
        if graph:
            self.rt.set_batch(cmd.slots, pad_to=self.s.requests)
            if self.graph is None:
                self.graph = self.torch.cuda.CUDAGraph()
                with self.torch.cuda.graph(self.graph):
                    for call in self.calls:
                        call()
            self.graph.replay()
        else:
            self.rt.set_batch(cmd.slots)
            for call in self.calls:
                call(t)
        rows = self.rows.cpu().numpy()
        self.row_log.append(rows[:, :t].copy())
        for g, group in enumerate(self.layout.index_groups):
            for layer in group["layers"]:
                view = self.views[layer][1]
                got = view[self.rows[g, :t].long().clamp(min=0)].cpu().numpy()
                for i, x in enumerate(sched):
                    valid = sel[g, i] >= 0
                    assert (rows[g, i][~valid] == -1).all()
                    want = scenario.rows_of(np.full(valid.sum(), x["id"]), sel[g, i][valid], layer, view.shape[1])
                    assert np.array_equal(got[i][valid], want), f"step {step} group {g} request {x['id']}"
                    self.verified += int(valid.sum())
        self.finish_step(cmd)

    def drain(self):
        self.coord.report(self.rt.drain())
        return self.rt.counters()


# 140 GPU blocks: the four requests decode together (each keeps its 13 indexer pages, its hot
# region and its unreclaimed pages: 25 blocks) while the last one prefills (52), yet the pool is
# well below all-resident (4 x 52 pages and the hot regions), so pages are reclaimed and swapped in.
SHAPE = scenario.Shape(requests=4, prompt=200, gpu_blocks=140, top_k=16, hot=32)
# A captured call always resolves (right whatever the residency at replay); an eager one remaps
# when every request is fully resident: the calls are compared as a total.
COMPARED = ["hot_hits", "hot_misses", "resident_reads", "h2d_bytes", "decode_calls"]


def run_decode(torch, graph: bool, host_pool: str = "torch-pinned"):
    d = CudaDecode(torch, SHAPE, host_pool)
    d.prefill()
    for step in range(20):
        d.decode(step, graph)
    return d, d.drain()


@pytest.mark.parametrize("host_pool", ["runtime", "torch-pinned"])
def test_a_captured_decode_step_replays_like_the_eager_one(host_pool):
    torch = device.torch_cuda()
    eager, eager_counters = run_decode(torch, graph=False, host_pool=host_pool)
    replayed, replay_counters = run_decode(torch, graph=True, host_pool=host_pool)
    assert replayed.rt.captured_token_rows == [SHAPE.requests]
    assert replayed.verified == eager.verified > 0
    for a, b in zip(replayed.row_log, eager.row_log):
        np.testing.assert_array_equal(a, b)
    assert eager_counters["hot_misses"] > 0, "the pool was large enough that nothing was swapped in"
    for c in (eager_counters, replay_counters):
        c["decode_calls"] = c["resolve_calls"] + c["remap_calls"]
    assert {k: replay_counters[k] for k in COMPARED} == {k: eager_counters[k] for k in COMPARED}


def test_before_replay_work_is_refused_inside_a_capture():
    torch = device.torch_cuda()
    d = CudaDecode(torch, SHAPE)
    d.prefill()
    for req in d.coord.running_ids():
        d.coord.append_tokens(req, [1])
    cmd = d.coord.step()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(hisparse.InvalidArgumentError, match="begin_step"):
        with torch.cuda.graph(graph):
            d.rt.begin_step(cmd)
    d.rt.begin_step(cmd)
    with pytest.raises(hisparse.InvalidArgumentError, match="set_batch"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            d.rt.set_batch(cmd.slots)
    d.rt.set_batch(cmd.slots)
    with pytest.raises(hisparse.InvalidArgumentError, match="pad"):
        d.rt.set_batch(cmd.slots, pad_to=len(cmd.slots) - 1)
    d.finish_step(cmd)


def test_calls_follow_the_current_torch_stream():
    torch = device.torch_cuda()
    d = CudaDecode(torch, SHAPE)
    d.prefill()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        d.decode(0, graph=False)
    torch.cuda.synchronize()
    d.decode(1, graph=False)
    assert d.verified > 0
    d.drain()


def test_device_step_metadata_are_cuda_tensors_without_a_copy():
    torch = device.torch_cuda()
    d = CudaDecode(torch, SHAPE)
    d.prefill()
    sm = d.rt.slot_mapping()
    assert sm.device == "cuda" and not hasattr(sm, "__array_interface__")
    t = torch.as_tensor(sm, device="cuda")
    assert t.data_ptr() == sm.data_ptr and t.dtype == torch.int32
    assert tuple(t.shape) == sm.shape
    for bucket in range(d.layout.num_buckets):
        table = torch.as_tensor(d.rt.resident_table(bucket), device="cuda").cpu().numpy()
        for slot in range(SHAPE.requests):
            assert table[slot].tolist() == d.rt.resident_row(bucket, slot)
    d.drain()


def test_the_engine_loop_example_with_a_graph():
    device.torch_cuda()
    import subprocess
    import sys
    import pathlib

    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "engine_loop.py"
    outs = {}
    for args in (["--backend", "cuda"], ["--backend", "cuda", "--graph"]):
        for micro in ("1", "2"):
            # Polled after waiting for the GPU: which backups a poll finds done (and so the
            # reclaims and the schedule) no longer depends on timing, and two runs compare.
            run = [*args, "--micro-batches", micro, "--wait-before-poll"]
            out = subprocess.run([sys.executable, str(example), *run], capture_output=True, text=True)
            assert out.returncode == 0, out.stdout + out.stderr
            outs[tuple(run)] = out.stdout
    # Micro-batch calls on a side stream (eager, and forked and joined inside the graph): every
    # row verified and the same hits, misses and steps as one call per group.
    for args in (("--backend", "cuda"), ("--backend", "cuda", "--graph")):
        one, two = (outs[args + ("--micro-batches", m, "--wait-before-poll")] for m in ("1", "2"))
        assert two == one


def test_a_runtime_over_a_lent_host_pool_is_released_off_the_callers_thread():
    """The engine lends a large unpinned array as the host pool: the runtime registers it, and
    dropping the runtime hands the unregistration, then the array's reference, to a release
    thread — the drop returns at once, and the array is let go only after it is unregistered."""
    import sys

    device.torch_cuda()
    lay = hisparse.plan_layout("deepseek-v3.2", layers=1, gpu_mem=1 << 30, host_mem=96 << 20,
                               max_model_len=4096, num_gpu_blocks=256)
    host = hisparse.aligned_empty(lay.host_pool_bytes)
    before = sys.getrefcount(host)
    rt = hisparse.Runtime(lay, "cuda", state_rows=1, max_step_tokens=1, host_pool=host)
    assert sys.getrefcount(host) > before, "the runtime keeps the array alive"
    del rt
    assert hisparse.wait_for_releases(60)
    hisparse.releases_in_flight()  # a call into the module lets Python drop deferred references
    assert sys.getrefcount(host) == before, "the array is let go once unregistered"
    # Registered again at once: the first registration is gone.
    rt = hisparse.Runtime(lay, "cuda", state_rows=1, max_step_tokens=1, host_pool=host)
    del rt
    assert hisparse.wait_for_releases(60)
