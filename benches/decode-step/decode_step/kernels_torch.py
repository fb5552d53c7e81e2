"""The decode step's device work on the GPU: PyTorch ops, HiSparse's CUDA backend, FlashMLA.

* writes: per layer one ``index_copy_`` of the step's KV rows and one ``index_put_`` of its
  indexer keys through the runtime's device slot mapping (the rows drawn from the row tables by
  ``rows.row_hash``, computed on the device from the step's request ids and positions);
* the lightning indexer: by default one Triton kernel (``indexer_triton``) that reads each
  request's fp8 keys once through the runtime's indexer table, or (``--indexer torch``) PyTorch
  ops: the keys gathered (``pool_view[pages]``), fp8 → bfloat16, ``bmm`` with the 64 query heads,
  ReLU, the head weights (``bmm``), times each key's scale; positions past the request's length
  masked; then ``torch.topk`` (2048). The first step's inputs check the Triton logits against
  the PyTorch ops' (``check_indexer``);
* HiSparse's per-layer calls (``layer_call``), recorded by ``torch.cuda.graph``; in the
  pipelined step one call per micro-batch (its own state rows), on a side stream of higher
  priority that forks from and joins the captured stream through events (PyTorch's recipe for
  several streams in one graph);
* FlashMLA's sparse fp8 decode (vLLM 0.33's ``_flashmla_C``) over the flat device-pool view;
* the stand-in: ``torch.mm`` of the batch's hidden states by bfloat16 matrices cycled from a
  ring larger than the L2 cache, ``standin_bytes`` of weights read per step.

Graphs share one memory pool; every graph's outputs stay referenced while the graph lives.
"""

import os
import time

import hisparse
import numpy as np
import torch

from . import rows as R
from .config import layer_calls, micro_batches
from .stats import overlap_of

_flashmla = None


def unavailable(lib):
    """Why the GPU run cannot start (None when it can)."""
    if not torch.cuda.is_available():
        return "no CUDA device (PyTorch sees none)"
    if "cuda" not in hisparse.backends():
        return "the hisparse wheel has no cuda backend"
    if not lib or not os.path.exists(lib):
        return ("FlashMLA's library not found: run scripts/fetch-vllm-kernels.sh and pass "
                "--flashmla-lib (or HISPARSE_FLASHMLA_LIB)")
    return None


def load_flashmla(lib):
    global _flashmla
    torch.ops.load_library(lib)
    _flashmla = torch.ops._flashmla_C.sparse_decode_fwd


def device_name():
    p = torch.cuda.get_device_properties(0)
    return f"{p.name} ({p.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, CUDA {torch.version.cuda}"


def _events_ms(fn, repeat=5):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    a.record()
    for _ in range(repeat):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / repeat


