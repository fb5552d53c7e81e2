#!/usr/bin/env bash
# CUDA correctness on the GPU machine, from the repository root, with the binaries that
# scripts/h200/cuda-build.sh put in h200-cuda/ (carry that folder):
#
#   1. the conformance suite with a device required (HISPARSE_REQUIRE_DEVICE=1);
#   2. engine-owned memory and streams (h200-cuda/cuda-wrap);
#   3. compute-sanitizer memcheck over the whole conformance suite;
#   4. compute-sanitizer racecheck over the cases whose kernels use shared memory (resolve,
#      remap, gather, pipeline, tables, invalidate), one run per group.
#
# Every section has its own time limit and the script goes on after a failing or timed-out
# section. Logs go to $OUT/cuda-conformance/, a summary to $OUT/cuda-conformance/summary.json and
# stdout. Whole run: at most about 5.5 minutes (the limits add up to 305 s, plus a few seconds
# per section). Exit status 0 only when every section passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=scripts/h200/cuda-common.sh
. scripts/h200/cuda-common.sh
bin=${HISPARSE_H200_BIN:-h200-cuda}
out=${OUT:-/tmp/hisparse-h200}/cuda-conformance
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1
sanitizer=$(find_sanitizer)

echo "== CUDA conformance on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
for f in cuda-conformance cuda-wrap; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run scripts/h200/cuda-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

section conformance 60 "$bin/cuda-conformance"
section wrap 30 "$bin/cuda-wrap"
if [ -n "$sanitizer" ]; then
    common=(--error-exitcode 17 --print-limit 20)
    section memcheck 100 "$sanitizer" --tool memcheck --leak-check no "${common[@]}" \
        "$bin/cuda-conformance"
    # Racecheck is slow on shared-memory-heavy kernels: the resolver first, with the most time.
    for spec in resolve:40 remap:25 gather:15 pipeline:15 tables:10 invalidate:10; do
        group=${spec%%:*}
        section "racecheck-$group" "${spec##*:}" "$sanitizer" --tool racecheck \
            --racecheck-report hazard "${common[@]}" "$bin/cuda-conformance" "$group/"
    done
else
    echo "compute-sanitizer not found: memcheck and racecheck NOT run" | tee "$out/sanitizer.log"
    results+=("{\"section\":\"sanitizers\",\"status\":\"NOT RUN\"}")
    overall=1
fi
write_summary cuda-conformance
