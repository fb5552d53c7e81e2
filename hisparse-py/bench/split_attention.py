"""Can the misses cross the bus behind the attention? FlashMLA's sparse decode split at the misses,
beside the swap-in-then-attend path, on one GPU.

HiSparse's decode path today brings a layer's misses into the hot buffer and then runs the
attention over all top-k rows, so the misses' bus time lies between the top-k and the attention.
Two ways to hide it were proposed: (1) FlashMLA reads the misses itself, from their own cache
(``extra_k_cache`` / ``extra_indices``), in the same call; (2) the attention over the hits runs
while the misses are gathered on a second stream, then a second call over the misses only, the
two merged by their log-sum-exp. This script measures what each costs with DeepSeek V3.2's rows
(656-byte fp8 rows, 64 heads, top-k 2048, 4096 hot rows per request, 32K contexts in pinned host
memory, ``--miss`` of each top-k missing):

- ``extra_kv``: whether the FlashMLA build accepts a second row set for this row format at all;
- ``all``: FlashMLA over every row from the hot buffer (the all-resident cost);
- ``hits_only`` / ``misses_only``: FlashMLA over the hits (misses masked -1) / over the misses;
- ``merge``: the LSE merge of the two outputs, as plain PyTorch ops (an upper bound: a fused
  kernel would be one launch);
- ``gather``: the misses' rows read from mapped pinned host memory into their hot rows by one
  PyTorch index copy (a stand-in for the swap-in gather; ``bulk_h2d`` is one copy of the same
  bytes, the bus ceiling);
- ``gather_then_all``: the path as it runs today (gather, then attention over all rows);
- ``split``: hits-only attention on the main stream while the gather runs on a second stream, then
  the misses-only attention and the merge.

Each figure is GPU time per call in a CUDA graph with L2 flushed before each call (the flush's
own time subtracted), mean of ``--replays``. The split's output is compared with the all-rows
call (it is not bit-identical: the softmax is summed in another order).

    python hisparse-py/bench/split_attention.py --flashmla-lib PATH/_flashmla_C.abi3.so \\
        [--batches 1 16 64] [--miss 0.1] [--json OUT.json]

Needs a CUDA GPU (sm_90), PyTorch and FlashMLA's library (``scripts/fetch-vllm-kernels.sh``).
"""

import argparse
import json
import sys

ROW = 656
HEADS = 64
TOP_K = 2048
HOT = 4096
CONTEXT = 32768
BLOCK = 64


