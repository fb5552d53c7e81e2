#!/usr/bin/env bash
# Builds, on the development machine, the Python wheel .ci/gpu/python-torch.sh installs on
# the GPU machine (which has no Rust toolchain and no network), into gpu-python/ (ignored by
# git; carry it):
#
#   gpu-python/hisparse-<version>-cp39-abi3-manylinux_*_x86_64.whl   abi3 (Python >= 3.9), with
#                                        the cpu and cuda backends (libcuda and NVRTC loaded at
#                                        run time), release profile without debug info, stripped
#   gpu-python/fallback/numpy-*.whl     numpy for CPython 3.12 (PyPI), installed there only if
#                                        that machine's Python has none (the example uses it)
#   gpu-python/MANIFEST                 commit, build date, size and sha256 of the wheels
#
# maturin comes from PyPI into a virtual environment (HISPARSE_MATURIN_VENV, default
# /tmp/hisparse-maturin).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=gpu-python
venv=${HISPARSE_MATURIN_VENV:-/tmp/hisparse-maturin}
if [[ ! -x "$venv/bin/maturin" ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "maturin>=1.9,<2"
fi
rm -rf "$out"
mkdir -p "$out"
mkdir -p "$out/fallback"
"$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux2014_x86_64 -d "$out/fallback" "numpy>=2,<3"
CARGO_PROFILE_RELEASE_DEBUG=0 "$venv/bin/maturin" build --release --strip \
    -m hisparse-py/Cargo.toml -i "$venv/bin/python" -o "$out"
{
    echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- hisparse-py hisparse-runtime hisparse-core backend-cpu backend-cuda gpu-kernels host-memory || echo ' (with local changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    for f in "$out"/*.whl "$out"/fallback/*.whl; do
        echo "$(basename "$f") $(stat -c %s "$f") bytes sha256 $(sha256sum "$f" | cut -d' ' -f1)"
    done
} > "$out/MANIFEST"
cat "$out/MANIFEST"
