#!/usr/bin/env bash
# On the GPU machine: installs the hisparse wheel carried in gpu-python/ (built here by
# .ci/gpu/python-build.sh) with `pip install --no-index --target`, then runs
# examples/torch_decode.py — a PyTorch decode loop whose KV lives in hisparse's host pool, with
# PyTorch's tensors and current stream lent to the runtime — in three configurations:
#
#   default       4 layers, 8 requests x 8192 tokens, 32 decode steps, top-k 256, the pinned host
#                 pool a PyTorch tensor
#   runtime-host  the same with the host pool allocated by hisparse
#   large         8 layers, 16 requests x 32768 tokens, 16 decode steps, top-k 2048
#
# Each writes $OUT/<name>.log and $OUT/<name>.json; the summary line of each says IDENTICAL (every
# gathered row and attention output equal to the full-KV computation) or MISMATCH, and gives the
# mean per-step times with and without hisparse. Exits non-zero if any run failed.
# About 2 minutes.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
nvrtc=/usr/local/cuda-13.0/targets/x86_64-linux/lib
[[ -d "$nvrtc" ]] && export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

wheel=$(ls gpu-python/hisparse-*.whl 2>/dev/null | head -n 1)
if [[ -z "$wheel" ]]; then
    echo "no wheel in gpu-python/: build it with .ci/gpu/python-build.sh and carry gpu-python" >&2
    exit 2
fi
site=$(mktemp -d)
if ! python3 -m pip install --quiet --no-index --no-deps --target "$site" "$wheel" > "$OUT/pip.log" 2>&1; then
    echo "pip install of $wheel failed:" >&2
    cat "$OUT/pip.log" >&2
    exit 2
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import numpy" 2>/dev/null; then
    echo "no numpy in $(command -v python3): installing the carried one"
    python3 -m pip install --quiet --no-index --no-deps --target "$site" gpu-python/fallback/numpy-*.whl \
        >> "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log" >&2; exit 2; }
fi
cp gpu-python/MANIFEST "$OUT/wheel-MANIFEST" 2>/dev/null || true
python3 - <<'PY' 2>&1 | tee "$OUT/environment.txt"
import hisparse, numpy, torch
print(f"hisparse {hisparse.__version__} from {hisparse.__file__}, backends {hisparse.backends()}")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {torch.cuda.get_device_name(0)}")
print(f"numpy {numpy.__version__}")
PY

failed=0
run() {
    local name=$1
    shift
    local t0=$SECONDS rc
    timeout 300 python3 examples/torch_decode.py "$@" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "== $name (rc $rc, $((SECONDS - t0)) s): $*"
    grep -E "^(GPU pool|prefill|counters|mean over|IDENTICAL|MISMATCH|FAILED)" "$OUT/$name.log"
    if [[ $rc -ne 0 ]]; then
        failed=1
        tail -n 20 "$OUT/$name.log"
    fi
}
run default
run runtime-host --host-pool runtime
run large --layers 8 --requests 16 --context 32768 --decode-steps 16 --top-k 2048
if [[ $failed -ne 0 ]]; then
    echo "python-torch: FAILED (logs in $OUT)"
    exit 1
fi
echo "python-torch: all runs IDENTICAL (logs and JSON in $OUT)"
