#!/usr/bin/env bash
# tests/gpu/nccl_cluster.sh — the NCCL data plane on one GPU (issue 11, point 5): a real
# epmoe-coordinator and one epmoe-worker on cuda:0 with expert_parallel.data_plane nccl (P = 1:
# the worker's dispatch and combine are NCCL send/recv to itself), exact GEMMs.
#
# Proves: the communicator is bootstrapped through the coordinator (COMM_INIT, COMM_ID,
# COMM_DONE) and the cluster becomes ready; for both expert dtypes, a hash layer, a score layer
# and the MTP layer, and 1, 7, 64 and 300 tokens, the cluster's `forward` output file is
# byte-identical to `forward --local` (CPU backend, one process); shutdown stops both daemons
# with exit 0.
#
#   tests/gpu/nccl_cluster.sh BIN [MODEL_DIR | OUT_DIR]
#   NCCL_RANKS=2 tests/gpu/nccl_cluster.sh BIN            # P workers on cuda:0 .. cuda:P-1
#
# BIN holds epmoectl, epmoe-coordinator and epmoe-worker built with CUDA and NCCL: either flat
# (tests/gpu/prepare.sh's gpu-carry/bin, as check.sh passes it) or a CMake build directory
# (ctl/, coordinator/, worker/). A second argument with a config.json is the model to use (only
# that one, as check.sh passes it); otherwise it is OUT_DIR and both expert dtypes are made here.
#
# NCCL_RANKS (1, 2, 3, 4 or 6: the test model has 12 experts) runs the same check with P
# workers, one per GPU of this machine (NCCL refuses two ranks on one GPU); it skips when the
# machine has fewer GPUs.
#
# OUT_DIR, when given, receives nccl_cluster.log and the daemons' logs (otherwise they go
# only to stdout on failure: check.sh keeps what its caller gets back small). Exit: 0 pass, 1 fail, 77 skipped with the reason on stdout (no daemons in BIN, a worker
# built without NCCL, no GPU, libnccl not loadable).
set -u
BIN=${1:?usage: nccl_cluster.sh BIN [MODEL_DIR | OUT_DIR]}
MODEL=
OUTDIR=
if [ -n "${2:-}" ] && [ -f "$2/config.json" ]; then
    MODEL=$2
elif [ -n "${2:-}" ]; then
    OUTDIR=$2
fi
if [ -x "$BIN/epmoectl" ]; then
    CTL=$BIN/epmoectl COORD=$BIN/epmoe-coordinator WORKER=$BIN/epmoe-worker
else
    CTL=$BIN/ctl/epmoectl COORD=$BIN/coordinator/epmoe-coordinator WORKER=$BIN/worker/epmoe-worker
fi
[ -z "$OUTDIR" ] || mkdir -p "$OUTDIR"
TMP=$(mktemp -d /tmp/epmoe_nccl_XXXXXX)
PIDS=()
fails=0

skip() {
    echo "SKIP nccl_cluster: $*"
    exit 77
}

for b in "$CTL" "$COORD" "$WORKER"; do
    [ -x "$b" ] || skip "$b is missing (the daemons need libzmq, protobuf-c, libyaml and jansson)"
done
# The worker opens libnccl.so.2 at run time (dlopen): find one on the loader's path, in the
# toolkit, or in the wheel PyTorch brings (nvidia-nccl-cu13) on GPU images.
grep -q "libnccl.so.2" "$WORKER" || skip "epmoe-worker was built without NCCL (EPMOE_HAVE_NCCL off)"
if [ -z "${EPMOE_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q "libnccl.so.2 "; then
    wheel=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in "${dirs[@]}" /usr/local/cuda/lib64 /usr/local/cuda/lib ${wheel:+"$wheel"}; do
        if [ -n "$d" ] && [ -f "$d/libnccl.so.2" ]; then
            export EPMOE_NCCL_LIBRARY=$d/libnccl.so.2
            break
        fi
    done
    [ -n "${EPMOE_NCCL_LIBRARY:-}" ] || skip "libnccl.so.2 is not on this machine (loader path, /usr/local/cuda, nvidia-nccl wheel)"
fi
echo "NCCL: ${EPMOE_NCCL_LIBRARY:-libnccl.so.2 (loader path)}"
P=${NCCL_RANKS:-1}
case $P in 1 | 2 | 3 | 4 | 6) ;; *) echo "NCCL_RANKS must be 1, 2, 3, 4 or 6"; exit 1 ;; esac
n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
[ "$n_gpu" -ge 1 ] || skip "no GPU (nvidia-smi lists none)"
[ "$n_gpu" -ge "$P" ] || skip "NCCL_RANKS=$P needs $P GPUs, this machine has $n_gpu"

