#!/usr/bin/env bash
# Builds, on the development machine, everything .ci/gpu/vulkan.sh runs on the GPU machine
# (which has no Rust toolchain and no network), into gpu-vulkan/ (ignored by git; carry it):
#
#   gpu-vulkan/hisparse                 the CLI with --features cuda,vulkan
#   gpu-vulkan/vulkan-bench             the kernel lab's vulkan_bench (kernel-lab/src/bin)
#   gpu-vulkan/vulkan-conformance       the conformance suite in strict validation mode (a
#                                        validation message fails its case; tests/conformance.rs)
#   gpu-vulkan/vulkan-windowed          the conformance suite with 1 MiB pool windows, the copy
#                                        shader, the pipelined gather and barriers over all
#                                        stages (tests/conformance_windowed.rs)
#   gpu-vulkan/vulkan-streams-fault     the cross-stream case fails with event waits ignored
#                                        (tests/streams_fault.rs)
#   gpu-vulkan/vulkan-resolve-packing   odd hot-slot counts (tests/resolve_packing.rs)
#   gpu-vulkan/vulkan-resolve-replay    resolves of dumped states timed alone
#                                        (the kernel lab's resolve_replay)
#   gpu-vulkan/debs/                    the Vulkan loader, glvnd (the NVIDIA ICD needs
#                                        libGLdispatch) and the validation layers, as .debs
#   gpu-vulkan/MANIFEST                 commit, build date, sizes and sha256 of the binaries
#
# Release profile without debug info, stripped. Everything loads its GPU runtime at run time.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=gpu-vulkan
mkdir -p "$out/debs"
export CARGO_PROFILE_RELEASE_DEBUG=0
target=${CARGO_TARGET_DIR:-target}

# shellcheck source=.ci/gpu/cargo-exe.sh
. .ci/gpu/cargo-exe.sh
json=$(cargo test --release -p hisparse-backend-vulkan --test conformance --test conformance_windowed \
    --test streams_fault --test resolve_packing --no-run --message-format=json 2>/dev/null)
strict=$(exe_of conformance <<<"$json")
windowed=$(exe_of conformance_windowed <<<"$json")
fault=$(exe_of streams_fault <<<"$json")
packing=$(exe_of resolve_packing <<<"$json")
cargo build --release -p hisparse-kernel-lab --bin vulkan_bench --bin resolve_replay
cargo build --release -p hisparse-cli --features cuda,vulkan
for f in "$strict" "$windowed" "$fault" "$packing" "$target"/release/vulkan_bench \
    "$target"/release/resolve_replay "$target"/release/hisparse; do
    [ -x "$f" ] || { echo "missing executable: '$f'" >&2; exit 1; }
done
install -m 755 "$target"/release/hisparse "$out/hisparse"
install -m 755 "$target"/release/vulkan_bench "$out/vulkan-bench"
install -m 755 "$target"/release/resolve_replay "$out/vulkan-resolve-replay"
install -m 755 "$strict" "$out/vulkan-conformance"
install -m 755 "$windowed" "$out/vulkan-windowed"
install -m 755 "$fault" "$out/vulkan-streams-fault"
install -m 755 "$packing" "$out/vulkan-resolve-packing"
bins=(hisparse vulkan-bench vulkan-conformance vulkan-windowed vulkan-streams-fault vulkan-resolve-packing
    vulkan-resolve-replay)
(cd "$out" && strip "${bins[@]}")

# The loader and what the NVIDIA ICD links (glvnd), and the validation layers.
debs=(libvulkan1 libglvnd0 libglx0 libgl1 libegl1 libopengl0 libgles2 vulkan-validationlayers)
for d in "${debs[@]}"; do
    ls "$out/debs/${d}"_*.deb >/dev/null 2>&1 || (cd "$out/debs" && apt-get download "$d")
done

{
    echo "commit $(git rev-parse HEAD)$(git diff --quiet -- backend-vulkan kernel-lab hisparse-cli hisparse-runtime hisparse-core benches || echo ' (with uncommitted changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (cd "$out" && sha256sum "${bins[@]}")
    (cd "$out" && du -b "${bins[@]}" debs | awk '{ printf "%s %d bytes\n", $2, $1 }')
} >"$out/MANIFEST"
cat "$out/MANIFEST"
total=$(du -sb "$out" | cut -f1)
echo "gpu-vulkan/: $total bytes (carry limit 64 MiB, shared with everything else carried)"
