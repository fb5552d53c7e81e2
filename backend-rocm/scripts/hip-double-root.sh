#!/usr/bin/env bash
# Lays out the HIP test double as a ROCm root: DIR/lib/libamdhip64.so and DIR/lib/libhiprtc.so,
# both links to the built `hisparse-hip-double` library. Then `ROCM_PATH=DIR` makes the ROCm
# backend load the double through its normal run-time loading path.
#
#   cargo build -p hisparse-hip-double [--release]
#   backend-rocm/scripts/hip-double-root.sh DIR [--release]
#
# The library is looked up in $CARGO_TARGET_DIR (default: target/ of the workspace).
set -euo pipefail
dir=${1:?usage: $0 DIR [--release]}
profile=debug
[ "${2:-}" = --release ] && profile=release
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
lib="$target/$profile/libhisparse_hip_double.so"
if [ ! -f "$lib" ]; then
    echo "$lib not found: run cargo build -p hisparse-hip-double first" >&2
    exit 1
fi
mkdir -p "$dir/lib"
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
ln -sf "$lib" "$dir/lib/libamdhip64.so"
ln -sf "$lib" "$dir/lib/libhiprtc.so"
echo "$dir/lib: libamdhip64.so, libhiprtc.so -> $lib"
