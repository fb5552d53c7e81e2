#!/usr/bin/env bash
# CUDA correctness on the GPU machine, from the repository root, with the binaries that
# scripts/h200/cuda-build.sh put in h200-cuda/ (carry that folder):
#
#   1. the conformance suite with a device required (HISPARSE_REQUIRE_DEVICE=1);
#   2. engine-owned memory and streams (h200-cuda/cuda-wrap);
#   3. compute-sanitizer memcheck over the whole conformance suite;
#   4. compute-sanitizer racecheck over the cases whose kernels use shared memory (resolve,
#      remap, gather, tables, invalidate, pipeline), one run per group.
#
# Every section has its own time limit and the script goes on after a failing or timed-out
# section. Logs go to $OUT/cuda-conformance/, a summary to $OUT/cuda-conformance/summary.json and
# stdout. Whole run: at most about 5.5 minutes (the limits add up to 305 s, plus a few seconds
# per section). Exit status 0 only when every section passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=${HISPARSE_H200_BIN:-h200-cuda}
out=${OUT:-/tmp/hisparse-h200}/cuda-conformance
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)

results=()
overall=0
# limited SECONDS COMMAND...: runs COMMAND in its own process group and, past SECONDS, stops the
# whole group (compute-sanitizer and the program it runs), so nothing is left holding the GPU.
# Returns COMMAND's exit status, or 124 when it was stopped.
limited() {
    local limit=$1
    shift
    setsid "$@" &
    local pid=$! ticks=0 state
    while :; do
        state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)
        [ -z "$state" ] || [ "$state" = Z ] && break
        if [ "$ticks" -ge $((limit * 10)) ]; then
            kill -TERM -- "-$pid" 2>/dev/null
            sleep 5
            kill -KILL -- "-$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
        sleep 0.1
        ticks=$((ticks + 1))
    done
    wait "$pid"
}

# section NAME LIMIT_SECONDS COMMAND...: runs COMMAND with a time limit, output to NAME.log;
# records pass, FAIL (exit status) or TIMEOUT.
section() {
    local name=$1 limit=$2
    shift 2
    local log="$out/$name.log" t0 rc status
    t0=$(date +%s.%N)
    limited "$limit" "$@" >"$log" 2>&1
    rc=$?
    case $rc in
        0) status=pass ;;
        124) status=TIMEOUT ;;
        *) status="FAIL($rc)" ;;
    esac
    [ "$status" = pass ] || overall=1
    local secs counts errors
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    errors=$(grep -E 'ERROR SUMMARY: [0-9]+' "$log" | tail -n 1 | sed 's/^=* *//')
    printf '%-34s %-10s %6ss  %s %s\n' "$name" "$status" "$secs" "${counts:-}" "${errors:-}"
    results+=("{\"section\":\"$name\",\"status\":\"$status\",\"seconds\":$secs,\"counts\":\"${counts:-}\",\"sanitizer\":\"${errors:-}\"}")
}

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

{
    printf '{"script":"cuda-conformance","ok":%s,"sections":[' "$([ $overall = 0 ] && echo true || echo false)"
    (IFS=,; printf '%s' "${results[*]}")
    printf ']}\n'
} >"$out/summary.json"
echo "summary: $out/summary.json ($([ $overall = 0 ] && echo 'all sections passed' || echo 'SOME SECTIONS FAILED'))"
# The first failing cases and sanitizer reports, for the impatient.
grep -hE '^FAIL|ERROR SUMMARY: [1-9]|Race reported|Invalid __global__' "$out"/*.log 2>/dev/null | head -n 20
exit $overall
