#!/usr/bin/env bash
# The decode path at the physical limit on the GPU machine (issue 15), from the repository root,
# with the binaries of .ci/gpu/cuda-build.sh in gpu-cuda/ (carry that folder):
#
#   1. cuda_bench: every figure beside the ceilings of the same run (bulk H2D/D2H, D2D, an empty
#      kernel in a graph), warm and cold, the swap-in path separate and fused (each block its own request, checked byte for
#      byte against the pair), the configurations `hisparse bench`
#      measures, and the gather from a 48 GiB pool (HISPARSE_BIG_POOL_GIB; 0: none) with a decode
#      step's misses in request windows under both walks; 20 ms of sustained GPU work before every
#      timed run and the SM clock of each run in its row; JSON in $OUT/cuda-perf/bench.json;
#   2. the conformance suite with a device required (production build), the fused
#      resolve-and-gather against the reference, and compute-sanitizer racecheck of the fused launch's two small scenarios
#      (speculative rows with a corrupt LRU; split rows);
#   3. Nsight Compute (ncu) over the decode-size launches of `cuda_bench --profile-targets`
#      (remap at 1 and 64 tokens in every mode (few plain rows are
#      hs_remap_wide: plan::REMAP_WIDE_MAX_ROWS), the resolver at 1 and 64 requests, and the fused launch at 64 requests):
#      duration, achieved occupancy, issue-slot use and the four largest stall reasons of each, in
#      $OUT/cuda-perf/ncu-summary.log and on stdout, every raw metric in ncu-raw.csv;
#   4. the resolve cases with the resolver's global-state mode forced
#      (cuda-conformance-resolve-global, CudaOptions::resolve_global_state), and the gather and
#      swap-in cases with the gather's in-order walk forced (cuda-conformance-gather-in-order,
#      CudaOptions::gather_walk);
#   5. compute-sanitizer memcheck over the decode-path cases (remap, resolve, gather, pipeline,
#      tables) and the fused launch; racecheck over remap, every gather case and every resolve
#      scenario, one process per case or scenario, the 32768-slot one last with whatever time is
#      left.
#
# The whole script runs inside a 400 s budget (HISPARSE_GPU_BUDGET overrides it; each section's
# limit shrinks to what is left; a section with no time left is reported SKIPPED and listed as
# dropped at the end), so it ends within 7 minutes. Sections run in priority order, so a smaller
# budget drops from the end: with HISPARSE_GPU_BUDGET=200 the bench (about 30-40 s, 90 with the
# 48 GiB pool), the
# conformance suite, the fused test, the fused
# racechecks (about 10 s together) and the ncu step (limit 75 s) run first, and the resolve
# racechecks are the first to go. Expected:
# every racecheck "0 hazards displayed (0 errors, 0 warnings)", the fused speculative scenario
# included (an LRU naming a slot twice had two threads of one warp write that slot's inverse;
# only the thread whose atomicOr claims the slot writes it now). Logs in
# $OUT/cuda-perf/, a summary in $OUT/cuda-perf/summary.json and on stdout: the section results,
# the ceilings and every judged figure of the bench (the whole table is in bench.log and
# bench.json), then the targets missed. Exit status 0 only when every section passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=.ci/gpu/lib.sh
. .ci/gpu/lib.sh
budget "${HISPARSE_GPU_BUDGET:-400}"
bin=${HISPARSE_GPU_BIN:-gpu-cuda}
out=${OUT:-/tmp/hisparse-gpu}/cuda-perf
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1
sanitizer=$(find_sanitizer)

echo "== CUDA decode path on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
echo "clocks before (sm, max sm, mem, pstate, temperature, power): $(clocks)"
for f in cuda-bench cuda-conformance cuda-conformance-resolve-global \
    cuda-conformance-gather-in-order cuda-fused; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run .ci/gpu/cuda-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

