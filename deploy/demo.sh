#!/usr/bin/env bash
# demo.sh — the main job on its embedded default: a whole epmoe cluster on this machine.
#
#   deploy/demo.sh [BUILD_DIR]        (./dev demo builds first, then runs this)
#
# For each expert dtype (fp4 = MXFP4 experts like DeepSeek-V4-Flash, fp8 = FP8 block experts
# like Flash-Base) it generates a small DeepSeek V4 checkpoint in out/demo-model, starts the
# coordinator and 4 CPU workers on loopback with deploy/examples/local.yaml, waits until the
# cluster is ready, runs a forward of 64 tokens through every MoE layer (hash-routed, score-
# routed and MTP), checks each result against `epmoectl forward --local` in one process, prints
# a report, and shuts the cluster down. Exit 0 when every layer matched bit for bit.
#
# Environment: EPMOE_DEMO_TOKENS (64), EPMOE_DEMO_HIDDEN (1024), EPMOE_DEMO_INTER (512),
# EPMOE_DEMO_EXPERTS (16), EPMOE_DEMO_LAYERS (4), EPMOE_DEMO_SECURE=1 (keys from epmoectl
# keygen in out/demo-keys and a security: section: CURVE on every socket). Ports 7400, 7401,
# 7500-7503 must be free.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
CTL=$BUILD/ctl/epmoectl
COORD=$BUILD/coordinator/epmoe-coordinator
WORKER=$BUILD/worker/epmoe-worker
SPEC=deploy/examples/local.yaml
MODEL=out/demo-model
ADMIN=tcp://127.0.0.1:7401
LISTEN=tcp://127.0.0.1:7400
T=${EPMOE_DEMO_TOKENS:-64}
LOGS=out/demo-logs
PIDS=()

for b in "$CTL" "$COORD" "$WORKER"; do
    [ -x "$b" ] || { echo "demo: $b not found: build first (./dev build)"; exit 1; }
done
mkdir -p out "$LOGS"

# With EPMOE_DEMO_SECURE=1: fresh keys for the coordinator, the 4 workers and one operator,
# the example spec plus a security: section, and the operator's key for every epmoectl call.
WKEYS=()
if [ "${EPMOE_DEMO_SECURE:-0}" = 1 ]; then
    K=$PWD/out/demo-keys
    rm -rf "$K" && mkdir -p "$K/workers" "$K/operators"
    for k in coordinator operator cpu0 cpu1 cpu2 cpu3; do
        "$CTL" keygen --out "$K" --name $k >/dev/null || exit 1
    done
    cp "$K"/cpu?.pub "$K/workers/" && cp "$K/operator.pub" "$K/operators/"
    SPEC=out/demo-secure.yaml
    { sed "s|path: ../../out/demo-model|path: $PWD/$MODEL|" deploy/examples/local.yaml
      echo "security: {coordinator_key: $K/coordinator.key, worker_keys: $K/workers,"
      echo "           operator_keys: $K/operators}"; } >"$SPEC"
    export EPMOE_KEY=$K/operator.key EPMOE_SERVER_KEY=$K/coordinator.pub
    echo "demo: security on (keys in $K)"
fi

stop_all() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    PIDS=()
}
trap stop_all EXIT

json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

run_dtype() {
    local dt=$1
    echo
    echo "=== expert_dtype $dt ==="
    "$CTL" mkmodel --out "$MODEL" --expert-dtype "$dt" --force \
        --hidden "${EPMOE_DEMO_HIDDEN:-1024}" --inter "${EPMOE_DEMO_INTER:-512}" \
        --experts "${EPMOE_DEMO_EXPERTS:-16}" --layers "${EPMOE_DEMO_LAYERS:-4}" \
        --hash-layers 1 --mtp 1 --seed 2026 || return 1
    "$COORD" --cluster "$SPEC" >"$LOGS/coordinator-$dt.log" 2>&1 &
    PIDS+=($!)
    for i in 0 1 2 3; do
        [ -n "${K:-}" ] && WKEYS=(--key "$K/cpu$i.key" --coordinator-key "$K/coordinator.pub")
        "$WORKER" --coordinator "$LISTEN" --name "cpu$i" --threads 1 "${WKEYS[@]}" \
            >"$LOGS/cpu$i-$dt.log" 2>&1 &
        PIDS+=($!)
    done
    if ! "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 120; then
        echo "demo: the cluster did not become ready; logs in $LOGS:"
        tail -n 5 "$LOGS"/*-"$dt".log
        return 1
    fi
    "$CTL" --coordinator "$ADMIN" shards
    local layers nl
    layers=$("$CTL" --coordinator "$ADMIN" -o json config |
        json "' '.join([str(i) for i in range(d['config']['num_hidden_layers'])] + ['mtp.%d' % i for i in range(d['config']['num_nextn_predict_layers'])])")
    echo
    printf '%-9s %-6s %7s %10s %8s %9s %10s\n' LAYER KIND TOKENS "TIME (s)" ENTRY REPLAYED \
        "MAX DIFF"
    local bad=0
    for layer in $layers; do
        "$CTL" mkinput --model "$MODEL" --tokens "$T" --seed 7 --out out/demo-in.st >/dev/null
        local info kind
        info=$("$CTL" --coordinator "$ADMIN" -o json forward --layer "$layer" \
            --input out/demo-in.st --output "out/demo-$dt-$layer.st") || { bad=1; continue; }
        "$CTL" forward --local --model "$MODEL" --layer "$layer" --input out/demo-in.st \
            --output "out/demo-$dt-$layer-local.st" >/dev/null || { bad=1; continue; }
        local diff maxd
        diff=$("$CTL" -o json diff "out/demo-$dt-$layer.st" "out/demo-$dt-$layer-local.st")
        [ $? -eq 0 ] || bad=1
        maxd=$(echo "$diff" | json "max(t['max_abs'] for t in d['tensors'])")
        case $layer in mtp.*) kind=mtp ;; 0) kind=hash ;; *) kind=score ;; esac
        echo "$info" | json "'%-9s %-6s %7d %10.4f %8s %9s %10s' % ('$layer', '$kind', d['tokens'], d['forward_seconds'], d['entry'], 'yes' if d['replayed'] else 'no', '$maxd')"
    done
    "$CTL" --coordinator "$ADMIN" shutdown >/dev/null
    local rc=0
    for p in "${PIDS[@]}"; do wait "$p" || rc=1; done
    PIDS=()
    [ $rc -eq 0 ] && echo "cluster stopped cleanly (every daemon exited 0)" || echo "demo: a daemon exited non-zero"
    if [ $bad -ne 0 ]; then
        echo "demo: a layer differed from forward --local"
        return 1
    fi
    echo "every layer: cluster output bit-identical to forward --local (max diff 0)"
}

status=0
run_dtype fp4 || status=1
run_dtype fp8 || status=1
echo
[ $status -eq 0 ] && echo "demo: ok (logs in $LOGS)" || echo "demo: FAILED (logs in $LOGS)"
exit $status
