#!/usr/bin/env bash
# The host pool on the GPU machine (issue 28), from the repository root, with the binaries of
# .ci/gpu/host-pool-build.sh in gpu-hostpool/ and the wheel of .ci/gpu/python-build.sh
# in gpu-python/ (carry both):
#
#   1. cuda-host-pool: a ~200 MiB pool allocated, registered in 16 MiB chunks and whole, and an
#      engine's array lent — zeroed, rows across every chunk read through the device mapping
#      byte for byte, released (unregistered, unmapped) after the drop;
#   2. `hisparse bench --backend cuda --host-pool 8GiB,32GiB,64GiB`: set-up and release of the
#      runtime-owned pool, a lent array and a shared segment beside the same run's memset
#      (registration in chunks, transparent huge pages: the defaults);
#   3. the same for 64 GiB registered whole after a parallel touch (which default is faster);
#   4. the same for 64 GiB on base pages (whether transparent huge pages help here);
#   5. the Python side (scripts/bench/host_pool.py): hisparse.Runtime owning its pool, a numpy
#      array lent, PyTorch's `pin_memory=True` and `.pin_memory()`, for 8, 32 and 64 GiB;
#   6. a process that drops a 64 GiB pool and exits at once: it must exit 0 without waiting for
#      the release to finish (the time is printed).
#
# Budget 570 s (HISPARSE_GPU_BUDGET overrides); sections run in this order, so a smaller budget
# drops from the end. Logs and JSON in $OUT/host-pool/, a summary in summary.json and on stdout.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=.ci/gpu/lib.sh
. .ci/gpu/lib.sh
budget "${HISPARSE_GPU_BUDGET:-570}"
bin=${HISPARSE_GPU_BIN:-gpu-hostpool}
out=${OUT:-/tmp/hisparse-gpu}/host-pool
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1
nvrtc=/usr/local/cuda-13.0/targets/x86_64-linux/lib
[[ -d "$nvrtc" ]] && export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== host pool on $(nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>/dev/null | head -n 1)"
echo "cpus $(nproc), $(grep -E 'MemTotal|MemAvailable|HugePages_Total' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
echo "THP $(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag); /dev/shm $(df -h /dev/shm | awk 'NR==2 { print $2 " total, " $4 " free" }'); ulimit -l $(ulimit -l); NUMA nodes $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
for f in hisparse cuda-host-pool; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run .ci/gpu/host-pool-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

section pool-on-gpu 60 "$bin/cuda-host-pool"
section bench-chunks 200 sh -c "'$bin/hisparse' bench --backend cuda --host-pool 8GiB,32GiB,64GiB --json > '$out/bench-chunks.json'"
section bench-whole 70 sh -c "'$bin/hisparse' bench --backend cuda --host-pool 64GiB --registration whole --json > '$out/bench-whole.json'"
section bench-base-pages 70 sh -c "'$bin/hisparse' bench --backend cuda --host-pool 64GiB --huge-pages off --json > '$out/bench-base-pages.json'"

site=$(mktemp -d)
wheel=$(ls gpu-python/hisparse-*.whl 2>/dev/null | head -n 1)
if [ -n "$wheel" ] && python3 -m pip install --quiet --no-index --no-deps --target "$site" "$wheel" >"$out/pip.log" 2>&1; then
    python3 -c "import numpy" 2>/dev/null ||
        python3 -m pip install --quiet --no-index --no-deps --target "$site" gpu-python/fallback/numpy-*.whl >>"$out/pip.log" 2>&1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    section python 240 python3 scripts/bench/host_pool.py --backend cuda --sizes 8GiB,32GiB,64GiB --json "$out/python.json"
    section exit-while-releasing 60 python3 -c '
import time, hisparse
layout = hisparse.plan_layout("deepseek-v3.2", layers=1, gpu_mem=1 << 30, host_mem=64 << 30,
                              max_model_len=4096, num_gpu_blocks=256)
rt = hisparse.Runtime(layout, "cuda", state_rows=1, max_step_tokens=1)
t = time.perf_counter()
del rt
print(f"dropped a {layout.host_pool_bytes / 2**30:.1f} GiB pool in {time.perf_counter() - t:.3f} s; exiting")
'
else
    echo "no wheel in gpu-python/ (.ci/gpu/python-build.sh): the Python sections are skipped"
    overall=1
fi

for f in bench-chunks bench-whole bench-base-pages; do
    [ -s "$out/$f.json" ] || continue
    python3 - "$out/$f.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
name = sys.argv[1].rsplit("/", 1)[-1]
print(f"{name}: {r['device']}, registration {r['registration']}, pages {r['huge_pages']}")
for s in r["sizes"]:
    c = {x["name"]: x["gib_per_s"] for x in s["ceilings"]}
    print(f"  {s['bytes'] / 2**30:.0f} GiB: " + ", ".join(f"{k} {v:.1f} GiB/s" for k, v in c.items()))
    for p in s["paths"]:
        if "refused" in p:
            print(f"    {p['path']:<8} refused: {p['refused']}")
        elif "setup_seconds" in p:
            print(f"    {p['path']:<8} set-up {p['setup_seconds']:.2f} s = {p['setup_gib_per_s']:.1f} GiB/s "
                  f"({p['share_of_memset']:.2f}x memset), drop {p['drop_seconds']:.3f} s, "
                  f"released {p['release_seconds']:.2f} s; {p.get('setup') or '-'}")
PY
done
grep -hE "GiB:|^  (runtime|lent|torch)" "$out/python.log" 2>/dev/null
grep -h "dropped a" "$out/exit-while-releasing.log" 2>/dev/null
write_summary host-pool
