# lib.sh — shared by run_faults.sh and soak.sh (sourced): a cluster whose coordinator and four
# workers each live in their own network namespace with their own address (10.78.0.1 for the
# coordinator, .2-.5 for workers w0-w3, .6 for a spare host), joined by veth pairs to a bridge
# in another namespace. Namespace names carry this shell's pid, so suites running at the same
# time never meet. The admin socket is on the coordinator host's loopback; clients run there.
#
# The caller sets CTL, COORD, WORKER (binaries) and calls fl_init first; fl_cleanup runs at exit.

FL_P=4           # workers
FL_HB=200        # heartbeat_ms
FL_LIVENESS=5    # liveness: a worker is dead after 1 s of silence
FL_STEP_MS=4000  # step_timeout_ms
FL_PFX=fl$$
FL_PIDS=()
FL_COORD_PID=
declare -A FL_WPID

fl_skip() {
    echo "skip: $*"
    rm -rf "${TMP:-/nonexistent}"
    exit 77
}

fl_addr() { echo "10.78.0.$(($1 + 1))"; } # host i: 0 coordinator, 1..4 workers, 5 spare
fl_on() { ip netns exec "${FL_PFX}h$1" "${@:2}"; }
fl_now() { date +%s%3N; }

fl_cleanup() {
    touch "$TMP/stop" 2>/dev/null
    for p in "${FL_PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
    sleep 0.3
    for p in "${FL_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    for ((i = 0; i <= FL_P + 1; i++)); do ip netns del "${FL_PFX}h$i" 2>/dev/null; done
    ip netns del "${FL_PFX}br" 2>/dev/null
    [ -n "${FL_KEEP:-}" ] || rm -rf "$TMP"
}

# The network: skips (77) when namespaces cannot be made here.
fl_net() {
    [ "$(id -u)" -eq 0 ] || fl_skip "network namespaces need root"
    command -v ip >/dev/null || fl_skip "iproute2 (ip) is not installed"
    ip netns add "${FL_PFX}br" 2>/dev/null || fl_skip "cannot create network namespaces here"
    ip -n "${FL_PFX}br" link add br0 type bridge && ip -n "${FL_PFX}br" link set br0 up &&
        ip -n "${FL_PFX}br" link set lo up || fl_skip "cannot create a bridge"
    for ((i = 0; i <= FL_P + 1; i++)); do
        local ns=${FL_PFX}h$i
        ip netns add "$ns" &&
            ip link add "${FL_PFX}v$i" type veth peer name eth0 netns "$ns" &&
            ip link set "${FL_PFX}v$i" netns "${FL_PFX}br" &&
            ip -n "${FL_PFX}br" link set "${FL_PFX}v$i" master br0 up &&
            ip -n "$ns" addr add "$(fl_addr "$i")/24" dev eth0 &&
            ip -n "$ns" link set eth0 up &&
            ip -n "$ns" link set lo up || fl_skip "cannot set up veth pairs"
    done
}

fl_init() {
    TMP=$(mktemp -d /tmp/epmoe_faults_XXXXXX)
    trap fl_cleanup EXIT
    fl_net
    LISTEN="tcp://$(fl_addr 0):7400"
    ADMIN="tcp://127.0.0.1:7401"
    MODEL=$TMP/model
    SPEC=$TMP/cluster.yaml
    "$CTL" mkmodel --out "$MODEL" --expert-dtype fp4 --experts 8 --layers 2 --hash-layers 1 \
        --mtp 1 --seed 11 >/dev/null || { echo "FAIL: mkmodel"; exit 1; }
    fl_write_spec
}

# The spec; $1 (optional) replaces the heartbeat_ms value (a broken reload writes 5).
fl_write_spec() {
    {
        echo "cluster: {name: faults}"
        echo "coordinator:"
        echo "  listen: \"$LISTEN\""
        echo "  admin: \"$ADMIN\""
        echo "  heartbeat_ms: ${1:-$FL_HB}"
        echo "  liveness: $FL_LIVENESS"
        echo "  step_timeout_ms: $FL_STEP_MS"
        echo "model: {path: $MODEL}"
        [ -z "${FL_SPEC_EXTRA:-}" ] || echo "$FL_SPEC_EXTRA" # e.g. expert_parallel with replicas
        echo "nodes:"
        for ((r = 0; r < FL_P; r++)); do
            echo "  - name: host$((r + 1))"
            echo "    workers:"
            echo "      - {name: w$r, device: cpu, data: \"tcp://$(fl_addr $((r + 1))):7500\"}"
        done
    } >"$SPEC"
}

# Daemons and clients start with ip netns exec directly (not through fl_on), so that $! is the
# process itself (ip execs it) and a signal reaches it, not a subshell.
fl_start_coord() {
    ip netns exec "${FL_PFX}h0" "$COORD" --cluster "$SPEC" >>"$TMP/coord.log" 2>&1 &
    FL_COORD_PID=$!
    FL_PIDS+=("$FL_COORD_PID")
}

# fl_start_worker R [HOST]: worker wR on its host (or another one: an impostor)
fl_start_worker() {
    local r=$1 host=${2:-$(($1 + 1))}
    ip netns exec "${FL_PFX}h$host" "$WORKER" --coordinator "$LISTEN" --name "w$r" --threads 1 \
        >>"$TMP/w$r.h$host.log" 2>&1 &
    FL_PIDS+=($!)
    [ "$host" -eq $((r + 1)) ] && FL_WPID[$r]=$!
    return 0
}

