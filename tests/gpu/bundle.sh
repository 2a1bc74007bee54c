#!/usr/bin/env bash
# tests/gpu/bundle.sh — package the daemons built HERE (with CUDA and NCCL) for a GPU machine
# that has the CUDA runtime and NCCL but not the daemons' libraries (libzmq, protobuf-c, libyaml,
# jansson and what they pull in) and no package registry.
#
#   tests/gpu/bundle.sh BUILD_DIR OUT_DIR
#
# OUT_DIR gets the layout nccl_cluster.sh expects of a build directory (coordinator/, worker/,
# ctl/, tests/bench/) with epmoe-coordinator, epmoe-worker, epmoectl and bench_nccl_step, lib/
# with every shared library they load except the C runtime and CUDA's own (libc, libm,
# libstdc++, libgcc_s, libcudart, libnccl, libcuda: the GPU machine's are used), and env.sh,
# which puts lib/ on LD_LIBRARY_PATH (and NCCL from PyTorch's wheels when the system has none).
# On the GPU machine:
#
#   . OUT_DIR/env.sh && tests/gpu/nccl_cluster.sh OUT_DIR "$OUT"
#   . OUT_DIR/env.sh && OUT_DIR/tests/bench/bench_nccl_step
set -euo pipefail
BUILD=${1:?usage: bundle.sh BUILD_DIR OUT_DIR}
OUTB=${2:?usage: bundle.sh BUILD_DIR OUT_DIR}
bins=(coordinator/epmoe-coordinator worker/epmoe-worker ctl/epmoectl tests/bench/bench_nccl_step)
for b in "${bins[@]}"; do
    [ -x "$BUILD/$b" ] || { echo "bundle: $BUILD/$b is missing (a CUDA + NCCL build?)" >&2; exit 1; }
done
ldd "$BUILD/worker/epmoe-worker" | grep -q libnccl ||
    { echo "bundle: $BUILD/worker/epmoe-worker was built without NCCL" >&2; exit 1; }
rm -rf "$OUTB"
mkdir -p "$OUTB/lib"
for b in "${bins[@]}"; do
    mkdir -p "$OUTB/$(dirname "$b")"
    cp "$BUILD/$b" "$OUTB/$b"
done
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread\.|libdl\.|librt\.|libresolv\.|libstdc\+\+|libgcc_s|libcudart|libnccl|libcuda\.)'
for b in "${bins[@]}"; do
    ldd "$BUILD/$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
        [[ $name =~ $skip ]] || cp -L "$path" "$OUTB/lib/$name"
    done
done
cat >"$OUTB/env.sh" <<'EOF'
# . env.sh — the bundle's libraries first; NCCL from PyTorch's wheels when the system has none.
_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$_b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for _d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do
    [ -d "$_d" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$_d"
done
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
    _n=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$_n" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$_n"
fi
unset _b _n _d
EOF
echo "bundle: $(du -sh "$OUTB" | cut -f1) in $OUTB ($(ls "$OUTB/lib" | wc -l) libraries)"
