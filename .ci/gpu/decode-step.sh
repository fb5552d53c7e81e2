#!/usr/bin/env bash
# On the GPU machine: the decode-step benchmark (benches/decode-step) over the carried wheel.
# Carry gpu-python/ (.ci/gpu/python-build.sh) and gpu-decode-step/_flashmla_C.abi3.so
# (scripts/fetch-vllm-kernels.sh --dest gpu-decode-step). Arguments go to run.py; with none,
# the full sweep under a 450 s budget. Results (JSON, tables, plot, log) in $OUT.
# HISPARSE_GPU_PYTHON names another folder of the wheel (a second build carried beside).
#
#   .ci/gpu/decode-step.sh --smoke          # a few configurations first
#   .ci/gpu/decode-step.sh                  # the full sweep
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
nvrtc=/usr/local/cuda-13.0/targets/x86_64-linux/lib
[[ -d "$nvrtc" ]] && export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=${HISPARSE_GPU_PYTHON:-gpu-python}
wheel=$(ls "$py"/hisparse-*.whl 2>/dev/null | head -n 1)
lib=gpu-decode-step/_flashmla_C.abi3.so
[[ -n "$wheel" ]] || { echo "no wheel in $py/: .ci/gpu/python-build.sh, carry $py" >&2; exit 2; }
[[ -f "$lib" ]] || { echo "no $lib: scripts/fetch-vllm-kernels.sh --dest gpu-decode-step, carry it" >&2; exit 2; }
site=$(mktemp -d)
python3 -m pip install --quiet --no-index --no-deps --target "$site" "$wheel" > "$OUT/pip.log" 2>&1 \
    || { cat "$OUT/pip.log" >&2; exit 2; }
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import numpy" 2>/dev/null || python3 -m pip install --quiet --no-index --no-deps \
    --target "$site" "$py"/fallback/numpy-*.whl >> "$OUT/pip.log" 2>&1
args=("$@")
[[ ${#args[@]} -eq 0 ]] && args=(--time-budget 450)
HISPARSE_COMMIT=$(cut -d' ' -f2 "$py"/MANIFEST 2>/dev/null | head -n 1) \
    python3 benches/decode-step/run.py --flashmla-lib "$lib" --out "$OUT" "${args[@]}" 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
