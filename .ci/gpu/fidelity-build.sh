#!/usr/bin/env bash
# Builds, on the development machine, the CLI that .ci/gpu/fidelity.sh runs on the GPU
# machine (which has no Rust toolchain), and puts it in gpu-fidelity/ (ignored by git; carry it):
#
#   gpu-fidelity/hisparse   the CLI with --features cuda (release, no debug info, stripped)
#   gpu-fidelity/MANIFEST   commit, build date, size and sha256
#
# The binary loads libcuda and NVRTC at run time.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=gpu-fidelity
mkdir -p "$out"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/gpu-fidelity/' "$exclude" 2>/dev/null || echo '/gpu-fidelity/' >>"$exclude"
export CARGO_PROFILE_RELEASE_DEBUG=0
cargo build --release -p hisparse-cli --features cuda
install -m 755 "${CARGO_TARGET_DIR:-target}/release/hisparse" "$out/hisparse"
strip "$out/hisparse"
{
    echo "commit $(git rev-parse HEAD)$(git diff --quiet -- hisparse-core hisparse-runtime hisparse-cli backend-cuda gpu-kernels || echo ' (with uncommitted changes in hisparse-core/hisparse-runtime/hisparse-cli/backend-cuda/gpu-kernels)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (cd "$out" && sha256sum hisparse)
    (cd "$out" && du -b hisparse | awk '{ printf "%s %d bytes\n", $2, $1 }')
} >"$out/MANIFEST"
cat "$out/MANIFEST"
"$out/hisparse" --version >/dev/null
echo "gpu-fidelity/: $(du -sb "$out" | cut -f1) bytes (carry limit 64 MiB, shared with everything else carried)"