class _Mapped:
    """A CUDA-array view of pinned host memory (device-accessible through unified addressing)."""

    def __init__(self, ptr, shape):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def rows(torch, n, g):
    """`n` valid V3.2 rows: fp8 NoPE values, four float32 scales, bf16 RoPE values."""
    nope = (torch.rand(n, 512, device="cuda", generator=g) * 2 - 1).to(torch.float8_e4m3fn)
    scales = torch.rand(n, 4, device="cuda", generator=g) * 0.02 + 0.01
    rope = (torch.rand(n, 64, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    return torch.cat([nope.view(torch.uint8), scales.view(torch.uint8), rope.view(torch.uint8)], 1)


def timed(torch, fn, flush, replays):
    """GPU µs per call of `fn` in a CUDA graph with L2 flushed first, the flush subtracted."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.synchronize()
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    with torch.cuda.graph(graphs[0]):
        flush.zero_()
        fn()
    with torch.cuda.graph(graphs[1]):
        flush.zero_()
    us = []
    for gr in graphs:
        gr.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            gr.replay()
        b.record()
        b.synchronize()
        us.append(a.elapsed_time(b) * 1000 / replays)
    return round(us[0] - us[1], 2)


def one_batch(torch, flashmla, batch, miss, replays, flush):
    g = torch.Generator(device="cuda")
    g.manual_seed(batch)
    nhost = batch * CONTEXT
    host_rows = rows(torch, nhost, g)
    host = torch.empty(nhost * ROW, dtype=torch.uint8).pin_memory()
    host.copy_(host_rows.view(-1).cpu())
    mapped = torch.as_tensor(_Mapped(host.data_ptr(), (nhost, ROW)), device="cuda")
    hot = torch.zeros(batch * HOT, ROW, dtype=torch.uint8, device="cuda")
    nmiss = int(round(TOP_K * miss))
    extra_k = max(BLOCK, -(-nmiss // BLOCK) * BLOCK)
    idx_all = torch.empty(batch, 1, TOP_K, dtype=torch.int32, device="cuda")
    idx_hits = torch.empty_like(idx_all)
    idx_misses = torch.full((batch, 1, extra_k), -1, dtype=torch.int32, device="cuda")
    idx_host = torch.full_like(idx_misses, -1)
    miss_slots, miss_rows = [], []
    for b in range(batch):
        pos = torch.randperm(CONTEXT, generator=g, device="cuda")[:TOP_K]
        host_row = b * CONTEXT + pos
        slots = b * HOT + torch.randperm(HOT, generator=g, device="cuda")[:TOP_K]
        hot[slots] = host_rows[host_row]
        idx_all[b, 0] = slots.int()
        missed = torch.randperm(TOP_K, generator=g, device="cuda")[:nmiss]
        hits = slots.clone().int()
        hits[missed] = -1
        idx_hits[b, 0] = hits
        idx_misses[b, 0, :nmiss] = slots[missed].int()
        idx_host[b, 0, :nmiss] = host_row[missed].int()
        miss_slots.append(slots[missed])
        miss_rows.append(host_row[missed])
    miss_slots, miss_rows = torch.cat(miss_slots), torch.cat(miss_rows)
    hot4 = hot.view(-1, BLOCK, 1, ROW)
    q = (torch.randn(batch, 1, HEADS, 576, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    scale = 576 ** -0.5
    meta = {}

    def attend(name, idx, extra=None, extra_idx=None):
        m, s = meta.get(name, (None, None))
        out, lse, m, s = flashmla(q, hot4, idx, None, None, m, s, extra, extra_idx, None, 512,
                                  scale, None, False)
        meta[name] = (m, s)
        return out, lse

    def merge(o1, l1, o2, l2):
        a = l1.permute(0, 2, 1).unsqueeze(-1)
        b = l2.permute(0, 2, 1).unsqueeze(-1)
        m = torch.maximum(a, b)
        wa, wb = torch.exp(a - m), torch.exp(b - m)
        return ((o1.float() * wa + o2.float() * wb) / (wa + wb)).to(torch.bfloat16)

    def gather():
        hot.index_copy_(0, miss_slots, mapped.index_select(0, miss_rows))

    side = torch.cuda.Stream()

    def split():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            gather()
        o1, l1 = attend("hits", idx_hits)
        torch.cuda.current_stream().wait_stream(side)
        o2, l2 = attend("misses", idx_misses)
        return merge(o1, l1, o2, l2)

    try:
        attend("extra", idx_hits, host_rows.view(-1, BLOCK, 1, ROW), idx_host)
        extra_kv = "accepted"
    except RuntimeError as e:
        extra_kv = "refused: " + str(e).strip().splitlines()[-1][-120:]
    o_all, _ = attend("all", idx_all)
    o_split = split()
    torch.cuda.synchronize()
    o1, l1 = attend("hits", idx_hits)
    o2, l2 = attend("misses", idx_misses)
    nbytes = nmiss * batch * ROW
    bulk_src = host[:nbytes]
    bulk_dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    t = lambda fn: timed(torch, fn, flush, replays)  # noqa: E731
    row = {
        "requests": batch,
        "misses_per_request": nmiss,
        "miss_bytes": nbytes,
        "extra_kv": extra_kv,
        "split_max_abs_diff": float((o_split.float() - o_all.float()).abs().max()),
        "all_max_abs": float(o_all.float().abs().max()),
        "us": {
            "all": t(lambda: attend("all", idx_all)),
            "hits_only": t(lambda: attend("hits", idx_hits)),
            "misses_only": t(lambda: attend("misses", idx_misses)),
            "merge": t(lambda: merge(o1, l1, o2, l2)),
            "gather": t(gather),
            "bulk_h2d": t(lambda: bulk_dst.copy_(bulk_src, non_blocking=True)),
            "gather_then_all": t(lambda: (gather(), attend("all", idx_all))),
            "split": t(split),
        },
    }
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flashmla-lib", required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--miss", type=float, default=0.1)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--json")
    a = p.parse_args(argv)
    if not 0 < a.miss < 1:
        raise SystemExit("--miss is the missed share of each top-k: between 0 and 1")
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 2
    torch.ops.load_library(a.flashmla_lib)
    flashmla = torch.ops._flashmla_C.sparse_decode_fwd
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    out = {"device": torch.cuda.get_device_name(0), "miss": a.miss, "rows": []}
    for batch in a.batches:
        row = one_batch(torch, flashmla, batch, a.miss, a.replays, flush)
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
