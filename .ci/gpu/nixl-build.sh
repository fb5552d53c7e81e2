#!/usr/bin/env bash
# Builds, on the development machine, what .ci/gpu/nixl.sh runs on the GPU machine (which has
# no Rust toolchain and no network), into gpu-nixl/ (ignored by git; carry it):
#
#   gpu-nixl/hisparse          the CLI with --features cuda,nixl (simulate --pd nixl)
#   gpu-nixl/nixl-transfer     hisparse-nixl's transfer tests (two agents, every byte checked)
#   gpu-nixl/nixl-libs.tar.xz  the libraries of the nixl-cu13 wheel those need, in the wheel's
#                               own layout (.nixl_cu13.mesonpy.libs/ with plugins/libplugin_UCX.so,
#                               nixl_cu13.libs/ with UCX and its modules in ucx/): libnixl_capi.so
#                               and the UCX plugin with everything they load from the wheel; UCX's
#                               InfiniBand modules and perftest left out (no RDMA between two
#                               processes of one machine)
#   gpu-nixl/MANIFEST          commit, build date, sizes and sha256
#
# The wheel is taken from $NIXL_SITE (a site-packages folder holding it), else from the venv
# .ci/run installs (/opt/hisparse-nixl), else `pip download --no-deps nixl-cu13==1.5.1` into a
# temporary folder. Release profile without debug info, stripped; CARGO_TARGET_DIR is honoured
# (a clean build of a worktree in a private target folder).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=gpu-nixl
rm -rf "$out"
mkdir -p "$out"
export CARGO_PROFILE_RELEASE_DEBUG=0

# The wheel's site-packages folder.
site=${NIXL_SITE:-}
if [ -z "$site" ]; then
    site=$(find /opt/hisparse-nixl -maxdepth 4 -type d -name site-packages 2>/dev/null | head -n 1)
fi
if [ -z "$site" ] || [ ! -f "$site/.nixl_cu13.mesonpy.libs/libnixl_capi.so" ]; then
    tmp=$(mktemp -d)
    pip download --quiet --no-deps --dest "$tmp" nixl-cu13==1.5.1
    (cd "$tmp" && python3 -m zipfile -e nixl_cu13-*.whl site)
    site="$tmp/site"
fi
capi="$site/.nixl_cu13.mesonpy.libs/libnixl_capi.so"
plugin="$site/.nixl_cu13.mesonpy.libs/plugins/libplugin_UCX.so"
[ -f "$capi" ] && [ -f "$plugin" ] || { echo "no libnixl_capi.so / libplugin_UCX.so under $site" >&2; exit 1; }

# The libraries: what ldd resolves inside the wheel for the C API, the UCX plugin and UCX's
# shared-memory and CUDA modules.
export LD_LIBRARY_PATH="$site/.nixl_cu13.mesonpy.libs:$site/nixl_cu13.libs"
modules=()
for m in "$site"/nixl_cu13.libs/ucx/*.so.*; do
    case $(basename "$m") in
        libuct_ib*|libucx_perftest*) ;;
        *) modules+=("$m") ;;
    esac
done
libs=$( { echo "$capi"; echo "$plugin"; printf '%s\n' "${modules[@]}";
          ldd "$capi" "$plugin" "${modules[@]}" | awk '/=>/ { print $3 }'; } \
        | grep -F "$site/" | xargs -n 1 realpath | sort -u)
stage=$(mktemp -d)
for f in $libs; do
    rel=${f#"$(realpath "$site")/"}
    mkdir -p "$stage/$(dirname "$rel")"
    cp "$f" "$stage/$rel"
done
# UCX reads a module's .la beside it.
for m in "${modules[@]}"; do
    la=${m%.so.*}.la
    [ -f "$la" ] && cp "$la" "$stage/nixl_cu13.libs/ucx/"
done
(cd "$stage" && tar -cJf - .nixl_cu13.mesonpy.libs nixl_cu13.libs) >"$out/nixl-libs.tar.xz"
echo "libraries: $(echo "$libs" | wc -l) files, $(du -sb "$stage" | cut -f1) bytes, $(du -b "$out/nixl-libs.tar.xz" | cut -f1) bytes compressed"

# The binaries.
# shellcheck source=.ci/gpu/cargo-exe.sh
. .ci/gpu/cargo-exe.sh
tests=$(cargo test --release -p hisparse-nixl --features nixl --test transfer --no-run \
    --message-format=json 2>/dev/null)
transfer=$(exe_of transfer <<<"$tests")
cargo build --release -p hisparse-cli --features cuda,nixl
cli="${CARGO_TARGET_DIR:-target}/release/hisparse"
for f in "$transfer" "$cli"; do
    [ -x "$f" ] || { echo "missing executable: '$f'" >&2; exit 1; }
done
install -m 755 "$transfer" "$out/nixl-transfer"
install -m 755 "$cli" "$out/hisparse"
bins=(hisparse nixl-transfer)
(cd "$out" && strip "${bins[@]}")
{
    crates=(nixl hisparse-core hisparse-runtime hisparse-cli backend-cuda backend-cpu gpu-kernels Cargo.lock)
    echo "commit $(git rev-parse HEAD)$(git diff HEAD --quiet -- "${crates[@]}" || echo " (with uncommitted changes in ${crates[*]})")"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ); NIXL from the nixl-cu13 1.5.1 wheel"
    (cd "$out" && sha256sum "${bins[@]}" nixl-libs.tar.xz)
    (cd "$out" && du -b "${bins[@]}" nixl-libs.tar.xz | awk '{ printf "%s %d bytes\n", $2, $1 }')
} >"$out/MANIFEST"
cat "$out/MANIFEST"
total=$(du -sb "$out" | cut -f1)
echo "$out/: $total bytes (carry limit 64 MiB, shared with everything else carried)"
