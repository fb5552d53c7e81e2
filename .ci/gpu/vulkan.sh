#!/usr/bin/env bash
# The Vulkan backend on the GPU machine (NVIDIA driver, no Vulkan loader installed), from the
# repository root, with what .ci/gpu/vulkan-build.sh put in gpu-vulkan/ (carry that folder):
#
#   1. installs the carried loader, glvnd and validation-layer packages (dpkg -x into /);
#   2. correctness, validation layer on, device required: the conformance suite through the CLI
#      (validation messages counted) and the suite in strict validation mode (a message fails its
#      case); the suite again in strict validation mode with 1 MiB pool
#      windows, the copy shader, the pipelined gather and barriers over all stages; odd hot-slot counts; the cross-stream case failing with event waits ignored
#      (and passing with them) on truly concurrent queues;
#   3. performance, in the same session as CUDA: vulkan_bench (device time from timestamps and
#      wall time per call, both gather kernels, both copy engines), and its index paths once more
#      with `--option barriers=all` (every barrier over all stages, the round-4 behaviour, for
#      the remap's comparison) and with `--option queues=single` (one queue for everything);
#      `hisparse bench --json` on Vulkan and on CUDA; `hisparse simulate --json` on CUDA and on
#      Vulkan (and while another process holds an idle CUDA context), with the default workload (4 requests
#      × 8192 tokens, 48 decode steps); the GPU's clocks (nvidia-smi, every 100 ms) throughout
#      the performance part;
#   4. a summary of the issue-16 targets (each figure beside CUDA's or its own ceiling) and the
#      median SM clock of each performance section.
#
# Every section has its own time limit (they add up to 475 s; a whole run took 230 s on the H200,
# 2026-12-05, the two simulations 23.8 and 56.7 s of it: the CUDA one's limit is 60 s since it
# ran past 20 s that day) and the
# script goes on after a failing or timed-out section. Logs and JSON go to
# $OUT/vulkan/, the summary to stdout and to $OUT/vulkan/summary.txt. Exit status 0 only when
# every section passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=$(cd "${HISPARSE_GPU_VULKAN_BIN:-gpu-vulkan}" && pwd)
out=${OUT:-/tmp/hisparse-gpu}/vulkan
mkdir -p "$out"
for f in hisparse vulkan-bench vulkan-conformance vulkan-windowed vulkan-streams-fault vulkan-resolve-packing; do
    if [ ! -x "$bin/$f" ]; then
        echo "missing $bin/$f: run .ci/gpu/vulkan-build.sh on the development machine and carry gpu-vulkan" >&2
        exit 2
    fi
done
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"