big_pool=()
[ "${HISPARSE_BIG_POOL_GIB:-48}" != 0 ] && big_pool=(--big-pool-gib "${HISPARSE_BIG_POOL_GIB:-48}")
section bench 210 "$bin/cuda-bench" --json "$out/bench.json" ${big_pool[@]+"${big_pool[@]}"}
echo "clocks after the bench: $(clocks)"
section conformance 45 "$bin/cuda-conformance"
section fused 30 "$bin/cuda-fused"
if [ -n "$sanitizer" ]; then
    common=(--error-exitcode 17 --print-limit 20)
    race=("$sanitizer" --tool racecheck --racecheck-report hazard "${common[@]}")
    section racecheck-fused-speculative 30 "${race[@]}" "$bin/cuda-fused" fused/speculative
    section racecheck-fused-split 30 "${race[@]}" "$bin/cuda-fused" fused/split
fi
# Nsight Compute over the decode-size launches (cuda_bench --profile-targets: remap at 1 and 64
# tokens, the resolver at 1 and 64 requests, the fused launch at 64 requests,
# three calls each, eager stream
# launches; caches and clocks left as they are, so the third call of each is the L2-warm case):
# duration, achieved occupancy, issue-slot use and the top stall reasons of each, into
# ncu-summary.log (and on stdout), the raw metrics in ncu-raw.csv.
ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
if [ -n "$ncu_bin" ]; then
    rm -f "$out/ncu.ncu-rep"
    section ncu 75 "$ncu_bin" --target-processes all \
        --kernel-name regex:'^hs_(remap|remap_wide|resolve|resolve_gather)$' \
        --cache-control none --clock-control none \
        --section SpeedOfLight --section LaunchStats --section Occupancy \
        --section WarpStateStats --section SchedulerStats \
        --export "$out/ncu" --force-overwrite "$bin/cuda-bench" --profile-targets
    if [ -f "$out/ncu.ncu-rep" ]; then
        "$ncu_bin" --import "$out/ncu.ncu-rep" --page raw --csv >"$out/ncu-raw.csv" 2>"$out/ncu-import.log"
        cat >"$out/ncu_summary.py" <<'PY'
import csv, re, sys
raw, log = sys.argv[1], sys.argv[2]
labels = {}
for line in open(log, errors="replace"):
    m = re.match(r"profile-target (\d+): (.*)", line.strip())
    if m:
        labels[int(m.group(1))] = m.group(2)
rows = list(csv.reader(open(raw, errors="replace")))
start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
if start is None:
    print("no metrics in the Nsight Compute report (see ncu.log: counters may need admin rights)")
    sys.exit(1)
head, records = rows[start], [r for r in rows[start + 2:] if len(r) == len(rows[start])]
col = {n: i for i, n in enumerate(head)}
def num(r, name):
    i = col.get(name)
    if i is None:
        return None
    try:
        return float(r[i].replace(",", ""))
    except ValueError:
        return None
