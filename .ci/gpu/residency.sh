#!/usr/bin/env bash
# The residency policy on CUDA (issue 14), from the repository root, with the CLI of
# .ci/gpu/cuda-build.sh in gpu-cuda/ (carry that folder):
#
#   1. `hisparse simulate --backend cuda` with the default workload (lazy reclaim, the low
#      watermark; DeepSeek V3.2, 4 requests x 8192 tokens, 48 decode steps);
#   2. the same with `--shared-prefix 8192` (prefix hits adopt the GPU copies of the shared
#      pages: no hot region for them);
#   3. the same with `--import` (every request's prompt KV written into the host blocks the
#      coordinator names, as a prefill node would, then decoded from host);
#   4. `--prefix-on-host` (a 4096-token shared prefix whose GPU copies are dropped after the
#      first request: the others' prefill chunks read it staged back on the GPU);
#   5. the default workload with `--micro-batches 2` (each decode step's calls as two
#      micro-batches on a side stream: the same hits and misses as run 1).
#
# Every run also verifies prefill reads (each prefill chunk's last token's top-k over its whole
# context, remapped through the resident tables): prefill_rows_checked / prefill_mismatched.
# Every row attention reads is verified in each run. The whole script runs inside a 170 s
# budget (each simulation took about 13 s on an H200), so it ends within 3 minutes. Logs and JSON in $OUT/residency/, a summary in $OUT/residency/summary.json and on
# stdout: per run the rows verified and mismatched, hot_regions_allocated, h2d_bytes_per_step,
# pages reclaimed, requests imported, pages staged for prefill, prefill rows checked and
# device time per decode step. Exit status 0 only when
# every run passed and no row mismatched.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=.ci/gpu/lib.sh
. .ci/gpu/lib.sh
budget 170
bin=${HISPARSE_GPU_BIN:-gpu-cuda}
out=${OUT:-/tmp/hisparse-gpu}/residency
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1

echo "== residency policy on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
if [ ! -x "$bin/hisparse" ]; then
    echo "missing $bin/hisparse: run .ci/gpu/cuda-build.sh on the development machine and carry $bin" >&2
    exit 2
fi
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

section sim-default 50 sh -c "'$bin/hisparse' simulate --backend cuda --json > '$out/sim-default.json'"
section sim-shared-prefix 50 sh -c "'$bin/hisparse' simulate --backend cuda --shared-prefix 8192 --json > '$out/sim-shared-prefix.json'"
section sim-import 50 sh -c "'$bin/hisparse' simulate --backend cuda --import --json > '$out/sim-import.json'"
section sim-prefix-on-host 50 sh -c "'$bin/hisparse' simulate --backend cuda --prefix-on-host --json > '$out/sim-prefix-on-host.json'"
section sim-micro-batches 50 sh -c "'$bin/hisparse' simulate --backend cuda --micro-batches 2 --json > '$out/sim-micro-batches.json'"

for f in sim-default sim-shared-prefix sim-import sim-prefix-on-host sim-micro-batches; do
    if [ ! -s "$out/$f.json" ]; then
        echo "$f: no JSON (see $out/$f.log)"
        overall=1
        continue
    fi
    python3 - "$out/$f.json" <<'PY' || overall=1
import json, sys
s = json.load(open(sys.argv[1]))
name = sys.argv[1].rsplit("/", 1)[-1]
print(f"{name}: verified={s.get('verified_rows')} mismatched={s.get('mismatched_rows')} "
      f"hot_regions_allocated={s.get('hot_regions_allocated')} "
      f"h2d_bytes_per_step={s.get('h2d_bytes_per_step', 0):.0f} "
      f"reclaimed={s.get('reclaimed_pages')} imported={s.get('imported_requests')} "
      f"staged={s.get('pages_staged')} prefill_rows={s.get('prefill_rows_checked')} "
      f"prefill_mismatched={s.get('prefill_mismatched_rows')} "
      f"hit_rate={s.get('hit_rate')} device_us_per_step={s.get('device_us_per_step', 0):.0f}")
if s.get("first_mismatch"):
    print(f"  first mismatch: {s['first_mismatch']}")
ok = s.get("mismatched_rows", 1) == 0 and s.get("verified_rows", 0) > 0
if name.startswith("sim-prefix-on-host") and not s.get("pages_staged"):
    print("  no page was staged: the prefix-on-host run did not exercise staging")
    ok = False
if name.startswith("sim-micro-batches"):
    whole = json.load(open(sys.argv[1].replace("sim-micro-batches", "sim-default")))
    for key in ("verified_rows", "hot_hits", "misses", "h2d_bytes", "reclaimed_pages"):
        if s.get(key) != whole.get(key):
            print(f"  {key}: {s.get(key)} with micro-batches, {whole.get(key)} with one call")
            ok = False
sys.exit(0 if ok else 1)
PY
done
write_summary residency.sh
