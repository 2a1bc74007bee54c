#!/usr/bin/env bash
# tests/gpu/check.sh — the one prepared GPU check: build with CUDA, check every CUDA kernel
# against the CPU backend, benchmark. Designed to finish well under 8 minutes on one H200.
#
#   tests/gpu/check.sh [OUT_DIR]      (OUT_DIR defaults to $OUT or ./gpu-check)
#
# Writes OUT_DIR/check.log (everything) and OUT_DIR/summary.txt (device, test verdicts,
# benchmark table) for docs/performance.md. Exit status: that of the kernel tests.
# Never changes clocks or device settings.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
log="$out/check.log"
exec > >(tee "$log") 2>&1

step() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
nvcc --version | tail -1 || true

step "build (Release, CUDA on)"
# The CMake build needs the daemons' libraries (libzmq, protobuf-c, libyaml, jansson); a bare
# GPU machine may lack them and cannot install them, so fall back to compiling just the kernels
# and their checks, which need only gcc, nvcc and the CUDA runtime.
bin=build-gpu
direct_build() {
    bin=build-gpu-direct
    mkdir -p "$bin"
    local cf="-O2 -g -std=c11 -ffp-contract=off -fno-math-errno -D_GNU_SOURCE -I. -Itests"
    local cuda=${CUDA_HOME:-/usr/local/cuda}
    local objs=()
    for f in common/error.c common/log.c kernels/formats.c kernels/gemm.c kernels/quant.c \
             kernels/swiglu.c kernels/cpu/gemm_ref.c; do
        gcc $cf -DEPMOE_AVX2_KERNELS=1 -c "$f" -o "$bin/$(basename "$f").o" || return 1
        objs+=("$bin/$(basename "$f").o")
    done
    for f in kernels/cpu/gemm_avx2.c kernels/cpu/quant_avx2.c kernels/cpu/swiglu_avx2.c; do
        gcc $cf -DEPMOE_AVX2_KERNELS=1 -mavx2 -mfma -c "$f" -o "$bin/$(basename "$f").o" || return 1
        objs+=("$bin/$(basename "$f").o")
    done
    "$cuda/bin/nvcc" -O2 -arch=sm_90 --fmad=false -I. -c kernels/cuda/cuda_backend.cu \
        -o "$bin/cuda_backend.o" || return 1
    objs+=("$bin/cuda_backend.o")
    local ld=(-L"$cuda/lib64" -lcudart -lstdc++ -lpthread -lm)
    mkdir -p "$bin/tests/gpu" "$bin/tests/bench"
    gcc $cf tests/gpu/test_cuda_kernels.c "${objs[@]}" "${ld[@]}" \
        -o "$bin/tests/gpu/test_cuda_kernels" || return 1
    "$cuda/bin/nvcc" -O2 -arch=sm_90 -I. tests/bench/bench_cuda.cu "${objs[@]}" \
        -o "$bin/tests/bench/bench_cuda" || return 1
}
if cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DEPMOE_CUDA=ON >/dev/null; then
    cmake --build build-gpu -j "$(nproc)" --target test_cuda_kernels bench_cuda
    build_rc=$?
else
    echo "cmake configure failed (missing libraries?): building the kernels directly"
    direct_build
    build_rc=$?
fi
[ $build_rc -eq 0 ] || { echo "build failed"; exit $build_rc; }

step "CUDA kernels vs CPU backend (bit-exact)"
timeout 300 "./$bin/tests/gpu/test_cuda_kernels"
test_rc=$?

step "benchmark: CUDA exact GEMMs vs device copy bandwidth"
timeout 120 "./$bin/tests/bench/bench_cuda" | tee "$out/bench_cuda.txt"

step "done"
{
    echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
    echo "test_cuda_kernels exit: $test_rc (0 pass, 77 skipped: no device)"
    cat "$out/bench_cuda.txt" 2>/dev/null
} > "$out/summary.txt"
cat "$out/summary.txt"
exit $test_rc
