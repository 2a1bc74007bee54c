#!/usr/bin/env bash
# vs_ggml.sh — epmoe's whole MoE layer beside ggml's matmuls of the same layer, on both of ggml's
# CPU paths, and beside the machine's memory and FMA bounds, in one process on one machine
# (docs/performance.md). The headline is ggml's repacked path: llama.cpp puts MXFP4 expert
# weights in the CPU device's extra buffer type CPU_REPACK by default on x86, which repacks them
# for its AVX2/AVX-512 kernels; the plain path (the same bytes in the CPU buffer) is the second
# row. All three sides run interleaved, round by round, on the same weights and inputs; the
# bench prints the evidence that the repacked path was taken (ggml's repack log, the buffer
# type, the chosen layout) and that both ggml paths computed the same result.
#
#   GGML_DIR=/path/to/ggml tests/bench/vs_ggml.sh [--model DIR] [--work DIR] [--threads 1,N]
#                                                 [--tokens 1,8,64,256] [--runs R]
#                                                 [--clock wall|cpu]
#
# GGML_DIR   a ggml source tree (github.com/ggml-org/ggml, or llama.cpp's ggml/ folder). It is
#            built here with its own CMake (Release, GGML_NATIVE) into the work folder; epmoe
#            never vendors or commits any of it.
# --model    a checkpoint folder (config.json + safetensors); layer 0 is measured. Default: a
#            DeepSeek-V4-Flash-shaped layer (H 4096, I 2048, 256 MXFP4 experts, top-6, FP8
#            shared expert) written with `epmoectl mkmodel` into the work folder (3.5 GB; a few
#            minutes on 2 cores).
# --work     where to build ggml and this bench and put the generated layer (default: a new
#            mktemp folder, removed at the end; give one to keep and reuse them).
# --threads  thread counts, one bench_vs_ggml run each (default 1,$(nproc): one thread and all
#            of them, in one invocation; a single number runs that count only). Every run
#            prints each side's instruction set and the CPUs its threads ran on, and a WARNING
#            when a side's threads ran on one CPU (OMP_PROC_BIND left in the environment, an
#            affinity mask): such a run measures the pinning.
# --tokens --runs   passed to bench_vs_ggml (defaults 1,8,64,256, 10 (<= 32)):
#            every result and bound keeps its best of --runs rounds spread over the run, and
#            the ratios are also given per round (median and range) for the spread.
# --clock    wall (default) or cpu: time the 1-thread run in process CPU time, which a
#            machine shared with other jobs disturbs far less than wall time (runs with more
#            threads stay in wall time: their CPU time is not their latency).
#
# Needs ~3.5 GB free on disk and ~12 GB of memory (the layer in the page cache; then epmoe's
# packed layer, ggml's plain copy and its repacked copy at once, since they run interleaved).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
MODEL="" WORK="" THREADS=1,$(nproc) TOKENS=1,8,64,256 RUNS=10 CLOCK=wall
while [ $# -gt 0 ]; do
    case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --clock) CLOCK=$2; shift 2 ;;
    -h | --help) sed -n '2,37p' "$0"; exit 0 ;;
    *) echo "vs_ggml.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done

: "${GGML_DIR:?set GGML_DIR to a ggml source tree (see --help)}"
GGML_SRC=$GGML_DIR
if [ ! -f "$GGML_SRC/include/ggml.h" ] && [ -f "$GGML_SRC/ggml/include/ggml.h" ]; then
    GGML_SRC=$GGML_SRC/ggml # a llama.cpp checkout
fi
if [ ! -f "$GGML_SRC/include/ggml.h" ] || [ ! -f "$GGML_SRC/CMakeLists.txt" ]; then
    echo "vs_ggml.sh: $GGML_DIR is not a ggml source tree (no include/ggml.h, CMakeLists.txt)" >&2
    exit 66
fi

