#!/usr/bin/env bash
# On the GPU machine, from the repository root, with gpu-engine/ and gpu-python/ of
# .ci/gpu/engine-build.sh carried: the engine-integration checks in one run, each a section
# with its own limit inside one budget (HISPARSE_GPU_BUDGET, default 540 s):
#
#   conformance      the conformance suite, a device required
#   graph-capture    per-layer calls captured in a CUDA graph, replayed, bit-exact
#   runtime-cuda     the runtime over engine-owned memory and streams
#   python           pytest with a device required: PyTorch's graph recipe over a whole decode step
#                    replayed 20 steps against an eager run (rows and counters), capture refusals,
#                    the current stream, the two-process test with each worker on the GPU
#   engine-loop      examples/engine_loop.py --backend cuda --graph (its own scheduler)
#   engine-loop-micro  the same with two micro-batch calls per group on a side stream, forked
#                    and joined inside the graph (--micro-batches 2)
#   flashmla-v3.2    examples/flashmla_decode.py: FlashMLA over HiSparse's rows, bit-identical to
#   flashmla-v4      an all-resident copy, the decode path in one CUDA graph (V3.2 and V4 rows)
#   host-overhead    host µs per eager per-layer call, 1-256 requests, beside its GPU time
#   remap-vs-vllm    the all-resident remap beside vLLM's Triton remap, same inputs, CUDA graphs
#                    (hisparse-py/bench/remap_vs_vllm.py), outputs bit-compared
#   split-attention  FlashMLA split at the misses (hits while the misses are gathered, then the
#                    misses, merged by LSE) beside the swap-in-then-attend path
#                    (hisparse-py/bench/split_attention.py)
#   host-pool        the pool registered on the GPU (test), then set-up/release at 8 and 64 GiB
#                    beside the same run's memset, and PyTorch's pin_memory at 64 GiB
#
# HISPARSE_SECTIONS="python flashmla-v4 ..." runs only the sections named. Logs in $OUT/engine/
# (and every log's tail in $OUT/engine/tails.txt), a summary on stdout and in summary.json.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=.ci/gpu/lib.sh
. .ci/gpu/lib.sh
budget "${HISPARSE_GPU_BUDGET:-540}"
bin=gpu-engine
out=${OUT:-/tmp/hisparse-gpu}/engine
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1 PYTHONUNBUFFERED=1
nvrtc=/usr/local/cuda-13.0/targets/x86_64-linux/lib
[[ -d "$nvrtc" ]] && export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cat "$bin/MANIFEST" gpu-python/MANIFEST 2>/dev/null | head -n 3
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
site=$(mktemp -d)
python3 -m pip install --quiet --no-index --no-deps --target "$site" gpu-python/hisparse-*.whl \
    > "$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 2; }
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export HISPARSE_FLASHMLA_LIB=$root/$bin/_flashmla_C.abi3.so

# Runs a section when HISPARSE_SECTIONS is unset or names it.
run_section() {
    if [[ -n "${HISPARSE_SECTIONS:-}" && " $HISPARSE_SECTIONS " != *" $1 "* ]]; then
        return
    fi
    section "$@"
}

run_section conformance 120 "$bin/cuda-conformance"
run_section graph-capture 40 "$bin/cuda-graph-capture"
run_section runtime-cuda 120 "$bin/runtime-cuda"
run_section python 200 sh -c "cd hisparse-py/tests && python3 -m pytest -v -p no:cacheprovider --timeout=90 --timeout-method=thread --ignore=test_layout.py ."
run_section engine-loop 40 python3 examples/engine_loop.py --backend cuda --graph
run_section engine-loop-micro 40 python3 examples/engine_loop.py --backend cuda --graph --micro-batches 2
run_section flashmla-v3.2 60 python3 examples/flashmla_decode.py --format v3.2 --json "$out/flashmla-v3.2.json"
run_section flashmla-v4 60 python3 examples/flashmla_decode.py --format v4 --json "$out/flashmla-v4.json"
run_section capi-engine 60 sh -c "cc -std=c11 -Wall -Wextra -Werror -I hisparse-capi/include hisparse-capi/examples/engine.c $bin/libhisparse_capi.a -lpthread -ldl -lm -o /tmp/hs-engine && /tmp/hs-engine cuda"
run_section host-overhead 40 python3 hisparse-py/bench/host_overhead.py --backend cuda --json "$out/host_overhead.json"
run_section remap-vs-vllm 90 python3 hisparse-py/bench/remap_vs_vllm.py --sparse-utils "$bin/sparse_utils.py" --json "$out/remap-vs-vllm.json"
run_section split-attention 90 python3 hisparse-py/bench/split_attention.py --flashmla-lib "$HISPARSE_FLASHMLA_LIB" --json "$out/split-attention.json"
run_section host-pool-test 40 "$bin/cuda-host-pool"
run_section host-pool-bench 90 sh -c "'$bin/hisparse' bench --backend cuda --host-pool 8GiB,64GiB --json > '$out/host-pool.json'"
run_section host-pool-torch 150 python3 scripts/bench/host_pool.py --backend cuda --sizes 64GiB --json "$out/host-pool-python.json"
for f in "$out"/*.log; do
    { echo "===== $(basename "$f")"; tail -n 40 "$f"; } >> "$out/tails.txt"
done
write_summary engine
