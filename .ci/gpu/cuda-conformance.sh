#!/usr/bin/env bash
# CUDA correctness on the GPU machine, from the repository root, with the binaries
# .ci/gpu/cuda-build.sh put in gpu-cuda/ (carry that folder):
#
#   1. the whole conformance suite with a device required (HISPARSE_REQUIRE_DEVICE=1);
#   2. engine-owned memory and streams (gpu-cuda/cuda-lent), the fused resolve-and-gather
#      (gpu-cuda/cuda-fused), one shared host pool mapped twice (gpu-cuda/cuda-shared), the
#      gather and swap-in cases with the gather's in-order walk forced
#      (gpu-cuda/cuda-conformance-gather-in-order);
#   3. compute-sanitizer memcheck over the whole conformance suite, the fused launch and the
#      in-order gather's cases;
#   4. compute-sanitizer racecheck where it fits the budget: the remap, the gather op's own cases
#      (`^gather/`, a prefix: every name containing "gather" would take in the resolve-and-gather
#      scenarios, 80 cases, past 30 s on an H100 machine; both walks) and the table cases,
#      and the resolver at small shapes: the fused launch's speculative scenario (128-entry
#      rows, 512 hot slots; hs_resolve_gather runs the whole resolver, then its gather) and two
#      conformance resolve scenarios (hs_resolve: several rows per request, and the speculative
#      gather). The resolver's large shapes (64 x 2048 decode, the 32768-slot scenario) are not
#      raced: racecheck instruments every shared-memory access of 1024-thread blocks, and the
#      32768-slot scenario alone ran past 300 s before; the small shapes take the same phases and
#      barriers with the state and table in shared memory.
#
# Every section has its own time limit inside a 290 s budget for the whole script (a section with
# no time left is reported SKIPPED, which fails the run), and the script goes on after a failing
# or timed-out section. Logs go to $OUT/cuda-conformance/, a summary to
# $OUT/cuda-conformance/summary.json and stdout. Exit status 0 only when every section passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=.ci/gpu/lib.sh
. .ci/gpu/lib.sh
budget 290
bin=${HISPARSE_GPU_BIN:-gpu-cuda}
out=${OUT:-/tmp/hisparse-gpu}/cuda-conformance
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1
sanitizer=$(find_sanitizer)

echo "== CUDA conformance on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
for f in cuda-conformance cuda-lent cuda-fused cuda-shared cuda-conformance-gather-in-order; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run .ci/gpu/cuda-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

section conformance 45 "$bin/cuda-conformance"
section lent 20 "$bin/cuda-lent"
section fused 20 "$bin/cuda-fused"
section shared 20 "$bin/cuda-shared"
section gather-in-order 20 "$bin/cuda-conformance-gather-in-order" gather
if [ -n "$sanitizer" ]; then
    common=(--error-exitcode 17 --print-limit 20)
    section memcheck 90 "$sanitizer" --tool memcheck --leak-check no "${common[@]}" \
        "$bin/cuda-conformance"
    section memcheck-fused 30 "$sanitizer" --tool memcheck --leak-check no "${common[@]}" \
        "$bin/cuda-fused"
    section memcheck-gather-in-order 20 "$sanitizer" --tool memcheck --leak-check no \
        "${common[@]}" "$bin/cuda-conformance-gather-in-order" gather
    race=("$sanitizer" --tool racecheck --racecheck-report hazard "${common[@]}")
    for spec in remap/:15 ^gather/:30 tables/:10 resolve/speculative/0:15 \
        resolve/speculative-gather/0:15; do
        filter=${spec%%:*}
        name=${filter#^}
        name=${name%/}
        section "racecheck-${name//\//-}" "${spec##*:}" "${race[@]}" "$bin/cuda-conformance" "$filter"
    done
    section racecheck-fused-speculative 20 "${race[@]}" "$bin/cuda-fused" fused/speculative
    section racecheck-gather-in-order 30 "${race[@]}" "$bin/cuda-conformance-gather-in-order" \
        ^gather/
else
    echo "compute-sanitizer not found: memcheck and racecheck NOT run" | tee "$out/sanitizer.log"
    results+=("{\"section\":\"sanitizers\",\"status\":\"NOT RUN\"}")
    overall=1
fi
write_summary cuda-conformance
