#!/usr/bin/env bash
# Disaggregated prefill -> decode over NIXL on the GPU machine (issue 18), from the repository
# root, with what scripts/h200/nixl-build.sh put in h200-nixl/ (carry that folder):
#
#   1. libs: the wheel's libraries unpacked to a temporary folder; ldd of the C API, the UCX
#      plugin and UCX's CUDA module (a library that does not load is named here);
#   2. transfer: hisparse-nixl's transfer tests, NIXL required (two agents, host to host, every
#      byte of the decode pool checked);
#   3. pd-host / pd-host-packed: `simulate --pd nixl --backend cpu` with the default workload
#      (4 requests x 8192 tokens of DeepSeek V3.2, 61 layers; 48 decode steps, 8 for the packed
#      run): a prefill and a decode process, host memory to the decode host pool, page by page
#      (one descriptor per layer and page) and packed (pages gathered into a staging buffer in
#      the host pool's order, one descriptor per layer and run of host blocks); every imported
#      row verified in the host pool, then every imported request decoded, every row attention
#      reads verified;
#   4. pd-gpu / pd-gpu-pages: `simulate --pd nixl --backend cuda`, 4 requests x 8100 tokens
#      (not a whole number of pages: each request's partial last page is restored to the GPU at
#      import; 48 decode steps, 8 for the page-by-page run): the prefill side's pool in GPU
#      memory written into the decode side's pinned host pool, packed on the GPU (device copies
#      into a registered VRAM staging buffer) and, for comparison, page by page straight from
#      the pool; decode on the GPU. The bulk figures of these runs include GPU memory -> host
#      pool (the imports' own transport), one descriptor and 2.5 MiB descriptors, beside host ->
#      host pool;
#   5. pd-gpu-protocols (skipped with HISPARSE_NIXL_PROTO_INFO=0): a small packed run of (4)
#      with UCX's protocol selection printed (UCX_PROTO_INFO=y, UCX_LOG_LEVEL=info); its tables
#      for puts are copied into the summary.
#
# The whole script runs inside a 180 s budget (about 2 minutes are expected). Logs and JSON in
# $OUT/nixl/, a summary in $OUT/nixl/summary.json and on stdout: per run, the write layout and
# descriptors, rows verified and mismatched (imported and decoded), pages restored, import
# throughput beside every bulk figure of the same run and its ratio to the same-transport one.
# Exit status 0 only when every section passed and no row mismatched.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=scripts/h200/cuda-common.sh
. scripts/h200/cuda-common.sh
budget 180
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
# In priority order (a section the budget has no time left for is skipped and named).
section pd-gpu 70 sh -c "HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --context 8100 --pd-write packed --json > '$out/pd-gpu.json'"
section pd-host 45 sh -c "'$bin/hisparse' simulate --pd nixl --backend cpu --pd-write pages --json > '$out/pd-host.json'"
section pd-gpu-pages 70 sh -c "HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --context 8100 --pd-write pages --decode-steps 8 --json > '$out/pd-gpu-pages.json'"
section pd-host-packed 40 sh -c "'$bin/hisparse' simulate --pd nixl --backend cpu --pd-write packed --decode-steps 8 --json > '$out/pd-host-packed.json'"
if [ "${HISPARSE_NIXL_PROTO_INFO:-1}" != 0 ]; then
    section pd-gpu-protocols 30 sh -c "UCX_PROTO_INFO=y UCX_LOG_LEVEL=info HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --pd-write packed --layers 4 --requests 1 --context 2000 --decode-steps 2"
    echo "-- UCX's choice for puts (pd-gpu-protocols.log):"
    grep -A8 'remote memory write by ucp_put' "$out/pd-gpu-protocols.log" 2>/dev/null | grep -E 'ucp_put|\|' | sed 's/^\[[^]]*\] \[[^]]*\] *//' | sort -u | head -n 24
    grep -iE 'error|warn|unsupported|failed' "$out/pd-gpu-protocols.log" 2>/dev/null | head -n 10
fi

for f in pd-host pd-host-packed pd-gpu pd-gpu-pages; do  # host rows, then GPU rows
    [ -s "$out/$f.json" ] || { echo "$f: no report (see $out/$f.log)"; tail -n 15 "$out/$f.log" 2>/dev/null; overall=1; continue; }
    python3 - "$out/$f.json" <<'PY' || overall=1
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: {r['source_memory']} memory on {r['prefill_device']} -> "
      f"host pool on {r['device']}: {r['requests']} requests x {r['context']} tokens, {r['writes']} "
      f"{r['write_layout']} writes of {r['descriptors_per_write']} descriptors")
print(f"  transfer {r['transfer_gb_per_s']:.2f} GB/s ({r['transfer_bytes']} B in {r['transfer_seconds']:.3f} s); "
      f"with packing ({r['pack_seconds']:.3f} s) {r['transfer_with_pack_gb_per_s']:.2f} GB/s")
for b in r["bulk"]:
    print(f"  bulk {b['source_memory']:>4} -> host pool, {b['descriptors']:>4} descriptor(s): {b['gb_per_s']:.2f} GB/s "
          f"({b['bytes']} B in {b['seconds']:.3f} s, best of 3); transfer/bulk {r['transfer_gb_per_s'] / b['gb_per_s']:.2f}")
print(f"  same-transport ceiling: {r['same_transport_bulk']} {r['same_transport_bulk_gb_per_s']:.2f} GB/s, "
      f"transfer at {r['transfer_vs_same_transport']:.2f} of it")
print(f"  verified: {r['imported_rows_verified']} imported rows, {r['decode_rows_verified']} decode reads, "
      f"mismatched {r['mismatched_rows']}; decoded={r['decoded']} ({r['decode_steps']} tokens each, "
      f"pages restored: {r['restored_pages']}, hit rate {r['hit_rate']:.3f}); wall {r['wall_seconds']:.1f} s")
want = r["requests"] * r["sparse_layers"] * r["context"]
ok = r["mismatched_rows"] == 0 and r["imported_rows_verified"] == want and r["decoded"]
# DeepSeek V3.2's pages are 64 tokens: a context that is no multiple leaves a partial last page.
if r["context"] % 64 and r["restored_pages"] < r["requests"]:
    print(f"  FAIL: {r['context']} tokens leave a partial last page per request, but {r['restored_pages']} pages were restored")
    ok = False
sys.exit(0 if ok else 1)
PY
done
write_summary nixl
