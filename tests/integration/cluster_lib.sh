# shellcheck shell=bash
# cluster_lib.sh — real clusters on tcp loopback for the script tests (sourced).
#
# The caller sets CTL (epmoectl), COORD, WORKER (binaries), TMP (its mktemp -d directory) and
# PIDS=() and fails=0 before sourcing; every daemon started here or by the caller is in PIDS,
# and the EXIT trap set here stops them, touches $TMP/stop (background client loops watch it)
# and removes $TMP (kept when KEEP is set). Ports are picked free (bound to port 0 and released).
# With SECURE set (non-empty) start_cluster writes a security: section for the keys in $KEYS
# (coordinator.key, workers/wR.pub, operators/; make them with cluster_keys) and starts each
# worker with its key; CL_CLIENT_KEYS, when set, is its security.client_keys directory.

cluster_cleanup() {
    touch "$TMP/stop" 2>/dev/null
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$TMP"
}
trap cluster_cleanup EXIT

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

ok() { echo "ok   $*"; }

# wait_grep SECONDS FILE ERE: whether FILE gets a line matching ERE within SECONDS (a daemon
# logs what its threads saw a little later, much later on a loaded machine: never a fixed sleep)
wait_grep() {
    local n=0
    while [ $n -lt $(($1 * 10)) ]; do
        grep -qE "$3" "$2" 2>/dev/null && return 0
        sleep 0.1
        n=$((n + 1))
    done
    grep -qE "$3" "$2" 2>/dev/null
}

# The Python with the Debian packages (prometheus_client), not a user's pyenv shim.
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3

# N free tcp ports on 127.0.0.1 (bound to port 0 and released; another program taking one in
# between is the race every test of this kind accepts). Ports this test was given before (kept in
# $TMP/ports.used) are never given again: the kernel may hand a released port out again at once,
# and two endpoints of one spec on the same port make its daemon fail to bind.
free_ports() {
    "$PY" - "$1" "$TMP/ports.used" <<'PY'
import os, socket, sys
used = set()
if os.path.exists(sys.argv[2]):
    used = set(open(sys.argv[2]).read().split())
socks, ports = [], []
while len(ports) < int(sys.argv[1]):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
    p = str(s.getsockname()[1])
    if p not in used:
        ports.append(p)
        used.add(p)
with open(sys.argv[2], "a") as f:
    f.write(" ".join(ports) + "\n")
print(" ".join(ports))
PY
}

# cluster_keys NAME...: keys in $KEYS for the secure runs (epmoectl keygen): coordinator, the
# names given (w0.. go into workers/, the first other one into operators/), and epmoectl's
# EPMOE_KEY/EPMOE_SERVER_KEY set to that operator's
cluster_keys() {
    mkdir -p "$KEYS/workers" "$KEYS/operators"
    local k op=
    for k in coordinator "$@"; do
        "$CTL" keygen --out "$KEYS" --name "$k" >/dev/null || { echo "FAIL: keygen $k"; exit 1; }
        case $k in
        coordinator) ;;
        w[0-9]*) cp "$KEYS/$k.pub" "$KEYS/workers/" ;;
        *) [ -z "$op" ] && op=$k && cp "$KEYS/$k.pub" "$KEYS/operators/" ;;
        esac
    done
    export EPMOE_KEY=$KEYS/$op.key EPMOE_SERVER_KEY=$KEYS/coordinator.pub
}

# worker_keys NAME: the worker's key options when SECURE is set
worker_keys() {
    [ -n "${SECURE:-}" ] && echo "--key $KEYS/$1.key --coordinator-key $KEYS/coordinator.pub"
}

