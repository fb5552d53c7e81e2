#!/usr/bin/env bash
# Model fidelity on CUDA (issue 12's acceptance), from the repository root, with the CLI of
# .ci/gpu/fidelity-build.sh in gpu-fidelity/ (carry that folder; HISPARSE_GPU_BIN picks
# another folder holding a `hisparse` built with --features cuda, e.g. gpu-cuda):
#
#   v4-prefix        hisparse simulate --preset deepseek-v4 --shared-prefix 8192   (prefix hits > 0)
#   spec             hisparse simulate --spec-tokens 1 --accept-rate 0.7           (rollbacks > 0)
#   v4-spec3         DeepSeek V4, 12 tensors, 2 × 32K, three drafts per step        (rollbacks > 0)
#   v4-prefix-half   DeepSeek V4, a 2048-token prefix of 4096-token prompts, 1 GiB  (hits = 4096)
#
# each with --backend cuda --json, every row read verified byte for byte. The whole script keeps
# to a 170 s budget (about a minute is expected). Results in $OUT/fidelity/: NAME.json and
# NAME.log per run, summary.json, and one line per run on stdout. Exit status 0 only when every
# run finished with 0 mismatched rows and its figure.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=${HISPARSE_GPU_BIN:-gpu-fidelity}
out=${OUT:-/tmp/hisparse-gpu}/fidelity
mkdir -p "$out"
export HISPARSE_REQUIRE_DEVICE=1
if [ ! -x "$bin/hisparse" ]; then
    echo "missing $bin/hisparse: run .ci/gpu/fidelity-build.sh on the development machine and carry $bin" >&2
    exit 2
fi
echo "== model fidelity on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
[ -f "$bin/MANIFEST" ] && head -n 2 "$bin/MANIFEST"
end=$(($(date +%s) + 170))
overall=0

# run NAME LIMIT CHECK ARGS...: `hisparse simulate --backend cuda --json ARGS` into NAME.json
# (stderr in NAME.log) within LIMIT seconds (less if the budget has less left); CHECK is a Python
# expression over the report `j` that must hold besides 0 mismatched rows.
run() {
    local name=$1 limit=$2 check=$3
    shift 3
    local left=$((end - $(date +%s)))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        echo "$name: SKIPPED (no time left in the budget)"
        echo "{\"run\":\"$name\",\"status\":\"SKIPPED\"}" >"$out/$name.result"
        overall=1
        return
    fi
    local t0 rc
    t0=$(date +%s%N)
    timeout -k 5 "$limit" "$bin/hisparse" simulate --backend cuda --json "$@" >"$out/$name.json" 2>"$out/$name.log"
    rc=$?
    python3 - "$name" "$rc" "$((($(date +%s%N) - t0) / 1000000))" "$check" "$out" "$*" <<'PY' || overall=1
import json, sys
name, rc, secs, check, out, args = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
res = {"run": name, "args": args, "exit": rc, "seconds": round(secs / 1000, 1)}
try:
    j = json.load(open(f"{out}/{name}.json"))
except (OSError, ValueError):
    j = None
if j is None:
    res["status"] = "TIMEOUT" if rc == 124 else "FAIL"
    tail = open(f"{out}/{name}.log").read().strip().splitlines()[-1:] if rc else []
    res["error"] = tail[0] if tail else "no JSON report"
else:
    keys = ["device", "verified_rows", "mismatched_rows", "first_mismatch", "hit_rate",
            "prefix_hit_tokens", "draft_tokens", "accepted_tokens", "rolled_back_tokens",
            "reclaimed_pages", "resolve_calls", "device_buffer_size", "device_us_per_step",
            "wall_seconds"]
    res.update({k: j.get(k) for k in keys})
    ok = rc == 0 and j.get("mismatched_rows") == 0 and j.get("verified_rows", 0) > 0 and eval(check)
    res["check"] = check
    res["status"] = "pass" if ok else "FAIL"
json.dump(res, open(f"{out}/{name}.result", "w"))
print(f"{name}: {res['status']} in {res['seconds']} s: verified {res.get('verified_rows')} "
      f"mismatched {res.get('mismatched_rows')} prefix hits {res.get('prefix_hit_tokens')} "
      f"drafts {res.get('draft_tokens')} accepted {res.get('accepted_tokens')} "
      f"rolled back {res.get('rolled_back_tokens')} hit rate {res.get('hit_rate')} "
      f"({check}){' ' + res['error'] if 'error' in res else ''}")
sys.exit(0 if res["status"] == "pass" else 1)
PY
}

run v4-prefix 40 'j["prefix_hit_tokens"] > 0' --preset deepseek-v4 --shared-prefix 8192
run spec 110 'j["rolled_back_tokens"] > 0 and j["draft_tokens"] == j["accepted_tokens"] + j["rolled_back_tokens"]' \
    --spec-tokens 1 --accept-rate 0.7
run v4-spec3 20 'j["rolled_back_tokens"] > 0 and j["resolve_calls"] > 0' --preset deepseek-v4 --layers 12 \
    --requests 2 --context 32768 --decode-steps 24 --spec-tokens 3 --accept-rate 0.5
run v4-prefix-half 20 'j["prefix_hit_tokens"] == 4096' --preset deepseek-v4 --requests 3 --context 4096 \
    --shared-prefix 2048 --decode-steps 8 --gpu-mem 1GiB

python3 - "$out" <<'PY'
import glob, json, sys
out = sys.argv[1]
runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/*.result"))]
json.dump({"script": "fidelity", "runs": runs,
           "passed": all(r["status"] == "pass" for r in runs)}, open(f"{out}/summary.json", "w"), indent=1)
print(f"fidelity: {sum(r['status'] == 'pass' for r in runs)} of {len(runs)} runs passed; {out}/summary.json")
PY
exit $overall
