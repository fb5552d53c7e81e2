#!/usr/bin/env bash
# Disaggregated prefill -> decode over NIXL on the GPU machine (issue 18), from the repository
# root, with what .ci/gpu/nixl-build.sh put in gpu-nixl/ (carry that folder):
#
#   1. libs: the wheel's libraries unpacked to a temporary folder; ldd of the C API, the UCX
#      plugin and UCX's CUDA module (a library that does not load is named here);
#   2. transfer: hisparse-nixl's transfer tests, NIXL required (two agents, host to host, every
#      byte of the decode pool checked);
#   3. pd-gpu: `simulate --pd nixl --backend cuda --pd-write auto` (= packed-host), 4 requests x
#      8100 tokens of DeepSeek V3.2, 61 layers (not a whole number of pages: each request's partial
#      last page is restored to the GPU at import), 48 decode steps: the prefill side copies each
#      request's pages from its GPU pool into a pinned host staging buffer (device -> host copies
#      on the copy stream, one event), in the decode host pool's order, and writes it host ->
#      decode host pool (one descriptor per layer and run of host blocks); decode on the GPU.
#      Its same-transport ceiling is the host -> host pool bulk figure of the same run; the GPU
#      -> host pool bulk figures are measured too (they show why the mode exists: UCX emulates
#      puts from GPU memory into another process's host memory over TCP loopback);
#   4. pd-gpu-packed: the same with --pd-write packed (device staging buffer in VRAM, written
#      from GPU memory: run 12's mode), 8 decode steps; ceiling: the GPU -> host pool bulk;
#   5. pd-host: `simulate --pd nixl --backend cpu --pd-write pages`, 4 requests x 8192 tokens,
#      host memory to the decode host pool page by page (one descriptor per layer and page);
#   6. pd-gpu-pages / pd-host-packed (lower priority, skipped when the budget runs short): GPU
#      pool page by page, host pool packed, 8 decode steps;
#   7. pd-gpu-protocols (skipped with HISPARSE_NIXL_PROTO_INFO=0): a small packed-host run of (3)
#      with UCX's protocol selection printed (UCX_PROTO_INFO=y, UCX_LOG_LEVEL=info); its tables
#      for puts (host -> host for the imports, GPU -> host for the GPU bulk figure) are printed.
#
# Every imported row is verified in the decode host pool, then every imported request decoded,
# every row attention reads verified. The whole script runs inside a 180 s budget (about 2.5
# minutes are expected). Logs and JSON in $OUT/nixl/, a summary in $OUT/nixl/summary.json and on
# stdout: per run, the write layout, the memory its writes read from and descriptors, rows
# verified and mismatched, pages restored, transfer throughput and transfer with packing (the
# device -> host or device -> device copies counted), every bulk figure of the same run and the
# ratios to the same-transport one; then packed-host over packed (transfer with packing).
# Exit status 0 only when every section passed and no row mismatched.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=.ci/gpu/lib.sh
. .ci/gpu/lib.sh
budget 180
bin=${HISPARSE_GPU_NIXL:-gpu-nixl}
out=${OUT:-/tmp/hisparse-gpu}/nixl
mkdir -p "$out"

echo "== NIXL disaggregated prefill -> decode on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
for f in hisparse nixl-transfer nixl-libs.tar.xz; do
    if [ ! -e "$bin/$f" ]; then
        echo "missing $bin/$f: run .ci/gpu/nixl-build.sh on the development machine and carry $bin" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

use_nixl_libs "$bin/nixl-libs.tar.xz"

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
section pd-gpu 60 sh -c "HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --context 8100 --pd-write auto --json > '$out/pd-gpu.json'"
section pd-gpu-packed 60 sh -c "HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --context 8100 --pd-write packed --decode-steps 8 --json > '$out/pd-gpu-packed.json'"
section pd-host 40 sh -c "'$bin/hisparse' simulate --pd nixl --backend cpu --pd-write pages --json > '$out/pd-host.json'"
if [ "${HISPARSE_NIXL_PROTO_INFO:-1}" != 0 ]; then
    section pd-gpu-protocols 30 sh -c "UCX_PROTO_INFO=y UCX_LOG_LEVEL=info HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --pd-write auto --layers 4 --requests 1 --context 2000 --decode-steps 2"
    echo "-- UCX's choice for puts (pd-gpu-protocols.log):"
    grep -A8 'remote memory write by ucp_put' "$out/pd-gpu-protocols.log" 2>/dev/null | grep -E 'ucp_put|\|' | sed 's/^\[[^]]*\] \[[^]]*\] *//' | sort -u | head -n 24
    grep -iE 'error|warn|unsupported|failed' "$out/pd-gpu-protocols.log" 2>/dev/null | head -n 10