stall = [(m.group(1), n) for n in col
         for m in [re.match(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$", n)] if m
         and not m.group(1).startswith("not_issued")]
if len(records) != len(labels):
    print(f"WARNING: {len(records)} profiled launches, {len(labels)} labels: names below may be off")
print(f"{len(records)} launches profiled; the third call of each target (caches warm):")
for n, r in enumerate(records):
    label = labels.get(n, f"launch {n}")
    if len(records) == len(labels) and not label.endswith("call 3"):
        continue
    dur = num(r, "gpu__time_duration.sum")
    occ = num(r, "sm__warps_active.avg.pct_of_peak_sustained_active")
    issue = num(r, "smsp__issue_active.avg.pct_of_peak_sustained_active")
    cpi = num(r, "smsp__average_warp_latency_per_inst_issued.ratio")
    top = sorted(((num(r, column) or 0.0, reason) for reason, column in stall), reverse=True)[:4]
    unit = r[col["gpu__time_duration.sum"]] if "gpu__time_duration.sum" in col else ""
    print(f"{label} [{r[col.get('Kernel Name', 0)]}, grid {r[col['Grid Size']] if 'Grid Size' in col else '?'}, block {r[col['Block Size']] if 'Block Size' in col else '?'}]")
    print(f"    duration {dur} (unit row: {rows[start + 1][col['gpu__time_duration.sum']] if 'gpu__time_duration.sum' in col else '?'}), "
          f"achieved occupancy {occ} %, issue slots busy {issue} %, cycles per issued instruction per warp {cpi}")
    print("    top stalls (warp cycles per issued instruction): " + ", ".join(f"{name} {v:.2f}" for v, name in top))
PY
        section ncu-summary 15 python3 "$out/ncu_summary.py" "$out/ncu-raw.csv" "$out/ncu.log"
        cat "$out/ncu-summary.log"
    fi
else
    echo "ncu not found: the Nsight Compute step NOT run" | tee "$out/ncu.log"
    results+=("{\"section\":\"ncu\",\"status\":\"NOT RUN\"}")
    overall=1
fi
section resolve-global-state 20 "$bin/cuda-conformance-resolve-global" resolve/
section gather-in-order 30 "$bin/cuda-conformance-gather-in-order" gather
if [ -n "$sanitizer" ]; then
    for spec in remap:20 resolve:30 gather:15 pipeline:15 tables:10; do
        group=${spec%%:*}
        section "memcheck-$group" "${spec##*:}" "$sanitizer" --tool memcheck --leak-check no \
            "${common[@]}" "$bin/cuda-conformance" "$group/"
    done
    section memcheck-fused 40 "$sanitizer" --tool memcheck --leak-check no "${common[@]}" \
        "$bin/cuda-fused"
    section racecheck-remap 15 "${race[@]}" "$bin/cuda-conformance" remap/
    # racecheck_each NAME SHARE FILTER...: one racecheck process per conformance filter, SHARE
    # seconds each; with no filter at all the check is NOT RUN and the script fails.
    racecheck_each() {
        local name=$1 share=$2 f f2
        shift 2
        if [ "$#" -eq 0 ]; then
            echo "no $name cases listed by $bin/cuda-conformance --list" | tee "$out/racecheck-$name.log"
            results+=("{\"section\":\"racecheck-$name\",\"status\":\"NOT RUN\"}")
            overall=1
        fi
        for f in "$@"; do
            f2=${f%/}
            section "racecheck-${f2//\//-}" "$share" "${race[@]}" "$bin/cuda-conformance" "$f"
        done
    }
    listed() { "$bin/cuda-conformance" --list 2>/dev/null | sed -n 's/: test$//p'; }
    # The gather cases one process each (all of them in one process outlast any share of the
    # budget under racecheck).
    mapfile -t gathers < <(listed | grep '^gather/')
    racecheck_each gather 20 "${gathers[@]}"
    # The resolver is shared-memory heavy and slow under racecheck: one process per scenario,
    # the 32768-slot scenario (the largest state) last, with the time that is left.
    mapfile -t groups < <(listed | grep '^resolve/' | sed -E 's#^(resolve/[^/]+)/.*#\1/#' \
        | sort -u | grep -v max-hot-slots)
    racecheck_each resolve 25 "${groups[@]}"
    section racecheck-resolve-max-hot-slots-32768 300 "${race[@]}" "$bin/cuda-conformance" \
        resolve/max-hot-slots-32768/
else
    echo "compute-sanitizer not found: memcheck and racecheck NOT run" | tee "$out/sanitizer.log"
    results+=("{\"section\":\"sanitizers\",\"status\":\"NOT RUN\"}")
    overall=1
fi
echo "clocks at the end: $(clocks)"

# The ceilings and every judged figure of the bench (the whole table is in
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
echo "dropped for the budget (${HISPARSE_GPU_BUDGET:-400} s): ${dropped:-none}"
write_summary cuda-perf
