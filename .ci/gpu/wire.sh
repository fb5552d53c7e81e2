#!/usr/bin/env bash
# The wire format's encode and decode time (a 256-request DeepSeek V3.2 decode step, 36,260
# bytes) and the layout fingerprint's, on the GPU machine's idle host CPU, from the repository
# root, with the binaries of .ci/gpu/wire-build.sh in gpu-wire/. No GPU is used.
#
# Runs the criterion bench three times (30 samples over 3 s per figure after a 3 s warm-up) and
# the driver five times, and prints every run's figures, then the median of the three criterion
# medians of each figure. Logs in $OUT/wire/, a summary in $OUT/wire/summary.json. Whole run:
# about 1.5 minutes (60 s per run at most).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=${HISPARSE_GPU_BIN:-gpu-wire}
out=${OUT:-/tmp/hisparse-gpu}/wire
mkdir -p "$out"
for f in wire wire_codec; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run .ci/gpu/wire-build.sh on the development machine" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"
echo "== host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
for round in 1 2 3; do
    log="$out/bench-$round.log"
    # criterion writes its own reports under target/criterion: keep them out of the tree.
    if ! (cd "$out" && timeout 60 "$root/$bin/wire" --bench --noplot) >"$log" 2>&1; then
        echo "bench run $round failed or timed out (see $log)"
        status=1
    fi
    grep -E '^message bytes|^wire/|time:' "$log" | sed 's/^ */  /'
done
for round in 1 2 3 4 5; do
    timeout 60 "$root/$bin/wire_codec" 2>&1 | tee -a "$out/driver.log" || status=1
done
python3 - "$out" <<'PY'
import json, re, statistics, sys, pathlib
out = pathlib.Path(sys.argv[1])
scale = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3}
figures = {}
for log in sorted(out.glob("bench-*.log")):
    text = log.read_text()
    for name, mid, unit in re.findall(r"(wire/\S+)\s+time:\s+\[\S+ \S+ ([\d.]+) (\S+) \S+ \S+\]", text):
        figures.setdefault(name, []).append(float(mid) * scale[unit])
summary = {n: {"medians_us": m, "median_of_medians_us": statistics.median(m)} for n, m in figures.items()}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
for n, r in summary.items():
    print(f"{n}: median of medians {r['median_of_medians_us']:.2f} µs over {r['medians_us']}")
PY
exit $status
