#!/usr/bin/env python3
"""FlashMLA's sparse decode reading HiSparse's rows, bit for bit against an all-resident cache.

A DeepSeek decode loop on one GPU: requests prefill and decode through the coordinator and the
runtime, the forward pass writes every layer's KV rows (DeepSeek V3.2's 656-byte fp8_ds_mla
rows, or DeepSeek V4's 584-byte rows split into values and scales) through the runtime's device
slot mapping, and each decode step runs FlashMLA's sparse decode twice per layer:

* over HiSparse: the device pool (well below what an all-resident cache needs, so pages are
  reclaimed and rows swapped in from the pinned host pool) read at the rows the runtime resolved
  from the step's top-k;
* over an all-resident copy: every request's KV kept whole on the GPU, read at the same top-k.

Both outputs and both LSEs must be bit-identical, every layer and every step. The decode path
(HiSparse's per-layer calls and FlashMLA for every layer) is captured into one CUDA graph with
PyTorch's recipe and replayed for every decode step after the first.

The kernel library is vLLM 0.33's prebuilt FlashMLA (`_flashmla_C.abi3.so`, never part of this
repository): `scripts/fetch-vllm-kernels.sh` extracts it from the PyPI wheel; pass its path
with `--flashmla-lib` or `HISPARSE_FLASHMLA_LIB`. Without CUDA, PyTorch or the library the
example says so and exits 0, or 1 with `--require` (or `HISPARSE_REQUIRE_DEVICE=1`).

    scripts/fetch-vllm-kernels.sh
    python examples/flashmla_decode.py --format v3.2
    python examples/flashmla_decode.py --format v4
"""

import argparse
import json
import os
import sys
import time

