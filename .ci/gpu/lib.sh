#!/usr/bin/env bash
# The one section/budget helper of the GPU scripts in .ci/gpu/ (sourced, not run on its own):
# sections with their own time limit, inside one time budget for the whole script, whose results
# are collected for a JSON summary.
#
#   budget SECONDS                          the whole script's time budget, from now
#   section NAME LIMIT_SECONDS [--stdout FILE] COMMAND...
#                                           run COMMAND, output to $out/NAME.log (with --stdout,
#                                           standard output to FILE and standard error to the
#                                           log), record the result and its start and end in
#                                           $out/sections.tsv; the limit shrinks to what is left
#                                           of the budget (minus a reserve for the summary), and a
#                                           section with less than 5 s left is recorded as SKIPPED
#                                           (no time). A script may define `section_note NAME LOG`
#                                           to add a note of its own to each section's line.
#   write_summary SCRIPT                    $out/summary.json; returns 0 when every section passed
#   use_nixl_libs ARCHIVE                   unpacks the carried NIXL/UCX libraries (nixl-build.sh)
#                                           into $libs, removed at exit, puts them and CUDA's on
#                                           the loader path and requires NIXL
#
# The caller sets `out` (a directory) before using them.

results=()
overall=0
budget_end=0
# Seconds kept back from the budget for the summary and the stopping of a timed-out section.
budget_reserve=15

budget() {
    budget_end=$(($(date +%s) + $1))
}

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
            sleep 3
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
# records pass, FAIL (exit status), TIMEOUT or SKIPPED, with the last "N passed, M failed" line
# and the sanitizer's summary line of the log.
section() {
    local name=$1 limit=$2
    shift 2
    local log="$out/$name.log" stdout="" t0 rc status
    if [ "${1:-}" = --stdout ]; then
        stdout=$2
        shift 2
    fi
    if [ "$budget_end" -gt 0 ]; then
        local left=$((budget_end - $(date +%s) - budget_reserve))
        if [ "$left" -lt 5 ]; then
            printf '%-34s %-10s %6ss  %s\n' "$name" "SKIPPED" "0.0" "(no time left in the budget)"
            results+=("{\"section\":\"$name\",\"status\":\"SKIPPED\",\"seconds\":0,\"counts\":\"no time left\",\"sanitizer\":\"\"}")
            overall=1
            return
        fi
        [ "$limit" -gt "$left" ] && limit=$left
    fi
    t0=$(date +%s.%N)
    if [ -n "$stdout" ]; then
        limited "$limit" "$@" >"$stdout" 2>"$log"
    else
        limited "$limit" "$@" >"$log" 2>&1
    fi
    rc=$?
    case $rc in
        0) status=pass ;;
        124) status=TIMEOUT ;;
        *) status="FAIL($rc)" ;;
    esac
    [ "$status" = pass ] || overall=1
    local t1 secs counts errors note=""
    t1=$(date +%s.%N)
    printf '%s\t%s\t%s\n' "$name" "$t0" "$t1" >>"$out/sections.tsv"
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    counts=$(cat "$log" ${stdout:+"$stdout"} | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    errors=$(grep -E '(ERROR|RACECHECK) SUMMARY: ' "$log" | tail -n 1 | sed 's/^=* *//')
    if declare -F section_note >/dev/null; then
        note=$(section_note "$name" "$log")
    fi
    printf '%-34s %-10s %6ss  %s %s %s\n' "$name" "$status" "$secs" "${counts:-}" "${errors:-}" "$note"
    results+=("{\"section\":\"$name\",\"status\":\"$status\",\"seconds\":$secs,\"counts\":\"${counts:-}\",\"sanitizer\":\"${errors:-}\",\"note\":\"$note\"}")
}

# write_summary SCRIPT: $out/summary.json, and the first failing cases and sanitizer reports.
write_summary() {
    {
        printf '{"script":"%s","ok":%s,"sections":[' "$1" "$([ $overall = 0 ] && echo true || echo false)"
        (IFS=,; printf '%s' "${results[*]}")
        printf ']}\n'
    } >"$out/summary.json"
    echo "summary: $out/summary.json ($([ $overall = 0 ] && echo 'all sections passed' || echo 'SOME SECTIONS FAILED'))"
    grep -hE '^FAIL|FAILED|ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]|Race reported|Invalid __global__' \
        "$out"/*.log 2>/dev/null | head -n 20
    return $overall
}

# The compute-sanitizer of the machine, or nothing.
find_sanitizer() {
    command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1
}

# The SM and memory clocks nvidia-smi reports now (current, and the maximum), on one line.
clocks() {
    nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,pstate,temperature.gpu,power.draw \
        --format=csv,noheader 2>/dev/null | head -n 1
}

# use_nixl_libs ARCHIVE: the NIXL and UCX libraries of the nixl-cu13 wheel that nixl-build.sh
# carried, unpacked into a temporary folder ($libs, removed when the script exits), on the
# loader path with CUDA's runtime libraries; NIXL_PLUGIN_DIR set; NIXL required by the tests.
use_nixl_libs() {
    libs=$(mktemp -d)
    trap 'rm -rf "$libs"' EXIT
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$libs"
    local cuda_lib
    cuda_lib=$(ls -d /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | head -n 1)
    export LD_LIBRARY_PATH="$libs/.nixl_cu13.mesonpy.libs:$libs/nixl_cu13.libs${cuda_lib:+:$cuda_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export NIXL_PLUGIN_DIR="$libs/.nixl_cu13.mesonpy.libs/plugins"
    export HISPARSE_REQUIRE_NIXL=1
}
