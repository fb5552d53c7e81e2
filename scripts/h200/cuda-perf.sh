#!/usr/bin/env bash
# The decode path at the physical limit on the GPU machine (issue 15), from the repository root,
# with the binaries of scripts/h200/cuda-build.sh in h200-cuda/ (carry that folder):
#
#   1. cuda_bench: every figure beside the ceilings of the same run (bulk H2D/D2H, D2D, an empty
#      kernel in a graph), every kernel variant, warm and cold, JSON in $OUT/cuda-perf/bench.json;
#   2. the conformance suite with a device required (production build);
#   3. the resolve cases with the resolver's global-state mode forced (bench-variants build,
#      HISPARSE_CUDA_RESOLVE_GLOBAL=1);
#   4. compute-sanitizer memcheck over the decode-path cases (remap, resolve, gather, pipeline,
#      tables), and racecheck over resolve, remap and gather.
#
# Every section has its own time limit; the script goes on after a failing or timed-out section.
# Logs in $OUT/cuda-perf/, a summary in $OUT/cuda-perf/summary.json and on stdout (the bench's
# table of figures, then the targets missed). Whole run: at most about 5.6 minutes (the limits
# add up to 325 s; the bench itself should take well under a minute). Exit status 0 only when
# every section passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=scripts/h200/cuda-common.sh
. scripts/h200/cuda-common.sh
bin=${HISPARSE_H200_BIN:-h200-cuda}
out=${OUT:-/tmp/hisparse-h200}/cuda-perf
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1
sanitizer=$(find_sanitizer)

echo "== CUDA decode path on $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -n 1)"
for f in cuda-bench cuda-conformance cuda-conformance-variants; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run scripts/h200/cuda-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

section bench 120 "$bin/cuda-bench" --json "$out/bench.json"
section conformance 45 "$bin/cuda-conformance"
section resolve-global-state 20 env HISPARSE_CUDA_RESOLVE_GLOBAL=1 \
    "$bin/cuda-conformance-variants" resolve/
if [ -n "$sanitizer" ]; then
    common=(--error-exitcode 17 --print-limit 20)
    for spec in remap:20 resolve:30 gather:15 pipeline:15 tables:10; do
        group=${spec%%:*}
        section "memcheck-$group" "${spec##*:}" "$sanitizer" --tool memcheck --leak-check no \
            "${common[@]}" "$bin/cuda-conformance" "$group/"
    done
    for spec in resolve:25 remap:15 gather:10; do
        group=${spec%%:*}
        section "racecheck-$group" "${spec##*:}" "$sanitizer" --tool racecheck \
            --racecheck-report hazard "${common[@]}" "$bin/cuda-conformance" "$group/"
    done
else
    echo "compute-sanitizer not found: memcheck and racecheck NOT run" | tee "$out/sanitizer.log"
    results+=("{\"section\":\"sanitizers\",\"status\":\"NOT RUN\"}")
    overall=1
fi

# The bench's table, and every target it reports missed.
if [ -f "$out/bench.log" ]; then
    echo
    grep -E '^\| ' "$out/bench.log"
    echo
    echo "targets missed:"
    grep -E '^\| .*\| NO +\|$' "$out/bench.log" || echo "  none"
fi
write_summary cuda-perf
