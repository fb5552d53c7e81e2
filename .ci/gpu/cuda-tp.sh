#!/usr/bin/env bash
# One host pool for every tensor-parallel rank of a node, on CUDA (issue 17), from the repository
# root, with the binaries of .ci/gpu/cuda-build.sh in gpu-cuda/ (carry that folder):
#
#   1. gpu-cuda/cuda-shared: one shared-memory segment mapped twice, a device→host copy through
#      one mapping's buffer read back by a host→device copy and the gather kernel through the
#      other's (on device 1 for the second mapping when the machine has two GPUs);
#   2. `hisparse simulate --backend cuda --tp 2 --shared-host-pool` with the default workload: two
#      rank processes, one pinned host pool in shared memory, every row verified in both ranks
#      (JSON in $OUT/cuda-tp/sim-tp2-shared.json);
#   3. the same with one host pool per rank, for the node's host memory against (2);
#   4. `hisparse bench --backend cuda` (JSON), the figures cuda_bench's `cli` section reproduces.
#
# The whole script runs inside a 300 s budget (about 2 minutes are expected). Logs in
# $OUT/cuda-tp/, a summary in $OUT/cuda-tp/summary.json and on stdout, with each simulation's
# verified and mismatched rows per rank and the node's host memory. Exit status 0 only when every
# section passed and no row mismatched.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=.ci/gpu/lib.sh
. .ci/gpu/lib.sh
budget "${HISPARSE_GPU_BUDGET:-300}"
bin=${HISPARSE_GPU_BIN:-gpu-cuda}
out=${OUT:-/tmp/hisparse-gpu}/cuda-tp
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1

echo "== CUDA tensor-parallel ranks on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1) ($(nvidia-smi -L 2>/dev/null | wc -l) GPUs)"
for f in cuda-shared hisparse; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run .ci/gpu/cuda-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

section shared 30 "$bin/cuda-shared"
section sim-tp2-shared 120 sh -c "'$bin/hisparse' simulate --backend cuda --tp 2 --shared-host-pool --json > '$out/sim-tp2-shared.json'"
section sim-tp2-own-pools 120 sh -c "'$bin/hisparse' simulate --backend cuda --tp 2 --json > '$out/sim-tp2-own.json'"
section cli-bench 60 sh -c "'$bin/hisparse' bench --backend cuda --json > '$out/bench-cli.json'"

# Per simulation: rows verified and mismatched in every rank, and the node's host memory.
for f in sim-tp2-shared sim-tp2-own; do
    [ -s "$out/$f.json" ] || continue
    python3 - "$out/$f.json" <<'PY' || overall=1
import json, sys
s = json.load(open(sys.argv[1]))
ranks = s.get("ranks", [])
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: shared_host_pool={s.get('shared_host_pool')} "
      f"tp={s.get('tp')} verified={s.get('verified_rows')} mismatched={s.get('mismatched_rows')} "
      f"host_memory={s.get('host_memory_bytes')} host_pool={s.get('host_pool_bytes')} "
      f"reclaimed={s.get('reclaimed_pages')} hit_rate={s.get('hit_rate')}")
for i, r in enumerate(ranks):
    print(f"  rank {i}: verified {r.get('verified_rows')} mismatched {r.get('mismatched_rows')} "
          f"device_us_per_step {r.get('device_us_per_step')}")
bad = s.get("mismatched_rows", 1) != 0 or any(r.get("mismatched_rows", 1) != 0 for r in ranks)
sys.exit(1 if bad or len(ranks) != s.get("tp") else 0)
PY
done
write_summary cuda-tp