# 1. The Vulkan loader and the NVIDIA ICD (HISPARSE_GPU_SKIP_INSTALL=1: already installed, e.g.
#    a dry run on the development machine).
if [ "${HISPARSE_GPU_SKIP_INSTALL:-0}" != 1 ]; then
    for f in "$bin"/debs/*.deb; do dpkg -x "$f" / || echo "dpkg -x $f failed" >&2; done
    ldconfig
fi
if [ -z "${VK_DRIVER_FILES:-}" ]; then
    for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json \
        /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
        [ -f "$icd" ] && { export VK_DRIVER_FILES=$icd; break; }
    done
fi
echo "== Vulkan on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1), ICD ${VK_DRIVER_FILES:-not found}"
export HISPARSE_REQUIRE_DEVICE=1
# NVRTC for the CUDA figures (not on the default library path there).
for d in /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
done
# The test binaries open their devices in strict validation mode; the CLI's suite counts messages.
validation=(env VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation)

# shellcheck source=.ci/gpu/lib.sh
. .ci/gpu/lib.sh
# Each section's line counts the validation layer's messages in its log.
section_note() {
    echo "(validation messages: $(grep -c 'vulkan validation' "$2"))"
}

# 2. Correctness.
section conformance 60 "${validation[@]}" "$bin/hisparse" conformance --backend vulkan
section conformance-strict 60 "${validation[@]}" "$bin/vulkan-conformance"
section windowed 40 "${validation[@]}" "$bin/vulkan-windowed"
section resolve-packing 10 "${validation[@]}" "$bin/vulkan-resolve-packing" --nocapture
section streams-fault 20 "${validation[@]}" "$bin/vulkan-streams-fault" --nocapture
# 3. Performance (no validation layer). The GPU's clocks every 100 ms while it runs.
: >"$out/sections.tsv"
clock_pid=
if command -v nvidia-smi >/dev/null; then
    nvidia-smi -q -d PERFORMANCE,CLOCK >"$out/clocks-before.txt" 2>&1
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,pstate,utilization.gpu \
        --format=csv,noheader,nounits -lms 100 >"$out/clocks.csv" 2>"$out/clocks.err" &
    clock_pid=$!
fi
section vulkan-bench 45 "$bin/vulkan-bench" --iters 50 --json "$out/vulkan_bench.json"
section bench-vulkan 30 --stdout "$out/bench_vulkan.json" "$bin/hisparse" bench --backend vulkan --json
section bench-cuda 20 --stdout "$out/bench_cuda.json" "$bin/hisparse" bench --backend cuda --json
# The index paths with every barrier over all stages and accesses (the round-4 behaviour), and
# with one queue for everything.
section vulkan-bench-barriers-all 30 "$bin/vulkan-bench" --iters 50 --only index \
    --option barriers=all --json "$out/vulkan_bench_barriers_all.json"
section vulkan-bench-1q 30 "$bin/vulkan-bench" --iters 50 --only index \
    --option queues=single --json "$out/vulkan_bench_single_queue.json"
section simulate-cuda 60 --stdout "$out/simulate_cuda.json" "$bin/hisparse" simulate --backend cuda --json
section simulate-vulkan 70 --stdout "$out/simulate_vulkan.json" "$bin/hisparse" simulate --backend vulkan --json
# The Vulkan simulation while another process holds an idle CUDA context (run 12: the GPU then
# keeps its clocks up through the simulator's host gaps, as it does for the CUDA simulation).
with_cuda_context() {
    python3 -c 'import time, torch; x = torch.zeros(1, device="cuda"); torch.cuda.synchronize(); print("cuda context up", flush=True); time.sleep(60)' \
        >"$out/cuda-context.log" 2>&1 &
    local py=$! i
    for i in $(seq 1 300); do
        grep -q 'cuda context up' "$out/cuda-context.log" 2>/dev/null && break
        kill -0 "$py" 2>/dev/null || break
        sleep 0.1
    done
    "$@"
    local rc=$?
    kill "$py" 2>/dev/null
    wait "$py" 2>/dev/null
    return $rc
}
export out
export -f with_cuda_context
section simulate-vulkan-cudactx 60 --stdout "$out/simulate_vulkan_cuda_context.json" \
    bash -c 'with_cuda_context "$@"' with_cuda_context "$bin/hisparse" simulate --backend vulkan --json
[ -n "$clock_pid" ] && kill "$clock_pid" 2>/dev/null

# 4. Summary of the issue-16 targets.
python3 - "$out" <<'EOF' | tee "$out/summary.txt"
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception as e:
        print(f"  ({name}: {e})")
        return None
def fig(b, prefix):
    return next((f for f in (b or {}).get("figures", []) if f["name"].startswith(prefix)), None)
def ceil(b, name):
    return next((c for c in (b or {}).get("ceilings", []) if c["name"] == name), None)
bv, bc = load("bench_vulkan.json"), load("bench_cuda.json")
vb = load("vulkan_bench.json")
sv, sc = load("simulate_vulkan.json"), load("simulate_cuda.json")
s1 = None  # one queue: measured by vulkan_bench --option queues=single (below)
rows = []
def row(what, value, target, ok):
    rows.append((what, value, target, "-" if ok is None else "met" if ok else "MISSED"))
GB = 1e9
if bv and bc:
    for p, name in [("backup", "backup"), ("restore", "restore")]:
        f = fig(bv, p)
        if f:
            row(f"{name} (bench, Vulkan)", f"{f['bytes_per_s']/GB:.2f} GB/s = {f['share_of_ceiling']:.2f}x own bulk",
                ">= 0.8x", f["share_of_ceiling"] >= 0.8)
    cv, cc = ceil(bv, "device copy (read+write)"), ceil(bc, "device copy (read+write)")
    if cv and cc:
        r = cv["bytes_per_s"] / cc["bytes_per_s"]
        row("device copy (bench)", f"{cv['bytes_per_s']/GB:.0f} vs CUDA {cc['bytes_per_s']/GB:.0f} GB/s = {r:.2f}x",
            ">= 0.8x CUDA", r >= 0.8)
    for p in ["gather 656 B rows × 2048 ", "gather 656 B rows × 32768 "]:
        fv, fc = fig(bv, p), fig(bc, p)
        if fv and fc:
            r = fv["bytes_per_s"] / fc["bytes_per_s"]
            row(p.strip() + " (bench)", f"{fv['bytes_per_s']/GB:.2f} vs CUDA {fc['bytes_per_s']/GB:.2f} GB/s = {r:.2f}x",
                ">= 0.8x CUDA", r >= 0.8)
    for p in ["remap", "resolve"]:
        fv, fc = fig(bv, p), fig(bc, p)
        if fv and fc:
            r = fv["seconds_per_call"] / fc["seconds_per_call"]
            row(f"{p} (bench)", f"{fv['seconds_per_call']*1e6:.1f} vs CUDA {fc['seconds_per_call']*1e6:.1f} us = {r:.2f}x",
                "<= 1.5x CUDA", r <= 1.5)
if vb and bc:
    for rows_n, cuda_prefix in [(2048, "gather 656 B rows × 2048 "), (32768, "gather 656 B rows × 32768 ")]:
        fc = fig(bc, cuda_prefix)
        for f in vb["figures"]:
            if f["name"].startswith(f"gather {rows_n} x") and fc:
                r = f["gbps"] * GB / fc["bytes_per_s"]
                row(f"{f['name']} (vulkan_bench)", f"{f['gbps']:.2f} GB/s = {r:.2f}x CUDA bench, {f['share']:.2f}x bulk",
                    ">= 0.8x CUDA", r >= 0.8)
    for t in vb.get("timings", []):
        if t["name"].startswith(("decode step", "remap")):
            row(f"{t['name']} (vulkan_bench)",
                f"device {t['device_us']:.1f} us, wall {t['wall_us']:.1f} us, enqueue {t['enqueue_us']:.1f} us, "
                f"{t['submissions']:.2f} submissions", "", None)
    for f in vb["figures"]:
        if f["name"].startswith(("backup", "restore", "device copy")):
            row(f"{f['name']} (vulkan_bench)", f"{f['gbps']:.2f} GB/s = {f['share']:.2f}x {f['ceiling']}", "", None)
if sv and sc:
    scf = None  # the compute-only family run (run 11: 2.67x, no better than all queues) is not repeated
    for label, s in [("all queues", sv), ("one queue", s1), ("compute-only family", scf)]:
        if not s:
            continue
        r = s["device_us_per_step"] / sc["device_us_per_step"]
        row(f"simulate device time/step, Vulkan {label}",
            f"{s['device_us_per_step']:.0f} vs CUDA {sc['device_us_per_step']:.0f} us = {r:.2f}x",
            "<= 2x CUDA", r <= 2.0)
    # Steps 20-47 of the default workload: every request decoding, hot buffers full.
    def plateau(s):
        steps = [x["device_us"] for x in s.get("steps", [])[20:48]]
        return sum(steps) / len(steps) if steps else float("nan")
    for label, s in [("all queues", sv), ("one queue", s1), ("compute-only family", scf)]:
        if s:
            r = plateau(s) / plateau(sc)
            row(f"simulate steps 20-47 device time/step, Vulkan {label}",
                f"{plateau(s):.0f} vs CUDA {plateau(sc):.0f} us = {r:.2f}x", "", None)
    extra = [(lbl, load(n)) for lbl, n in [("vulkan idle CUDA context", "simulate_vulkan_cuda_context.json")]]
    for label, s in [("vulkan", sv), ("vulkan 1q", s1), ("cuda", sc)] + extra:
        if s:
            row(f"simulate {label}: rows verified / mismatched",
                f"{s['verified_rows']} / {s['mismatched_rows']}, hit rate {s['hit_rate']:.4f}, "
                f"reclaimed {s['reclaimed_pages']}, wall {s['wall_seconds']:.1f} s", "0 mismatched",
                s["mismatched_rows"] == 0)
if sv and sc:
    # Steps 7-11: the first decode steps, right after the prefill kept the GPU busy.
    def early(s):
        steps = [x["device_us"] for x in s.get("steps", [])[7:12]]
        return sum(steps) / len(steps) if steps else float("nan")
    for label, s in [("all queues", sv), ("one queue", s1)]:
        if s:
            row(f"simulate steps 7-11 device time/step, Vulkan {label}",
                f"{early(s):.0f} vs CUDA {early(sc):.0f} us = {early(s)/early(sc):.2f}x", "", None)
    for label, name in [("idle CUDA context held", "simulate_vulkan_cuda_context.json")]:
        s = load(name)
        if s:
            r = s["device_us_per_step"] / sc["device_us_per_step"]
            row(f"simulate device time/step, Vulkan {label}",
                f"{s['device_us_per_step']:.0f} vs CUDA {sc['device_us_per_step']:.0f} us = {r:.2f}x, "
                f"steps 20-47 {plateau(s):.0f} us, {s['mismatched_rows']} mismatched", "", None)
# The index paths with the default settings beside barriers over all stages, and one queue.
for label, name in [("barriers all", "vulkan_bench_barriers_all.json"), ("one queue", "vulkan_bench_single_queue.json")]:
    other = load(name)
    if vb and other:
        base = {t["name"]: t for t in vb.get("timings", [])}
        for t in other.get("timings", []):
            b0 = base.get(t["name"])
            if b0 and t["name"].startswith(("decode step", "remap", "resolve")):
                row(f"{t['name']} (vulkan_bench), default / {label}",
                    f"device {b0['device_us']:.1f} / {t['device_us']:.1f} us, "
                    f"wall {b0['wall_us']:.1f} / {t['wall_us']:.1f} us", "", None)
# The GPU's clocks in each performance section (nvidia-smi every 100 ms).
try:
    import datetime
    samples = []
    with open(os.path.join(out, "clocks.csv")) as f:
        for line in f:
            parts = [x.strip() for x in line.split(",")]
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                samples.append((t, float(parts[1]), float(parts[2]), parts[3], float(parts[4])))
            except (ValueError, IndexError):
                pass
    with open(os.path.join(out, "sections.tsv")) as f:
        for line in f:
            name, a, b = line.split("\t")
            sm = sorted(x[1] for x in samples if float(a) <= x[0] <= float(b))
            util = sorted(x[4] for x in samples if float(a) <= x[0] <= float(b))
            states = sorted({x[3] for x in samples if float(a) <= x[0] <= float(b)})
            if sm:
                row(f"GPU clocks during {name}",
                    f"SM median {sm[len(sm)//2]:.0f} MHz (min {sm[0]:.0f}, p90 {sm[len(sm)*9//10]:.0f}, max {sm[-1]:.0f}), "
                    f"utilisation median {util[len(util)//2]:.0f}%, {'/'.join(states)}, {len(sm)} samples", "", None)
except Exception as e:
    print(f"  (clocks: {e})")
w = max((len(r[0]) for r in rows), default=10)
print("== issue 16 targets (H200, this session)")
for what, value, target, ok in rows:
    print(f"  {what:<{w}}  {value:<70} {target:<14} {ok}")
EOF
echo "== sections"
write_summary vulkan.sh >/dev/null
echo "logs and JSON: $out"
exit $overall
