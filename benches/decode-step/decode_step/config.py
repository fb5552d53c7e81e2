"""What one benchmark run measures: the model geometry and the sweeps."""

import dataclasses
from typing import List, Optional, Tuple

GiB = 1 << 30

#: DeepSeek V3.2's weights (671 B parameters, fp8: one byte each) split over 8 GPUs: the default
#: weight bytes the stand-in for the rest of the model reads per decode step.
V32_WEIGHT_BYTES_PER_GPU_TP8 = 671 * 10**9 // 8


@dataclasses.dataclass
class Config:
    """A run's parameters. The defaults are the full sweep on the GPU."""

    preset: str = "deepseek-v3.2"
    #: The model's first layers only (None: all 61).
    layers: Optional[int] = None
    #: None: the model's (2048).
    top_k: Optional[int] = None
    #: FlashMLA's query heads (64 or 128; the kernel pads fewer).
    heads: int = 64
    #: The lightning indexer's query heads and their width.
    indexer_heads: int = 64
    #: How the indexer's logits are computed on the GPU: ``triton`` (one kernel reading each key
    #: once) or ``torch`` (PyTorch ops).
    indexer: str = "triton"
    contexts: List[int] = dataclasses.field(default_factory=lambda: [32768, 131072])
    batches: List[int] = dataclasses.field(default_factory=lambda: [1, 8, 32, 64, 128])
    #: Top-k overlap targets between adjacent steps; the first is the main one.
    overlaps: List[float] = dataclasses.field(default_factory=lambda: [0.9, 0.8, 0.95])
    #: KV budgets of GPU memory (bytes) each arm must fit in.
    budgets: List[int] = dataclasses.field(default_factory=lambda: [16 * GiB, 32 * GiB, 64 * GiB])
    #: Bytes of weights the stand-in reads per decode step (0: no stand-in).
    standin_bytes: int = V32_WEIGHT_BYTES_PER_GPU_TP8
    #: The stand-in's hidden width (its matrices are [width, width] bfloat16).
    standin_width: int = 7168
    warmup_steps: int = 3
    timed_steps: int = 10
    #: Before HiSparse's modes at each overlap, whole steps in windows of ``settle_window`` until
    #: a window misses no fewer than ``1 - settle_tolerance`` of the one before (at most
    #: ``settle_max_steps``): a batch fresh from prefill, or at a new overlap, misses far more in
    #: its first few dozen steps than later, and those steps must not land in the first mode timed.
    settle_window: int = 4
    settle_tolerance: float = 0.05
    settle_max_steps: int = 32
    #: Prefill tokens per step (the coordinator's max_batched_tokens).
    prefill_chunk: int = 16384
    #: Tokens each request may grow by while it is measured.
    decode_reserve: int = 512
    #: Host memory the pools may take (bytes); None: 90% of MemAvailable less 8 GiB.
    host_limit: Optional[int] = None
    #: GPU memory kept free of the pool for activations, graphs and the stand-in (bytes).
    gpu_headroom: int = 12 * GiB
    #: GPU pool ceiling (bytes); None: free memory less the headroom.
    gpu_pool_limit: Optional[int] = None
    #: Rows of the tables the synthetic rows are drawn from.
    kv_table_rows: int = 1 << 16
    indexer_table_rows: int = 1 << 18
    seed: int = 1
    #: Stop starting new configurations after this many seconds (None: no limit).
    time_budget: Optional[float] = None
    #: Micro-batches of HiSparse's pipelined step (1: no pipelined step): each micro-batch's
    #: swap-in crosses the bus while the next one's indexer and top-k, or the previous one's
    #: attention, run (``micro_batches``).
    micro_batches: int = 2
    #: What the pipelined step cuts into micro-batches: ``batch`` (each micro-batch's indexer,
    #: top-k, per-layer call and attention: its call overlaps the next one's indexer and top-k)
    #: or ``swap`` (the whole batch's indexer and top-k, then each micro-batch's per-layer call,
    #: its attention waiting for it: a call overlaps only the previous one's attention, and only
    #: FlashMLA runs twice per layer). On the H200 ``batch`` cost 4–5 ms a step in launches it
    #: splits (the indexer's top-k and FlashMLA twice per layer) for what it hid.
    pipeline_split: str = "batch"
    #: How the CUDA backend's swap-in gather walks the misses: ``auto`` (the production rule,
    #: in order for host arrays past 1 GiB a layer), ``all-rows`` or ``in-order``; set through
    #: ``HISPARSE_CUDA_GATHER_WALK`` before the runtime opens, so one run can compare the walks.
    gather_walk: str = "auto"
    #: Run the fully-resident HiSparse path (a pool that holds everything, nothing reclaimed)
    #: at batches up to this.
    resident_path_max_batch: int = 8


def micro_batches(batch: int, parts: int) -> List[Tuple[int, int]]:
    """The token rows ``[a, b)`` of each micro-batch of a decode batch of ``batch`` requests (one
    row each, so every request's rows fall in one micro-batch, as the runtime's calls require):
    ``parts`` runs of near-equal length, fewer when the batch has fewer requests, never empty."""
    n = max(1, min(parts, batch))
    bounds = [round(batch * i / n) for i in range(n + 1)]
    return list(zip(bounds, bounds[1:]))


#: Each arm's per-layer call: HiSparse's resolve and swap-in, the all-resident remap.
ARM_SWAPS = (("hisparse", "index_group"), ("all_resident", "prefill"))


def layer_calls(rt, topk, rows, counts, parts, zeros):
    """The prepared per-layer calls of a batch, numpy or PyTorch alike: ``calls[arm][g]`` over
    the whole batch (``topk``, ``rows``: ``[groups, B, top_k]``; ``counts``: ``[groups, >= B]``)
    and ``part_calls[arm][g][p]`` over micro-batch ``p`` of ``parts`` (``micro_batches``), each
    with its own state rows and counts (``zeros(shape)`` int32 arrays: lent arrays are 16-byte
    aligned, which slices at odd rows are not; slices of whole top-k rows are). Returns
    ``(calls, part_state, part_calls)``: the caller writes ``part_state[p]`` each step."""
    groups, batch = topk.shape[0], topk.shape[1]
    calls = {arm: [rt.layer_call(g, topk[g], rows[g], counts[g, :batch], swap=swap) for g in range(groups)]
             for arm, swap in ARM_SWAPS}
    part_state = [zeros((b - a,)) for a, b in parts]
    part_counts = [zeros((groups, -(-(b - a) // 4) * 4)) for a, b in parts]
    part_calls = {arm: [[rt.layer_call(g, topk[g, a:b], rows[g, a:b], part_counts[p][g, :b - a],
                                       state_rows=part_state[p], swap=swap)
                         for p, (a, b) in enumerate(parts)] for g in range(groups)]
                  for arm, swap in ARM_SWAPS}
    return calls, part_state, part_calls
