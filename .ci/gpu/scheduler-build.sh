#!/usr/bin/env bash
# Builds, on the development machine, the scheduler-step bench (benches/benches/scheduler.rs: one
# decode step of 256 DeepSeek V3.2 requests at 32K context) twice — at the current commit and at
# a baseline commit (default: the commit before the coordinator's liveness work, $1 overrides) —
# so the GPU machine's idle host CPU can compare them; the development machine is too loaded
# (and too shared) for a before/after within a few percent. Puts into gpu-scheduler/ (ignored by
# git; carry it):
#
#   gpu-scheduler/scheduler-new   the bench at HEAD (committed files only)
#   gpu-scheduler/scheduler-base  the bench at the baseline commit
#   gpu-scheduler/MANIFEST        both commits, build date, sizes and sha256
#
# Release (bench) profile without debug info, stripped; about 1 MB each.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
base=${1:-d6fa2c2^}
base=$(git rev-parse "$base")
out=gpu-scheduler
mkdir -p "$out"
export CARGO_PROFILE_BENCH_DEBUG=0

# shellcheck source=.ci/gpu/cargo-exe.sh
. .ci/gpu/cargo-exe.sh

# Both benches from clean trees of their commits (`git archive`: the checkout may hold
# uncommitted edits), each in its own target folder.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head=$(git rev-parse HEAD)
mkdir "$work/new" "$work/base"
git archive "$head" | tar -x -C "$work/new"
new=$(cd "$work/new" && CARGO_TARGET_DIR="$root/target/scheduler-new" \
    cargo bench -p hisparse-benches --bench scheduler --no-run --message-format=json | exe_of scheduler)
cp "$new" "$out/scheduler-new"

# The baseline: the whole tree at that commit.
git archive "$base" | tar -x -C "$work/base"
tree=$work/base
old=$(cd "$tree" && CARGO_TARGET_DIR="$root/target/scheduler-base" \
    cargo bench -p hisparse-benches --bench scheduler --no-run --message-format=json | exe_of scheduler)
cp "$old" "$out/scheduler-base"
strip "$out/scheduler-new" "$out/scheduler-base"
{
    echo "new:  $head $(git log -1 --format=%s "$head" | cut -c1-80)"
    echo "base: $base $(git log -1 --format=%s "$base" | cut -c1-80)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    for f in scheduler-new scheduler-base; do
        echo "$f $(stat -c %s "$out/$f") $(sha256sum "$out/$f" | cut -d' ' -f1)"
    done
} > "$out/MANIFEST"
cat "$out/MANIFEST"
