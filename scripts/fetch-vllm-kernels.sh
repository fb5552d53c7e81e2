#!/usr/bin/env bash
# Fetches the engine kernels the examples and benchmarks run beside hisparse from vLLM's wheel on
# PyPI (they are vLLM's, under its license; nothing of them is part of this repository):
#
#   _flashmla_C.abi3.so        FlashMLA's sparse decode (torch.ops._flashmla_C.sparse_decode_fwd),
#                              stable libtorch ABI: loads with torch.ops.load_library under torch
#                              2.11 (examples/flashmla_decode.py, benches/decode-step)
#   sparse_utils.py            vLLM's Triton index remap (the remap comparison of the benchmarks)
#   _C_stable_libtorch.abi3.so vLLM's own HiSparse kernels (92 MB; only with --with-vllm-hisparse)
#
# Usage: scripts/fetch-vllm-kernels.sh [--dest DIR] [--with-vllm-hisparse]
# DIR defaults to $HISPARSE_VLLM_KERNELS or ~/.cache/hisparse/vllm-0.33.0. Needs pip and unzip
# and the network (PyPI); the wheel (336 MB) is downloaded once into DIR/wheel and reused.
# Prints the paths of what it extracted; `export HISPARSE_FLASHMLA_LIB=DIR/_flashmla_C.abi3.so`
# is what the examples read.
set -euo pipefail

version=0.33.0
dest=${HISPARSE_VLLM_KERNELS:-$HOME/.cache/hisparse/vllm-$version}
with_hisparse=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --dest) dest=$2; shift 2 ;;
        --with-vllm-hisparse) with_hisparse=1; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument $1; see --help" >&2; exit 2 ;;
    esac
done
command -v unzip >/dev/null || { echo "unzip is needed (apt-get install unzip)" >&2; exit 2; }
mkdir -p "$dest/wheel"
wheel=$(ls "$dest"/wheel/vllm-"$version"-*.whl 2>/dev/null | head -n 1 || true)
if [[ -z "$wheel" ]]; then
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
        -d "$dest/wheel" "vllm==$version"
    wheel=$(ls "$dest"/wheel/vllm-"$version"-*.whl | head -n 1)
fi
extract() {
    local member=$1 name
    name=$(basename "$member")
    unzip -p "$wheel" "$member" > "$dest/$name.tmp"
    mv "$dest/$name.tmp" "$dest/$name"
    echo "$dest/$name"
}
extract vllm/_flashmla_C.abi3.so
extract vllm/v1/attention/backends/mla/sparse_utils.py
if [[ $with_hisparse == 1 ]]; then
    extract vllm/_C_stable_libtorch.abi3.so
fi
