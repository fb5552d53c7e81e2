"""How many requests each arm fits in a KV budget of GPU memory, found by allocating.

The coordinator owns the block pools: for a budget, a context and ``n`` requests it plans the
layout the budget gives, prefills the ``n`` requests and decodes them (transfers reported done
at once, as a worker that keeps up would) and says whether all ``n`` decode together — for the
all-resident arm with every page still on the GPU (no request given a hot region, none reading
from host), for HiSparse without a preemption or a refusal. The planner's capacity report for
the same layout stands beside it. A dense all-resident engine (one cache of 656-B rows and
132-B indexer keys per layer, no block sharing) is counted from its bytes as well: HiSparse's
pool lays out a block per bucket of layers, which is not how such an engine would."""

from typing import Dict, Optional

import hisparse

from . import rows

#: Decode steps a fit must survive after every request has started decoding.
DECODE_PROBE_STEPS = 3


def read_mem_available() -> Optional[int]:
    """MemAvailable in bytes (None where /proc/meminfo has none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def host_limit(cfg) -> int:
    """Bytes of host memory the host pools may take."""
    if cfg.host_limit is not None:
        return cfg.host_limit
    avail = read_mem_available()
    if avail is None:
        raise SystemExit("no MemAvailable in /proc/meminfo: pass --host-limit")
    return max(int(avail * 0.9) - 8 * (1 << 30), 0)


def max_model_len(cfg, context: int) -> int:
    return context + cfg.decode_reserve


def probe_layout(cfg, context: int) -> "hisparse.Layout":
    """A layout of the model with room for one request: its block size and strides."""
    return plan(cfg, context, gpu_mem=1 << 40, host_mem=1 << 40)


def plan(cfg, context: int, *, gpu_mem: int = 0, num_gpu_blocks: Optional[int] = None,
         host_mem: int) -> "hisparse.Layout":
    return hisparse.plan_layout(cfg.preset, layers=cfg.layers, top_k=cfg.top_k,
                                max_model_len=max_model_len(cfg, context), gpu_mem=gpu_mem,
                                num_gpu_blocks=num_gpu_blocks, host_mem=host_mem)


def host_blocks_per_request(cfg, context: int, block_tokens: int) -> int:
    return -(-max_model_len(cfg, context) // block_tokens)


def host_bytes(cfg, context: int, requests: int, probe: "hisparse.Layout") -> int:
    """A host pool for ``requests`` requests (null and copy-on-write blocks, and a few spare)."""
    per = host_blocks_per_request(cfg, context, probe.block_size)
    return (requests * per + 8) * probe.host_bytes_per_block


def host_max_requests(cfg, context: int, probe: "hisparse.Layout", limit: int) -> int:
    """Requests whose host pages fit ``limit`` bytes: each block's pool stride and its pages of
    the indexer host cache the runtime pins beside the pool."""
    block = probe.host_bytes_per_block
    per = host_blocks_per_request(cfg, context, probe.block_size) * block
    return max((limit - 8 * block) // per, 0)


def dense_bytes_per_request(cfg, context: int, layers: int) -> int:
    """KV and indexer bytes of one request in a dense all-resident cache (64-token pages)."""
    pages = -(-context // 64)
    return pages * 64 * layers * (rows.KV_ROW_BYTES + rows.INDEXER_ROW_BYTES)


def fits(cfg, context: int, budget: int, n: int, arm: str) -> Dict:
    """Whether ``n`` requests of ``context`` tokens decode together in a GPU pool of ``budget``
    bytes; ``arm`` is ``"all_resident"`` or ``"hisparse"``. Returns the verdict and why."""
    probe = probe_layout(cfg, context)
    layout = plan(cfg, context, gpu_mem=budget, host_mem=host_bytes(cfg, context, max(n, 1), probe))
    if n == 0:
        return {"fits": True, "why": "no request"}
    coord = hisparse.Coordinator(layout, max_running=n, max_batched_tokens=cfg.prefill_chunk,
                                 enable_prefix_caching=False)
    prompt = list(range(context))
    ids = list(range(1, n + 1))
    for rid in ids:
        coord.admit(rid, prompt)
    decoding_steps = 0
    idle = 0
    for _ in range(4 * n * (-(-context // cfg.prefill_chunk) + 2) + 64):
        cmd = coord.step()
        if cmd.transfer_id is not None:
            coord.report(0, [cmd.transfer_id], [cmd.transfer_id])
        if cmd.preempted:
            return {"fits": False, "why": f"request {cmd.preempted[0]} preempted"}
        if cmd.refused:
            return {"fits": False, "why": f"refused: {cmd.refused[0]}"}
        done = [rid for rid in ids if coord.num_computed(rid) == coord.num_tokens(rid)]
        if len(done) == n:
            if decoding_steps >= DECODE_PROBE_STEPS:
                break
            if decoding_steps > 0 and not (len(cmd.scheduled) == n
                                           and all(s["num_tokens"] == 1 for s in cmd.scheduled)):
                return {"fits": False, "why": "not every request decodes in one step"}
            for rid in ids:
                coord.append_tokens(rid, [7])
            decoding_steps += 1
        idle = idle + 1 if not cmd.scheduled else 0
        if idle > 8:
            return {"fits": False, "why": "no progress: waiting for blocks"}
    else:
        return {"fits": False, "why": "did not reach decoding"}
    if arm == "all_resident":
        for rid in ids:
            if coord.has_hot_region(rid) or coord.host_only_pages(rid):
                return {"fits": False, "why": f"request {rid} reads from host"}
    return {"fits": True, "why": "every request decodes"}


def largest_fitting(cfg, context: int, budget: int, arm: str, ceiling: int,
                    guess: int) -> Dict:
    """The largest ``n ≤ ceiling`` that fits, searched from the planner's ``guess`` (fits is
    monotonic in ``n``: more requests never fit where fewer do not)."""
    tried = {}

    def ok(n):
        if n not in tried:
            tried[n] = fits(cfg, context, budget, n, arm)
        return tried[n]["fits"]

    n = max(min(guess, ceiling), 0)
    if ok(n):
        lo, hi = n, None
        step = 1
        while lo < ceiling:
            cand = min(lo + step, ceiling)
            if ok(cand):
                lo = cand
                step *= 2
            else:
                hi = cand
                break
    else:
        hi, lo = n, None
        step = 1
        while hi > 0:
            cand = max(hi - step, 0)
            if ok(cand):
                lo = cand
                break
            hi = cand
            step *= 2
        lo = lo or 0
    if hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
    why_next = tried.get(lo + 1, {}).get("why") if lo < ceiling else "host memory"
    return {"requests": lo, "next_refused_because": why_next,
            "probes": sorted(tried)}


def budget_report(cfg, context: int, budget: int, host_ceiling: int) -> Dict:
    """Per arm the largest batch found by allocating, the planner's capacity report of the
    same layout, and the dense all-resident engine's count from its bytes."""
    probe = probe_layout(cfg, context)
    layout = plan(cfg, context, gpu_mem=budget,
                  host_mem=host_bytes(cfg, context, max(host_ceiling, 1), probe))
    cap = layout.capacity(context)
    layers = len({v["layer"] for v in layout.gpu_views() if v["kind"] == "resident"})
    dense = budget // dense_bytes_per_request(cfg, context, layers)
    out = {
        "budget_bytes": budget,
        "context": context,
        "planner": cap,
        "host_max_requests": host_ceiling,
        "dense_all_resident_requests": int(min(dense, host_ceiling)),
        "dense_bytes_per_request": dense_bytes_per_request(cfg, context, layers),
    }
    out["all_resident"] = largest_fitting(cfg, context, budget, "all_resident", host_ceiling,
                                          cap["all_on_gpu_max"])
    out["hisparse"] = largest_fitting(cfg, context, budget, "hisparse", host_ceiling,
                                      min(cap["hisparse_gpu_max"], host_ceiling))
    return out
