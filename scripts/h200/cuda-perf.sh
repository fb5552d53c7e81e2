#!/usr/bin/env bash
# The decode path at the physical limit on the GPU machine (issue 15), from the repository root,
# with the binaries of scripts/h200/cuda-build.sh in h200-cuda/ (carry that folder):
#
#   1. cuda_bench: every figure beside the ceilings of the same run (bulk H2D/D2H, D2D, an empty
#      kernel in a graph), every kernel variant, warm and cold, the swap-in path separate and
#      fused, the configurations `hisparse bench` measures; 20 ms of sustained GPU work before
#      every timed run and the SM clock of each run in its row; JSON in $OUT/cuda-perf/bench.json;
#   2. the conformance suite with a device required (production build), the fused
#      resolve-and-gather against the reference, and compute-sanitizer racecheck of the fused
#      launch's two small scenarios (speculative rows with a corrupt LRU; split rows);
#   3. the resolve cases with the resolver's global-state mode forced (bench-variants build,
#      HISPARSE_CUDA_RESOLVE_GLOBAL=1);
#   4. compute-sanitizer memcheck over the decode-path cases (remap, resolve, gather, pipeline,
#      tables) and the fused launch; racecheck over remap, gather and every resolve scenario, one
#      process per scenario, the 32768-slot one last with whatever time is left.
#
# The whole script runs inside a 345 s budget (HISPARSE_H200_BUDGET overrides it; each section's
# limit shrinks to what is left; a section with no time left is reported SKIPPED and listed as
# dropped at the end), so it ends within 6 minutes. Sections run in priority order, so a smaller
# budget drops from the end: with HISPARSE_H200_BUDGET=150 the bench (about 25 s, every variant,
# the production rows judged), the conformance suite, the fused test and the fused racechecks
# still run (about 35 s together), and the resolve racechecks are the first to go. Expected:
# every racecheck "0 hazards displayed (0 errors, 0 warnings)", the fused speculative scenario
# included (an LRU naming a slot twice had two threads of one warp write that slot's inverse;
# only the thread whose atomicOr claims the slot writes it now). Logs in
# $OUT/cuda-perf/, a summary in $OUT/cuda-perf/summary.json and on stdout: the section results,
# the ceilings and every judged figure of the bench (the whole table of every variant is in
# bench.log and bench.json), then the targets missed (targets are judged on the production
# kernels and the fused path). Exit status 0 only when every section passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=scripts/h200/cuda-common.sh
. scripts/h200/cuda-common.sh
budget "${HISPARSE_H200_BUDGET:-345}"
bin=${HISPARSE_H200_BIN:-h200-cuda}
out=${OUT:-/tmp/hisparse-h200}/cuda-perf
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1
sanitizer=$(find_sanitizer)

echo "== CUDA decode path on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
echo "clocks before (sm, max sm, mem, pstate, temperature, power): $(clocks)"
for f in cuda-bench cuda-conformance cuda-conformance-variants cuda-fused; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run scripts/h200/cuda-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

section bench 150 "$bin/cuda-bench" --json "$out/bench.json"
echo "clocks after the bench: $(clocks)"
section conformance 45 "$bin/cuda-conformance"
section fused 30 "$bin/cuda-fused"
if [ -n "$sanitizer" ]; then
    common=(--error-exitcode 17 --print-limit 20)
    race=("$sanitizer" --tool racecheck --racecheck-report hazard "${common[@]}")
    section racecheck-fused-speculative 30 "${race[@]}" "$bin/cuda-fused" fused/speculative
    section racecheck-fused-split 30 "${race[@]}" "$bin/cuda-fused" fused/split
fi
section resolve-global-state 20 env HISPARSE_CUDA_RESOLVE_GLOBAL=1 \
    "$bin/cuda-conformance-variants" resolve/
if [ -n "$sanitizer" ]; then
    for spec in remap:20 resolve:30 gather:15 pipeline:15 tables:10; do
        group=${spec%%:*}
        section "memcheck-$group" "${spec##*:}" "$sanitizer" --tool memcheck --leak-check no \
            "${common[@]}" "$bin/cuda-conformance" "$group/"
    done
    section memcheck-fused 40 "$sanitizer" --tool memcheck --leak-check no "${common[@]}" \
        "$bin/cuda-fused"
    section racecheck-remap 15 "${race[@]}" "$bin/cuda-conformance" remap/
    section racecheck-gather 15 "${race[@]}" "$bin/cuda-conformance" gather/
    # The resolver is shared-memory heavy and slow under racecheck: one process per scenario,
    # the 32768-slot scenario (the largest state) last, with the time that is left.
    mapfile -t groups < <("$bin/cuda-conformance" --list 2>/dev/null | sed -n 's/: test$//p' \
        | grep '^resolve/' | sed -E 's#^(resolve/[^/]+)/.*#\1#' | sort -u | grep -v max-hot-slots)
    if [ "${#groups[@]}" -eq 0 ]; then
        echo "no resolve scenarios listed by $bin/cuda-conformance --list" | tee "$out/racecheck-resolve.log"
        results+=("{\"section\":\"racecheck-resolve\",\"status\":\"NOT RUN\"}")
        overall=1
    fi
    for g in "${groups[@]}"; do
        section "racecheck-${g//\//-}" 25 "${race[@]}" "$bin/cuda-conformance" "$g/"
    done
    section racecheck-resolve-max-hot-slots-32768 300 "${race[@]}" "$bin/cuda-conformance" \
        resolve/max-hot-slots-32768/
else
    echo "compute-sanitizer not found: memcheck and racecheck NOT run" | tee "$out/sanitizer.log"
    results+=("{\"section\":\"sanitizers\",\"status\":\"NOT RUN\"}")
    overall=1
fi
echo "clocks at the end: $(clocks)"

# The ceilings and every judged figure of the bench (the whole table, every variant, is in
# $out/bench.log and bench.json), and every target it reports missed.
if [ -f "$out/bench.log" ]; then
    echo
    grep -E '^SM clock' "$out/bench.log"
    grep -E '^\| (figure|bulk|device-to-device|empty kernel|SM clock) ' "$out/bench.log"
    grep -E '^\| .*\| (yes|NO) +\|' "$out/bench.log"
    echo
    echo "targets missed:"
    grep -E '^\| .*\| NO +\|' "$out/bench.log" || echo "  none"
fi
dropped=$(printf '%s\n' "${results[@]}" | sed -n 's/.*"section":"\([^"]*\)","status":"SKIPPED".*/\1/p' | tr '\n' ' ')
echo
echo "dropped for the budget (${HISPARSE_H200_BUDGET:-345} s): ${dropped:-none}"
write_summary cuda-perf
