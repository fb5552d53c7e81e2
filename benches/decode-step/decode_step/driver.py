"""The benchmark's engine loop: per context one runtime, per batch a prefill and the arms'
decode steps, each configuration measured and checked.

The device work goes through a *kernels* object (``kernels_torch.TorchKernels`` on the GPU,
``kernels_numpy.NumpyKernels`` for the CPU dry run) that owns the step's static buffers and
offers each piece of a decode step for one layer — the KV and indexer-key writes through the
slot mapping, the indexer's scores, the top-k, HiSparse's per-layer call (or the all-resident
remap), sparse attention, the stand-in's GEMMs — plus ``capture`` (a CUDA graph, or the eager
function on the CPU) and timers. Everything else, the host side an engine runs (coordinator,
``begin_step``, ``set_batch``, ``end_step``, reports), the arms, the sweeps, the checks and the
records, is here, once.

Per context, and per batch ``B`` (fresh requests each time, the same prompts in both arms):

1. all-resident arm, when the batch's whole KV fits the largest GPU pool the device allows (one
   engine per context, reused by every such batch): prefill (each token's KV row and indexer
   key written through the slot mapping, no prefill attention; ``end_step``'s row mirrors make
   the host copy durable), then per layer the resident-table remap (``layer_call(...,
   swap="prefill")``: the fully-resident path's remap, capturable), checked to have resolved
   nothing; for small batches also HiSparse's own call over the same fully resident state (the
   fully-resident path's cost inside a graph);
2. HiSparse arm: an engine whose GPU pool holds what HiSparse needs for ``B`` requests (hot
   regions, indexer pages, active tails, one request's prefill), so the coordinator reclaims
   pages under pressure while the batch prefills and the decode steps swap rows in, at each
   top-k overlap target.

Each arm's decode step is one graph (with and without the stand-in) and, for the breakdown,
the same work as six graphs in a row (writes, indexer, top-k, per-layer calls, attention,
stand-in) timed between. The *pipelined* step (``pipelined_step``) is the same work with each
layer's batch cut into micro-batches, so that one micro-batch's per-layer call (and the rows it
brings over the bus) runs on a side stream while the main stream computes the next one's
indexer and top-k and the previous one's attention (``pipeline_split`` ``batch``), or only the
previous one's attention (``swap``: the indexer and top-k over the whole batch). HiSparse's steps also run with the queries
held still (top-k overlap 1.0, ``ALL_HIT``): the same step with no miss, which the miss
transfer's hidden share is measured against. A sampled step's attention outputs are compared
bit for bit with the attention over the rows the synthetic forward wrote (both arms, the
pipelined step too) and HiSparse's with the all-resident arm's for the same top-k and queries.
"""

import time
from typing import Dict, List, Optional, Tuple

import hisparse
import numpy as np

from . import capacity
from .stats import overlap_of

ARMS = ("all_resident", "hisparse")
SEGMENTS = ("write", "indexer", "topk", "resolve", "attention", "standin")
#: The overlap target of the all-hit runs: the indexer queries do not drift, so each step's top-k
#: is the last one's (but for the newest tokens) and every row is already in the hot buffer.
ALL_HIT = 1.0
#: The pipelined step's modes, when the kernels can pipeline (``Kernels.can_pipeline``).
PIPELINED = ("pipelined", "pipelined_no_standin")


class BenchError(RuntimeError):
    """A configuration failed a check; the message says which and how."""


class Clock:
    """Wall time since the run started, and whether the time budget allows another start."""

    def __init__(self, budget: Optional[float]):
        self.t0 = time.perf_counter()
        self.budget = budget

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def allows(self, estimate: float) -> bool:
        return self.budget is None or self.elapsed() + estimate <= self.budget