fi
section pd-gpu-pages 45 sh -c "HISPARSE_REQUIRE_DEVICE=1 '$bin/hisparse' simulate --pd nixl --backend cuda --context 8100 --pd-write pages --decode-steps 8 --json > '$out/pd-gpu-pages.json'"
section pd-host-packed 25 sh -c "'$bin/hisparse' simulate --pd nixl --backend cpu --pd-write packed --decode-steps 8 --json > '$out/pd-host-packed.json'"

# Per run: (report, the write layout it must have used, the memory its writes must read from).
for row in pd-gpu:packed-host:host pd-gpu-packed:packed:gpu pd-host:pages:host pd-gpu-pages:pages:gpu pd-host-packed:packed:host; do
    f=${row%%:*}
    [ -s "$out/$f.json" ] || { echo "$f: no report (see $out/$f.log)"; tail -n 15 "$out/$f.log" 2>/dev/null; overall=1; continue; }
    python3 - "$out/$f.json" "$row" <<'PY' || overall=1
import json, sys
r = json.load(open(sys.argv[1]))
name, layout, memory = sys.argv[2].split(":")
print(f"{name}: {r['source_memory']} memory on {r['prefill_device']} -> host pool on {r['device']}: "
      f"{r['requests']} requests x {r['context']} tokens, {r['writes']} {r['write_layout']} writes of "
      f"{r['descriptors_per_write']} descriptors from {r['write_memory']} memory")
same = r["same_transport_bulk_gb_per_s"]
print(f"  transfer {r['transfer_gb_per_s']:.2f} GB/s ({r['transfer_bytes']} B in {r['transfer_seconds']:.3f} s); "
      f"with packing ({r['pack_seconds']:.3f} s) {r['transfer_with_pack_gb_per_s']:.2f} GB/s")
for b in r["bulk"]:
    print(f"  bulk {b['source_memory']:>4} -> host pool, {b['descriptors']:>4} descriptor(s): {b['gb_per_s']:.2f} GB/s "
          f"({b['bytes']} B in {b['seconds']:.3f} s, best of 3); transfer/bulk {r['transfer_gb_per_s'] / b['gb_per_s']:.2f}")
print(f"  same-transport ceiling: {r['same_transport_bulk']} {same:.2f} GB/s; transfer at "
      f"{r['transfer_vs_same_transport']:.2f} of it, transfer with packing at "
      f"{r['transfer_with_pack_gb_per_s'] / same if same else 0:.2f}")
print(f"  verified: {r['imported_rows_verified']} imported rows, {r['decode_rows_verified']} decode reads, "
      f"mismatched {r['mismatched_rows']}; decoded={r['decoded']} ({r['decode_steps']} tokens each, "
      f"pages restored: {r['restored_pages']}, hit rate {r['hit_rate']:.3f}); wall {r['wall_seconds']:.1f} s")
want = r["requests"] * r["sparse_layers"] * r["context"]
ok = r["mismatched_rows"] == 0 and r["imported_rows_verified"] == want and r["decoded"]
if (r["write_layout"], r["write_memory"]) != (layout, memory):
    print(f"  FAIL: expected {layout} writes from {memory} memory")
    ok = False
if not r["same_transport_bulk"].startswith(memory):
    print(f"  FAIL: the same-transport ceiling should be a bulk figure from {memory} memory")
    ok = False
# DeepSeek V3.2's pages are 64 tokens: a context that is no multiple leaves a partial last page.
if r["context"] % 64 and r["restored_pages"] < r["requests"]:
    print(f"  FAIL: {r['context']} tokens leave a partial last page per request, but {r['restored_pages']} pages were restored")
    ok = False
sys.exit(0 if ok else 1)
PY
done
# Packed-host (auto) beside the device-staged packed write of the same workload.
if [ -s "$out/pd-gpu.json" ] && [ -s "$out/pd-gpu-packed.json" ]; then
    python3 - "$out/pd-gpu.json" "$out/pd-gpu-packed.json" <<'PY'
import json, sys
h, d = (json.load(open(p)) for p in sys.argv[1:3])
print(f"packed-host over packed (GPU source): transfer {h['transfer_gb_per_s']:.2f} / {d['transfer_gb_per_s']:.2f} GB/s "
      f"= {h['transfer_gb_per_s'] / d['transfer_gb_per_s']:.2f}x; with packing {h['transfer_with_pack_gb_per_s']:.2f} / "
      f"{d['transfer_with_pack_gb_per_s']:.2f} GB/s = {h['transfer_with_pack_gb_per_s'] / d['transfer_with_pack_gb_per_s']:.2f}x; "
      f"packing {h['pack_seconds']:.3f} s (device -> host) vs {d['pack_seconds']:.3f} s (device -> device)")
PY
fi
write_summary nixl
