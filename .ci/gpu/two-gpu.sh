#!/usr/bin/env bash
# Two GPUs of one host, from the repository root, in one call: tensor-parallel ranks on their own
# GPUs over one host pool, prefill on GPU 0 -> decode on GPU 1 over NIXL, and the Python module's
# two worker processes each on its own GPU. Carry gpu-nixl/ (.ci/gpu/nixl-build.sh: the CLI with
# cuda and nixl, the NIXL libraries) and gpu-python/ (.ci/gpu/python-build.sh: the wheel).
#
#   1. gpus: at least two GPUs, or the job fails here (nothing below would mean what it says);
#   2. tp1: `hisparse simulate --backend cuda` on GPU 0 alone, the one-GPU figure;
#   3. tp2-shared: `--tp 2 --shared-host-pool`, rank r on GPU r, one pinned host pool for the
#      node: 0 mismatched rows in both ranks, host memory counted once, each rank's device time
#      per step beside (2);
#   4. pd-two-gpus: `simulate --pd nixl --backend cuda --pd-prefill-device 0 --device 1`, the
#      default write (packed-host), every imported row and decode read verified; its transfer
#      beside the same run's bulk figures; then the same with UCX's protocol report
#      (UCX_PROTO_INFO=y) to name the transport that carried the writes;
#   5. python-two-gpus: hisparse-py's two-process test with each CUDA worker on its own GPU
#      (HISPARSE_WORKER_GPUS=2: worker r on cuda:r).
#
# Budget 540 s (HISPARSE_GPU_BUDGET). Logs and JSON in $OUT/two-gpu/, a summary in
# $OUT/two-gpu/summary.json and on stdout. Exit status 0 only when every section passed and no
# row mismatched.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=.ci/gpu/lib.sh
. .ci/gpu/lib.sh
budget "${HISPARSE_GPU_BUDGET:-540}"
bin=${HISPARSE_GPU_BIN:-gpu-nixl}
out=${OUT:-/tmp/hisparse-gpu}/two-gpu
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1

for f in "$bin/hisparse" "$bin/nixl-libs.tar.xz"; do
    if [ ! -e "$f" ]; then
        echo "missing $f: run .ci/gpu/nixl-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"
nvidia-smi -L 2>/dev/null | tee "$out/gpus.txt"

use_nixl_libs "$bin/nixl-libs.tar.xz"

section gpus 10 sh -c '[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "fewer than two GPUs: this job needs a two-GPU machine"; exit 1; }'
section tp1 120 --stdout "$out/tp1.json" "$bin/hisparse" simulate --backend cuda --device 0 --json
section tp2-shared 150 --stdout "$out/tp2-shared.json" \
    "$bin/hisparse" simulate --backend cuda --tp 2 --shared-host-pool --json
section pd-two-gpus 90 --stdout "$out/pd-two-gpus.json" \
    "$bin/hisparse" simulate --pd nixl --backend cuda --pd-prefill-device 0 --device 1 \
    --context 8100 --json
section pd-two-gpus-protocols 60 --stdout "$out/pd-two-gpus-protocols.json" \
    env UCX_PROTO_INFO=y UCX_LOG_LEVEL=info "$bin/hisparse" simulate --pd nixl --backend cuda \
    --pd-prefill-device 0 --device 1 --requests 1 --context 2000 --decode-steps 2 --json
if [ -d gpu-python ]; then
    section python-two-gpus 120 sh -c "pip install --quiet --no-index --target /tmp/hisparse-wheel gpu-python/hisparse-*.whl && cd hisparse-py/tests && HISPARSE_WORKER_GPUS=2 PYTHONPATH=/tmp/hisparse-wheel python3 -m pytest -v -p no:cacheprovider test_processes.py -k cuda"
else
    echo "gpu-python/ not carried: the Python two-process run is not done" | tee "$out/python-two-gpus.log"
    overall=1
fi

# Per run: rows verified and mismatched in every rank or side, host memory, device time per step,
# transfer figures; the transports UCX chose for puts.
python3 - "$out" <<'PY' || overall=1
import json, os, sys
out, unreadable = sys.argv[1], []
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception as e:
        print(f"{name}: not readable ({e})")
        unreadable.append(name)
        return None
tp1, tp2, pd = load("tp1.json"), load("tp2-shared.json"), load("pd-two-gpus.json")
# A run whose report is missing verified nothing: the job fails.
bad = bool(unreadable)
if tp1:
    print(f"one GPU: verified {tp1.get('verified_rows')} mismatched {tp1.get('mismatched_rows')} "
          f"device_us_per_step {tp1.get('device_us_per_step')}")
    bad |= tp1.get("mismatched_rows", 1) != 0
if tp2:
    print(f"tp 2, shared host pool: host_memory {tp2.get('host_memory_bytes')} B")
    for i, r in enumerate(tp2.get("ranks", [])):
        print(f"  rank {i}: verified {r.get('verified_rows')} mismatched {r.get('mismatched_rows')} "
              f"device_us_per_step {r.get('device_us_per_step')}")
        bad |= r.get("mismatched_rows", 1) != 0
    bad |= len(tp2.get("ranks", [])) != 2
if pd:
    keys = ("prefill_device", "device", "write_layout", "verified_rows", "mismatched_rows",
            "transfer_gb_per_s", "same_transport_bulk_gb_per_s", "transfer_vs_same_transport")
    print("pd two GPUs: " + ", ".join(f"{k} {pd.get(k)}" for k in keys))
    bad |= pd.get("mismatched_rows", 1) != 0
sys.exit(1 if bad else 0)
PY
grep -h "remote memory write" "$out/pd-two-gpus-protocols.log" 2>/dev/null | sort -u | head -n 8
write_summary two-gpu.sh