# start_cluster NAME MODEL P DISPATCH [EP_EXTRA [COORD_EXTRA [WORKER_METRICS]]]: writes
# $TMP/NAME.yaml, starts the daemons, waits for ready. EP_EXTRA goes into the expert_parallel
# mapping ("placement: eplb, redundant_experts: 4"), COORD_EXTRA into coordinator's; with
# WORKER_METRICS=1 every worker serves /metrics on a free port (METRICS[r]). Sets ADMIN, LISTEN,
# DATA (array), CPIDS (coordinator then workers), SPEC. CL_HEARTBEAT_MS and CL_LIVENESS, when
# set, replace the heartbeat (200 ms) and liveness (10).
start_cluster() {
    local name=$1 model=$2 p=$3 dispatch=$4 ep=${5:-placement: contiguous} cx=${6:-} wm=${7:-0}
    read -r -a ports <<<"$(free_ports $((2 * p + 2)))"
    LISTEN="tcp://127.0.0.1:${ports[0]}"
    ADMIN="tcp://127.0.0.1:${ports[1]}"
    DATA=()
    METRICS=()
    SPEC=$TMP/$name.yaml
    {
        echo "cluster: {name: $name}"
        echo "coordinator: {listen: \"$LISTEN\", admin: \"$ADMIN\", heartbeat_ms: ${CL_HEARTBEAT_MS:-200}, liveness: ${CL_LIVENESS:-10}${cx:+, $cx}}"
        echo "model: {path: $model}"
        echo "expert_parallel: {$ep, dispatch: $dispatch}"
        echo "nodes:"
        echo "  - name: local"
        echo "    workers:"
        for ((r = 0; r < p; r++)); do
            DATA+=("tcp://127.0.0.1:${ports[$((r + 2))]}")
            local m=""
            if [ "$wm" = 1 ]; then
                METRICS+=("127.0.0.1:${ports[$((p + r + 2))]}")
                m=", metrics: \"${METRICS[$r]}\""
            fi
            echo "      - {name: w$r, device: cpu, data: \"${DATA[$r]}\"$m}"
        done
        if [ -n "${SECURE:-}" ]; then
            echo "security: {coordinator_key: $KEYS/coordinator.key, worker_keys: $KEYS/workers,"
            echo "           operator_keys: $KEYS/operators${CL_CLIENT_KEYS:+, client_keys: $CL_CLIENT_KEYS}}"
        fi
    } >"$SPEC"
    CPIDS=()
    "$COORD" --cluster "$SPEC" >"$TMP/$name.coord.log" 2>&1 &
    CPIDS+=($!)
    PIDS+=($!)
    for ((r = 0; r < p; r++)); do
        # shellcheck disable=SC2046
        "$WORKER" --coordinator "$LISTEN" --name "w$r" --threads 1 $(worker_keys "w$r") \
            >"$TMP/$name.w$r.log" 2>&1 &
        CPIDS+=($!)
        PIDS+=($!)
    done
    if ! "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 120 >"$TMP/$name.status" 2>&1; then
        fail "$name: cluster not ready"
        cat "$TMP/$name.status" "$TMP/$name.coord.log" "$TMP/$name".w*.log | tail -40
        return 1
    fi
}

# stop_cluster NAME: admin shutdown, every daemon must exit 0 within 20 s (but those the test
# killed on purpose, listed in KILLED)
KILLED=()
stop_cluster() {
    local name=$1
    "$CTL" --coordinator "$ADMIN" shutdown >/dev/null 2>&1 || fail "$name: shutdown verb"
    for pid in "${CPIDS[@]}"; do
        [[ " ${KILLED[*]} " == *" $pid "* ]] && { wait "$pid" 2>/dev/null; continue; }
        local waited=0
        while kill -0 "$pid" 2>/dev/null && [ $waited -lt 200 ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        if kill -0 "$pid" 2>/dev/null; then
            fail "$name: pid $pid still running 20 s after shutdown"
            kill -9 "$pid"
        fi
        wait "$pid"
        local rc=$?
        [ $rc -eq 0 ] || fail "$name: pid $pid exited $rc after shutdown"
    done
}

# local_ref MODEL LAYER INPUT: the reference output of forward --local (computed once)
local_ref() {
    local model=$1 layer=$2 input=$3 ref
    ref=$TMP/ref_$(basename "$model")_${layer}_$(basename "$input")
    if [ ! -f "$ref" ]; then
        "$CTL" forward --local --model "$model" --layer "$layer" --input "$input" \
            --output "$ref" >/dev/null || echo "FAIL: forward --local $model $layer $input" >&2
    fi
    echo "$ref"
}

# forward_check TAG MODEL LAYER INPUT: one cluster forward, byte-identical to forward --local
forward_check() {
    local tag=$1 model=$2 layer=$3 input=$4 out=$TMP/$1.out.st ref
    ref=$(local_ref "$model" "$layer" "$input")
    if ! "$CTL" --coordinator "$ADMIN" forward --layer "$layer" --input "$input" \
        --output "$out" >"$TMP/$tag.fwd.log" 2>&1; then
        echo "forward $tag (layer $layer, $input): $(cat "$TMP/$tag.fwd.log")"
        return 1
    fi
    if ! cmp -s "$out" "$ref"; then
        echo "forward $tag (layer $layer, $input) differs from forward --local"
        return 1
    fi
}

# json_get FILE EXPR: a value of a JSON file (EXPR is Python over `d`)
json_get() {
    "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"
}