fl_ctl() { fl_on 0 "$CTL" --coordinator "$ADMIN" "$@"; }

# fl_cut_data HOST / fl_heal_data HOST: drop every packet of the data plane (TCP port 7500) to
# and from a worker's host, both directions, its control connection (7400) and client endpoint
# untouched: a partition of the data port. With iproute2's tc only: an htb class whose pfifo
# holds nothing (limit 0) takes the data port's packets, on the host's eth0 (what it sends)
# and on the bridge's end of its veth (what it receives).
fl_tc_drop() {
    local ns=$1 dev=$2
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: htb default 1 r2q 100000 &&
        ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:1 htb rate 10gbit &&
        ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:2 htb rate 10gbit &&
        ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:2 handle 20: pfifo limit 0 &&
        ip netns exec "$ns" tc filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
            match ip dport 7500 0xffff flowid 1:2 &&
        ip netns exec "$ns" tc filter add dev "$dev" parent 1: protocol ip prio 2 u32 \
            match ip sport 7500 0xffff flowid 1:2
}
fl_cut_data() {
    fl_tc_drop "${FL_PFX}h$1" eth0 && fl_tc_drop "${FL_PFX}br" "${FL_PFX}v$1"
}
fl_heal_data() {
    ip netns exec "${FL_PFX}h$1" tc qdisc del dev eth0 root
    ip netns exec "${FL_PFX}br" tc qdisc del dev "${FL_PFX}v$1" root
}

# fl_numbers T0 RESTORE END: "pause_ms back95_ms reint_ms rate" from the client timelines
# (fault_numbers.py); RESTORE "-" when nothing comes back.
fl_numbers() {
    python3 "$(dirname "${BASH_SOURCE[0]}")/fault_numbers.py" "$1" "$2" "$3" "$TMP"/client[012].log.t
}

# "STATE CURRENT_EPOCH": the cluster as STATUS reports it ("down 0" when it does not answer).
fl_state() {
    fl_ctl --timeout 1000 -o json status 2>/dev/null | python3 -c '
import json, sys
try:
    s = json.load(sys.stdin)
    print(s["state"], s.get("current_epoch", s["epoch"]))
except Exception:
    print("down 0")'
}

# fl_wait_ready MIN_EPOCH TIMEOUT_S: wait until the cluster is ready in an epoch >= MIN_EPOCH;
# prints the epoch; returns 1 on timeout.
fl_wait_ready() {
    local end=$(($(fl_now) + $2 * 1000)) st ep
    while [ "$(fl_now)" -lt "$end" ]; do
        read -r st ep <<<"$(fl_state)"
        if [ "$st" = ready ] && [ "$ep" -ge "$1" ]; then
            echo "$ep"
            return 0
        fi
        sleep 0.05
    done
    return 1
}

# Inputs and references: one (layer, tokens) per client, the output of forward --local.
fl_inputs() {
    local i=0
    for spec in "0 64" "1 17" "mtp.0 300"; do
        read -r layer tokens <<<"$spec"
        "$CTL" mkinput --model "$MODEL" --tokens "$tokens" --seed $((i + 5)) \
            --out "$TMP/in$i.st" >/dev/null &&
            "$CTL" forward --local --model "$MODEL" --layer "$layer" --input "$TMP/in$i.st" \
                --output "$TMP/ref$i.st" >/dev/null || { echo "FAIL: inputs"; exit 1; }
        FL_LAYER[$i]=$layer
        i=$((i + 1))
    done
}

fl_start_clients() {
    rm -f "$TMP/stop"
    for i in 0 1 2; do
        ip netns exec "${FL_PFX}h0" bash "$(dirname "${BASH_SOURCE[0]}")/client.sh" "$CTL" "$ADMIN" \
            "${FL_LAYER[$i]}" "$TMP/in$i.st" "$TMP/ref$i.st" "$FL_STEP_MS" "$TMP/client$i.log" \
            "$TMP/stop" &
        FL_CLIENTS+=($!)
        FL_PIDS+=($!)
    done
}

fl_stop_clients() {
    touch "$TMP/stop"
    for p in "${FL_CLIENTS[@]}"; do wait "$p" 2>/dev/null; done
    FL_CLIENTS=()
}

# Lines of kind K (OK, FAIL, LOST, WRONG) in the client logs, or every line (no K).
fl_count() {
    cat "$TMP"/client?.log 2>/dev/null | if [ $# -gt 0 ]; then grep -c "^$1" ; else wc -l; fi
}

# Sets ISSUED OK FAILED LOST WRONG from the client logs and prints them, the lost and wrong
# requests, and the most frequent explicit failures (numbers folded).
fl_report() {
    ISSUED=$(fl_count)
    OK=$(fl_count OK)
    FAILED=$(fl_count FAIL)
    LOST=$(fl_count LOST)
    WRONG=$(fl_count WRONG)
    echo "requests: $ISSUED issued, $OK answered bit-identical, $FAILED failed with an explicit" \
        "error, $LOST lost, $WRONG wrong"
    grep -h "^WRONG\|^LOST" "$TMP"/client?.log | sort | uniq -c | head
    grep -h "^FAIL" "$TMP"/client?.log | sed 's/step [0-9]*/step N/g; s/[0-9]* ms/N ms/g' |
        sort | uniq -c | sort -rn | head -8
}
