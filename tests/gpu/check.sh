#!/usr/bin/env bash
# tests/gpu/check.sh — the one prepared GPU check, under 8 minutes on one H200:
#   (a) every CUDA kernel and the CUDA backend against the CPU backend (exact: bit for bit; fast:
#       spec §7's calc_diff), test_cuda_kernels and test_cuda_backend;
#   (b) real daemons: a 2-worker cluster with both workers on cuda:0, a mixed cluster (cpu +
#       cuda:0), and forward --local on cuda:0, each against forward --local on the CPU
#       (exact: epmoectl diff identical; fast: --max-calc-diff 1e-3, top-k ids identical); the
#       NCCL plane's one-worker cluster when the build has NCCL (tests/gpu/nccl_cluster.sh);
#   (c) benchmarks at V4-Flash shapes (tests/bench/bench_cuda; decode launch by launch with rows
#       split 4 and 16 ways; the NCCL step benchmark when built), then a summary table last.
#
#   tests/gpu/check.sh [OUT_DIR]        (OUT_DIR defaults to $OUT or ./gpu-check)
#
# Binaries: gpu-carry/bin when present (built on a build machine by tests/gpu/prepare.sh, with
# the shared libraries a bare GPU machine lacks in gpu-carry/lib), else a CMake build here.
# Writes OUT_DIR/check.log (everything) and OUT_DIR/summary.txt. Exit status: 0 when every check
# passed. Never changes clocks or device settings.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee "$out/check.log") 2>&1
T0=$SECONDS
step() { printf '\n== %s (%ss)\n' "$*" "$((SECONDS - T0))"; }
VERDICTS=()
verdict() { VERDICTS+=("$(printf '%-58s %s' "$1" "$2")"); echo "-> $1: $2"; }

# a kernel that never finishes is a step error after this many seconds, not a hang
export EPMOE_CUDA_WAIT_S=${EPMOE_CUDA_WAIT_S:-30}

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 || true
nproc

step "binaries"
if [ -x gpu-carry/bin/epmoectl ]; then
    BIN=$ROOT/gpu-carry/bin
    export LD_LIBRARY_PATH="$ROOT/gpu-carry/lib:${LD_LIBRARY_PATH:-}"
    echo "prebuilt: $(cat gpu-carry/BUILD-INFO 2>/dev/null)"
else
    echo "no gpu-carry/: building with CMake"
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DEPMOE_CUDA=ON >/dev/null &&
        cmake --build build-gpu -j "$(nproc)" || { echo "build failed"; exit 2; }
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
    BIN=$ROOT/build-gpu/bin
    mkdir -p "$BIN"
    for t in ctl/epmoectl coordinator/epmoe-coordinator worker/epmoe-worker \
        tests/gpu/test_cuda_kernels tests/gpu/test_cuda_backend tests/bench/bench_cuda \
        tests/bench/bench_nccl_step; do
        [ -x "build-gpu/$t" ] && ln -sf "$ROOT/build-gpu/$t" "$BIN/"
    done
