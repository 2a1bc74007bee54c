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
jobs=$(nproc)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPMOE_CUDA=ON >/dev/null &&
    cmake --build build-gpu -j "$jobs" --target test_cuda_kernels bench_cuda bench_gemm
build_rc=$?
[ $build_rc -eq 0 ] || { echo "build failed"; exit $build_rc; }

step "CUDA kernels vs CPU backend (bit-exact)"
timeout 300 ./build-gpu/tests/gpu/test_cuda_kernels
test_rc=$?

step "benchmark: CUDA exact GEMMs vs device copy bandwidth"
timeout 120 ./build-gpu/tests/bench/bench_cuda | tee "$out/bench_cuda.txt"

step "done"
{
    echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
    echo "test_cuda_kernels exit: $test_rc (0 pass, 77 skipped: no device)"
    cat "$out/bench_cuda.txt" 2>/dev/null
} > "$out/summary.txt"
cat "$out/summary.txt"
exit $test_rc
