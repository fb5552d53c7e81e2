"""The fully-resident remap beside vLLM's Triton remap, on identical inputs, in one process, both
in CUDA graphs.

Ours is the runtime's capturable per-layer call over the resident tables (``layer_call(...,
swap="prefill")``, the all-resident path an engine runs); vLLM's is
``sparse_mla_index_remap_kernel`` from its ``vllm/v1/attention/backends/mla/sparse_utils.py``
(``scripts/fetch-vllm-kernels.sh`` extracts that file from the vLLM wheel). The file imports vLLM
itself, so this script takes only the kernel and its tiling rule (``_remap_tiling``) out of it,
with Triton, and launches them as vLLM's dispatch does: a plain remap in tiles of 128 columns of 4
warps, counting in one program per row of 8 warps.

Both read the same request ids (token row → state row), the same block table (the runtime's
resident table, filled with random GPU block ids) and the same top-k (random positions of a 32K
context, with a few -1). Outputs and counts are compared bit for bit before anything is timed.
Each configuration is a CUDA graph of ``--calls`` launches, replayed ``--replays`` times; the
figure is GPU time per call (CUDA events around the replays), median of ``--repeats``. Caches
are warm (the same inputs every call).

    python hisparse-py/bench/remap_vs_vllm.py --sparse-utils PATH/sparse_utils.py \
        [--tokens 1 64 256 1024] [--json OUT.json]

Needs a CUDA GPU, PyTorch, Triton and the hisparse wheel built with CUDA.
"""

import argparse
import ast
import importlib.util
import os
import json
import statistics
import sys
import tempfile
import textwrap

BLOCK = 64
CONTEXT = 32768
TOP_K = 2048


