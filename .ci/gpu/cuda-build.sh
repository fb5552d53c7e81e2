#!/usr/bin/env bash
# Builds, on the development machine, every binary the CUDA scripts of .ci/gpu/ run on the
# GPU machine (which has no Rust toolchain), and puts them in gpu-cuda/ (ignored by git; carry it
# to the GPU machine):
#
#   gpu-cuda/cuda-conformance           the shared conformance suite on CUDA device 0
#   gpu-cuda/cuda-lent                  engine-owned memory and streams (tests/lent.rs)
#   gpu-cuda/cuda-fused                 the fused resolve-and-gather against the reference
#                                        (tests/fused.rs)
#   gpu-cuda/cuda-shared                one shared-memory host pool mapped twice (tests/shared.rs)
#   gpu-cuda/cuda-conformance-resolve-global  the suite with the resolver's global-state mode
#                                        forced (tests/conformance_resolve_global.rs)
#   gpu-cuda/cuda-conformance-gather-in-order  the suite with the gather's in-order walk forced
#                                        (tests/conformance_gather_in_order.rs)
#   gpu-cuda/cuda-bench                 the kernel lab's cuda_bench (kernel-lab/src/bin/cuda_bench)
#   gpu-cuda/hisparse                   the CLI with --features cuda (simulate, bench, conformance)
#   gpu-cuda/MANIFEST                   commit, build date, sizes and sha256 of the binaries
#
# Release profile without debug info, stripped. The binaries load libcuda and NVRTC at run time
# (NVRTC from /usr/local/cuda-*/targets/x86_64-linux/lib, CUDA_PATH or LD_LIBRARY_PATH).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=gpu-cuda
mkdir -p "$out"
export CARGO_PROFILE_RELEASE_DEBUG=0

# shellcheck source=.ci/gpu/cargo-exe.sh
. .ci/gpu/cargo-exe.sh
prod=$(cargo test --release -p hisparse-backend-cuda --test conformance --test lent --test fused \
    --test shared --test conformance_resolve_global --test conformance_gather_in_order --no-run \
    --message-format=json 2>/dev/null)
cargo build --release -p hisparse-kernel-lab --bin cuda_bench
cargo build --release -p hisparse-cli --features cuda
conformance=$(exe_of conformance <<<"$prod")
lent=$(exe_of lent <<<"$prod")
fused=$(exe_of fused <<<"$prod")
shared=$(exe_of shared <<<"$prod")
resolve_global=$(exe_of conformance_resolve_global <<<"$prod")
gather_in_order=$(exe_of conformance_gather_in_order <<<"$prod")
target=${CARGO_TARGET_DIR:-target}
bench=$target/release/cuda_bench
cli=$target/release/hisparse
for f in "$conformance" "$lent" "$fused" "$shared" "$resolve_global" "$gather_in_order" "$bench" \
    "$cli"; do
    [ -x "$f" ] || { echo "missing executable: '$f'" >&2; exit 1; }
done
install -m 755 "$conformance" "$out/cuda-conformance"
install -m 755 "$lent" "$out/cuda-lent"
install -m 755 "$fused" "$out/cuda-fused"
install -m 755 "$shared" "$out/cuda-shared"
install -m 755 "$resolve_global" "$out/cuda-conformance-resolve-global"
install -m 755 "$gather_in_order" "$out/cuda-conformance-gather-in-order"
install -m 755 "$bench" "$out/cuda-bench"
install -m 755 "$cli" "$out/hisparse"
bins=(cuda-conformance cuda-lent cuda-fused cuda-shared cuda-conformance-resolve-global
    cuda-conformance-gather-in-order cuda-bench hisparse)
(cd "$out" && strip "${bins[@]}")
{
    crates=(gpu-kernels backend-cuda kernel-lab hisparse-core hisparse-runtime hisparse-cli conformance Cargo.lock)
    echo "commit $(git rev-parse HEAD)$(git diff HEAD --quiet -- "${crates[@]}" || echo " (with uncommitted changes in ${crates[*]})")"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (cd "$out" && sha256sum "${bins[@]}")
    (cd "$out" && du -b "${bins[@]}" | awk '{ printf "%s %d bytes\n", $2, $1 }')
} >"$out/MANIFEST"
cat "$out/MANIFEST"
total=$(du -sb "$out" | cut -f1)
echo "gpu-cuda/: $total bytes (carry limit 64 MiB, shared with everything else carried)"
