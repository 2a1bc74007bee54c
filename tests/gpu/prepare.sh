#!/usr/bin/env bash
# tests/gpu/prepare.sh — build what tests/gpu/check.sh runs, on a build machine, into
# gpu-carry/ (ignored by git): Release binaries for sm_90 in gpu-carry/bin; in gpu-carry/lib the
# CUDA module (libepmoe_cuda.so, opened at run time) and the shared libraries a bare GPU
# machine may lack (libzmq, protobuf-c, libyaml, jansson and their own dependencies; never the
# C library, the CUDA libraries or the driver). A GPU machine then
# runs check.sh without compiling anything (device time is short), and falls back to a CMake
# build when gpu-carry/ is absent.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-gpu
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPMOE_CUDA=ON -DEPMOE_BENCH=ON >/dev/null
targets=(epmoectl epmoe-coordinator epmoe-worker test_cuda_kernels test_cuda_backend bench_cuda)
for t in bench_nccl_step test_nccl_device; do
    # not grep -q: it exits at the first match, ninja dies of SIGPIPE and pipefail drops the
    # target (bench_nccl_step was never carried)
    ninja -C "$B" -t targets all 2>/dev/null | grep "^$t:" >/dev/null && targets+=("$t")
done
cmake --build "$B" -j "${EPMOE_JOBS:-$(nproc)}" --target "${targets[@]}"
rm -rf gpu-carry
mkdir -p gpu-carry/bin gpu-carry/lib
for t in "${targets[@]}"; do
    f=$(find "$B" -type f -name "$t" -perm -u+x | head -1)
    [ -n "$f" ] && cp "$f" gpu-carry/bin/ && strip --strip-debug gpu-carry/bin/"$t"
done
# the CUDA module the binaries open for cuda:N (kernels/cuda/cuda_module.c): found through
# LD_LIBRARY_PATH, which check.sh points at gpu-carry/lib
cp "$B/kernels/cuda/libepmoe_cuda.so" gpu-carry/lib/ && strip --strip-debug gpu-carry/lib/libepmoe_cuda.so
# the libraries the binaries need, less the C runtime and the driver (whole names: a prefix
# like libm also matched libmicrohttpd, which a GPU machine then lacked)
skip='^(libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libnccl|libcudart|ld-linux(-x86-64)?)\.so'
for f in gpu-carry/bin/* gpu-carry/lib/libepmoe_cuda.so; do
    ldd "$f" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "gpu-carry/lib/$name"
done
echo "built $(date -u +%FT%TZ) on $(uname -n) from $(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty)" \
    >gpu-carry/BUILD-INFO
du -sh gpu-carry gpu-carry/bin gpu-carry/lib
ls gpu-carry/bin gpu-carry/lib
