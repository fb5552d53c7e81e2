#!/usr/bin/env bash
# On the GPU machine, from the repository root, with gpu-hostreads/ of .ci/gpu/host-reads-build.sh
# carried: how fast random 656-byte rows cross the bus from pinned host memory as the pool grows
# (a decode step's misses are such rows, scattered over one layer's host array of every request).
#
#   1. sizes: pools of 0.7 to 48 GiB, the runtime's allocation (THP-advised, cudaHostRegister):
#      where the rate falls (every allocation kind falls alike: `--kinds register-4k,hostalloc,vmm`
#      measured that once; it is not repeated here);
#   2. grouped: 1.4 and 48 GiB with rows in groups of 53 inside a random 21 MiB window each (one
#      request's misses of one layer at 32K, its host blocks side by side, as a fresh pool's
#      in-order free list hands them out): the decode step's case, beside rows anywhere, which a
#      long-running pool's scattered blocks tend towards; each with a warp per row and with 256,
#      1024 and 4096 warps walking the list in order (fewer windows in flight at once);
#   3. anywhere: the 48 GiB pool's rows anywhere, walked by as few warps: whether fewer rows in
#      flight alone changes the rate;
#   4. window: a 48 GiB pool whose every row of the run lies in one random 1 GiB (then 4 GiB)
#      window: whether the rows' spread or the pool's size sets the rate;
#   5. rows: 2 and 4 KiB rows (aligned to their size) from 0.7 and 48 GiB: whether a read costs
#      per row or per 4 KiB page it touches.
#
# About 5 minutes (the 48 GiB pools take most of it). Tables in $OUT/host-reads/ and on stdout.
# Exit status 0 only when every part ran and measured.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=${HISPARSE_GPU_BIN:-gpu-hostreads}
out=${OUT:-/tmp/hisparse-gpu}/host-reads
mkdir -p "$out"
if [ ! -x "$bin/sysmem-gather" ]; then
    echo "missing $bin/sysmem-gather: run .ci/gpu/host-reads-build.sh on the development machine and carry $bin" >&2
    exit 2
fi
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"
echo "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1); transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
status=0
run() {
    local name=$1 limit=$2
    shift 2
    echo "--- $name: sysmem-gather $*"
    if ! timeout "$limit" "$bin/sysmem-gather" "$@" 2>&1 | tee "$out/$name.md"; then
        echo "$name FAILED or timed out (limit $limit s)"
        status=1
    fi
}
run sizes 120 --sizes 0.7,3,12,48 --kinds register
run grouped 90 --sizes 1.4,48 --kinds register --grouped 21,53 --warps 0,256,1024,4096
run anywhere 60 --sizes 48 --kinds register --warps 256,1024,4096
run window 60 --sizes 48 --kinds register --grouped 1024,100000000
run window-4g 60 --sizes 48 --kinds register --grouped 4096,100000000
run rows-2k 60 --sizes 0.7,48 --kinds register --row-bytes 2048
run rows-4k 60 --sizes 0.7,48 --kinds register --row-bytes 4096
exit $status