if [ -z "$WORK" ]; then
    WORK=$(mktemp -d /tmp/epmoe_vs_ggml_XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK"
JOBS=${EPMOE_JOBS:-$(nproc)}

echo "== building ggml from $GGML_SRC" >&2
cmake -S "$GGML_SRC" -B "$WORK/ggml-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
    -DCMAKE_INSTALL_PREFIX="$WORK/ggml" >"$WORK/ggml-configure.log"
cmake --build "$WORK/ggml-build" -j "$JOBS" >"$WORK/ggml-build.log"
cmake --install "$WORK/ggml-build" >"$WORK/ggml-install.log"

echo "== building epmoe's bench_vs_ggml" >&2
cmake -S "$REPO" -B "$WORK/epmoe-build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DEPMOE_CUDA=OFF -DEPMOE_BENCH=ON -DEPMOE_GGML_PREFIX="$WORK/ggml" >"$WORK/epmoe-configure.log"
cmake --build "$WORK/epmoe-build" -j "$JOBS" --target bench_vs_ggml epmoectl >"$WORK/epmoe-build.log"

MODEL_ARG=$MODEL
if [ -z "$MODEL" ]; then
    MODEL=$WORK/model
    if [ ! -f "$MODEL/config.json" ]; then
        echo "== generating a V4-Flash-shaped layer in $MODEL" >&2
        "$WORK/epmoe-build/ctl/epmoectl" mkmodel --out "$MODEL" --expert-dtype fp4 --hidden 4096 \
            --inter 2048 --experts 256 --topk 6 --layers 1 --hash-layers 0 --mtp 0 --vocab 1000 \
            --shards 1 >&2
    fi
fi
# the load is measured from the page cache: read the checkpoint once first
cat "$MODEL"/*.safetensors >/dev/null

# the ggml revision: git's, or for a tree without .git (a snapshot, a tarball) its version from
# CMakeLists.txt and a hash of its sources, so a run names what it measured either way
ggml_revision() {
    local rev ver sum
    if rev=$(git -C "$GGML_DIR" rev-parse --short HEAD 2>/dev/null); then
        echo "git $rev"
        return
    fi
    ver=$(sed -n 's/.*GGML_VERSION_\(MAJOR\|MINOR\|PATCH\)[ ]*\([0-9][0-9]*\).*/\2/p' \
        "$GGML_DIR/CMakeLists.txt" 2>/dev/null | head -3 | paste -sd. -)
    sum=$(cd "$GGML_DIR" && find src include -type f \( -name '*.c' -o -name '*.cpp' -o -name '*.h' \) \
        2>/dev/null | LC_ALL=C sort | xargs cat 2>/dev/null | sha256sum | cut -c1-12)
    echo "no .git: version ${ver:-?}, sources sha256 $sum"
}
ggml_rev=$(ggml_revision)
# a VM may name its CPU only "AMD EPYC": the family and model say which generation it is
cpu_field() { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'; }
cpu_has() { grep -m1 -q -w "$1" /proc/cpuinfo && echo "$1" || echo "no $1"; }
echo "machine: $(cpu_field 'model name') (family $(cpu_field 'cpu family'), model $(cpu_field model))," \
    "$(nproc) CPUs, $(cpu_has avx512f), $(cpu_has avx512_vnni), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ggml: $GGML_DIR ($ggml_rev); epmoe: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "command: GGML_DIR=$GGML_DIR tests/bench/vs_ggml.sh${MODEL_ARG:+ --model $MODEL_ARG}" \
    "--threads $THREADS --tokens $TOKENS --runs $RUNS --clock $CLOCK"
# what pins threads, if anything does: both sides' threads on one CPU looked 1.4-1.9x slower
echo "pinning: OMP_PROC_BIND=${OMP_PROC_BIND:-unset} OMP_PLACES=${OMP_PLACES:-unset}" \
    "GOMP_CPU_AFFINITY=${GOMP_CPU_AFFINITY:-unset}; $(grep Cpus_allowed_list /proc/self/status)"
for n in $(echo "$THREADS" | tr ',' ' ' | xargs -n1 | awk '!seen[$0]++'); do
    clock=$CLOCK
    [ "$n" -gt 1 ] && clock=wall
    echo
    echo "== $n thread(s), clock $clock"
    "$WORK/epmoe-build/tests/bench/bench_vs_ggml" --model "$MODEL" --threads "$n" \
        --tokens "$TOKENS" --runs "$RUNS" --clock "$clock"
done