def ceilings(nbytes=1 << 30):
    """Same-run ceilings: bulk pinned host→device and device→device copies."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty_like(dev)
    h2d = _events_ms(lambda: dev.copy_(host, non_blocking=True))
    d2d = _events_ms(lambda: dev2.copy_(dev))
    return {"h2d_gb_s": nbytes / h2d / 1e6, "d2d_gb_s": 2 * nbytes / d2d / 1e6, "bytes": nbytes}


class _Graph:
    def __init__(self, fn, pool):
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn()

    def replay(self):
        self.graph.replay()

    def outputs(self):
        return self.out


class TorchKernels:
    """See ``driver`` for what each method is for."""

    @classmethod
    def pool_limit(cls, cfg) -> int:
        if cfg.gpu_pool_limit:
            return cfg.gpu_pool_limit
        free, _ = torch.cuda.mem_get_info()
        return max(free - cfg.gpu_headroom, 0)

    def __init__(self, cfg, layout, backend, *, state_rows, max_batched_tokens):
        self.cfg, self.layout = cfg, layout
        self.pool = torch.zeros(layout.gpu_pool_bytes, dtype=torch.uint8, device="cuda")
        self.rt = hisparse.Runtime(layout, backend, state_rows=state_rows, max_step_tokens=state_rows,
                                   max_batched_tokens=max_batched_tokens, device_pool=self.pool)
        self.kv_table = torch.from_numpy(R.kv_table(cfg.kv_table_rows, cfg.seed)).cuda()
        self.key_table = torch.from_numpy(R.indexer_table(cfg.indexer_table_rows, cfg.seed)).cuda()
        groups = self.rt.slot_mapping_groups()
        self.slots = torch.as_tensor(self.rt.slot_mapping(), device="cuda")
        self.indexer_table = torch.as_tensor(self.rt.indexer_table(), device="cuda")
        self.kv_rows, self.kv4, self.key_pages = {}, {}, {}
        for v in (R.whole_view(v, layout.gpu_pool_bytes) for v in layout.gpu_views()):
            if v["kind"] == "resident":
                flat = hisparse.pool_rows(self.pool, v)
                self.kv_rows[v["layer"]] = (groups.index(v["group"]), flat)
                self.kv4[v["layer"]] = flat.view(v["num_pages"], v["rows_per_page"], 1, v["row_bytes"])
            elif v["kind"] == "indexer":
                self.key_pages[v["layer"]] = (groups.index(v["group"]), hisparse.pool_view(self.pool, v))
        self.K = layout.top_k
        self.G = len(layout.index_groups)
        self.L = len(self.kv_rows)
        self.pages = -(-layout.max_model_len // layout.block_size)
        self.sm_scale = R.QK_DIM ** -0.5
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(cfg.seed + 7)
        self.graph_pool = torch.cuda.graph_pool_handle()
        # The micro-batches' calls run here, ahead of the work queued behind them on the main
        # stream (the indexer of the next micro-batch, the attention of the previous one).
        self.side = torch.cuda.Stream(priority=-1)
        self.ring = None
        if cfg.standin_bytes:
            d = cfg.standin_width
            mat = d * d * 2
            n = max(2, -(-(512 << 20) // mat))  # a ring far larger than the L2 cache
            self.ring = torch.randn((n, d, d), generator=self.gen, device="cuda").to(torch.bfloat16) * 0.01
            per_layer = cfg.standin_bytes // self.L
            self.standin_plan = []
            k = 0
            for _ in range(self.L):
                full, rest = divmod(per_layer, mat)
                cols = rest // (d * 2)
                mats = [(k + i) % n for i in range(full)]
                k += full
                self.standin_plan.append((mats, (k % n, cols) if cols else None))
                k += 1 if cols else 0
        self.bound = False
        self.indexer_kind = cfg.indexer
        self.indexer_checked = False
        if self.indexer_kind == "triton":
            from . import indexer_triton
            self._triton = indexer_triton

    # ---- writes ---------------------------------------------------------------------------

    def _write(self, req, pos, width, layers):
        for layer in layers:
            w, view = self.kv_rows[layer]
            slot = self.slots[w, :width].long()
            h = R.row_hash(req, layer, pos, R.KV_SALT) % self.kv_table.shape[0]
            view.index_copy_(0, slot, self.kv_table.index_select(0, h))
            w, pages = self.key_pages[layer]
            slot = self.slots[w, :width].long()
            rpp = pages.shape[1]
            h = R.row_hash(req, layer, pos, R.INDEXER_SALT) % self.key_table.shape[0]
            pages.index_put_((slot // rpp, slot % rpp), self.key_table.index_select(0, h))

    def write_tokens(self, req, pos):
        n = len(req)
        req = torch.from_numpy(req).cuda()
        pos = torch.from_numpy(pos).cuda()
        self._write(req, pos, n, list(self.kv_rows))

    # ---- a batch's static state -------------------------------------------------------------

    def bind(self, B, ids):
        cfg, dev = self.cfg, "cuda"
        self.B = B
        self.index_of = {rid: i for i, rid in enumerate(ids)}
        H = cfg.indexer_heads
        self.q_state = torch.randn((B, H, R.INDEXER_DIM), generator=self.gen, device=dev)
        self.head_w = torch.rand((B, H), generator=self.gen, device=dev) + 0.5
        self.req = torch.zeros(B, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(B, dtype=torch.int64, device=dev)
        self.state = torch.zeros(B, dtype=torch.int64, device=dev)
        self.q_idx = torch.zeros((B, H, R.INDEXER_DIM), dtype=torch.bfloat16, device=dev)
        self.w_idx = torch.zeros((B, 1, H), dtype=torch.bfloat16, device=dev)
        self.q_attn = torch.zeros((self.L, B, 1, cfg.heads, R.QK_DIM), dtype=torch.bfloat16, device=dev)
        width = self.pages * self.layout.block_size
        self.scores = torch.zeros((self.L, B, width), dtype=torch.float32, device=dev)
        self.positions = torch.arange(width, device=dev)
        self.topk_buf = torch.full((self.G, B, self.K), -1, dtype=torch.int32, device=dev)
        self.rows_buf = torch.full((self.G, B, self.K), -1, dtype=torch.int32, device=dev)
        self.counts = torch.zeros((self.G, -(-B // 4) * 4), dtype=torch.int32, device=dev)
        self.parts = micro_batches(B, cfg.micro_batches)
        self.calls, self.part_state, self.part_calls = layer_calls(
            self.rt, self.topk_buf, self.rows_buf, self.counts, self.parts,
            lambda shape: torch.zeros(shape, dtype=torch.int32, device=dev))
        self.meta = {}
        if self.ring is not None:
            self.x = torch.randn((B, cfg.standin_width), generator=self.gen, device=dev).to(torch.bfloat16)
            self.y = torch.empty_like(self.x)
        self.bound = True

    def unbind(self):
        torch.cuda.synchronize()
        self.calls = self.part_calls = self.meta = None
        self.scores = self.q_attn = None
        self.bound = False

    def close(self):
        torch.cuda.synchronize()
        self.calls = self.part_calls = None
        self.rt = None
        self.pool = None
        torch.cuda.empty_cache()

    def set_inputs(self, scheduled, rho):
        order = torch.tensor([self.index_of[s["id"]] for s in scheduled], device="cuda")
        self.req.copy_(torch.tensor([s["id"] for s in scheduled]), non_blocking=True)
        self.pos.copy_(torch.tensor([s["first_token"] for s in scheduled]), non_blocking=True)
        self.state.copy_(torch.tensor([s["slot"] for s in scheduled]), non_blocking=True)
        for (a, b), rows in zip(self.parts, self.part_state):
            rows.copy_(self.state[a:b])
        noise = torch.randn(self.q_state.shape, generator=self.gen, device="cuda")
        self.q_state.mul_(rho).add_(noise, alpha=float(np.sqrt(max(1 - rho * rho, 0.0))))
        self.q_idx.copy_(self.q_state.index_select(0, order))
        self.w_idx.copy_(self.head_w.index_select(0, order)[:, None, :])
        self.q_attn.copy_(torch.randn(self.q_attn.shape, generator=self.gen, device="cuda"))
        if self.indexer_kind == "triton" and not self.indexer_checked:
            # Eager, before the first capture: compiles the kernel and checks it once.
            self.check_indexer(self.layout.index_groups[0]["leader"])

    # ---- the pieces of a step ---------------------------------------------------------------

    def write(self, layer):
        self._write(self.req, self.pos, self.B, [layer])

    def _logits(self, layer, q_idx, a=0, b=None):
        """The PyTorch ops' logits of rows ``a:b`` of the batch (``q_idx``: those rows')."""
        b = self.B if b is None else b
        _, pages = self.key_pages[layer]
        table = self.indexer_table.index_select(0, self.state[a:b])[:, : self.pages].long()
        keys = pages[table].reshape(b - a, -1, R.INDEXER_ROW_BYTES)
        vals = keys[..., : R.INDEXER_DIM].view(torch.float8_e4m3fn).to(torch.bfloat16)
        scale = keys[..., R.INDEXER_DIM:].contiguous().view(torch.float32)[..., 0]
        s = torch.relu(torch.bmm(vals, q_idx.transpose(1, 2)))  # [B, positions, heads]
        logits = torch.bmm(self.w_idx[a:b], s.transpose(1, 2))[:, 0, :].float() * scale
        return logits.masked_fill(self.positions[None, :] > self.pos[a:b, None], float("-inf"))

    def _triton_logits(self, layer, out, a=0, b=None):
        _, pages = self.key_pages[layer]
        self._triton.logits(pages, self.indexer_table, self.state[a:b], self.pos[a:b], self.q_idx[a:b],
                            self.w_idx[a:b, 0, :], out, R.INDEXER_DIM)

    def indexer(self, layer, part=None):
        """The scores of every request, or of micro-batch ``part``'s."""
        a, b = self.parts[part] if part is not None else (0, self.B)
        if self.indexer_kind == "torch":
            self.scores[layer, a:b].copy_(self._logits(layer, self.q_idx[a:b], a, b))
            return
        self._triton_logits(layer, self.scores[layer, a:b], a, b)

    def check_indexer(self, layer):
        """The Triton logits of ``layer`` against the PyTorch ops' (equal up to bfloat16
        rounding of the intermediates); raises when they differ by more."""
        want = self._logits(layer, self.q_idx)
        got = torch.empty_like(self.scores[layer])
        self._triton_logits(layer, got)
        live = torch.isfinite(want)
        if not torch.equal(live, torch.isfinite(got)):
            raise RuntimeError("the Triton indexer masks other positions than the PyTorch ops")
        err = (got[live] - want[live]).abs().max().item() if live.any() else 0.0
        scale = want[live].abs().max().item() if live.any() else 0.0
        if err > 0.02 * max(scale, 1e-6):
            raise RuntimeError(f"the Triton indexer's logits differ from the PyTorch ops' by {err:.3g} "
                               f"(largest logit {scale:.3g})")
        self.indexer_checked = True
        self.indexer_check = {"layer": layer, "max_abs_error": err, "max_abs_logit": scale}

    def topk(self, g, layer, part=None):
        a, b = self.parts[part] if part is not None else (0, self.B)
        self.topk_buf[g, a:b].copy_(torch.topk(self.scores[layer, a:b], self.K, dim=-1, sorted=False).indices)

    def resolve(self, arm, g, part=None):
        if part is None:
            self.calls[arm][g]()
        else:
            self.part_calls[arm][g][part]()

    def attention(self, layer, g, part=None):
        """FlashMLA over the rows of every request, or of micro-batch ``part``'s (its own
        scheduling metadata, made by the first call outside a capture)."""
        a, b = self.parts[part] if part is not None else (0, self.B)
        meta, splits = self.meta.get((layer, part), (None, None))
        out, lse, meta, splits = _flashmla(self.q_attn[layer, a:b], self.kv4[layer],
                                           self.rows_buf[g, a:b].unsqueeze(1), None, None, meta, splits,
                                           None, None, None, R.NOPE, self.sm_scale, None, False)
        self.meta[(layer, part)] = (meta, splits)
        return out, lse

    def can_pipeline(self):
        """Whether the pipelined step runs: several micro-batches."""
        return len(self.parts) > 1

    def join(self, outs):
        """One micro-batch output per part → the batch's (PyTorch tensors, outside a graph)."""
        return tuple(torch.cat(x) for x in zip(*outs))

    def on_side(self, fn):
        """Runs ``fn``'s work on the side stream after the work queued so far; returns the
        event that marks its end (the fork and join of a multi-stream capture)."""
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            fn()
            done = torch.cuda.Event()
            done.record(self.side)
        return done

    def wait(self, event):
        """The current stream's later work waits for ``event``."""
        torch.cuda.current_stream().wait_event(event)

    def standin(self, layer):
        if self.ring is None:
            return
        mats, part = self.standin_plan[layer]
        for m in mats:
            torch.mm(self.x, self.ring[m], out=self.y)
        if part:
            m, cols = part
            torch.mm(self.x, self.ring[m][:, :cols], out=self.y[:, :cols])

    def eager(self, arm):
        t = time.perf_counter()
        for g, grp in enumerate(self.layout.index_groups):
            for l in grp["layers"]:
                self.write(l)
            self.indexer(grp["layers"][0])
            self.topk(g, grp["layers"][0])
            self.resolve(arm, g)
            for l in grp["layers"]:
                self.attention(l, g)
                if len(self.parts) > 1:
                    # Each micro-batch's FlashMLA metadata, made here, outside any capture.
                    for p in range(len(self.parts)):
                        self.attention(l, g, p)
                self.standin(l)
        return {"graph": time.perf_counter() - t}

    # ---- graphs and time --------------------------------------------------------------------

    def new_graph_pool(self):
        """A fresh memory pool for the next set of graphs (PyTorch refuses to capture into a
        pool whose graphs were all destroyed)."""
        self.graph_pool = torch.cuda.graph_pool_handle()

    def capture(self, fn):
        return _Graph(fn, self.graph_pool)

    def timed(self, fn):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        return lambda: a.elapsed_time(b) / 1e3  # read after the step's synchronisation

    def timed_sequence(self, pieces):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(pieces) + 1)]
        ev[0].record()
        for i, (_, fn) in enumerate(pieces):
            fn()
            ev[i + 1].record()
        return {name: (lambda i=i: ev[i].elapsed_time(ev[i + 1]) / 1e3)
                for i, (name, _) in enumerate(pieces)}

    def sync(self):
        torch.cuda.current_stream().synchronize()

    # ---- what the checks read ---------------------------------------------------------------

    def topk_host(self):
        return self.topk_buf[[0, self.G // 2, self.G - 1]].cpu().numpy()

    def indexer_overlap(self, rho, steps):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(self.cfg.seed + 11)
        q = torch.randn(self.q_idx.shape, generator=gen, device="cuda")
        layer = self.layout.index_groups[0]["leader"]
        prev, shares = None, []
        for _ in range(steps + 1):
            cur = torch.topk(self._logits(layer, q.to(torch.bfloat16)), self.K, dim=-1).indices.cpu().numpy()
            if prev is not None:
                shares.append(overlap_of(prev, cur))
            prev = cur
            q = rho * q + float(np.sqrt(1 - rho * rho)) * torch.randn(q.shape, generator=gen, device="cuda")
        return float(np.mean(shares))

    def snapshot(self, scheduled, outs):
        return {"req": self.req.cpu().numpy(), "topk": self.topk_buf.clone(), "q_attn": self.q_attn.clone(),
                "outs": [(o.clone(), s.clone()) for o, s in outs]}

    def _layer_order(self):
        return [l for grp in self.layout.index_groups for l in grp["layers"]]

    def compare_with_reference(self, snap, parts=None):
        """Each layer's output against FlashMLA over the rows the forward wrote, gathered from
        the row tables at the step's top-k into a compact cache (same page size); one FlashMLA
        call per micro-batch of ``parts`` (as the pipelined step called it: its split of the
        work depends on the batch), else one over the batch."""
        bad = []
        group_of = {l: g for g, grp in enumerate(self.layout.index_groups) for l in grp["layers"]}
        req = torch.from_numpy(snap["req"]).cuda()
        rpp = next(iter(self.kv4.values())).shape[1]
        for i, layer in enumerate(self._layer_order()):
            top = snap["topk"][group_of[layer]].long()
            h = R.row_hash(req[:, None], layer, top.clamp(min=0), R.KV_SALT) % self.kv_table.shape[0]
            rows = self.kv_table[h.reshape(-1)]
            n = rows.shape[0]
            padded = torch.zeros((-(-n // rpp) * rpp, R.KV_ROW_BYTES), dtype=torch.uint8, device="cuda")
            padded[:n] = rows
            idx = torch.arange(n, dtype=torch.int32, device="cuda").view(self.B, self.K)
            idx = torch.where(top >= 0, idx, -1).unsqueeze(1).to(torch.int32)
            want = [_flashmla(snap["q_attn"][layer, a:b], padded.view(-1, rpp, 1, R.KV_ROW_BYTES), idx[a:b],
                              None, None, None, None, None, None, None, R.NOPE, self.sm_scale, None,
                              False)[:2] for a, b in (parts or [(0, self.B)])]
            out, lse = self.join(want)
            o, s = snap["outs"][i]
            if not (torch.equal(o, out) and torch.equal(s, lse)):
                bad.append(layer)
        return bad

    def _order(self, snap, scheduled):
        where = {int(r): i for i, r in enumerate(snap["req"])}
        return torch.tensor([where[s["id"]] for s in scheduled], device="cuda")

    def load_snapshot(self, snap, scheduled):
        o = self._order(snap, scheduled)
        self.topk_buf.copy_(snap["topk"][:, o])
        self.q_attn.copy_(snap["q_attn"][:, o])

    def compare_outputs(self, snap, outs, scheduled):
        o = self._order(snap, scheduled)
        bad = []
        for i, layer in enumerate(self._layer_order()):
            out, lse = snap["outs"][i]
            if not (torch.equal(outs[i][0], out[o]) and torch.equal(outs[i][1], lse[o])):
                bad.append(layer)
        return bad

    def memory(self):
        free, total = torch.cuda.mem_get_info()
        rss = 0
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        return {"gpu_pool_bytes": int(self.layout.gpu_pool_bytes),
                "host_pool_bytes": int(self.layout.host_pool_bytes),
                "gpu_used_bytes": int(total - free),
                "torch_max_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "process_rss_bytes": rss}
