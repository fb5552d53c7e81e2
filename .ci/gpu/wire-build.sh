#!/usr/bin/env bash
# Builds, on the development machine, the wire-format bench (benches/benches/wire.rs: encoding and
# decoding the scheduler bench's 256-request DeepSeek V3.2 decode step, and the layout's
# fingerprint) and its instruction-count driver (benches/examples/wire_codec.rs), so the GPU
# machine's idle host CPU can time them; the development machine is too shared for a stable
# figure. Puts into gpu-wire/ (untracked; it travels with the working tree):
#
#   gpu-wire/wire        the criterion bench at HEAD (committed files only)
#   gpu-wire/wire_codec  the driver (prints wall-clock µs per message)
#   gpu-wire/MANIFEST    the commit, build date, sizes and sha256
#
# Release (bench) profile without debug info, stripped.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=gpu-wire
mkdir -p "$out"
export CARGO_PROFILE_BENCH_DEBUG=0 CARGO_PROFILE_RELEASE_DEBUG=0

# shellcheck source=.ci/gpu/cargo-exe.sh
. .ci/gpu/cargo-exe.sh

# From a clean tree of HEAD (`git archive`: the checkout may hold uncommitted edits).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head=$(git rev-parse HEAD)
git archive "$head" | tar -x -C "$work"
bench=$(cd "$work" && CARGO_TARGET_DIR="$root/target/gpu-wire" \
    cargo bench -p hisparse-benches --bench wire --no-run --message-format=json | exe_of wire)
driver=$(cd "$work" && CARGO_TARGET_DIR="$root/target/gpu-wire" \
    cargo build --release -p hisparse-benches --example wire_codec --message-format=json \
    | exe_of wire_codec)
cp "$bench" "$out/wire"
cp "$driver" "$out/wire_codec"
strip "$out/wire" "$out/wire_codec"
{
    echo "commit: $head $(git log -1 --format=%s "$head" | cut -c1-80)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    for f in wire wire_codec; do
        echo "$f $(stat -c %s "$out/$f") $(sha256sum "$out/$f" | cut -d' ' -f1)"
    done
} > "$out/MANIFEST"
cat "$out/MANIFEST"
