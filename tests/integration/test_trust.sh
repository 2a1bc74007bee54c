#!/usr/bin/env bash
# test_trust.sh — what a careless operator or a hostile peer can do to real daemons (issue 7),
# each case one the old code failed:
#   - a second epmoe-worker under a live worker's name is refused with ERR_DUPLICATE and exits
#     78, again and again, while the first keeps serving and the coordinator never aborts (it
#     used to abort in libzmq or flap between loading and ready);
#   - a worker whose device differs from the spec's exits 78 naming the spec line (it used to
#     log "coordinator silent" and retry for ever), and so does one on a device it cannot serve;
#   - --check refuses an admin endpoint other hosts can reach when there is no security:, a
#     secret key others may read, and (in a build without CUDA) cuda:N workers;
#   - epochs and step ids keep increasing when the coordinator restarts (they restarted at 1);
#   - a checkpoint regenerated in place (same shapes) under a running coordinator: a worker
#     restarted afterwards refuses to load it, naming the file (it loaded the mixed weights),
#     and the cluster is `blocked` with that reason, forwards refused at once (it stayed
#     `loading` for ever, every forward waiting out its timeout: issue 17, defect 4);
#   - with security: a worker with an unlisted key, and one whose key is another worker's,
#     exit 78 and never register; epmoectl without a key or with an unlisted one exits 77; a
#     stranger's messages to a worker's data endpoint are refused (logged with the address);
#     a client without CURVE, one with another server key and a stream that is not ZeroMQ are
#     logged with the peer's address and reason and counted (they left no trace: issue 17, 6);
#     the operator's key works and the cluster's forwards are bit-identical to --local.
#
#   test_trust.sh CTL_DIR COORDINATOR WORKER ZMQ_POKE HAVE_CUDA
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
POKE=$4
HAVE_CUDA=${5:-0}
TMP=$(mktemp -d /tmp/epmoe_trust_XXXXXX)
PIDS=()
fails=0
# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

