#!/usr/bin/env bash
# Builds here what .ci/gpu/engine.sh runs on the GPU machine (no Rust toolchain there):
#
#   gpu-engine/cuda-conformance   the conformance suite on CUDA device 0
#   gpu-engine/cuda-graph-capture per-layer calls captured in a CUDA graph (global capture mode)
#   gpu-engine/cuda-host-pool     the host pool registered in chunks, whole, and lent
#   gpu-engine/runtime-cuda       the runtime over engine-owned CUDA memory and streams, graphs
#   gpu-engine/hisparse           the CLI with the cuda backend (bench --host-pool)
#   gpu-engine/libhisparse_capi.a the C library with the cuda backend (examples/engine.c)
#   gpu-engine/_flashmla_C.abi3.so  vLLM 0.33's FlashMLA (scripts/fetch-vllm-kernels.sh)
#   gpu-engine/sparse_utils.py      vLLM 0.33's Triton remap, for the remap comparison
#   gpu-python/                   the abi3 wheel with cpu and cuda (.ci/gpu/python-build.sh)
#
# All are ignored by git; carry gpu-engine and gpu-python.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=gpu-engine
mkdir -p "$out"
export CARGO_PROFILE_RELEASE_DEBUG=0
# shellcheck source=.ci/gpu/cargo-exe.sh
. .ci/gpu/cargo-exe.sh
cuda=$(cargo test --release -p hisparse-backend-cuda --test conformance --test graph_capture \
    --test host_pool --no-run --message-format=json 2>/dev/null)
runtime=$(cargo test --release -p hisparse-runtime --features cuda --test cuda --no-run \
    --message-format=json 2>/dev/null)
cargo build --release -p hisparse-cli --features cuda
cargo build --release -p hisparse-capi --features cuda
install -m 755 "$(exe_of conformance <<<"$cuda")" "$out/cuda-conformance"
install -m 755 "$(exe_of graph_capture <<<"$cuda")" "$out/cuda-graph-capture"
install -m 755 "$(exe_of host_pool <<<"$cuda")" "$out/cuda-host-pool"
install -m 755 "$(exe_of cuda <<<"$runtime")" "$out/runtime-cuda"
install -m 755 "${CARGO_TARGET_DIR:-target}/release/hisparse" "$out/hisparse"
install -m 644 "${CARGO_TARGET_DIR:-target}/release/libhisparse_capi.a" "$out/libhisparse_capi.a"
(cd "$out" && strip cuda-conformance cuda-graph-capture cuda-host-pool runtime-cuda hisparse)
if [[ ! -f "$out/_flashmla_C.abi3.so" || ! -f "$out/sparse_utils.py" ]]; then
    scripts/fetch-vllm-kernels.sh --dest "$out" >/dev/null
fi
rm -rf "$out/wheel"  # the downloaded vLLM wheel (over 300 MB): only what was extracted travels
.ci/gpu/python-build.sh
rm -rf gpu-python/fallback  # the GPU machine has numpy
echo "commit $(git rev-parse HEAD) built $(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$out/MANIFEST"
du -sh "$out" gpu-python
