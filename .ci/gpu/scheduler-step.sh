#!/usr/bin/env bash
# The coordinator's scheduler step before and after (issue 13: it must stay within 20 µs), on
# the GPU machine's idle host CPU, from the repository root, with the binaries of
# .ci/gpu/scheduler-build.sh in gpu-scheduler/ (carry that folder). No GPU is used.
#
# Runs the baseline and the new bench alternately, three times each (criterion: 30 samples over
# 6 s after a 3 s warm-up; each run also prefills 256 requests of 32K tokens first), and prints
# every run's median and interval, then the median of the three medians of each. Logs in
# $OUT/scheduler/, a summary in $OUT/scheduler/summary.json. Whole run: about 2 minutes (a limit
# of 60 s per run, 6 minutes at most).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=${HISPARSE_GPU_BIN:-gpu-scheduler}
out=${OUT:-/tmp/hisparse-gpu}/scheduler
mkdir -p "$out"
for f in scheduler-new scheduler-base; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run .ci/gpu/scheduler-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"
echo "== host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
for round in 1 2 3; do
    for which in base new; do
        log="$out/$which-$round.log"
        # criterion writes its own reports under target/criterion: keep them out of the tree.
        if ! (cd "$out" && timeout 60 "$root/$bin/scheduler-$which" --bench --noplot) >"$log" 2>&1; then
            echo "$which run $round failed or timed out (see $log)"
            status=1
        fi
        line=$(grep -m1 'time:' "$log" | sed 's/^ *//')
        echo "$which $round: ${line:-no figure}"
    done
done
python3 - "$out" <<'PY'
import json, re, statistics, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {}
for which in ("base", "new"):
    meds = []
    for log in sorted(out.glob(f"{which}-*.log")):
        m = re.search(r"time:\s+\[([\d.]+) (\S+) ([\d.]+) (\S+) ([\d.]+) (\S+)\]", log.read_text())
        if m:
            scale = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3}[m.group(4)]
            meds.append(float(m.group(3)) * scale)
    runs[which] = {"medians_us": meds, "median_of_medians_us": statistics.median(meds) if meds else None}
(out / "summary.json").write_text(json.dumps(runs, indent=2))
for which, r in runs.items():
    print(f"{which}: median of medians {r['median_of_medians_us']} µs over {r['medians_us']}")
PY
exit $status