fi
# cuBLASLt and NCCL come from the machine: the CUDA toolkit, or the Python wheels' copies
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
for m in nvidia.cublas nvidia.nccl nvidia.cu13; do
    d=$(python3 -c "import $m, os; print(os.path.dirname($m.__file__))" 2>/dev/null) &&
        for l in "$d"/lib "$d"/*/lib; do [ -d "$l" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$l"; done
done
export LD_LIBRARY_PATH
ls "$BIN"
CTL=$BIN/epmoectl
# the CUDA module (opened at run time for cuda:N): gpu-carry/lib or the build's
module=$ROOT/gpu-carry/lib/libepmoe_cuda.so
[ -f "$module" ] || module=$ROOT/build-gpu/kernels/cuda/libepmoe_cuda.so
for f in "$BIN"/* "$module"; do
    missing=$(ldd "$f" 2>&1 | grep "not found" || true)
    [ -z "$missing" ] || echo "$(basename "$f"): missing libraries: $missing"
done

step "(a) CUDA kernels vs the CPU backend"
timeout 150 "$BIN/test_cuda_kernels"
rc=$?
verdict "kernels vs CPU (exact bits, fast calc_diff)" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL ($rc)")"

step "(a) CUDA backend vs the CPU backend (seam API, every layer kind)"
timeout 200 "$BIN/test_cuda_backend"
rc=$?
verdict "backend vs CPU (forward, steps, experts, quant)" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL ($rc)")"

# ---- (b) clusters of real daemons ----
TMP=$(mktemp -d /tmp/epmoe_gpucheck_XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    [ ${#PIDS[@]} -gt 0 ] && wait "${PIDS[@]}" 2>/dev/null # not the tee of the log
    rm -rf "$TMP"
}
trap cleanup EXIT

free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))
PY
}

# run_cluster NAME MODEL GEMM DEV0 DEV1 ...: starts the daemons, forwards every layer kind at
# several T, compares with forward --local on the CPU, shuts down. Prints PASS/FAIL.
run_cluster() {
    local name=$1 model=$2 gemm=$3
    shift 3
    local devs=("$@") p=$#
    read -r -a ports <<<"$(free_ports $((p + 2)))"
    local listen="tcp://127.0.0.1:${ports[0]}" admin="tcp://127.0.0.1:${ports[1]}"
    local spec=$TMP/$name.yaml
    {
        echo "cluster: {name: $name}"
        echo "coordinator: {listen: \"$listen\", admin: \"$admin\", heartbeat_ms: 500, liveness: 20, step_timeout_ms: 120000}"
        echo "model: {path: $model}"
        echo "expert_parallel: {placement: contiguous, gpu_gemm: $gemm}"
        echo "nodes:"
        echo "  - name: local"
        echo "    workers:"
        for ((r = 0; r < p; r++)); do
            echo "      - {name: w$r, device: \"${devs[$r]}\", data: \"tcp://127.0.0.1:${ports[$((r + 2))]}\"}"
        done
    } >"$spec"
    local cp=()
    "$BIN/epmoe-coordinator" --cluster "$spec" >"$TMP/$name.coord.log" 2>&1 &
    cp+=($!)
    for ((r = 0; r < p; r++)); do
        "$BIN/epmoe-worker" --coordinator "$listen" --name "w$r" --device "${devs[$r]}" --threads 4 \
            >"$TMP/$name.w$r.log" 2>&1 &
        cp+=($!)
    done
    PIDS+=("${cp[@]}")
    local bad=0 n=0 ready=0
    # ready within 120 s, and give up at once when a daemon has exited (a device it cannot
    # serve, a refused registration)
    for _ in $(seq 240); do
        "$CTL" --coordinator "$admin" --timeout 2000 status --wait-ready --wait-timeout 1 \
            >"$TMP/$name.status" 2>&1 && { ready=1; break; }
        local dead=0
        for pid in "${cp[@]}"; do kill -0 "$pid" 2>/dev/null || dead=1; done
        [ $dead -eq 1 ] && break
    done
    if [ $ready -eq 0 ]; then
        echo "$name: not ready"
        tail -n 20 "$TMP/$name.status" "$TMP/$name.coord.log" "$TMP/$name".w*.log
        bad=1
    else
        "$CTL" --coordinator "$admin" workers
        local tol=()
        [ "$gemm" = fast ] && tol=(--max-calc-diff 1e-3)
        for layer in 0 2 mtp.0; do
            for t in 1 7 64 300; do
                n=$((n + 1))
                local in=$TMP/in_$t.st out=$TMP/$name.$layer.$t.st
                local ref=$TMP/ref_$(basename "$model").$layer.$t.st
                [ -f "$in" ] || "$CTL" mkinput --model "$model" --tokens "$t" --seed "$t" --out "$in" >/dev/null
                [ -f "$ref" ] || "$CTL" forward --local --model "$model" --layer "$layer" \
                    --input "$in" --output "$ref" >/dev/null
                if ! "$CTL" --coordinator "$admin" forward --layer "$layer" --input "$in" --output "$out" >"$TMP/fwd.log" 2>&1; then
                    echo "$name: forward layer $layer T=$t failed: $(tail -2 "$TMP/fwd.log")"
                    bad=$((bad + 1))
                elif ! "$CTL" diff "$out" "$ref" "${tol[@]}" >"$TMP/diff.log"; then
                    echo "$name: layer $layer T=$t differs from forward --local:"
                    cat "$TMP/diff.log"
                    bad=$((bad + 1))
                fi
            done
        done
        echo "$name: $((n - bad))/$n forwards match forward --local (${tol[*]:-bit-identical})"
    fi
    "$CTL" --coordinator "$admin" shutdown >/dev/null 2>&1
    for pid in "${cp[@]}"; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
    done
    [ $bad -eq 0 ]
}

step "(b) models"
for dt in fp4 fp8; do
    "$CTL" mkmodel --out "$TMP/m_$dt" --expert-dtype "$dt" --hidden 1024 --inter 512 --experts 32 \
        --topk 6 --layers 4 --hash-layers 1 --mtp 1 --shards 1 --force >/dev/null ||
        echo "mkmodel $dt failed"
done

for dt in fp4 fp8; do
    step "(b) forward --local on cuda:0 vs cpu ($dt)"
    ok=0 n=0
    for gemm in exact fast; do
        for layer in 0 2 mtp.0; do
            # T=1024: the shared expert's 1024 rows take cuBLASLt in fast mode (FP8, >= 96)
            for t in 1 64 300 1024; do
                n=$((n + 1))
                in=$TMP/in_$t.st
                [ -f "$in" ] || "$CTL" mkinput --model "$TMP/m_$dt" --tokens "$t" --seed "$t" --out "$in" >/dev/null
                ref=$TMP/lref_$dt.$layer.$t.st
                [ -f "$ref" ] || "$CTL" forward --local --model "$TMP/m_$dt" --layer "$layer" --input "$in" --output "$ref" >/dev/null
                tol=()
                [ $gemm = fast ] && tol=(--max-calc-diff 1e-3)
                if timeout 60 "$CTL" forward --local --device cuda:0 --gpu-gemm $gemm --model "$TMP/m_$dt" \
                    --layer "$layer" --input "$in" --output "$TMP/g.st" >/dev/null &&
                    "$CTL" diff "$TMP/g.st" "$ref" "${tol[@]}" >"$TMP/diff.log"; then
                    ok=$((ok + 1))
                else
                    echo "local $dt $gemm layer $layer T=$t:"
                    cat "$TMP/diff.log" 2>/dev/null
                fi
            done
        done
    done
    verdict "forward --local cuda:0 vs cpu, $dt (exact + fast)" "$([ $ok -eq $n ] && echo "PASS $ok/$n" || echo "FAIL $ok/$n")"
done

for dt in fp4 fp8; do
    step "(b) cluster: 2 workers on cuda:0, exact ($dt)"
    run_cluster "g2_$dt" "$TMP/m_$dt" exact cuda:0 cuda:0 && v=PASS || v=FAIL
    verdict "cluster 2 x cuda:0, exact, $dt: bit-identical" $v
    step "(b) cluster: cpu + cuda:0, exact ($dt)"
    run_cluster "mix_$dt" "$TMP/m_$dt" exact cpu cuda:0 && v=PASS || v=FAIL
    verdict "cluster cpu + cuda:0, exact, $dt: bit-identical" $v
done
step "(b) cluster: 2 workers on cuda:0, fast (fp4)"
run_cluster g2f "$TMP/m_fp4" fast cuda:0 cuda:0 && v=PASS || v=FAIL
verdict "cluster 2 x cuda:0, fast, fp4: calc_diff < 1e-3" $v

if [ -x tests/gpu/nccl_cluster.sh ] && [ -x "$BIN/bench_nccl_step" -o -x "$BIN/epmoe-worker" ]; then
    step "(b) NCCL plane: one-worker cluster vs forward --local"
    timeout 240 tests/gpu/nccl_cluster.sh "$BIN" "$TMP/m_fp4" 2>&1
    rc=$?
    verdict "NCCL one-worker cluster, exact: bit-identical" \
        "$([ $rc -eq 0 ] && echo PASS || { [ $rc -eq 77 ] && echo SKIP || echo "FAIL ($rc)"; })"
fi

# ---- (c) benchmarks ----
step "(c) benchmark: V4-Flash shapes"
timeout 240 "$BIN/bench_cuda" | tee "$out/bench_cuda.txt"
step "(c) benchmark: decode launch by launch, rows split 4 ways (default) and 16 ways"
timeout 60 "$BIN/bench_cuda" decode-parts | grep "decode part" | tee "$out/decode_parts.txt"
EPMOE_CUDA_SPLIT=16 timeout 60 "$BIN/bench_cuda" decode-parts | grep "decode part" |
    sed 's/^decode part/split16 part/' | tee -a "$out/decode_parts.txt"
if [ -x "$BIN/bench_nccl_step" ]; then
    step "(c) benchmark: NCCL step vs ZeroMQ with host staging"
    timeout 120 "$BIN/bench_nccl_step" | tee "$out/bench_nccl.txt"
fi

step "summary"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
    echo "total: $((SECONDS - T0)) s"
    echo
    printf '%s\n' "${VERDICTS[@]}"
    echo
    sed -n '/^| what /,$p' "$out/bench_cuda.txt" 2>/dev/null
    [ -f "$out/decode_parts.txt" ] && grep -v "exact-ref" "$out/decode_parts.txt"
    [ -f "$out/bench_nccl.txt" ] && tail -8 "$out/bench_nccl.txt"
} >"$out/summary.txt"
cat "$out/summary.txt"
grep -q "FAIL" "$out/summary.txt" && exit 1
exit 0
