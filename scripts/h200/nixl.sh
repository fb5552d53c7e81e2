#!/usr/bin/env bash
# Disaggregated prefill -> decode over NIXL on the GPU machine (issue 18), from the repository
# root, with what scripts/h200/nixl-build.sh put in h200-nixl/ (carry that folder):
#
#   1. libs: the wheel's libraries unpacked to a temporary folder; ldd of the C API, the UCX
#      plugin and UCX's CUDA module (a library that does not load is named here);
#   2. transfer: hisparse-nixl's transfer tests, NIXL required (two agents, host to host, every
#      byte of the decode pool checked);
#   3. pd-host: `simulate --pd nixl --backend cpu` with the default workload (4 requests x 8192
#      tokens of DeepSeek V3.2, 61 layers): a prefill and a decode process, host memory to the
#      decode host pool, every imported row verified;
#   4. pd-gpu: `simulate --pd nixl --backend cuda`, the same workload: the prefill side's pool in
#      GPU memory (registered with NIXL as VRAM) written into the decode side's pinned host pool;
#   5. pd-gpu-protocols: only when pd-gpu failed, a small run of it with UCX's protocol selection
#      and warnings printed (UCX_PROTO_INFO=y, UCX_LOG_LEVEL=info), to say what UCX refused.
#
# The whole script runs inside a 300 s budget (about 1-2 minutes are expected). Logs and JSON in
# $OUT/nixl/, a summary in $OUT/nixl/summary.json and on stdout: per run, rows verified and
# mismatched, import throughput beside NIXL's bulk figure of the same run. Exit status 0 only when
# every section passed and no row mismatched.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=scripts/h200/cuda-common.sh
. scripts/h200/cuda-common.sh
budget 300
bin=${HISPARSE_H200_NIXL:-h200-nixl}
out=${OUT:-/tmp/hisparse-h200}/nixl
mkdir -p "$out"

echo "== NIXL disaggregated prefill -> decode on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
for f in hisparse nixl-transfer nixl-libs.tar.xz; do
    if [ ! -e "$bin/$f" ]; then
        echo "missing $bin/$f: run scripts/h200/nixl-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

libs=$(mktemp -d)
trap 'rm -rf "$libs"' EXIT
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$bin/nixl-libs.tar.xz" "$libs"
cuda_lib=$(ls -d /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | head -n 1)
export LD_LIBRARY_PATH="$libs/.nixl_cu13.mesonpy.libs:$libs/nixl_cu13.libs${cuda_lib:+:$cuda_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NIXL_PLUGIN_DIR="$libs/.nixl_cu13.mesonpy.libs/plugins"
export HISPARSE_REQUIRE_NIXL=1

check_libs() {
    local f missing=0
    for f in "$libs/.nixl_cu13.mesonpy.libs/libnixl_capi.so" "$NIXL_PLUGIN_DIR/libplugin_UCX.so" \
        "$libs"/nixl_cu13.libs/ucx/libuct_cuda.so.* "$libs"/nixl_cu13.libs/ucx/libucm_cuda.so.*; do
        echo "$f:"
        if ldd "$f" | grep 'not found'; then missing=1; fi
    done
    [ $missing = 0 ] && echo "every library resolves"
    return $missing
}

section libs 20 check_libs
section transfer 90 "$bin/nixl-transfer" --test-threads=1
section pd-host 120 sh -c "'$bin/hisparse' simulate --pd nixl --backend cpu --json > '$out/pd-host.json'"
section pd-gpu 120 sh -c "HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --json > '$out/pd-gpu.json'"
if ! grep -q '"mismatched_rows": 0' "$out/pd-gpu.json" 2>/dev/null; then
    section pd-gpu-protocols 60 sh -c "UCX_PROTO_INFO=y UCX_LOG_LEVEL=info HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --layers 4 --requests 1 --context 2048 --json"
    tail -n 40 "$out/pd-gpu.log" "$out/pd-gpu-protocols.log" 2>/dev/null
fi

for f in pd-host pd-gpu; do
    [ -s "$out/$f.json" ] || { echo "$f: no report (see $out/$f.log)"; continue; }
    python3 - "$out/$f.json" <<'PY' || overall=1
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: {r['source_memory']} memory on {r['prefill_device']} -> "
      f"host pool: {r['requests']} requests x {r['context']} tokens, {r['writes']} writes of "
      f"{r['descriptors_per_write']} descriptors; verified {r['verified_rows']} mismatched "
      f"{r['mismatched_rows']}; transfer {r['transfer_gb_per_s']:.2f} GB/s "
      f"({r['transfer_bytes']} B in {r['transfer_seconds']:.3f} s) beside NIXL bulk "
      f"{r['bulk_gb_per_s']:.2f} GB/s ({r['bulk_bytes']} B host -> host, best of 3); "
      f"decoded={r['decoded']}")
want = r["requests"] * r["sparse_layers"] * r["context"]
sys.exit(0 if r["mismatched_rows"] == 0 and r["verified_rows"] == want else 1)
PY
done
write_summary nixl
