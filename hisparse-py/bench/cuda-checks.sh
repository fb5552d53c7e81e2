#!/usr/bin/env bash
# The Python module's checks that need an NVIDIA GPU and PyTorch, in one run: the CUDA tests
# (graph capture and replay against an eager run, capture refusals, PyTorch's current stream,
# zero-copy CUDA tensors, the engine loop with a graph) required to run, the CPU tests beside
# them, the examples on CUDA, and the per-call host time.
#
#   maturin build --release -m hisparse-py/Cargo.toml -o target/wheels   # on the build machine
#   hisparse-py/bench/cuda-checks.sh target/wheels/hisparse-*-abi3-*.whl [out-dir]
#
# Needs python3 with torch (CUDA) and numpy; pytest is installed from the index when missing.
# Writes host_overhead.json and the logs to out-dir (default: $OUT, else ./cuda-checks).
set -euo pipefail

wheel=${1:?usage: cuda-checks.sh <hisparse abi3 wheel> [out-dir]}
out=${2:-${OUT:-cuda-checks}}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$(mktemp -d)/venv
# The system's torch and numpy stay visible; the wheel goes into the venv only.
python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --no-deps --force-reinstall "$wheel"
"$venv/bin/python" -c "import pytest" 2>/dev/null || "$venv/bin/pip" install --quiet pytest
"$venv/bin/python" - <<'EOF'
import torch, hisparse
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))
print("hisparse", hisparse.__version__, "backends", hisparse.backends())
EOF

status=0
run() {
    echo "== $*"
    if ! "$@" 2>&1 | tee -a "$out/log.txt"; then
        echo "FAILED: $*" | tee -a "$out/log.txt"
        status=1
    fi
}

cd "$root/hisparse-py/tests"
# test_layout.py compares with the CLI binary, which this run does not carry.
run env HISPARSE_REQUIRE_DEVICE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    --ignore=test_layout.py .
cd "$root"
run "$venv/bin/python" examples/engine_loop.py --backend cuda
run "$venv/bin/python" examples/engine_loop.py --backend cuda --graph
run "$venv/bin/python" examples/torch_decode.py --backend cuda
run "$venv/bin/python" hisparse-py/bench/host_overhead.py --backend cuda \
    --json "$out/host_overhead.json"
exit $status