class Engine:
    """One coordinator and runtime over one GPU pool: the engine loop of either arm."""

    def __init__(self, cfg, context: int, kernels_cls, backend: str, num_gpu_blocks: int,
                 max_batch: int, log=print):
        self.cfg, self.context, self.log = cfg, context, log
        probe = capacity.probe_layout(cfg, context)
        self.layout = capacity.plan(cfg, context, gpu_mem=0, num_gpu_blocks=num_gpu_blocks,
                                    host_mem=capacity.host_bytes(cfg, context, max_batch, probe))
        batched = max(cfg.prefill_chunk, max_batch)
        self.coord = hisparse.Coordinator(self.layout, max_running=max_batch,
                                          max_batched_tokens=batched, enable_prefix_caching=False)
        t = time.perf_counter()
        self.kernels = kernels_cls(cfg, self.layout, backend, state_rows=max_batch,
                                   max_batched_tokens=batched)
        self.rt = self.kernels.rt
        self.setup_seconds = time.perf_counter() - t
        self.groups = self.layout.index_groups
        self.layers = [l for g in self.groups for l in g["layers"]]
        self.rho: Dict[float, float] = {}
        #: Steps each (batch, arm, overlap) took to settle (``settle``).
        self.settled: Dict[Tuple[int, str, float], int] = {}

    # ---- the engine's host side -------------------------------------------------------------

    def host_step(self, *, expect_decode: Optional[int] = None):
        """Schedules a step and opens it on the runtime; returns (command, host seconds)."""
        t = time.perf_counter()
        cmd = self.coord.step()
        self.check_decode(cmd, expect_decode)
        self.rt.begin_step(cmd)
        return cmd, time.perf_counter() - t

    @staticmethod
    def check_decode(cmd, expect_decode: Optional[int]) -> None:
        """Refuses a step that preempted or refused requests, or (``expect_decode``) that is not
        one decode token of each of the batch's requests."""
        if cmd.preempted or cmd.refused:
            raise BenchError(f"step {cmd.step}: preempted {cmd.preempted}, refused {cmd.refused}: "
                             "the pool does not hold the batch; lower the batch or raise the pool")
        if expect_decode is not None and not (
                len(cmd.scheduled) == expect_decode
                and all(s["num_tokens"] == 1 for s in cmd.scheduled)):
            raise BenchError(f"step {cmd.step} scheduled {len(cmd.scheduled)} requests, not the "
                             f"{expect_decode} decode tokens of the batch")

    def close_step(self, cmd, *, sample: bool) -> float:
        """``end_step``, reports, and (for decode steps) the sampled tokens; host seconds."""
        t = time.perf_counter()
        self.rt.end_step(cmd)
        self.rt.poll_and_report(self.coord)
        if sample:
            for s in cmd.scheduled:
                self.coord.append_tokens(s["id"], [1 + s["id"] % 1000])
        return time.perf_counter() - t

    def prefill(self, ids: List[int]) -> Dict:
        """Prefills ``ids`` (writes only), then starts every one decoding; returns stats."""
        t = time.perf_counter()
        prompt = list(range(self.context))
        for rid in ids:
            self.coord.admit(rid, prompt)
        steps = tokens = 0
        while any(self.coord.num_computed(r) < self.coord.num_tokens(r) for r in ids):
            cmd, _ = self.host_step()
            if not cmd.scheduled:
                self.rt.drain()
                self.rt.poll_and_report(self.coord)
                steps += 1
                if steps > 100_000:
                    raise BenchError("prefill made no progress")
                self.close_step(cmd, sample=False)
                continue
            req = np.concatenate([np.full(s["num_tokens"], s["id"], np.int64) for s in cmd.scheduled])
            pos = np.concatenate([np.arange(s["first_token"], s["first_token"] + s["num_tokens"],
                                            dtype=np.int64) for s in cmd.scheduled])
            self.kernels.write_tokens(req, pos)
            tokens += len(req)
            self.close_step(cmd, sample=False)
            steps += 1
        self.kernels.sync()
        for rid in ids:
            self.coord.append_tokens(rid, [1 + rid % 1000])
        return {"steps": steps, "tokens": tokens, "seconds": time.perf_counter() - t}

    def all_on_gpu(self, ids) -> bool:
        return not any(self.coord.has_hot_region(r) or self.coord.host_only_pages(r) for r in ids)

    def close(self) -> None:
        """Releases the runtime and its pools."""
        self.rt.drain()
        self.kernels.close()
        self.kernels = self.rt = None

    # ---- one decode step, and runs of them ----------------------------------------------------

    def decode_step(self, B: int, arm: str, replay, overlap: float, *, pad: bool = True):
        """One decode step of the batch with ``replay`` (a graph or the eager pieces) as its
        device work; returns the step's record, with the host seconds of each part of the
        engine's host side (``host_parts``)."""
        k = self.kernels
        parts = {}
        clock = [time.perf_counter()]

        def lap(name):
            now = time.perf_counter()
            parts[name] = parts.get(name, 0.0) + now - clock[0]
            clock[0] = now

        t0 = clock[0]
        # The previous step's completed transfers reach the coordinator before it schedules (as
        # an engine polls before it plans): the GPU is idle here, so the poll is host work only.
        # Polled right after the launch instead, it took about half the graph's time (its driver
        # queries waited on the graph), which counted GPU time as host time.
        self.rt.poll_and_report(self.coord)
        lap("report")
        cmd = self.coord.step()
        lap("schedule")
        self.check_decode(cmd, B)
        self.rt.begin_step(cmd)
        lap("begin_step")
        k.set_inputs(cmd.scheduled, self.rho.get(overlap, 0.0))
        lap("inputs")
        self.rt.set_batch([s["slot"] for s in cmd.scheduled], pad_to=B if pad else None)
        lap("set_batch")
        device = replay()
        lap("launch")
        self.rt.end_step(cmd)
        lap("end_step")
        k.sync()
        lap("wait")
        # Device times are read once the step is done (CUDA events; host seconds on the CPU).
        device = {name: (v() if callable(v) else v) for name, v in device.items()}
        lap("read_times")
        for s in cmd.scheduled:
            self.coord.append_tokens(s["id"], [1 + s["id"] % 1000])
        lap("sample")
        wall = clock[0] - t0
        host = sum(v for name, v in parts.items() if name not in ("launch", "wait"))
        return {"cmd": cmd, "wall": wall, "host": host, "launch": parts["launch"],
                "wait": parts["wait"], "host_parts": parts, "device": device}

    def run_mode(self, B: int, arm: str, mode: str, overlap: float, graphs) -> Dict:
        """Warm-up and timed steps of one (arm, mode, overlap): ``mode`` is ``step`` (the whole
        step in one graph), ``step_no_standin``, ``segments`` (the breakdown), ``pipelined`` or
        ``pipelined_no_standin`` (the pipelined step in one graph)."""
        cfg, k = self.cfg, self.kernels
        replay = graphs[mode]
        for _ in range(cfg.warmup_steps):
            self.decode_step(B, arm, replay, overlap)
        c0 = self.rt.counters()
        recs, tops = [], []
        for _ in range(cfg.timed_steps):
            recs.append(self.decode_step(B, arm, replay, overlap))
            tops.append(k.topk_host())
        self.coord.report(self.rt.drain())
        c1 = self.rt.counters()
        delta = {key: c1[key] - c0[key] for key in c0 if isinstance(c0[key], int)}
        n = len(recs)
        wall = [r["wall"] for r in recs]
        out = {
            "arm": arm, "mode": mode, "overlap_target": overlap,
            "steps": n,
            "step_ms": 1e3 * float(np.mean(wall)),
            "step_ms_min": 1e3 * float(np.min(wall)),
            "host_ms": 1e3 * float(np.mean([r["host"] for r in recs])),
            "host_parts_ms": {name: 1e3 * float(np.mean([r["host_parts"][name] for r in recs]))
                              for name in recs[0]["host_parts"]},
            "launch_ms": 1e3 * float(np.mean([r["launch"] for r in recs])),
            "tokens_per_s": B / float(np.mean(wall)),
            "overlap_measured": float(np.mean([overlap_of(a, b) for a, b in zip(tops, tops[1:])]))
            if len(tops) > 1 else None,
            "per_step": {key: delta[key] / n for key in
                         ("hot_hits", "hot_misses", "resident_reads", "h2d_bytes", "d2h_bytes",
                          "resolve_calls", "remap_calls", "prefill_remap_calls")},
        }
        out["missed_bytes_per_step"] = out["per_step"]["hot_misses"] * self.layout.row_bytes
        out["settle_steps"] = self.settled.get((B, arm, overlap), 0)
        dev = [r["device"] for r in recs]
        if mode == "segments":
            out["device_ms"] = {s: 1e3 * float(np.mean([d[s] for d in dev])) for s in SEGMENTS}
            out["device_ms"]["total"] = float(sum(out["device_ms"].values()))
        else:
            out["device_ms"] = {"graph": 1e3 * float(np.mean([d["graph"] for d in dev]))}
        if arm == "all_resident" and (delta["resolve_calls"] or delta["hot_misses"]):
            raise BenchError(f"the all-resident arm resolved {delta['resolve_calls']} calls "
                             f"({delta['hot_misses']} misses): a page was not on the GPU")
        return out

    def settle(self, B: int, arm: str, graphs, overlap: float) -> int:
        """Whole steps at ``overlap`` until the hot buffers reach its steady state (each window's
        misses per step no fewer than ``1 - settle_tolerance`` of the window before); returns the
        steps run. Without it the first mode timed at an overlap pays the transition's extra
        misses (a batch fresh from prefill missed 1.7× the steady rate over its first 13 steps)."""
        cfg = self.cfg
        before, steps = None, 0
        while steps < cfg.settle_max_steps:
            c0 = self.rt.counters()
            for _ in range(cfg.settle_window):
                self.decode_step(B, arm, graphs["step"], overlap)
            steps += cfg.settle_window
            self.coord.report(self.rt.drain())
            misses = (self.rt.counters()["hot_misses"] - c0["hot_misses"]) / cfg.settle_window
            if before is not None and misses >= before * (1 - cfg.settle_tolerance):
                break
            before = misses
        self.settled[(B, arm, overlap)] = steps
        return steps

    # ---- a batch --------------------------------------------------------------------------------

    def calibrate(self, B: int) -> Dict[float, float]:
        """The indexer-query drift giving each overlap target (bisection on the measured
        top-k overlap of layer 0 over a few drift steps)."""
        k = self.kernels
        out = {}
        for target in self.cfg.overlaps:
            lo, hi = 0.0, 1.0
            for _ in range(12):
                mid = (lo + hi) / 2
                if k.indexer_overlap(mid, steps=4) < target:
                    lo = mid
                else:
                    hi = mid
            out[target] = (lo + hi) / 2
        return out

    def start_batch(self, ids: List[int]) -> Dict:
        """Prefills ``ids`` and binds the batch's static buffers; the first decode step runs
        eagerly (FlashMLA makes its scheduling metadata there)."""
        B = len(ids)
        res = {"prefill": self.prefill(ids)}
        res["all_pages_on_gpu"] = self.all_on_gpu(ids)
        self.kernels.bind(B, ids)
        arm = "all_resident" if res["all_pages_on_gpu"] else "hisparse"
        self.decode_step(B, arm, lambda: self.kernels.eager(arm), self.cfg.overlaps[0], pad=False)
        return res

    def end_batch(self, ids: List[int]) -> None:
        for rid in ids:
            self.coord.finish(rid)
        self.coord.report(self.rt.drain())
        self.kernels.unbind()

    def all_resident_arm(self, B: int, runs: List[Dict]) -> Dict:
        """The all-resident arm's modes (and, for small batches, HiSparse's own calls over the
        same fully resident state); returns the sampled step's snapshot."""
        cfg, main = self.cfg, self.cfg.overlaps[0]
        graphs = self.capture_graphs(B, "all_resident", main)
        for mode in ("step", "step_no_standin", "segments") + (PIPELINED if "pipelined" in graphs else ()):
            runs.append(self.run_mode(B, "all_resident", mode, main, graphs))
        stored = self.sampled_check(B, "all_resident", graphs, main)
        if "pipelined" in graphs:
            stored["summary"]["pipelined_reference_layers_identical"] = self.pipelined_check(
                B, "all_resident", graphs, main)
        if B <= cfg.resident_path_max_batch:
            graphs = self.capture_graphs(B, "hisparse", main)
            for mode in ("step", "step_no_standin"):
                r = self.run_mode(B, "hisparse", mode, main, graphs)
                r["arm"] = "hisparse_fully_resident"
                if r["per_step"]["hot_misses"]:
                    raise BenchError("HiSparse's calls over a fully resident batch missed")
                runs.append(r)
        return stored

    def hisparse_arm(self, B: int, runs: List[Dict], against) -> Dict:
        """HiSparse's modes at every overlap target, then the sampled check."""
        cfg, main = self.cfg, self.cfg.overlaps[0]
        graphs = self.capture_graphs(B, "hisparse", main)
        piped = PIPELINED if "pipelined" in graphs else ()
        for i, overlap in enumerate(cfg.overlaps):
            modes = ("step", "step_no_standin") + (("segments",) if i == 0 else ()) + piped
            self.settle(B, "hisparse", graphs, overlap)
            for mode in modes:
                runs.append(self.run_mode(B, "hisparse", mode, overlap, graphs))
        # The same steps with nothing to swap in: what the misses' transfer is measured against.
        self.rho[ALL_HIT] = 1.0
        self.settle(B, "hisparse", graphs, ALL_HIT)
        for mode in ("step",) + piped[:1]:
            runs.append(self.run_mode(B, "hisparse", mode, ALL_HIT, graphs))
        check = self.sampled_check(B, "hisparse", graphs, main, against=against)
        if piped:
            check["summary"]["pipelined_reference_layers_identical"] = self.pipelined_check(
                B, "hisparse", graphs, main)
        return check

    def capture_graphs(self, B: int, arm: str, overlap: float) -> Dict:
        """The arm's step graphs, captured inside a step (nothing runs while capturing; the
        step's own device work is then one replay of the whole step)."""
        k = self.kernels
        layers_of = [(g, grp["layers"]) for g, grp in enumerate(self.groups)]

        def whole(standin: bool):
            def fn():
                outs = []
                for g, layers in layers_of:
                    for l in layers:
                        k.write(l)
                    k.indexer(layers[0])
                    k.topk(g, layers[0])
                    k.resolve(arm, g)
                    for l in layers:
                        outs.append(k.attention(l, g))
                        if standin:
                            k.standin(l)
                return outs
            return fn

        if self.cfg.pipeline_split not in ("batch", "swap"):
            raise BenchError(f"pipeline_split {self.cfg.pipeline_split!r}: batch or swap")
        # ``swap``: the whole batch's indexer and top-k before the micro-batches' calls.
        whole_topk = self.cfg.pipeline_split == "swap"

        def pipelined(standin: bool):
            def fn():
                outs = []
                for g, layers in layers_of:
                    for l in layers:
                        k.write(l)
                    ready = []
                    if whole_topk:
                        k.indexer(layers[0])
                        k.topk(g, layers[0])
                    for p in range(len(k.parts)):
                        if not whole_topk:
                            k.indexer(layers[0], p)
                            k.topk(g, layers[0], p)
                        ready.append(k.on_side(lambda p=p: k.resolve(arm, g, p)))
                    for i, l in enumerate(layers):
                        parts = []
                        for p, event in enumerate(ready):
                            if i == 0:
                                k.wait(event)
                            parts.append(k.attention(l, g, p))
                        outs.append(parts)
                        if standin:
                            k.standin(l)
                return outs
            return fn

        pieces = {
            "write": lambda: [k.write(l) for l in self.layers],
            "indexer": lambda: [k.indexer(layers[0]) for _, layers in layers_of],
            "topk": lambda: [k.topk(g, layers[0]) for g, layers in layers_of],
            "resolve": lambda: [k.resolve(arm, g) for g, _ in layers_of],
            "attention": lambda: [k.attention(l, g) for g, layers in layers_of for l in layers],
            "standin": lambda: [k.standin(l) for l in self.layers],
        }
        holder = {}

        def capture_all():
            k.new_graph_pool()
            holder["step"] = k.capture(whole(True))
            holder["step_no_standin"] = k.capture(whole(False))
            holder["pieces"] = {name: k.capture(fn) for name, fn in pieces.items()}
            if k.can_pipeline():
                holder["pipelined"] = k.capture(pipelined(True))
                holder["pipelined_no_standin"] = k.capture(pipelined(False))
            return {"graph": 0.0}

        # A step whose device work is the eager pieces after the capture: the captures
        # themselves run nothing.
        def eager_after_capture():
            capture_all()
            return k.eager(arm)

        self.decode_step(B, arm, eager_after_capture, overlap, pad=False)
        step, nostandin, segs = holder["step"], holder["step_no_standin"], holder["pieces"]
        graphs = {
            "step": lambda: {"graph": k.timed(step.replay)},
            "step_no_standin": lambda: {"graph": k.timed(nostandin.replay)},
            "segments": lambda: k.timed_sequence([(s, segs[s].replay) for s in SEGMENTS]),
            "outputs": {"step": step, "segments": segs["attention"]},
            "pieces": segs,
        }
        if "pipelined" in holder:
            for mode in PIPELINED:
                graphs[mode] = lambda g=holder[mode]: {"graph": k.timed(g.replay)}
            graphs["outputs"]["pipelined"] = holder["pipelined"]
        return graphs

    def sampled_check(self, B: int, arm: str, graphs, overlap: float, against=None) -> Dict:
        """One step whose attention outputs are compared bit for bit: with the attention over
        the rows the forward wrote, taken straight from the row tables at the step's top-k
        (every layer), and — given ``against``, the all-resident arm's sampled step — HiSparse's
        outputs for that step's top-k and queries with the all-resident ones."""
        k = self.kernels
        rec = self.decode_step(B, arm, graphs["step"], overlap)
        outs = graphs["outputs"]["step"].outputs()
        snap = k.snapshot(rec["cmd"].scheduled, outs)
        bad = k.compare_with_reference(snap)
        if bad:
            raise BenchError(f"{arm}: attention output of layer {bad[0]} differs from the "
                             f"attention over the rows the forward wrote ({len(bad)} layers)")
        summary = {"reference_layers_identical": len(self.layers), "arm": arm}
        if against is not None:
            # The stored step's top-k and queries, replayed through HiSparse's calls.
            cmd, _ = self.host_step(expect_decode=B)
            k.set_inputs(cmd.scheduled, self.rho.get(overlap, 0.0))
            k.load_snapshot(against, cmd.scheduled)
            self.rt.set_batch([s["slot"] for s in cmd.scheduled], pad_to=B)
            pieces = graphs["pieces"]
            pieces["write"].replay()
            pieces["resolve"].replay()
            pieces["attention"].replay()
            self.close_step(cmd, sample=False)
            k.sync()
            for s in cmd.scheduled:
                self.coord.append_tokens(s["id"], [1 + s["id"] % 1000])
            bad = k.compare_outputs(against, pieces["attention"].outputs(), cmd.scheduled)
            if bad:
                raise BenchError(f"HiSparse's attention output of layer {bad[0]} differs from the "
                                 f"all-resident arm's for the same top-k ({len(bad)} layers)")
            summary["all_resident_layers_identical"] = len(self.layers)
        return {"summary": summary, "snapshot": snap}

    def pipelined_check(self, B: int, arm: str, graphs, overlap: float) -> int:
        """One pipelined step whose attention outputs, micro-batch by micro-batch, are compared
        bit for bit with the attention over the rows the forward wrote; returns the layers
        checked."""
        k = self.kernels
        rec = self.decode_step(B, arm, graphs["pipelined"], overlap)
        outs = [k.join(parts) for parts in graphs["outputs"]["pipelined"].outputs()]
        bad = k.compare_with_reference(k.snapshot(rec["cmd"].scheduled, outs), k.parts)
        if bad:
            raise BenchError(f"{arm}, pipelined: attention output of layer {bad[0]} differs from the "
                             f"attention over the rows the forward wrote ({len(bad)} layers)")
        return len(self.layers)


