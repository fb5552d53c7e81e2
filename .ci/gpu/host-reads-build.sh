#!/usr/bin/env bash
# Builds, on the development machine, kernel-lab/host-translation/sysmem_gather.cu: random
# 656-byte rows read by the GPU from pinned host memory, by pool size, allocation kind and
# locality. nvcc comes from the CUDA 13.0 PyPI wheels (nvidia-cuda-nvcc, -nvvm, -crt, -runtime;
# 13.1+ emits PTX the H200's 580 driver cannot load), fetched once into target/nvcc-13.0.
# The program links the CUDA runtime statically and finds the driver's calls at run time, so it
# needs no libcuda here. Puts into gpu-hostreads/ (untracked; it travels with the working tree):
#
#   gpu-hostreads/sysmem-gather   the program, sm_90
#   gpu-hostreads/MANIFEST        the commit, build date, size and sha256
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=gpu-hostreads
mkdir -p "$out"
cuda=target/nvcc-13.0
if [ ! -x "$cuda/nvidia/cu13/bin/nvcc" ]; then
    mkdir -p "$cuda/wheels"
    python3 -m pip download --quiet --no-deps --dest "$cuda/wheels" \
        "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" \
        "nvidia-cuda-runtime==13.0.*"
    for w in "$cuda"/wheels/*.whl; do
        python3 -m zipfile -e "$w" "$cuda"
    done
    chmod +x "$cuda"/nvidia/cu13/bin/* "$cuda"/nvidia/cu13/nvvm/bin/*
fi
# From HEAD's committed source (the checkout may hold uncommitted edits).
head=$(git rev-parse HEAD)
src=$(mktemp --suffix=.cu)
trap 'rm -f "$src"' EXIT
git show "$head:kernel-lab/host-translation/sysmem_gather.cu" > "$src"
PATH="$root/$cuda/nvidia/cu13/bin:$PATH" nvcc -O3 -arch=sm_90 -o "$out/sysmem-gather" "$src" \
    -L"$root/$cuda/nvidia/cu13/lib"
{
    echo "commit: $head $(git log -1 --format=%s "$head" | cut -c1-80)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "sysmem-gather $(stat -c %s "$out/sysmem-gather") $(sha256sum "$out/sysmem-gather" | cut -d' ' -f1)"
} > "$out/MANIFEST"
cat "$out/MANIFEST"
