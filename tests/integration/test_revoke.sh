#!/usr/bin/env bash
# test_revoke.sh — revoking a client key reaches the workers (issue 26, defect 5), with real
# CURVE keys (epmoectl keygen) and real daemons.
#
# A secure cluster with security.client_keys holding engine1.pub and engine2.pub; two
# long-lived libepmoe clients (serve_load), one per key, keep requests in flight. Then
# engine2.pub is removed and `epmoectl reload`:
#   - engine2's open connections are served no more: its next requests are refused
#     (ERR_REFUSED, "no longer admitted") within a few seconds and the connection is then
#     closed by the worker (they were served until the
#     workers restarted: the allow-list reached them only in WELCOME, and a keys-only reload
#     welcomed nobody);
#   - a new connection with engine2's key to a worker's client endpoint is refused by its ZAP
#     handler (logged with the address);
#   - engine1's client never notices: 0 failed, every answer bit-identical to forward --local.
# And, independently: with client_keys, an operator's key is no client: a worker's client
# endpoint refuses its handshake (it was admitted there too).
# Putting engine2.pub back and reloading admits it again.
#
#   test_revoke.sh CTL_DIR COORDINATOR WORKER ZMQ_POKE SERVE_LOAD
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
POKE=$4
LOAD=$5
TMP=$(mktemp -d /tmp/epmoe_revoke_XXXXXX)
PIDS=()
fails=0
# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

"$CTL" mkmodel --out "$TMP/m" --expert-dtype fp8 --experts 8 --layers 2 --seed 4 >/dev/null ||
    { echo "FAIL: mkmodel"; exit 1; }
"$CTL" mkinput --model "$TMP/m" --tokens 8 --seed 2 --out "$TMP/in.st" >/dev/null ||
    { echo "FAIL: mkinput"; exit 1; }
REF=$(local_ref "$TMP/m" 1 "$TMP/in.st")

KEYS=$TMP/keys
cluster_keys op1 w0 w1
mkdir -p "$KEYS/clients"
for k in engine1 engine2; do
    "$CTL" keygen --out "$KEYS" --name $k >/dev/null || { echo "FAIL: keygen $k"; exit 1; }
    cp "$KEYS/$k.pub" "$KEYS/clients/"
done
z() { sed -n "s/.*$1 = \"\(.*\)\"/\1/p" "$2"; }

# poke_client KEY W: a CURVE handshake with KEY at worker W's client endpoint; whether W's log
# shows it refused within 5 s (the count of refusals grew)
poke_refused() {
    local key=$1 w=$2 log=$TMP/rev.$2.log n0
    local ep
    ep=$(sed -n 's/.*client endpoint \(tcp:[^ ]*\).*/\1/p' "$log" | tail -1)
    n0=$(grep -c "refused a connection from 127.0.0.1 to epmoe-clients" "$log")
    POKE_PUBLIC=$(z public-key "$KEYS/$key.key") POKE_SECRET=$(z secret-key "$KEYS/$key.key") \
        POKE_SERVER=$(z public-key "$KEYS/$w.pub") timeout 30 "$POKE" "$ep" dealer garbage >/dev/null
    local n=0
    while [ $n -lt 50 ]; do
        [ "$(grep -c "refused a connection from 127.0.0.1 to epmoe-clients" "$log")" -gt "$n0" ] && return 0
        sleep 0.1
        n=$((n + 1))
    done
    return 1
}

# load_start KEY: serve_load with that client key until $TMP/KEY.stop
load_start() {
    EPMOE_KEY=$KEYS/$1.key EPMOE_SERVER_KEY=$KEYS/coordinator.pub \
        "$LOAD" "$ADMIN" 1 "$TMP/in.st" "$TMP/$1.out.st" 2 "$TMP/$1.stop" 10000 >"$TMP/$1.load" 2>&1 &
    LOADS[$1]=$!
    PIDS+=($!)
}
declare -A LOADS

export SECURE=1 CL_CLIENT_KEYS=$KEYS/clients
if start_cluster rev "$TMP/m" 2 fp8; then
    load_start engine1
    load_start engine2
    sleep 2
    # an operator's key is no client where client_keys lists the clients
    poke_refused op1 w0 || fail "w0's client endpoint admitted the operator's key"
    poke_refused engine2 w1 && fail "w1's client endpoint refused engine2 while it was listed"

    rm "$KEYS/clients/engine2.pub"
    "$CTL" --coordinator "$ADMIN" reload >"$TMP/reload.out" 2>&1 ||
        fail "reload: $(cat "$TMP/reload.out")"
    wait_grep 10 "$TMP/engine2.load" "no longer admitted" ||
        fail "engine2's open connections are still served 10 s after the reload that revoked it"
    # and closed, not only refused: the entry shuts the connection down after its refusal
    closed=0
    for _ in $(seq 100); do
        if grep -q "closed a connection whose key a reload revoked" "$TMP"/rev.w*.log; then
            closed=1
            break
        fi
        sleep 0.1
    done
    [ $closed = 1 ] || fail "engine2's connection was refused but left open 10 s after the reload"
    poke_refused engine2 w1 || fail "w1's client endpoint admits a new connection with the revoked key"
    EPMOE_KEY=$KEYS/engine2.key "$CTL" --coordinator "$ADMIN" forward --layer 1 \
        --input "$TMP/in.st" --output "$TMP/e2.st" >"$TMP/e2.fwd" 2>&1 &&
        fail "epmoectl forward with the revoked key was served"

    touch "$TMP/engine2.stop"
    wait "${LOADS[engine2]}"
    grep -q "^serve_load: [1-9][0-9]* ok" "$TMP/engine2.load" ||
        fail "engine2 was never served before its revocation: $(tail -1 "$TMP/engine2.load")"
    grep "failed:" "$TMP/engine2.load" | head -1

    # listed again: admitted again
    cp "$KEYS/engine2.pub" "$KEYS/clients/"
    "$CTL" --coordinator "$ADMIN" reload >"$TMP/reload.out" 2>&1 ||
        fail "reload: $(cat "$TMP/reload.out")"
    EPMOE_KEY=$KEYS/engine2.key "$CTL" --coordinator "$ADMIN" forward --layer 1 \
        --input "$TMP/in.st" --output "$TMP/e2.st" >"$TMP/e2.fwd" 2>&1 ||
        fail "engine2, listed again, is refused: $(cat "$TMP/e2.fwd")"
    cmp -s "$TMP/e2.st" "$REF" || fail "engine2's forward differs from forward --local"

    touch "$TMP/engine1.stop"
    wait "${LOADS[engine1]}" || fail "engine1's client saw failed or wrong requests: $(tail -3 "$TMP/engine1.load")"
    cmp -s "$TMP/engine1.out.st" "$REF" || fail "engine1's answers differ from forward --local"
    tail -1 "$TMP/engine1.load"
    [ $fails -eq 0 ] && ok "a revoked client key is served no more (open connections and new ones), the others serve on"
    stop_cluster rev
fi

if [ $fails -ne 0 ]; then
    echo "$fails failure(s)"
    for f in "$TMP"/rev.*.log "$TMP"/*.load; do echo "== $f"; tail -n 6 "$f"; done
    exit 1
fi
echo "all ok"