class ContextBench:
    """One context length: the all-resident engine (a GPU pool as large as the device allows,
    reused by every batch that fits in it whole) and, per batch, a HiSparse engine whose pool
    holds what HiSparse needs for the batch (each request's hot regions, indexer pages and
    active tail, and one request's prefill) — so the coordinator reclaims pages under pressure
    as it would in an engine that uses the memory it saved."""

    def __init__(self, cfg, context: int, kernels_cls, backend: str, batches: List[int],
                 host_ceiling: int, clock: Clock, log=print):
        self.cfg, self.context, self.kernels_cls, self.backend = cfg, context, kernels_cls, backend
        self.clock, self.log = clock, log
        self.batches = sorted(set(b for b in batches if 0 < b <= host_ceiling))
        self.probe = capacity.probe_layout(cfg, context)
        self.per_request = self.probe.capacity(context)
        self.full_blocks = kernels_cls.pool_limit(cfg) // self.probe.bytes_per_block
        all_on_gpu = self.per_request["gpu_blocks_per_request"]["all_on_gpu"]
        self.resident_batches = [b for b in self.batches if b * all_on_gpu + 16 <= self.full_blocks]
        self.resident_engine = None
        self.next_id = 1

    def hisparse_blocks(self, B: int) -> int:
        per = self.per_request["gpu_blocks_per_request"]["hisparse"]
        return B * per + self.per_request["prefill_gpu_blocks"] + 16

    def run_batch(self, B: int) -> Dict:
        ids = list(range(self.next_id, self.next_id + B))
        self.next_id += B
        res = {"batch": B, "context": self.context, "runs": []}
        stored = None
        if B in self.resident_batches:
            # The pool this batch needs on the GPU whole, not all the device has: the HiSparse
            # engine of the same batch is built after it.
            all_on_gpu = self.per_request["gpu_blocks_per_request"]["all_on_gpu"]
            blocks = min(self.full_blocks, B * all_on_gpu + self.per_request["prefill_gpu_blocks"] + 16)
            e = self.resident_engine = Engine(self.cfg, self.context, self.kernels_cls, self.backend,
                                              blocks, B, self.log)
            res["all_resident_engine"] = e.start_batch(ids)
            res["all_resident_engine"]["gpu_pool_bytes"] = e.layout.gpu_pool_bytes
            if not res["all_resident_engine"]["all_pages_on_gpu"]:
                raise BenchError(f"batch {B} did not stay whole in the all-resident pool")
            e.rho = e.rho or e.calibrate(B)
            stored = e.all_resident_arm(B, res["runs"])
            res["check_all_resident"] = stored["summary"]
            res["memory_all_resident"] = e.kernels.memory()
            e.end_batch(ids)
            rho = e.rho
            # Closed before the HiSparse engine is built: both engines' host pools at once need
            # more host memory than the machine has at the larger batches.
            e.close()
            self.resident_engine = None
        else:
            res["all_resident_engine"] = "does not fit: the batch's whole KV exceeds the GPU pool"
            rho = None
        e = Engine(self.cfg, self.context, self.kernels_cls, self.backend, self.hisparse_blocks(B),
                   B, self.log)
        try:
            res["hisparse_engine"] = e.start_batch(ids)
            res["hisparse_engine"]["gpu_pool_bytes"] = e.layout.gpu_pool_bytes
            res["hisparse_engine"]["setup_seconds"] = e.setup_seconds
            e.rho = rho or e.calibrate(B)
            res["query_drift"] = {str(t): r for t, r in e.rho.items()}
            check = e.hisparse_arm(B, res["runs"], stored["snapshot"] if stored else None)
            res["check_hisparse"] = check["summary"]
            res["memory_hisparse"] = e.kernels.memory()
            res["indexer"] = {"kind": self.cfg.indexer,
                              "check": getattr(e.kernels, "indexer_check", None)}
            hs = [r for r in res["runs"] if r["arm"] == "hisparse"]
            res["hisparse_swapped"] = any(r["per_step"]["hot_misses"] for r in hs)
            if B > 1 and not res["hisparse_swapped"]:
                raise BenchError("the HiSparse arm swapped nothing in: every page stayed resident")
            e.end_batch(ids)
        finally:
            e.close()
        return res

    def run_one(self, B: int) -> Dict:
        """Batch ``B``'s record, or why it was skipped (the time budget)."""
        est = self.estimate_seconds(B)
        if not self.clock.allows(est):
            left = self.clock.budget - self.clock.elapsed()
            self.log(f"context {self.context}: batch {B} skipped: the time budget leaves "
                     f"{left:.0f} s, it needs about {est:.0f} s")
            return {"batch": B, "context": self.context, "skipped": "time budget"}
        t = time.perf_counter()
        r = self.run_batch(B)
        r["seconds"] = time.perf_counter() - t
        prefill = sum(r[k]["prefill"]["seconds"] for k in ("all_resident_engine", "hisparse_engine")
                      if isinstance(r.get(k), dict))
        self.last_cost = (B, r["seconds"], prefill)
        self.log(summary_line(r))
        return r

    def estimate_seconds(self, B: int) -> float:
        """A batch's time from the last one's: its prefill scales with the batch; the rest (pools,
        graphs, the timed steps) is taken as the last batch's, twice over for a margin."""
        last = getattr(self, "last_cost", None)
        if last is None:
            return 0.0
        b, seconds, prefill = last
        return 2 * (seconds - prefill) + prefill * B / b

    def close(self):
        if self.resident_engine is not None:
            self.resident_engine.close()
            self.resident_engine = None


def summary_line(r: Dict) -> str:
    parts = [f"context {r['context']} batch {r['batch']}:"]
    for run in r.get("runs", []):
        if run["mode"] == "step":
            parts.append(f"{run['arm']}@{run['overlap_target']:.2f} {run['step_ms']:.2f} ms "
                         f"({run['tokens_per_s']:.0f} tok/s, overlap {run['overlap_measured']:.3f}, "
                         f"{run['per_step']['h2d_bytes'] / 1e6:.1f} MB H2D)")
    return " ".join(parts)
