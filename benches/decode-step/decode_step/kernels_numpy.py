"""The decode step's device work in numpy, on HiSparse's CPU backend: the dry run.

The same pieces as the GPU's (``kernels_torch``), at small shapes: the slot-mapping writes, the
lightning indexer (float32 scores over the whole context, a stable top-k), HiSparse's per-layer
calls, and the attention as ``rows.reference_attention`` over the rows the call returned (in
place of FlashMLA). No graphs: ``capture`` returns the function itself, and no streams: the
pipelined step's side-stream work runs in line. Timings are host seconds and mean nothing; the
dry run checks the plumbing and the bit-identity checks.
"""

import time

import hisparse
import numpy as np

from . import rows as R
from .config import layer_calls, micro_batches
from .stats import overlap_of


class _Eager:
    """What ``capture`` gives on the CPU: the function, run at each replay."""

    def __init__(self, fn):
        self.fn, self.last = fn, None

    def replay(self):
        self.last = self.fn()

    def outputs(self):
        return self.last


class NumpyKernels:
    """See ``driver`` for what each method is for."""

    @classmethod
    def pool_limit(cls, cfg) -> int:
        return cfg.gpu_pool_limit or (256 << 20)

    def __init__(self, cfg, layout, backend, *, state_rows, max_batched_tokens):
        self.cfg, self.layout = cfg, layout
        self.pool = hisparse.aligned_empty(layout.gpu_pool_bytes)
        self.pool[:] = 0
        self.rt = hisparse.Runtime(layout, backend, state_rows=state_rows, max_step_tokens=state_rows,
                                   max_batched_tokens=max_batched_tokens, device_pool=self.pool)
        self.kv_table = R.kv_table(cfg.kv_table_rows, cfg.seed)
        self.key_table = R.indexer_table(cfg.indexer_table_rows, cfg.seed)
        groups = self.rt.slot_mapping_groups()
        self.slots = np.asarray(self.rt.slot_mapping())
        self.kv_rows, self.key_pages = {}, {}
        for v in map(R.whole_view, layout.gpu_views(), [layout.gpu_pool_bytes] * 10**6):
            if v["kind"] == "resident":
                self.kv_rows[v["layer"]] = (groups.index(v["group"]), hisparse.pool_rows(self.pool, v))
            elif v["kind"] == "indexer":
                self.key_pages[v["layer"]] = (groups.index(v["group"]), hisparse.pool_view(self.pool, v))
        self.indexer_table = np.asarray(self.rt.indexer_table())
        self.K = layout.top_k
        self.G = len(layout.index_groups)
        self.rng = np.random.default_rng(cfg.seed + 7)
        self.max_len = layout.max_model_len
        self.pages = -(-self.max_len // layout.block_size)
        self.sm_scale = R.QK_DIM ** -0.5
        self.standin_w = None
        if cfg.standin_bytes:
            width = cfg.standin_width
            per_layer = max(cfg.standin_bytes // max(len(self.kv_rows), 1) // (width * width * 4), 1)
            self.standin_w = self.rng.standard_normal((per_layer, width, width)).astype(np.float32)

    # ---- writes ---------------------------------------------------------------------------

    def _write(self, req, pos, width):
        for layer, (w, view) in self.kv_rows.items():
            slot = self.slots[w, :width]
            view[slot] = self.kv_table[R.row_hash(req, layer, pos, R.KV_SALT) % len(self.kv_table)]
        for layer, (w, pages) in self.key_pages.items():
            slot = self.slots[w, :width]
            rows = pages.shape[1]
            h = R.row_hash(req, layer, pos, R.INDEXER_SALT) % len(self.key_table)
            pages[slot // rows, slot % rows] = self.key_table[h]

    def write_tokens(self, req, pos):
        self._write(req, pos, len(req))

    # ---- a batch's static state -------------------------------------------------------------

    def bind(self, B, ids):
        cfg = self.cfg
        self.B = B
        self.index_of = {rid: i for i, rid in enumerate(ids)}
        self.q_state = self.rng.standard_normal((B, cfg.indexer_heads, R.INDEXER_DIM)).astype(np.float32)
        self.head_w = self.rng.uniform(0.5, 1.5, (B, cfg.indexer_heads)).astype(np.float32)
        self.req = np.zeros(B, np.int64)
        self.pos = np.zeros(B, np.int64)
        self.state = np.zeros(B, np.int64)
        self.q_idx = np.zeros((B, cfg.indexer_heads, R.INDEXER_DIM), np.float32)
        self.w_idx = np.zeros((B, cfg.indexer_heads), np.float32)
        self.q_attn = np.zeros((len(self.kv_rows), B, cfg.heads, R.QK_DIM), np.float32)
        self.scores = np.zeros((len(self.kv_rows), B, self.pages * self.layout.block_size), np.float32)
        self.topk_buf = np.full((self.G, B, self.K), -1, np.int32)
        self.rows_buf = np.full((self.G, B, self.K), -1, np.int32)
        # Each group's counts 16-byte aligned (lent arrays must be).
        self.counts = np.zeros((self.G, -(-B // 4) * 4), np.int32)
        self.parts = micro_batches(B, cfg.micro_batches)
        self.calls, self.part_state, self.part_calls = layer_calls(
            self.rt, self.topk_buf, self.rows_buf, self.counts, self.parts,
            lambda shape: np.zeros(shape, np.int32))
        self.standin_x = np.ones((B, self.cfg.standin_width), np.float32)

    def unbind(self):
        self.calls = self.part_calls = None

    def set_inputs(self, scheduled, rho):
        """The step's per-row inputs: request, position, state row; the indexer queries drift
        (per request) by ``rho``; fresh attention queries."""
        order = np.array([self.index_of[s["id"]] for s in scheduled])
        self.req[:] = [s["id"] for s in scheduled]
        self.pos[:] = [s["first_token"] for s in scheduled]
        self.state[:] = [s["slot"] for s in scheduled]
        for (a, b), rows in zip(self.parts, self.part_state):
            rows[:] = self.state[a:b]
        noise = self.rng.standard_normal(self.q_state.shape).astype(np.float32)
        self.q_state = (rho * self.q_state + np.sqrt(max(1 - rho * rho, 0.0)) * noise).astype(np.float32)
        self.q_idx[:] = self.q_state[order]
        self.w_idx[:] = self.head_w[order]
        self.q_attn[:] = self.rng.standard_normal(self.q_attn.shape).astype(np.float32)

    # ---- the pieces of a step ---------------------------------------------------------------

    def write(self, layer):
        w, view = self.kv_rows[layer]
        slot = self.slots[w, :self.B]
        view[slot] = self.kv_table[R.row_hash(self.req, layer, self.pos, R.KV_SALT) % len(self.kv_table)]
        w, pages = self.key_pages[layer]
        slot = self.slots[w, :self.B]
        h = R.row_hash(self.req, layer, self.pos, R.INDEXER_SALT) % len(self.key_table)
        pages[slot // pages.shape[1], slot % pages.shape[1]] = self.key_table[h]

    def _logits(self, layer, q_idx, a=0, b=None):
        """The logits of rows ``a:b`` of the batch (``q_idx`` holds those rows' queries)."""
        b = self.B if b is None else b
        _, pages = self.key_pages[layer]
        table = self.indexer_table[self.state[a:b], : self.pages]
        keys = pages[table].reshape(b - a, -1, R.INDEXER_ROW_BYTES)
        vals, scale = R.decode_keys(keys)
        # Positions past the request's length hold whatever the block held before (masked).
        with np.errstate(over="ignore", invalid="ignore"):
            s = np.maximum(np.einsum("bhd,bld->bhl", q_idx, vals), 0.0)
            logits = np.einsum("bh,bhl->bl", self.w_idx[a:b], s) * scale
        positions = np.arange(logits.shape[1])[None, :]
        return np.where(positions <= self.pos[a:b, None], logits, -np.inf).astype(np.float32)

    def indexer(self, layer, part=None):
        a, b = self.parts[part] if part is not None else (0, self.B)
        self.scores[layer, a:b, :] = self._logits(layer, self.q_idx[a:b], a, b)

    def _select(self, logits):
        order = np.argsort(-logits, axis=-1, kind="stable")[:, : self.K]
        return np.where(np.take_along_axis(logits, order, -1) > -np.inf, order, -1).astype(np.int32)

    def topk(self, g, layer, part=None):
        a, b = self.parts[part] if part is not None else (0, self.B)
        self.topk_buf[g, a:b] = self._select(self.scores[layer, a:b])

    def resolve(self, arm, g, part=None):
        if part is None:
            self.calls[arm][g](self.B)
        else:
            self.part_calls[arm][g][part]()

    def attention(self, layer, g, part=None):
        a, b = self.parts[part] if part is not None else (0, self.B)
        _, view = self.kv_rows[layer]
        idx = self.rows_buf[g, a:b]
        return R.reference_attention(self.q_attn[layer, a:b], view[np.maximum(idx, 0)], idx >= 0,
                                     self.sm_scale)

    def can_pipeline(self):
        """Whether the pipelined step runs: several micro-batches."""
        return len(self.parts) > 1

    def join(self, outs):
        """One micro-batch output per part → the batch's."""
        return tuple(np.concatenate(x) for x in zip(*outs))

    def on_side(self, fn):
        """No streams on the CPU: ``fn`` runs now."""
        fn()

    def wait(self, event):
        """Nothing to wait for on the CPU."""

    def standin(self, layer):
        if self.standin_w is not None:
            for w in self.standin_w:
                self.standin_x = np.tanh(self.standin_x @ w)

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
                self.standin(l)
        return {"graph": time.perf_counter() - t}

    # ---- graphs and time --------------------------------------------------------------------

    def new_graph_pool(self):
        """No graphs on the CPU: nothing to pool."""

    def capture(self, fn):
        return _Eager(fn)

    def timed(self, fn):
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def timed_sequence(self, pieces):
        return {name: self.timed(fn) for name, fn in pieces}

    def sync(self):
        pass

    # ---- what the checks read ---------------------------------------------------------------

    def topk_host(self):
        return self.topk_buf[[0, self.G // 2, self.G - 1]].copy()

    def indexer_overlap(self, rho, steps):
        """Mean top-k overlap of layer 0 between adjacent steps when the indexer query drifts
        by ``rho`` (the batch's current rows; nothing is written)."""
        rng = np.random.default_rng(self.cfg.seed + 11)
        q = rng.standard_normal(self.q_idx.shape).astype(np.float32)
        layer = self.layout.index_groups[0]["leader"]
        prev, shares = None, []
        for _ in range(steps + 1):
            cur = self._select(self._logits(layer, q))
            if prev is not None:
                shares.append(overlap_of(prev, cur))
            prev = cur
            q = (rho * q + np.sqrt(1 - rho * rho) * rng.standard_normal(q.shape)).astype(np.float32)
        return float(np.mean(shares))

    def snapshot(self, scheduled, outs):
        return {"req": self.req.copy(), "topk": self.topk_buf.copy(), "q_attn": self.q_attn.copy(),
                "outs": [(o.copy(), s.copy()) for o, s in outs]}

    def _layer_order(self):
        return [l for grp in self.layout.index_groups for l in grp["layers"]]

    def compare_with_reference(self, snap, parts=None):
        """Each layer's output against the attention over the rows the forward wrote (row by
        row: ``parts`` changes nothing here)."""
        bad = []
        group_of = {l: g for g, grp in enumerate(self.layout.index_groups) for l in grp["layers"]}
        for i, layer in enumerate(self._layer_order()):
            top = snap["topk"][group_of[layer]]
            h = R.row_hash(snap["req"][:, None], layer, np.maximum(top, 0), R.KV_SALT)
            ref = R.reference_attention(snap["q_attn"][layer], self.kv_table[h % len(self.kv_table)],
                                        top >= 0, self.sm_scale)
            out, lse = snap["outs"][i]
            if not (np.array_equal(out, ref[0]) and np.array_equal(lse, ref[1])):
                bad.append(layer)
        return bad

    def _order(self, snap, scheduled):
        where = {int(r): i for i, r in enumerate(snap["req"])}
        return np.array([where[s["id"]] for s in scheduled])

    def load_snapshot(self, snap, scheduled):
        o = self._order(snap, scheduled)
        self.topk_buf[:] = snap["topk"][:, o]
        self.q_attn[:] = snap["q_attn"][:, o]

    def compare_outputs(self, snap, outs, scheduled):
        o = self._order(snap, scheduled)
        bad = []
        for i, layer in enumerate(self._layer_order()):
            out, lse = snap["outs"][i]
            if not (np.array_equal(outs[i][0], out[o]) and np.array_equal(outs[i][1], lse[o])):
                bad.append(layer)
        return bad

    def close(self):
        self.calls = self.part_calls = self.rt = None

    def memory(self):
        return {"gpu_pool_bytes": int(self.layout.gpu_pool_bytes),
                "host_pool_bytes": int(self.layout.host_pool_bytes)}
