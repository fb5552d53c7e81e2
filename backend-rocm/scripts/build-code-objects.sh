#!/usr/bin/env bash
# Builds the AMDGPU code objects the ROCm backend embeds, from the one kernel source shared with
# CUDA (gpu-kernels/kernels), for every target in TARGETS, with clang from LLVM 19 (apt:
# clang-19 lld-19 llvm-19; never Debian's hipcc). Reproducible: a fixed -cuid and relative paths.
#
#   backend-rocm/scripts/build-code-objects.sh          # rewrite backend-rocm/kernels/*.co
#   backend-rocm/scripts/build-code-objects.sh --check  # rebuild into a temporary directory and
#                                                       # fail unless byte-identical to the
#                                                       # checked-in ones; always checks symbols
#
# Every code object must define every kernel of the ABI table (`name` and its descriptor
# `name.kd`), checked with llvm-readelf. The test `code_objects` of the crate checks the same
# without LLVM tools.
set -euo pipefail

CLANG=${CLANG:-clang-19}
READELF=${READELF:-llvm-readelf-19}
TARGETS=(gfx90a gfx942 gfx1100 gfx1201)

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=backend-rocm/kernels
mode=${1:-build}
scratch= # the temporary destination of --check
case "$mode" in
    build) dest=$out ;;
    --check) dest=$(mktemp -d); scratch=$dest ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# The kernel source's parts in order, from the one list of them (gpu-kernels/src/lib.rs,
# `common_source!`), concatenated into one translation unit as the Rust crates embed it.
mapfile -t parts < <(grep -oE 'include_str!\("\.\./kernels/[a-z_]+\.cuh"\)' gpu-kernels/src/lib.rs |
    grep -oE '[a-z_]+\.cuh' | sed 's|^|gpu-kernels/kernels/|')
if [ "${#parts[@]}" -eq 0 ]; then
    echo "no kernel source parts found in gpu-kernels/src/lib.rs" >&2
    exit 1
fi
# At a fixed relative path (under the ignored target/), like every other input, so that the
# code objects do not depend on where the unit was written.
unit=target/rocm-code-objects/hisparse.cu
mkdir -p "$(dirname "$unit")"
cleanup() {
    rm -f "$unit"
    if [ -n "$scratch" ]; then rm -rf "$scratch"; fi
}
trap cleanup EXIT
cat "${parts[@]}" >"$unit"

# Kernel symbols from the ABI table (gpu-kernels/src/lib.rs: `Kernel::X => ("hs_...", ...)`).
mapfile -t kernels < <(grep -oE '"hs_[a-z_]+", [A-Z_]+_PARAMS' gpu-kernels/src/lib.rs | grep -oE 'hs_[a-z_]+' | sort -u)
if [ "${#kernels[@]}" -eq 0 ]; then
    echo "no kernel names found in gpu-kernels/src/lib.rs" >&2
    exit 1
fi

version=$("$CLANG" --version | head -n 1)
status=0
for arch in "${TARGETS[@]}"; do
    co="$dest/hisparse-$arch.co"
    "$CLANG" -x hip --offload-arch="$arch" --cuda-device-only --no-gpu-bundle-output \
        -nogpulib -nogpuinc -O3 -cuid=hisparse -Wall -Werror \
        -include backend-rocm/kernels/hip_offline.h -include gpu-kernels/kernels/vendor_hip.h \
        "$unit" -o "$co"
    chmod 644 "$co"
    symbols=$("$READELF" -s --wide "$co")
    for k in "${kernels[@]}"; do
        for s in "$k" "$k.kd"; do
            if ! grep -qE "[[:space:]]$s\$" <<<"$symbols"; then
                echo "$co: symbol $s missing" >&2
                status=1
            fi
        done
    done
    # The backend sizes hs_resolve's dynamic shared memory against the device limit minus
    # RESOLVE_STATIC_SHARED_BYTES (gpu-kernels/src/lib.rs): the static part must stay below it.
    static_max=$(grep -oE 'RESOLVE_STATIC_SHARED_BYTES: u64 = [0-9 *+]+' gpu-kernels/src/lib.rs \
        | sed 's/.*= //' | tr -d ' ')
    resolve_lds=$("$READELF" --notes "$co" | awk '
        /\.group_segment_fixed_size:/ { lds = $2 }
        /\.name:[[:space:]]+hs_resolve$/ { print lds }')
    if [ -z "$resolve_lds" ] || [ "$resolve_lds" -gt $((static_max)) ]; then
        echo "$co: hs_resolve uses '${resolve_lds}' bytes of static LDS, the backend budgets $((static_max))" >&2
        status=1
    fi
    flags=$("$READELF" -h "$co" | grep Flags)
    if ! grep -q "$arch" <<<"$flags"; then
        echo "$co: header says '$flags', expected $arch" >&2
        status=1
    fi
    if [ "$mode" = --check ]; then
        if cmp -s "$co" "$out/hisparse-$arch.co"; then
            echo "ok: $out/hisparse-$arch.co is reproducible (${#kernels[@]} kernels; $version)"
        else
            echo "MISMATCH: $out/hisparse-$arch.co differs from a fresh build with $version;" \
                "run backend-rocm/scripts/build-code-objects.sh and commit the result" >&2
            status=1
        fi
    else
        echo "built $co (${#kernels[@]} kernels; $version)"
    fi
done
# FNV-1a (64-bit) of the exact sources compiled; the crate's tests compare it with the sources
# they embed, so a kernel change without rebuilt code objects fails `cargo test`.
fnv=$(cat backend-rocm/kernels/hip_offline.h gpu-kernels/kernels/vendor_hip.h \
    "$unit" | od -An -v -tu1 | tr -s ' \n' '\n\n' | {
    h=-3750763034362895579 # 0xcbf29ce484222325
    while read -r b; do
        [ -n "$b" ] || continue
        h=$(( (h ^ b) * 1099511628211 ))
    done
    printf '%016x' "$h"
})
if [ "$mode" = build ]; then
    echo "$version" > "$out/TOOLCHAIN"
    echo "$fnv" > "$out/SOURCE_FNV1A64"
elif [ "$(cat "$out/SOURCE_FNV1A64")" != "$fnv" ]; then
    echo "MISMATCH: $out/SOURCE_FNV1A64 does not match the current sources" >&2
    status=1
fi
exit $status