def vllm_remap(path):
    """vLLM's remap kernel and its tiling rule, compiled from `path` without importing vLLM."""
    text = open(path).read()
    lines = text.splitlines()
    wanted = {"sparse_mla_index_remap_kernel", "_remap_tiling"}
    found = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            # The function and its Triton decorator (not the class's @staticmethod).
            decorators = ["@" + ast.get_source_segment(text, d) for d in node.decorator_list
                          if not (isinstance(d, ast.Name) and d.id == "staticmethod")]
            body = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))
            found[node.name] = "\n".join(decorators + [body])
    missing = wanted - found.keys()
    if missing:
        raise SystemExit(f"{path} has no {', '.join(sorted(missing))}: pass vLLM 0.33's "
                         "vllm/v1/attention/backends/mla/sparse_utils.py")
    # Triton reads a kernel's source back from its file, so the two functions become a module
    # of their own in a temporary directory (vLLM's source, run as written).
    folder = tempfile.mkdtemp(prefix="vllm-remap-")
    module_path = os.path.join(folder, "vllm_remap_kernel.py")
    with open(module_path, "w") as f:
        f.write("import triton\nimport triton.language as tl\n\n\n")
        f.write("\n\n\n".join(found[n] for n in ("_remap_tiling", "sparse_mla_index_remap_kernel")))
        f.write("\n")
    spec = importlib.util.spec_from_file_location("vllm_remap_kernel", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sparse_mla_index_remap_kernel, module._remap_tiling


def layout(requests):
    import hisparse

    layer = {"sparse": {"row_bytes": 64, "value_bytes": 64, "compress_ratio": 1,
                        "indexer_row_bytes": 16}}
    model = json.dumps({"name": "remap-bench", "block_tokens": BLOCK, "top_k": TOP_K,
                        "layers": [layer]})
    pages = CONTEXT // BLOCK
    return hisparse.plan_layout(model_json=model, gpu_mem=0, max_model_len=CONTEXT,
                                host_mem=(requests * (pages + 1) + 4) * (64 + 16) * BLOCK,
                                device_buffer_size=2 * TOP_K,
                                num_gpu_blocks=requests * pages + 8)


def open_step(lay, requests, max_tokens):
    """A CUDA runtime with an open step scheduling `requests` requests (per-layer calls need
    one), and their state rows."""
    import hisparse

    budget = max(max_tokens, requests * 16)
    rt = hisparse.Runtime(lay, "cuda", state_rows=requests, max_step_tokens=max_tokens,
                          max_batched_tokens=budget)
    coord = hisparse.Coordinator(lay, max_running=requests, max_batched_tokens=budget,
                                 enable_prefix_caching=False)
    for rid in range(requests):
        coord.admit(rid, [1] * 16)
        if not coord.start(rid, 16):
            raise SystemExit(f"request {rid} did not start: the layout is too small")
    cmd = coord.build_offload_command()
    rt.begin_step(cmd)
    return rt, [s["slot"] for s in cmd.scheduled]


def graph_us(torch, fn, calls, replays, repeats):
    """GPU time per call of `fn` captured `calls` times in one CUDA graph (median of repeats)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm (Triton compiles here)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / (replays * calls))
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sparse-utils", required=True, help="vLLM's sparse_utils.py")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 256, 1024])
    p.add_argument("--requests", type=int, default=64, help="state rows the token rows cycle over")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: nothing measured")
    kernel, tiling = vllm_remap(a.sparse_utils)
    lay = layout(a.requests)
    rt, slots = open_step(lay, a.requests, max(a.tokens))
    gen = torch.Generator(device="cuda").manual_seed(7)
    table = torch.as_tensor(rt.resident_table(0), device="cuda")  # the runtime's own table
    table.copy_(torch.randint(1, lay.num_gpu_blocks, table.shape, device="cuda",
                              dtype=torch.int32, generator=gen))
    stride = lay.attention_block_stride
    results = []
    for t in a.tokens:
        req = torch.tensor([slots[i % len(slots)] for i in range(t)], dtype=torch.int32,
                           device="cuda")
        topk = torch.randint(0, CONTEXT, (t, TOP_K), dtype=torch.int32, device="cuda",
                             generator=gen)
        topk[torch.rand((t, TOP_K), device="cuda", generator=gen) < 0.01] = -1
        for counting in (False, True):
            ours, theirs = torch.empty_like(topk), torch.empty_like(topk)
            c_ours = torch.zeros(t, dtype=torch.int32, device="cuda") if counting else None
            c_theirs = torch.zeros(t, dtype=torch.int32, device="cuda")
            call = rt.layer_call(0, topk, ours, c_ours, state_rows=req, swap="prefill")
            single, block_n, tiles, warps = tiling(TOP_K, 128, counting)

            def vllm():
                if counting and not single:
                    c_theirs.zero_()
                kernel[(t, tiles)](
                    req, table, topk, theirs, c_theirs, req, req, req, 0, table.shape[1],
                    BLOCK_SIZE=BLOCK, BLOCK_STRIDE_ROWS=stride, BLOCK_N=block_n,
                    NUM_TOPK_TOKENS=TOP_K, HAS_PREFILL=False, HAS_IDX_MAPPING=False,
                    COUNT_VALID=counting, SINGLE_TILE=single, COMPACT_TO_FRONT=False,
                    DCP_SIZE=1, DCP_RANK=0, DCP_INTERLEAVE=1,
                    bt_stride0=table.stride(0), bt_stride1=table.stride(1),
                    ti_stride0=topk.stride(0), ti_stride1=topk.stride(1),
                    out_stride0=theirs.stride(0), out_stride1=theirs.stride(1),
                    num_warps=warps)

            call()
            vllm()
            torch.cuda.synchronize()
            if not torch.equal(ours, theirs):
                bad = int((ours != theirs).sum())
                raise SystemExit(f"{t} tokens, counts={counting}: {bad} entries differ from vLLM's")
            if counting and not torch.equal(c_ours, c_theirs):
                raise SystemExit(f"{t} tokens: the valid counts differ from vLLM's")
            us_ours = graph_us(torch, call, a.calls, a.replays, a.repeats)
            us_vllm = graph_us(torch, vllm, a.calls, a.replays, a.repeats)
            mode = "counts" if counting else "plain"
            results.append({"tokens": t, "mode": mode, "hisparse_us": us_ours, "vllm_us": us_vllm,
                            "vllm_over_hisparse": us_vllm / us_ours, "entries_checked": t * TOP_K})
            print(f"remap {t:5d} tokens x {TOP_K}, {mode:6s}: hisparse {us_ours:7.2f} us, "
                  f"vLLM {us_vllm:7.2f} us, vLLM/hisparse {us_vllm / us_ours:5.2f}x "
                  f"({t * TOP_K} entries identical)")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "context": CONTEXT, "top_k": TOP_K, "block": BLOCK, "results": results}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