FORMATS = {
    # preset, bytes per token in the cache, query/key width, value width
    "v3.2": ("deepseek-v3.2", 656, 576, 512),
    "v4": ("deepseek-v4", 584, 512, 512),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--format", choices=sorted(FORMATS), default="v3.2")
    p.add_argument("--layers", type=int, default=4,
                   help="sparse layers: the model's first layers up to this many sparse ones")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--context", type=int, default=16384, help="prompt tokens per request")
    p.add_argument("--decode-steps", type=int, default=12)
    p.add_argument("--heads", type=int, default=64, choices=[64, 128])
    p.add_argument("--top-k", type=int, default=None, help="default: the model's (2048)")
    p.add_argument("--overlap", type=float, default=0.9,
                   help="share of each request's top-k kept from the previous step")
    p.add_argument("--pool-fraction", type=float, default=0.5,
                   help="GPU pool as a share of what an all-resident cache needs")
    p.add_argument("--no-graph", action="store_true", help="run every decode step eagerly")
    p.add_argument("--flashmla-lib", default=os.environ.get("HISPARSE_FLASHMLA_LIB"))
    p.add_argument("--require", action="store_true",
                   default=os.environ.get("HISPARSE_REQUIRE_DEVICE") == "1",
                   help="exit 1 instead of 0 when CUDA, PyTorch or the library is missing")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the summary as JSON here")
    return p.parse_args(argv)


def unavailable(a, why):
    print(f"flashmla_decode: not run: {why}", file=sys.stderr)
    return 1 if a.require else 0


# ---- KV rows in the cache formats FlashMLA reads ---------------------------------------------


class V32Rows:
    """fp8_ds_mla, 656 bytes: 512 float8_e4m3 NoPE values, 4 float32 scales (one per 128
    values), 64 bfloat16 RoPE values. Contiguous rows."""

    split = False
    row_bytes = 656

    def __init__(self, torch):
        self.t = torch

    def make(self, gen, n):
        t = self.t
        nope = t.randn(n, 4, 128, generator=gen, device="cuda")
        scale = nope.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0
        q = (nope / scale).to(t.float8_e4m3fn).view(t.uint8).reshape(n, 512)
        s = scale.reshape(n, 4).to(t.float32).contiguous().view(t.uint8).reshape(n, 16)
        rope = t.randn(n, 64, generator=gen, device="cuda").to(t.bfloat16).view(t.uint8)
        return t.cat([q, s, rope.reshape(n, 128)], dim=1).contiguous()


class V4Rows:
    """DeepSeek V4, 584 bytes: a 576-byte data row (448 float8_e4m3 NoPE values, 64 bfloat16
    RoPE values) and an 8-byte scale row (7 float8_e8m0 scales, one per 64 values, and a pad
    byte). In a page, the rows' data come first and their scales after."""

    split = True
    row_bytes = 584
    values = 576

    def __init__(self, torch):
        self.t = torch

    def make(self, gen, n):
        t = self.t
        nope = t.randn(n, 7, 64, generator=gen, device="cuda")
        amax = nope.abs().amax(-1, keepdim=True).clamp(min=1e-4)
        exp = t.ceil(t.log2(amax / 448.0)).clamp(-126, 127)
        q = (nope / t.exp2(exp)).to(t.float8_e4m3fn).view(t.uint8).reshape(n, 448)
        rope = t.randn(n, 64, generator=gen, device="cuda").to(t.bfloat16).view(t.uint8)
        scales = (exp.reshape(n, 7) + 127).to(t.uint8)
        pad = t.zeros(n, 1, dtype=t.uint8, device="cuda")
        return t.cat([q, rope.reshape(n, 128), scales, pad], dim=1).contiguous()


class Pages:
    """Writes rows into, and builds FlashMLA's `[pages, rows_per_page, 1, row_bytes]` tensor
    over, one layer's pages: HiSparse's device pool through the layer's view, or the
    all-resident copy (one page per 64 rows of a request)."""

    def __init__(self, torch, storage, offset, page_stride, num_pages, rows_per_page, rows):
        self.t, self.rows, self.rpp = torch, rows, rows_per_page
        self.row_bytes = rb = rows.row_bytes
        self.pages = storage.as_strided((num_pages, rows_per_page * rb), (page_stride, 1),
                                        storage.storage_offset() + offset)
        self.kv = storage.as_strided((num_pages, rows_per_page, 1, rb), (page_stride, rb, rb, 1),
                                     storage.storage_offset() + offset)

    def write(self, row_index, data):
        """Row `row_index[i]` (page `r // rows_per_page`, row `r % rows_per_page`) = `data[i]`."""
        t = self.t
        page, r = row_index // self.rpp, row_index % self.rpp
        if not self.rows.split:
            cols = r[:, None] * self.row_bytes + t.arange(self.row_bytes, device="cuda")[None, :]
            self.pages[page[:, None], cols] = data
            return
        v = self.rows.values
        vcols = r[:, None] * v + t.arange(v, device="cuda")[None, :]
        self.pages[page[:, None], vcols] = data[:, :v]
        scale = self.row_bytes - v
        scols = self.rpp * v + r[:, None] * scale + t.arange(scale, device="cuda")[None, :]
        self.pages[page[:, None], scols] = data[:, v:]


# ---- the loop ------------------------------------------------------------------------------


def main(argv=None):
    a = parse_args(argv)
    try:
        import torch
    except ImportError:
        return unavailable(a, "PyTorch is not installed")
    if not torch.cuda.is_available():
        return unavailable(a, "no CUDA device")
    if not a.flashmla_lib or not os.path.exists(a.flashmla_lib):
        return unavailable(a, "FlashMLA's library not found: run scripts/fetch-vllm-kernels.sh "
                              "and pass --flashmla-lib (or HISPARSE_FLASHMLA_LIB)")
    torch.ops.load_library(a.flashmla_lib)
    flashmla = torch.ops._flashmla_C.sparse_decode_fwd
    import hisparse

    preset, row_bytes, d_qk, d_v = FORMATS[a.format]
    rows_fmt = (V4Rows if a.format == "v4" else V32Rows)(torch)
    max_len = a.context + a.decode_steps + 64
    # The model's first layers, up to its `--layers`-th sparse one (DeepSeek V4 interleaves
    # sliding-window layers, which stay regular GPU groups).
    whole = hisparse.plan_layout(preset, max_model_len=max_len, host_mem=1 << 40, gpu_mem=1 << 40)
    sparse = sorted({v["layer"] for v in whole.gpu_views() if v["kind"] == "resident"})
    if a.layers > len(sparse):
        raise SystemExit(f"{preset} has {len(sparse)} sparse layers; pass --layers up to that")
    model_layers = sparse[a.layers - 1] + 1
    probe = hisparse.plan_layout(preset, layers=model_layers, max_model_len=max_len,
                                 host_mem=64 << 30, gpu_mem=64 << 30, top_k=a.top_k)
    ratio = probe.to_dict().get("sparse_compress_ratio", 1) or 1
    cap = probe.capacity(max_len)
    per_req = cap["gpu_blocks_per_request"]
    blocks = max(int(a.pool_fraction * per_req["all_on_gpu"] * a.requests),
                 per_req["hisparse"] * a.requests + cap["prefill_gpu_blocks"]) + 8
    host_blocks = a.requests * (-(-max_len // probe.to_dict()["block_tokens"]) + 1) + 8
    layout = hisparse.plan_layout(preset, layers=model_layers, max_model_len=max_len,
                                  host_mem=host_blocks * probe.host_bytes_per_block,
                                  gpu_mem=0, num_gpu_blocks=blocks, top_k=a.top_k)
    K = layout.top_k
    R = a.requests
    sparse_layers = [l for g in layout.index_groups for l in g["layers"]]
    chunk = 2048
    coord = hisparse.Coordinator(layout, max_running=R, max_batched_tokens=chunk,
                                 enable_prefix_caching=False)
    device_pool = torch.zeros(layout.gpu_pool_bytes, dtype=torch.uint8, device="cuda")
    rt = hisparse.Runtime(layout, "cuda", state_rows=R, max_step_tokens=R,
                          max_batched_tokens=chunk, device_pool=device_pool)
    write_groups = rt.slot_mapping_groups()
    slot_mapping = torch.as_tensor(rt.slot_mapping(), device="cuda")

    # Per sparse layer: HiSparse's pages (its resident bucket's view: the rows the resolver
    # returns index it) and the all-resident copy (request i's row c at page i * P + c // 64).
    rows_per_req = -(-max_len // ratio)
    ref_pages_per_req = -(-rows_per_req // layout.block_size)
    layers = {}
    for v in layout.gpu_views():
        if v["kind"] != "resident":
            continue
        hs = Pages(torch, device_pool, v["offset"], v["page_stride"], v["num_pages"],
                   v["rows_per_page"], rows_fmt)
        page_bytes = v["rows_per_page"] * row_bytes
        ref_store = torch.zeros(R * ref_pages_per_req * page_bytes, dtype=torch.uint8, device="cuda")
        ref = Pages(torch, ref_store, 0, page_bytes, R * ref_pages_per_req, v["rows_per_page"],
                    rows_fmt)
        layers[v["layer"]] = (write_groups.index(v["group"]), hs, ref)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(a.seed)
    req_index = {}

    def forward(cmd):
        """Every computed token's KV row of every sparse layer, written through the slot
        mapping into HiSparse's pool and at (request, row) into the all-resident copy."""
        s = cmd.scheduled
        if not s:
            return
        t = rt.step_tokens
        pos = torch.cat([torch.arange(x["first_token"], x["first_token"] + x["num_tokens"])
                         for x in s]).cuda()
        req = torch.cat([torch.full((x["num_tokens"],), req_index[x["id"]]) for x in s]).cuda()
        for layer, (w, hs, ref) in layers.items():
            slots = slot_mapping[w, :t].long()
            writes = slots >= 0  # compressed layers write one row every `ratio` tokens
            if not bool(writes.any()):
                continue
            data = rows_fmt.make(gen, int(writes.sum()))
            hs.write(slots[writes], data)
            ref_row = req[writes] * (ref_pages_per_req * layout.block_size) + pos[writes] // ratio
            ref.write(ref_row, data)

    # The decode path's static tensors (a graph replays them in place).
    G = len(layout.index_groups)
    topk = torch.full((G, R, K), -1, dtype=torch.int32, device="cuda")
    rows = torch.full((G, R, K), -1, dtype=torch.int32, device="cuda")
    q = torch.zeros((len(sparse_layers), R, 1, a.heads, d_qk), dtype=torch.bfloat16, device="cuda")
    sm_scale = d_qk ** -0.5
    calls = [rt.layer_call(g, topk[g], rows[g]) for g in range(G)]
    meta = {l: (None, None) for l in sparse_layers}

    def attention(layer, kv, indices, qi):
        m, s = meta[layer]
        out, lse, m, s = flashmla(q[qi], kv, indices, None, None, m, s, None, None, None,
                                  d_v, sm_scale, None, False)
        meta[layer] = (m, s)
        return out, lse

    def decode_path():
        """HiSparse's per-layer calls, then FlashMLA over its rows, for every layer."""
        outs = []
        for g, group in enumerate(layout.index_groups):
            calls[g]()
            for layer in group["layers"]:
                qi = sparse_layers.index(layer)
                outs.append(attention(layer, layers[layer][1].kv, rows[g].unsqueeze(1), qi))
        return outs

    for i in range(R):
        rid = 100 + i
        req_index[rid] = i
        coord.admit(rid, [(rid * 7919 + t) % 50000 for t in range(a.context)])
    prev = None
    graph = static_outs = None
    steps = decode_steps = replays = compared = 0
    t_decode = 0.0
    while not coord.is_empty():
        steps += 1
        if steps > 100_000:
            raise SystemExit("no progress")
        cmd = coord.step()
        rt.begin_step(cmd)
        forward(cmd)
        dec = [x for x in cmd.scheduled if x["num_tokens"] == 1]
        if len(dec) == R and decode_steps < a.decode_steps:
            decode_steps += 1
            # The indexer's top-k: rows of each request's context, `overlap` of them kept from
            # the previous step.
            sel = torch.empty((G, R, K), dtype=torch.int32, device="cuda")
            for i, x in enumerate(dec):
                n = (x["first_token"] + 1) // ratio
                for g in range(G):
                    fresh = torch.randperm(n, generator=gen, device="cuda")[:K].to(torch.int32)
                    if prev is not None:
                        keep = int(a.overlap * K)
                        fresh = torch.cat([prev[g, i, :keep], fresh[: K - keep]])
                    row = torch.full((K,), -1, dtype=torch.int32, device="cuda")
                    row[: fresh.numel()] = fresh
                    sel[g, i] = row
            prev = sel
            topk.copy_(sel)
            q.copy_(torch.randn(q.shape, generator=gen, device="cuda").to(torch.bfloat16))
            rt.set_batch([x["slot"] for x in dec], pad_to=R)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if a.no_graph or decode_steps == 1:
                outs = decode_path()  # the first step eagerly: FlashMLA's metadata is made here
            else:
                if graph is None:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        static_outs = decode_path()
                graph.replay()
                replays += 1
                outs = static_outs
            torch.cuda.synchronize()
            t_decode += time.perf_counter() - t0
            # The all-resident reference: the same top-k at each request's rows of the copy.
            base = (torch.tensor([req_index[x["id"]] for x in dec], device="cuda")
                    * (ref_pages_per_req * layout.block_size)).to(torch.int32)
            k = 0
            for g, group in enumerate(layout.index_groups):
                ref_idx = torch.where(sel[g] >= 0, sel[g] + base[:, None], -1).unsqueeze(1)
                for layer in group["layers"]:
                    qi = sparse_layers.index(layer)
                    ref_out, ref_lse, _, _ = flashmla(q[qi], layers[layer][2].kv, ref_idx, None,
                                                      None, None, None, None, None, None, d_v,
                                                      sm_scale, None, False)
                    out, lse = outs[k]
                    k += 1
                    if not (torch.equal(out, ref_out) and torch.equal(lse, ref_lse)):
                        diff = (out.float() - ref_out.float()).abs().max().item()
                        print(f"step {decode_steps} layer {layer}: HiSparse's attention differs "
                              f"from the all-resident one (max |diff| {diff})", file=sys.stderr)
                        return 1
                    compared += 1
        rt.end_step(cmd)
        rt.poll_and_report(coord)
        for x in cmd.scheduled:
            rid = x["id"]
            if coord.num_computed(rid) == coord.num_tokens(rid):
                if decode_steps >= a.decode_steps:
                    coord.finish(rid)
                else:
                    coord.append_tokens(rid, [1 + rid % 1000])
    coord.report(rt.drain())  # the last transfers: their blocks go back
    c = rt.counters()
    usage = coord.pool_usage()
    summary = {
        "format": a.format, "layers": len(sparse_layers), "requests": R, "context": a.context,
        "heads": a.heads, "top_k": K, "decode_steps": decode_steps, "graph_replays": replays,
        "attention_calls_compared": compared, "bit_identical": True,
        "gpu_pool_blocks": blocks, "all_resident_blocks": per_req["all_on_gpu"] * R,
        "hot_hits": c["hot_hits"], "hot_misses": c["hot_misses"],
        "reclaimed_pages": c["reclaimed_pages"], "h2d_bytes": c["h2d_bytes"],
        "mean_decode_path_ms": 1e3 * t_decode / max(decode_steps, 1),
        "pools_empty": usage["gpu_used"] == 0 and usage["host_used"] == 0,
    }
    print(f"{a.format}: {compared} FlashMLA calls over HiSparse's rows bit-identical to the "
          f"all-resident cache ({decode_steps} decode steps, {replays} graph replays, "
          f"{len(sparse_layers)} layers x {R} requests x {a.context} tokens, GPU pool "
          f"{blocks} blocks vs {per_req['all_on_gpu'] * R} all-resident); "
          f"{c['hot_hits']} hits, {c['hot_misses']} misses, {c['reclaimed_pages']} pages reclaimed")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    if not summary["pools_empty"]:
        print(f"blocks still held after every request finished: {usage}", file=sys.stderr)
        return 1
    if c["hot_misses"] == 0 or c["reclaimed_pages"] == 0:
        print("no row was read from host: the check proved nothing; lower --pool-fraction",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