# wait_exit PID SECONDS: the exit code, or 255 after killing a process that did not exit
wait_exit() {
    local pid=$1 n=0
    while kill -0 "$pid" 2>/dev/null && [ $n -lt $(($2 * 10)) ]; do
        sleep 0.1
        n=$((n + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid"
        wait "$pid" 2>/dev/null
        return 255
    fi
    wait "$pid"
}

# write_spec FILE MODEL P ADMIN [DEVICE1] [SECURITY]: 2..P workers w0.. on loopback
write_spec() {
    local file=$1 model=$2 p=$3 admin=$4 dev1=${5:-cpu} sec=${6:-}
    read -r -a ports <<<"$(free_ports $((p + 1)))"
    LISTEN="tcp://127.0.0.1:${ports[0]}"
    ADMIN=$admin
    {
        echo "cluster: {name: trust}"
        echo "coordinator: {listen: \"$LISTEN\", admin: \"$ADMIN\", heartbeat_ms: 200, liveness: 10}"
        echo "model: {path: $model}"
        echo "nodes:"
        echo "  - name: here"
        echo "    workers:"
        for ((r = 0; r < p; r++)); do
            local d=cpu
            [ $r = 1 ] && d=$dev1
            echo "      - {name: w$r, device: $d, data: \"tcp://127.0.0.1:${ports[$((r + 1))]}\"}"
        done
        [ -n "$sec" ] && echo "$sec"
    } >"$file"
}

admin_ep() { echo "tcp://127.0.0.1:$(free_ports 1)"; }

ready() { "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 60 >"$TMP/st" 2>&1; }

# forward_ok NAME MODEL: layer 1, 64 tokens, bit-identical to --local
forward_ok() {
    "$CTL" --coordinator "$ADMIN" forward --layer 1 --input "$TMP/in.st" --output "$TMP/o.st" \
        >"$TMP/f.log" 2>&1 || { fail "$1: forward: $(cat "$TMP/f.log")"; return 1; }
    "$CTL" forward --local --model "$2" --layer 1 --input "$TMP/in.st" --output "$TMP/r.st" \
        >/dev/null 2>&1 || { fail "$1: forward --local"; return 1; }
    cmp -s "$TMP/o.st" "$TMP/r.st" || { fail "$1: the cluster's output differs from --local"; return 1; }
}

M=$TMP/m
"$CTL" mkmodel --out "$M" --expert-dtype fp4 --experts 8 --layers 2 --seed 5 >/dev/null ||
    { echo "FAIL: mkmodel"; exit 1; }
"$CTL" mkinput --model "$M" --tokens 64 --out "$TMP/in.st" >/dev/null || { echo "FAIL: mkinput"; exit 1; }

# ---- duplicate names ------------------------------------------------------------------------
write_spec "$TMP/dup.yaml" "$M" 2 "$(admin_ep)"
"$COORD" --cluster "$TMP/dup.yaml" >"$TMP/dup.coord.log" 2>&1 &
cpid=$!
PIDS+=($cpid)
"$WORKER" --coordinator "$LISTEN" --name w0 --threads 1 >"$TMP/dup.w0.log" 2>&1 &
w0=$!
"$WORKER" --coordinator "$LISTEN" --name w1 --threads 1 >"$TMP/dup.w1.log" 2>&1 &
w1=$!
PIDS+=($w0 $w1)
if ready; then
    forward_ok "duplicate: before" "$M"
    bad=0
    for i in 1 2 3; do
        "$WORKER" --coordinator "$LISTEN" --name w0 --threads 1 >"$TMP/dup.second$i.log" 2>&1 &
        second=$!
        wait_exit $second 20
        rc=$?
        if [ $rc -ne 78 ] || ! grep -q "ERR_DUPLICATE" "$TMP/dup.second$i.log"; then
            fail "duplicate $i: the second w0 exited $rc: $(tail -2 "$TMP/dup.second$i.log")"
            bad=1
        fi
    done
    kill -0 $cpid 2>/dev/null || { fail "duplicate: the coordinator died"; bad=1; }
    kill -0 $w0 2>/dev/null || { fail "duplicate: the first w0 died"; bad=1; }
    ready || { fail "duplicate: not ready afterwards: $(cat "$TMP/st")"; bad=1; }
    forward_ok "duplicate: after" "$M" || bad=1
    [ $bad -eq 0 ] && ok "3 second processes under w0 refused (ERR_DUPLICATE, exit 78); the first serves on"
    # the worker killed and started again is a restart, not a duplicate
    kill -9 $w0
    wait $w0 2>/dev/null
    "$WORKER" --coordinator "$LISTEN" --name w0 --threads 1 >"$TMP/dup.w0b.log" 2>&1 &
    w0=$!
    PIDS+=($w0)
    if ready && forward_ok "restart" "$M"; then
        ok "w0 killed and started again registers as a restart"
    else
        fail "restart of w0: $(cat "$TMP/st"; tail -3 "$TMP/dup.w0b.log")"
    fi
else
    fail "duplicate: cluster not ready: $(cat "$TMP/st")"
fi

# ---- epochs across a restart of the coordinator (a request reports the epoch it ran in; the
# serving path has no step ids) ------------------------------------------------------------------
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
e1=$("$CTL" --coordinator "$ADMIN" -o json status | json "d['epoch']")
s1=$("$CTL" --coordinator "$ADMIN" -o json forward --layer 1 --input "$TMP/in.st" \
    --output "$TMP/o.st" | json "d['epoch']")
"$CTL" --coordinator "$ADMIN" shutdown >/dev/null
for p in $cpid $w0 $w1; do wait_exit $p 20 || fail "a daemon exited $? after shutdown"; done
# heartbeats 10 times slower from here: the restart of w1 below must come before the next
# heartbeat notices its connection is gone (a restart, not a loss)
sed -i 's/heartbeat_ms: 200,/heartbeat_ms: 2000,/' "$TMP/dup.yaml"
"$COORD" --cluster "$TMP/dup.yaml" >"$TMP/again.coord.log" 2>&1 &
cpid=$!
"$WORKER" --coordinator "$LISTEN" --name w0 --threads 1 >"$TMP/again.w0.log" 2>&1 &
w0=$!
"$WORKER" --coordinator "$LISTEN" --name w1 --threads 1 >"$TMP/again.w1.log" 2>&1 &
w1=$!
PIDS+=($cpid $w0 $w1)
if ready; then
    e2=$("$CTL" --coordinator "$ADMIN" -o json status | json "d['epoch']")
    s2=$("$CTL" --coordinator "$ADMIN" -o json forward --layer 1 --input "$TMP/in.st" \
        --output "$TMP/o.st" | json "d['epoch']")
    if [ "$e2" -gt "$e1" ] && [ "$s2" -gt "$s1" ] && [ "$s1" -ge "$e1" ]; then
        ok "after a restart the epoch ($e1 -> $e2) and a request's epoch ($s1 -> $s2) keep increasing"
    else
        fail "after a restart: epoch $e1 -> $e2, a request's epoch $s1 -> $s2 (must increase)"
    fi
else
    fail "restarted coordinator not ready: $(cat "$TMP/st")"
fi

# ---- a checkpoint regenerated under the running coordinator ------------------------------------
# w1 restarted at once (a restart within liveness, not a loss: it keeps its place in the
# placement, and the cluster waits for it)
sleep 1.1 # a new modification time even on coarse file systems
"$CTL" mkmodel --out "$M" --expert-dtype fp4 --experts 8 --layers 2 --seed 6 --force >/dev/null
kill -9 $w1
wait $w1 2>/dev/null
"$WORKER" --coordinator "$LISTEN" --name w1 --threads 1 >"$TMP/regen.w1.log" 2>&1 &
w1=$!
PIDS+=($w1)
got=""
for _ in $(seq 1 100); do
    got=$("$CTL" --coordinator "$ADMIN" -o json workers 2>/dev/null |
        json "[w['error'] or '' for w in d['workers'] if w['name'] == 'w1'][0]" 2>/dev/null)
    [[ "$got" == *"changed since the coordinator started"* ]] && break
    sleep 0.2
done
if [[ "$got" == *"changed since the coordinator started"* ]] && [[ "$got" == *".safetensors"* ]]; then
    ok "a worker started after the checkpoint was regenerated refuses to load it: ${got:0:110}..."
else
    fail "regenerated checkpoint: w1's error is \"$got\"; log: $(tail -2 "$TMP/regen.w1.log")"
fi
# the failed load blocks the cluster with the reason (it stayed `loading` for ever, every
# forward waiting out step_timeout_ms), and a forward is refused at once naming it
st=""
for _ in $(seq 1 200); do
    st=$("$CTL" --coordinator "$ADMIN" -o json status 2>/dev/null | json "d['state'] + ' ' + (d['problem'] or '')")
    [[ "$st" == blocked* ]] && break
    sleep 0.1
done
t0=$(date +%s%N)
"$CTL" --coordinator "$ADMIN" forward --layer 1 --input "$TMP/in.st" --output "$TMP/o.st" \
    >"$TMP/regen.fwd.log" 2>&1
frc=$?
fms=$((($(date +%s%N) - t0) / 1000000))
if [[ "$st" == "blocked "*"could not load"* ]] && [ $frc -eq 1 ] && [ $fms -lt 3000 ] &&
    grep -q "ERR_NOT_READY.*could not load" "$TMP/regen.fwd.log"; then
    ok "the failed load blocks the cluster (${st:0:90}...); a forward is refused in $fms ms"
else
    fail "after w1's failed load: status \"$st\"; forward exit $frc after $fms ms: $(cat "$TMP/regen.fwd.log")"
fi
"$CTL" --coordinator "$ADMIN" shutdown >/dev/null
for p in $cpid $w0 $w1; do wait_exit $p 20; done
"$CTL" mkmodel --out "$M" --expert-dtype fp4 --experts 8 --layers 2 --seed 5 --force >/dev/null

# ---- a worker on another device than the spec's ---------------------------------------------------
write_spec "$TMP/dev.yaml" "$M" 2 "$(admin_ep)" cuda:0
"$COORD" --cluster "$TMP/dev.yaml" >"$TMP/dev.coord.log" 2>&1 &
cpid=$!
PIDS+=($cpid)
"$WORKER" --coordinator "$LISTEN" --name w1 --threads 1 >"$TMP/dev.w1.log" 2>&1 &
w1=$!
wait_exit $w1 20
rc=$?
if [ $rc -eq 78 ] && grep -q 'ERR_REFUSED' "$TMP/dev.w1.log" &&
    grep -q 'assigns "cuda:0"' "$TMP/dev.w1.log"; then
    ok "a cpu worker named for a cuda:0 slot exits 78 (ERR_REFUSED, naming the spec line)"
else
    fail "device refusal: exit $rc: $(tail -2 "$TMP/dev.w1.log")"
fi
# a device no host has (cuda:255): refused by the worker itself, before it registers
"$WORKER" --coordinator "$LISTEN" --name w1 --threads 1 --device cuda:255 >"$TMP/dev255.log" 2>&1 &
w1=$!
wait_exit $w1 20
rc=$?
if [ $rc -eq 78 ] && grep -q 'cuda:255' "$TMP/dev255.log"; then
    ok "a worker on a device it cannot serve exits 78: $(grep -m1 'cuda:255' "$TMP/dev255.log" | cut -c1-100)..."
else
    fail "unservable device: exit $rc: $(tail -2 "$TMP/dev255.log")"
fi
"$CTL" --coordinator "$ADMIN" shutdown >/dev/null
wait_exit $cpid 20
"$COORD" --cluster "$TMP/dev.yaml" --check >"$TMP/check.out" 2>&1
rc=$?
if [ "$HAVE_CUDA" = 1 ]; then
    [ $rc -eq 0 ] || fail "--check of a cuda:0 spec in a CUDA build: exit $rc"
elif [ $rc -eq 78 ] && grep -q "has no CUDA backend" "$TMP/check.out"; then
    ok "--check refuses cuda:0 in a build without CUDA"
else
    fail "--check of cuda:0 without CUDA: exit $rc: $(cat "$TMP/check.out")"
fi

# ---- --check: an open admin endpoint needs security: ----------------------------------------------
write_spec "$TMP/open.yaml" "$M" 2 "tcp://0.0.0.0:7401"
"$COORD" --cluster "$TMP/open.yaml" --check >"$TMP/check.out" 2>&1
rc=$?
if [ $rc -eq 78 ] && grep -q 'coordinator.admin: "tcp://0.0.0.0:7401" can be reached from other hosts' "$TMP/check.out"; then
    ok "--check refuses an admin endpoint other hosts reach without security: (exit 78)"
else
    fail "--check of an open admin endpoint: exit $rc: $(cat "$TMP/check.out")"
fi

# ---- security: ----------------------------------------------------------------------------------
# w0 and w1 in workers/, op1 in operators/, stranger in no list; EPMOE_KEY is op1's from here on
KEYS=$TMP/keys
cluster_keys op1 stranger w0 w1
K=$KEYS
SEC="security: {coordinator_key: $K/coordinator.key, worker_keys: $K/workers, operator_keys: $K/operators}"
write_spec "$TMP/sec.yaml" "$M" 2 "tcp://*:$(free_ports 1)" cpu "$SEC"
ADMIN_BIND=$ADMIN
ADMIN="tcp://127.0.0.1:${ADMIN_BIND##*:}"
SEC_METRICS=127.0.0.1:$(free_ports 1)
sed -i "s|liveness: 10}|liveness: 10, metrics: \"$SEC_METRICS\"}|" "$TMP/sec.yaml"
chmod 644 "$K/coordinator.key"
"$COORD" --cluster "$TMP/sec.yaml" --check >"$TMP/check.out" 2>&1
rc=$?
if [ $rc -eq 78 ] && grep -q "security.coordinator_key" "$TMP/check.out" && grep -q "chmod 600" "$TMP/check.out"; then
    ok "--check refuses a coordinator key others may read"
else
    fail "--check with a 0644 key: exit $rc: $(cat "$TMP/check.out")"
fi
chmod 600 "$K/coordinator.key"
"$COORD" --cluster "$TMP/sec.yaml" --check >"$TMP/check.out" 2>&1 ||
    fail "--check of the secure spec: $(cat "$TMP/check.out")"
"$COORD" --cluster "$TMP/sec.yaml" >"$TMP/sec.coord.log" 2>&1 &
cpid=$!
PIDS+=($cpid)
ckey=(--coordinator-key "$K/coordinator.pub")
"$WORKER" --coordinator "$LISTEN" --name w0 --threads 1 --key "$K/w0.key" "${ckey[@]}" >"$TMP/sec.w0.log" 2>&1 &
w0=$!
PIDS+=($w0)
# w1's slot: first a stranger's key, then w0's key claiming w1, then w1's own
"$WORKER" --coordinator "$LISTEN" --name w1 --threads 1 --key "$K/stranger.key" "${ckey[@]}" >"$TMP/sec.s.log" 2>&1 &
p=$!
wait_exit $p 20
rc=$?
[ $rc -eq 78 ] && grep -q "refused this process's key" "$TMP/sec.s.log" ||
    fail "a worker with an unlisted key: exit $rc: $(tail -2 "$TMP/sec.s.log")"
grep -q "auth: refused a connection from 127.0.0.1 to epmoe-workers" "$TMP/sec.coord.log" ||
    fail "the coordinator did not log the refused worker's address"
"$WORKER" --coordinator "$LISTEN" --name w1 --threads 1 --key "$K/w0.key" "${ckey[@]}" >"$TMP/sec.w0as1.log" 2>&1 &
p=$!
wait_exit $p 20
rc=$?
[ $rc -eq 78 ] && grep -q "ERR_REFUSED" "$TMP/sec.w0as1.log" &&
    grep -q "key is worker w0's" "$TMP/sec.w0as1.log" ||
    fail "w0's key registering as w1: exit $rc: $(tail -2 "$TMP/sec.w0as1.log")"
"$WORKER" --coordinator "$LISTEN" --name w1 --threads 1 --key "$K/w1.key" "${ckey[@]}" >"$TMP/sec.w1.log" 2>&1 &
w1=$!
PIDS+=($w1)
EPMOE_KEY=$K/op1.key ready || fail "secure: not ready: $(cat "$TMP/st")"
EPMOE_KEY=$K/op1.key forward_ok "secure" "$M" && ok "secure cluster: a forward bit-identical to --local"
EPMOE_KEY=$K/stranger.key timeout 60 "$CTL" --coordinator "$ADMIN" --timeout 5000 shutdown >"$TMP/op.log" 2>&1
rc=$?
[ $rc -eq 77 ] && grep -q "refused this process's key" "$TMP/op.log" ||
    fail "an operator with an unlisted key: exit $rc: $(cat "$TMP/op.log")"
EPMOE_KEY= EPMOE_SERVER_KEY= timeout 60 "$CTL" --coordinator "$ADMIN" --timeout 5000 shutdown >"$TMP/op.log" 2>&1
rc=$?
[ $rc -eq 77 ] && grep -qE "disagree on security|one side may use security: \(CURVE\)" "$TMP/op.log" ||
    fail "an operator without a key: exit $rc: $(cat "$TMP/op.log")"
kill -0 $cpid 2>/dev/null || fail "the refused SHUTDOWNs stopped the coordinator"
# a stranger at a worker's data endpoint: the handshake is refused and logged
DATA0=$(grep -o 'name: w0, device: cpu, data: "[^"]*' "$TMP/sec.yaml" | sed 's/.*data: "//')
z() { sed -n "s/.*$1 = \"\(.*\)\"/\1/p" "$2"; }
POKE_PUBLIC=$(z public-key "$K/stranger.key") POKE_SECRET=$(z secret-key "$K/stranger.key") \
    POKE_SERVER=$(z public-key "$K/w0.pub") timeout 30 "$POKE" "$DATA0" push garbage >/dev/null
wait_grep 10 "$TMP/sec.w0.log" "auth: refused a connection from 127\.0\.0\.1 to epmoe-data" ||
    fail "w0 did not refuse (and log) a stranger at its data endpoint"
# handshakes refused before ZAP sees a key: a client without CURVE, one holding another server
# key, a stream that is not ZeroMQ. Each is logged with the peer's address and port and the
# reason, and counted in epmoe_handshakes_refused_total{domain,reason} (they left no trace)
timeout 30 "$POKE" "$LISTEN" dealer garbage >/dev/null
POKE_PUBLIC=$(z public-key "$K/op1.key") POKE_SECRET=$(z secret-key "$K/op1.key") \
    POKE_SERVER=$(z public-key "$K/w0.pub") timeout 30 "$POKE" "$ADMIN" dealer garbage >/dev/null
"$PY" - "${ADMIN##*:}" <<'PY'
import os, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
time.sleep(0.3)  # an accepted connection that then sends what no ZeroMQ peer sends
s.sendall(b"\x16\x03\x01" + os.urandom(61))
s.settimeout(5)
try:
    s.recv(100)
except OSError:
    pass
PY
# (a client without CURVE may see the mismatch first and hang up: then the handshake broke off)
refused0=$fails
for want in "epmoe-workers: (it does not speak CURVE|its handshake broke off)" \
    "epmoe-operators: its CURVE handshake does not decrypt" \
    "epmoe-operators: the connection ended in its handshake"; do
    wait_grep 10 "$TMP/sec.coord.log" "auth: refused a connection from 127\.0\.0\.1:[0-9]+ to $want" ||
        fail "no refusal logged with the peer's address: \"$want\""
done
if "$PY" "$(dirname "$0")/check_metrics.py" "http://$SEC_METRICS/metrics" "$TMP/sec.metrics.json" \
    epmoe_handshakes_refused_total >/dev/null; then
    got=$(json_get "$TMP/sec.metrics.json" "' '.join('%s=%d' % (k.replace('domain=epmoe-', '').replace(',reason=', '/'), v) for k, v in sorted(d['epmoe_handshakes_refused_total'].items()))")
    for want in workers/key "workers/(mechanism|protocol)" operators/crypto operators/protocol; do
        [[ " $got " =~ \ $want=[1-9] ]] || fail "epmoe_handshakes_refused_total{$want} did not count: $got"
    done
    [ $fails -eq $refused0 ] && ok "refused handshakes logged with address and reason, and counted: $got"
else
    fail "the secure coordinator's metrics: $("$PY" "$(dirname "$0")/check_metrics.py" "http://$SEC_METRICS/metrics" "$TMP/x.json")"
fi
EPMOE_KEY=$K/op1.key forward_ok "secure, after the strangers" "$M" &&
    ok "with security: unlisted worker and operator keys, a key speaking for another worker and a stranger on the data plane are refused"
EPMOE_KEY=$K/op1.key "$CTL" --coordinator "$ADMIN" shutdown >/dev/null
for p in $cpid $w0 $w1; do wait_exit $p 20 || fail "secure: a daemon exited $? after shutdown"; done

if [ $fails -ne 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "all ok"
