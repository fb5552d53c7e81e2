#!/usr/bin/env bash
# Disaggregated prefill -> decode over NIXL on the GPU machine (issue 18), from the repository
# root, with what scripts/h200/nixl-build.sh put in h200-nixl/ (carry that folder):
#
#   1. libs: the wheel's libraries unpacked to a temporary folder; ldd of the C API, the UCX
#      plugin and UCX's CUDA module (a library that does not load is named here);
#   2. transfer: hisparse-nixl's transfer tests, NIXL required (two agents, host to host, every
#      byte of the decode pool checked);
#   3. pd-host: `simulate --pd nixl --backend cpu` with the default workload (4 requests x 8192
#      tokens of DeepSeek V3.2, 61 layers, 48 decode steps): a prefill and a decode process, host
#      memory to the decode host pool, every imported row verified in the host pool, then every
#      imported request decoded, every row attention reads verified;
#   4. pd-gpu: `simulate --pd nixl --backend cuda`, 4 requests x 8000 tokens (a partial last page
#      each, restored to the GPU at import): the prefill side's pool in GPU memory (registered with
#      NIXL as VRAM) written into the decode side's pinned host pool, decode on the GPU;
#   5. pd-gpu-protocols: a small run of (4) with UCX's protocol selection and warnings printed
#      (UCX_PROTO_INFO=y, UCX_LOG_LEVEL=info): which transport moved GPU memory to the host pool
#      (or what UCX refused); its tables for puts are copied into the summary.
#
# The whole script runs inside a 330 s budget (about 2-3 minutes are expected). Logs and JSON in
# $OUT/nixl/, a summary in $OUT/nixl/summary.json and on stdout: per run, rows verified and
# mismatched (imported and decoded), import throughput beside NIXL's bulk figure of the same run,
# and UCX's protocol choice for the GPU-memory source. Exit status 0 only when
# every section passed and no row mismatched.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=scripts/h200/cuda-common.sh
. scripts/h200/cuda-common.sh
budget 330
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

# ldd of the C API, the UCX plugin and UCX's CUDA modules: prints what does not resolve.
check_libs='missing=0
for f in "$0"/.nixl_cu13.mesonpy.libs/libnixl_capi.so "$0"/.nixl_cu13.mesonpy.libs/plugins/libplugin_UCX.so \
    "$0"/nixl_cu13.libs/ucx/libuct_cuda.so.* "$0"/nixl_cu13.libs/ucx/libucm_cuda.so.*; do
    echo "$f:"
    if ldd "$f" | grep "not found"; then missing=1; fi
done
[ $missing = 0 ] && echo "every library resolves"
exit $missing'

section libs 20 bash -c "$check_libs" "$libs"
section transfer 90 "$bin/nixl-transfer" --test-threads=1
section pd-host 120 sh -c "'$bin/hisparse' simulate --pd nixl --backend cpu --json > '$out/pd-host.json'"
section pd-gpu 120 sh -c "HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --context 8000 --json > '$out/pd-gpu.json'"
section pd-gpu-protocols 60 sh -c "UCX_PROTO_INFO=y UCX_LOG_LEVEL=info HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --layers 4 --requests 1 --context 2000 --decode-steps 2"
echo "-- UCX's choice for puts (pd-gpu-protocols.log):"
grep -A8 'remote memory write by ucp_put' "$out/pd-gpu-protocols.log" 2>/dev/null | grep -E 'ucp_put|\|' | sed 's/^\[[^]]*\] \[[^]]*\] *//' | sort -u | head -n 20
grep -iE 'error|warn|unsupported|failed' "$out/pd-gpu-protocols.log" 2>/dev/null | head -n 10
[ -s "$out/pd-gpu.json" ] || tail -n 30 "$out/pd-gpu.log"

for f in pd-host pd-gpu; do
    [ -s "$out/$f.json" ] || { echo "$f: no report (see $out/$f.log)"; continue; }
    python3 - "$out/$f.json" <<'PY' || overall=1
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: {r['source_memory']} memory on {r['prefill_device']} -> "
      f"host pool on {r['device']}: {r['requests']} requests x {r['context']} tokens, {r['writes']} writes "
      f"of {r['descriptors_per_write']} descriptors")
print(f"  transfer {r['transfer_gb_per_s']:.2f} GB/s ({r['transfer_bytes']} B in {r['transfer_seconds']:.3f} s) "
      f"beside NIXL bulk {r['bulk_gb_per_s']:.2f} GB/s ({r['bulk_bytes']} B host -> host pool, best of 3)")
print(f"  verified: {r['imported_rows_verified']} imported rows, {r['decode_rows_verified']} decode reads, "
      f"mismatched {r['mismatched_rows']}; decoded={r['decoded']} ({r['decode_steps']} tokens each, "
      f"{r['restored_pages']} pages restored, hit rate {r['hit_rate']:.3f}); wall {r['wall_seconds']:.1f} s")
want = r["requests"] * r["sparse_layers"] * r["context"]
ok = r["mismatched_rows"] == 0 and r["imported_rows_verified"] == want and r["decoded"]
sys.exit(0 if ok else 1)
PY
done
write_summary nixl
