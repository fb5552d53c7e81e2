#!/usr/bin/env bash
# Every ROCm check that needs no AMD GPU, for CI. Needs clang-19, lld-19 and llvm-19 from apt
# (never Debian's hipcc) and no ROCm. Uses $CARGO_TARGET_DIR (default target/).
#
# 1. The embedded code objects are byte-identical to a fresh clang-19 build of the current kernel
#    sources, define every kernel of the ABI table, and keep hs_resolve's static LDS in budget.
# 2. Without any HIP runtime the conformance suite reports every case skipped, and fails under
#    HISPARSE_REQUIRE_DEVICE=1.
# 3. With the HIP test double as the runtime (ROCM_PATH), the real backend passes the host-plumbing
#    tests and the conformance suite, through the embedded gfx942 code object and through hiprtc
#    (an architecture without an embedded code object), device required.
# 4. The shared kernel source, emulated on the CPU with 64-lane wavefronts (CDNA), matches the
#    reference (scripts/emulate-wave64.sh; needs g++ or clang++).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "--- code objects"
backend-rocm/scripts/build-code-objects.sh --check

echo "--- no HIP runtime: skipped, and a failure when a device is demanded"
no_runtime=(env -u ROCM_PATH -u HIP_PATH)
"${no_runtime[@]}" cargo test -p hisparse-backend-rocm --test conformance --test hip_double \
    2>&1 | tee "$log" | grep -E '^(SKIPPED|[0-9]+ passed)'
[ "$(grep -cE '^0 passed, 0 failed, [0-9]+ skipped$' "$log")" -eq 2 ]
if HISPARSE_REQUIRE_DEVICE=1 "${no_runtime[@]}" \
    cargo test -p hisparse-backend-rocm --test conformance >"$log" 2>&1; then
    echo "HISPARSE_REQUIRE_DEVICE=1 without a HIP runtime must fail" >&2
    exit 1
fi
grep -E '^(FAIL|[0-9]+ passed)' "$log" | cut -c1-160

echo "--- kernels emulated with 64-lane wavefronts"
backend-rocm/scripts/emulate-wave64.sh

echo "--- the HIP test double as the runtime"
cargo build -p hisparse-hip-double
backend-rocm/scripts/hip-double-root.sh "$target/hip-double"
export ROCM_PATH="$target/hip-double" HISPARSE_REQUIRE_DEVICE=1
cargo test -p hisparse-backend-rocm --test hip_double --test conformance --test fused
HISPARSE_HIP_DOUBLE_ARCH=gfx908:sramecc+:xnack- \
    cargo test -p hisparse-backend-rocm --test conformance
