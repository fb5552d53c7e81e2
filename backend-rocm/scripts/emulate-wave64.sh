#!/usr/bin/env bash
# Runs the shared kernel source on the CPU with 64-lane wavefronts, as CDNA GPUs (gfx90a, gfx942)
# execute it (and without a counting barrier, as HIP builds it), and compares every kernel with the core's reference: gpu-kernels' CPU emulation
# (emu/, tests/cpu_emulation/) models 32-lane warps; this copies the committed sources to a
# temporary workspace, switches the emulated warp to 64 lanes, and runs the same check there.
# RDNA (gfx1100, gfx1201) runs 32-lane wavefronts, which the unmodified check covers.
#
# Needs a C++20 compiler (g++ or clang++). Nothing in the working tree is modified.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive HEAD hisparse-core conformance gpu-kernels Cargo.toml Cargo.lock | tar -x -C "$work"
cd "$work"
# A workspace of the crates the check needs (the test draws its inputs from the conformance crate).
awk 'BEGIN { skip = 0 }
    /^members = \[/ { print "members = [\"hisparse-core\", \"conformance\", \"gpu-kernels\"]"; skip = 1; next }
    skip && /^\]/ { skip = 0; next }
    !skip { print }' Cargo.toml > Cargo.toml.new
mv Cargo.toml.new Cargo.toml

patch_file() { # FILE FROM TO: replace the literal text FROM, fail if it is absent
    grep -qF -- "$2" "$1" || { echo "emulate-wave64: '$2' not found in $1; update this script" >&2; exit 1; }
    local from
    from=$(printf '%s' "$2" | sed 's/[][\\.*^$|/]/\\&/g')
    sed -i "s|$from|$3|g" "$1"
}
# The driver's warps are HS_WARP lanes, as the kernels': the prelude's macro is the one place.
patch_file gpu-kernels/emu/vendor_cpu.h '#define HS_WARP 32u' '#define HS_WARP 64u'
# HIP has no counting barrier (vendor_hip.h defines no HS_SYNC_COUNT): the kernels' block sums
# take their scan there, and so here.
patch_file gpu-kernels/emu/vendor_cpu.h '#define HS_SYNC_COUNT(p) hs_cpu_sync_count((p))' '// no HS_SYNC_COUNT, as on HIP'
if grep -nE '\b32\b' gpu-kernels/emu/driver.cpp; then
    echo "emulate-wave64: driver.cpp names 32 lanes above instead of HS_WARP; update it" >&2
    exit 1
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/wave64"
HISPARSE_REQUIRE_CXX=1 cargo test -p hisparse-gpu-kernels --test cpu_emulation
