#!/usr/bin/env bash
# test_netns.sh — the cluster across "hosts": the coordinator and each of 4 workers in its own
# network namespace with its own address (10.77.0.1 .. 10.77.0.5/24), joined by veth pairs to a
# bridge in a sixth namespace, so every control and data-plane byte crosses a network
# interface between distinct addresses. Proves the cluster's forward output is byte-identical
# to `forward --local` for a hash, a score and the MTP layer (64 and 300 tokens, both expert
# dtypes), and that the daemons stop with exit 0. fp4 runs with security: (CURVE on every
# socket, keys from epmoectl keygen) and its operator on another host than the coordinator;
# fp8 without, its admin endpoint on the coordinator's loopback (the rule without security).
#
# Needs root and iproute2 (ip netns); exits 77 (skipped) otherwise, saying why.
#
#   test_netns.sh CTL_DIR COORDINATOR WORKER
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
P=4
PFX=epm$$
NS_BR=${PFX}br
TMP=$(mktemp -d /tmp/epmoe_netns_XXXXXX)
PIDS=()
fails=0

skip() {
    echo "skip: $*"
    rm -rf "$TMP"
    exit 77
}

[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    for ((i = 0; i <= P; i++)); do ip netns del "${PFX}h$i" 2>/dev/null; done
    ip netns del "$NS_BR" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

addr() { echo "10.77.0.$(($1 + 1))"; } # host i: 0 = coordinator, 1..P = workers

# ---- the network: one bridge, one namespace per host ----
ip netns add "$NS_BR" || skip "cannot create network namespaces here"
ip -n "$NS_BR" link add br0 type bridge && ip -n "$NS_BR" link set br0 up &&
    ip -n "$NS_BR" link set lo up || skip "cannot create a bridge"
for ((i = 0; i <= P; i++)); do
    ns=${PFX}h$i
    ip netns add "$ns" &&
        ip link add "${PFX}v$i" type veth peer name eth0 netns "$ns" &&
        ip link set "${PFX}v$i" netns "$NS_BR" &&
        ip -n "$NS_BR" link set "${PFX}v$i" master br0 up &&
        ip -n "$ns" addr add "$(addr "$i")/24" dev eth0 &&
        ip -n "$ns" link set eth0 up &&
        ip -n "$ns" link set lo up || skip "cannot set up veth pairs"
done
# each host has only lo and eth0 with its own address: another host is reachable only across
# the bridge
[ "$(ip -n "${PFX}h1" -4 -o addr show dev eth0 | awk '{print $4}')" = "$(addr 1)/24" ] ||
    fail "host 1 does not have $(addr 1)"

# ---- cluster spec: every endpoint on its host's own address ----
LISTEN="tcp://$(addr 0):7400"
# keys for the secure run: the coordinator, each worker, one operator
mkdir -p "$TMP/keys/workers" "$TMP/keys/operators"
for k in coordinator op1; do "$CTL" keygen --out "$TMP/keys" --name $k >/dev/null || fail "keygen $k"; done
for ((r = 0; r < P; r++)); do
    "$CTL" keygen --out "$TMP/keys" --name "w$r" >/dev/null || fail "keygen w$r"
    cp "$TMP/keys/w$r.pub" "$TMP/keys/workers/"
done
cp "$TMP/keys/op1.pub" "$TMP/keys/operators/"
# write_spec MODEL SECURE: with security the admin endpoint is on the network, else loopback
write_spec() {
    ADMIN="tcp://127.0.0.1:7401"
    [ "$2" = 1 ] && ADMIN="tcp://$(addr 0):7401"
    {
        echo "cluster: {name: netns}"
        echo "coordinator: {listen: \"$LISTEN\", admin: \"$ADMIN\", heartbeat_ms: 200, liveness: 10}"
        echo "model: {path: $1}"
        echo "nodes:"
        for ((r = 0; r < P; r++)); do
            echo "  - name: host$((r + 1))"
            echo "    workers:"
            echo "      - {name: w$r, device: cpu, data: \"tcp://$(addr $((r + 1))):7500\"}"
        done
        if [ "$2" = 1 ]; then
            echo "security: {coordinator_key: $TMP/keys/coordinator.key,"
            echo "  worker_keys: $TMP/keys/workers, operator_keys: $TMP/keys/operators}"
        fi
    } >"$TMP/netns.yaml"
}

on() { ip netns exec "${PFX}h$1" "${@:2}"; }

for dt in fp4 fp8; do
    model=$TMP/$dt
    "$CTL" mkmodel --out "$model" --expert-dtype "$dt" --experts 8 --layers 2 --hash-layers 1 \
        --mtp 1 --seed 11 >/dev/null || { fail "mkmodel $dt"; continue; }
    secure=0
    [ $dt = fp4 ] && secure=1
    write_spec "$model" $secure
    # the operator: with security on host 1 (across the bridge) with its key, else on host 0
    ophost=0
    export EPMOE_KEY= EPMOE_SERVER_KEY=
    if [ $secure = 1 ]; then
        ophost=1
        export EPMOE_KEY=$TMP/keys/op1.key EPMOE_SERVER_KEY=$TMP/keys/coordinator.pub
    fi
    cpids=()
    on 0 "$COORD" --cluster "$TMP/netns.yaml" >"$TMP/coord-$dt.log" 2>&1 &
    cpids+=($!)
    for ((r = 0; r < P; r++)); do
        keys=()
        [ $secure = 1 ] && keys=(--key "$TMP/keys/w$r.key" --coordinator-key "$TMP/keys/coordinator.pub")
        on $((r + 1)) "$WORKER" --coordinator "$LISTEN" --name "w$r" --threads 1 "${keys[@]}" \
            >"$TMP/w$r-$dt.log" 2>&1 &
        cpids+=($!)
    done
    PIDS+=("${cpids[@]}")
    if ! on $ophost "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 120 >"$TMP/st" 2>&1; then
        fail "$dt: cluster not ready"
        tail -20 "$TMP/st" "$TMP/coord-$dt.log" "$TMP"/w*-"$dt".log
        continue
    fi
    n=0
    for t in 64 300; do
        "$CTL" mkinput --model "$model" --tokens "$t" --seed "$t" --out "$TMP/in$t.st" >/dev/null
        for layer in 0 1 mtp.0; do
            "$CTL" forward --local --model "$model" --layer "$layer" --input "$TMP/in$t.st" \
                --output "$TMP/ref.st" >/dev/null || fail "$dt: forward --local $layer"
            if ! on $ophost "$CTL" --coordinator "$ADMIN" forward --layer "$layer" \
                --input "$TMP/in$t.st" --output "$TMP/out.st" >"$TMP/fwd.log" 2>&1; then
                fail "$dt: forward $layer T=$t: $(cat "$TMP/fwd.log")"
            elif ! cmp -s "$TMP/out.st" "$TMP/ref.st"; then
                fail "$dt: layer $layer T=$t differs from forward --local"
            else
                n=$((n + 1))
            fi
        done
    done
    # the workers really are on their own addresses: the coordinator saw them connect from there
    on $ophost "$CTL" --coordinator "$ADMIN" -o json workers >"$TMP/workers.json" 2>&1 ||
        fail "$dt: workers verb"
    for ((r = 0; r < P; r++)); do
        grep -q "tcp://$(addr $((r + 1))):7500" "$TMP/workers.json" || fail "$dt: w$r endpoint"
    done
    if [ $secure = 1 ]; then
        # without a listed key, from any host: refused, nothing reaches the coordinator
        "$CTL" keygen --out "$TMP/keys" --name stranger >/dev/null
        on 2 env EPMOE_KEY="$TMP/keys/stranger.key" "$CTL" --coordinator "$ADMIN" --timeout 5000 \
            status >"$TMP/stranger.log" 2>&1
        rc=$?
        [ $rc -eq 77 ] || fail "$dt: a stranger's key: exit $rc, expected 77: $(cat "$TMP/stranger.log")"
        grep -q "refused a connection from $(addr 2)" "$TMP/coord-$dt.log" ||
            fail "$dt: the coordinator did not log the refused address $(addr 2)"
    fi
    echo "ok   $dt: $n forwards across 5 namespaces bit-identical to --local (security $secure)"
    on $ophost "$CTL" --coordinator "$ADMIN" shutdown >/dev/null || fail "$dt: shutdown"
    for pid in "${cpids[@]}"; do
        wait "$pid" || fail "$dt: a daemon exited non-zero after shutdown"
    done
done

if [ $fails -ne 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "all ok"