[ -z "$OUTDIR" ] || exec > >(tee "$OUTDIR/nccl_cluster.log") 2>&1

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    # only the daemons: a bare `wait` would also wait for the tee above, which ends with us
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    [ -z "$OUTDIR" ] || cp "$TMP"/*.log "$OUTDIR/" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

ok() { echo "ok   $*"; }

free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# start_cluster NAME MODEL: P workers on cuda:0 .. cuda:P-1, data_plane nccl, exact GEMMs
start_cluster() {
    local name=$1 model=$2
    read -r -a ports <<<"$(free_ports $((P + 2)))"
    LISTEN="tcp://127.0.0.1:${ports[0]}"
    ADMIN="tcp://127.0.0.1:${ports[1]}"
    cat >"$TMP/$name.yaml" <<EOF
cluster: {name: $name}
coordinator: {listen: "$LISTEN", admin: "$ADMIN", heartbeat_ms: 500, liveness: 20, step_timeout_ms: 60000}
model: {path: $model}
expert_parallel: {placement: contiguous, dispatch: fp8, data_plane: nccl, gpu_gemm: exact}
nodes:
  - name: gpu
    workers:
EOF
    for ((r = 0; r < P; r++)); do
        echo "      - {name: g$r, device: \"cuda:$r\", data: \"tcp://127.0.0.1:${ports[$((r + 2))]}\"}"
    done >>"$TMP/$name.yaml"
    "$COORD" --cluster "$TMP/$name.yaml" --check >"$TMP/$name.check.log" 2>&1 ||
        { fail "$name: --check: $(tail -2 "$TMP/$name.check.log")"; return 1; }
    CPIDS=()
    EPMOE_DEBUG=net "$COORD" --cluster "$TMP/$name.yaml" >"$TMP/$name.coord.log" 2>&1 &
    CPIDS+=($!)
    PIDS+=($!)
    for ((r = 0; r < P; r++)); do
        "$WORKER" --coordinator "$LISTEN" --name "g$r" --device "cuda:$r" >"$TMP/$name.g$r.log" 2>&1 &
        CPIDS+=($!)
        PIDS+=($!)
    done
    if ! "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 180 >"$TMP/$name.status.log" 2>&1; then
        fail "$name: cluster not ready"
        tail -n 20 "$TMP/$name.status.log" "$TMP/$name.coord.log" "$TMP/$name".g*.log
        return 1
    fi
    if grep -q "NCCL communicator of epoch 1.0 ready" "$TMP/$name.coord.log"; then
        ok "$name: NCCL communicator bootstrapped through the coordinator ($(grep -o "ready: $P ranks in [0-9]* ms" "$TMP/$name.coord.log" | head -1))"
    else
        fail "$name: the coordinator logged no ready NCCL communicator"
    fi
}

stop_cluster() {
    local name=$1
    "$CTL" --coordinator "$ADMIN" shutdown >/dev/null 2>&1 || fail "$name: shutdown verb"
    for pid in "${CPIDS[@]}"; do
        local waited=0
        while kill -0 "$pid" 2>/dev/null && [ $waited -lt 300 ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        if kill -0 "$pid" 2>/dev/null; then
            fail "$name: pid $pid still running 30 s after shutdown"
            kill -9 "$pid"
        fi
        wait "$pid"
        local rc=$?
        [ $rc -eq 0 ] || fail "$name: pid $pid exited $rc after shutdown"
    done
}

check_forwards() {
    local name=$1 model=$2 n=0 bad=0
    for layer in 0 1 mtp.0; do
        for t in 1 7 64 300; do
            local out=$TMP/$name.$layer.$t.st ref=$TMP/ref.$name.$layer.$t.st
            "$CTL" forward --local --model "$model" --layer "$layer" --input "$TMP/in_$t.st" \
                --output "$ref" >/dev/null || { fail "forward --local $name $layer T=$t"; continue; }
            if ! "$CTL" --coordinator "$ADMIN" forward --layer "$layer" --input "$TMP/in_$t.st" \
                --output "$out" >"$TMP/$name.fwd.log" 2>&1; then
                fail "$name: forward layer $layer T=$t: $(cat "$TMP/$name.fwd.log")"
                bad=$((bad + 1))
            elif ! cmp -s "$out" "$ref"; then
                fail "$name: layer $layer T=$t differs from forward --local"
                "$CTL" diff "$out" "$ref" | head -5
                bad=$((bad + 1))
            fi
            n=$((n + 1))
        done
    done
    [ $bad -eq 0 ] && ok "$name: $n forwards over NCCL, P = $P (layers 0 hash, 1 score, mtp.0; T 1 7 64 300) bit-identical to --local"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
if [ -n "$MODEL" ]; then
    ln -s "$(cd "$MODEL" && pwd)" "$TMP/given"
    models=(given)
else
    models=(fp4 fp8)
    for dt in "${models[@]}"; do
        "$CTL" mkmodel --out "$TMP/$dt" --expert-dtype "$dt" --experts 12 --layers 2 \
            --hash-layers 1 --mtp 1 --seed 7 >/dev/null || { fail "mkmodel $dt"; exit 1; }
    done
fi
for t in 1 7 64 300; do
    "$CTL" mkinput --model "$TMP/${models[0]}" --tokens "$t" --seed "$t" --out "$TMP/in_$t.st" \
        >/dev/null || fail "mkinput $t"
done
for m in "${models[@]}"; do
    start_cluster "nccl-$m" "$TMP/$m" || continue
    check_forwards "nccl-$m" "$TMP/$m"
    stop_cluster "nccl-$m"
done

if [ $fails -ne 0 ]; then
    echo "nccl_cluster: $fails failure(s)"
    exit 1
fi
echo "nccl_cluster: all ok"
