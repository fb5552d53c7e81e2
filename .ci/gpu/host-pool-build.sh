#!/usr/bin/env bash
# Builds, on the development machine, what .ci/gpu/host-pool.sh runs on the GPU machine
# (which has no Rust toolchain), into gpu-hostpool/ (carry it):
#
#   gpu-hostpool/hisparse           the CLI with --features cuda (`bench --host-pool`)
#   gpu-hostpool/cuda-host-pool     backend-cuda's tests/host_pool.rs (the pool on a GPU: zeroed,
#                                    rows across every registered chunk read through the device
#                                    mapping, lent arrays, releases)
#   gpu-hostpool/MANIFEST           commit, build date, sha256 of the binaries
#
# The Python figures (PyTorch's pinning beside hisparse's paths) need the wheel of
# .ci/gpu/python-build.sh in gpu-python/ as well.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=gpu-hostpool
mkdir -p "$out"
export CARGO_PROFILE_RELEASE_DEBUG=0
# shellcheck source=.ci/gpu/cargo-exe.sh
. .ci/gpu/cargo-exe.sh
test_exe=$(cargo test --release -p hisparse-backend-cuda --test host_pool --no-run \
    --message-format=json 2>/dev/null | exe_of host_pool)
cargo build --release -p hisparse-cli --features cuda
target=${CARGO_TARGET_DIR:-target}
[ -x "$test_exe" ] || { echo "missing the host_pool test executable" >&2; exit 1; }
install -m 755 "$target/release/hisparse" "$out/hisparse"
install -m 755 "$test_exe" "$out/cuda-host-pool"
(cd "$out" && strip hisparse cuda-host-pool)
{
    echo "commit $(git rev-parse HEAD)$(git diff HEAD --quiet -- host-memory backend-cuda benches/device hisparse-cli hisparse-runtime hisparse-core || echo ' (with uncommitted changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (cd "$out" && sha256sum hisparse cuda-host-pool)
} >"$out/MANIFEST"
cat "$out/MANIFEST"
echo "gpu-hostpool/: $(du -sb "$out" | cut -f1) bytes"
