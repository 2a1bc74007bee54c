#!/usr/bin/env bash
# test_serve.sh — the serving path at the wire (docs/protocol.md "Serving path"): a real
# coordinator and 4 real workers on tcp loopback; clients submit layer calls straight to the
# workers' client endpoints (serve_poke speaks SUBMIT/RESULT itself, no libepmoe), and the
# coordinator sees no token.
#
# Proves, for both expert dtypes and every layer (hash, score, MTP): each entry worker answers
# bit-identically to `forward --local`; 3 client processes at different entries with 4 requests
# in flight each all get the same right answer (their requests run concurrently and batch at
# the experts); malformed requests (unknown layer, 0 tokens, more than EP_MAX_TOKENS, a hash
# layer without ids, a wrong config hash, a NaN) get explicit errors and the cluster goes on
# answering right; strangers that announce big frames at a client endpoint are refused above
# the model's bound and dropped when they stall mid-frame (client_slowloris.py);
# the entry counts the malformed requests by layer kind and code, and one client flooding an
# entry past its limit (with a resend) is counted as busy refusals, a resend and requests by result
# (its /metrics, issue 23); while 8 requests run, its in-flight and credit gauges show them.
#
# Then the same through libepmoe (serve_lib): 3 client processes x 4 requests in flight on
# every layer, each answer bit-identical to forward --local. A worker drained while 3000
# requests run, then undrained, answers its first requests back at once (as entry and as owner).
#
#   test_serve.sh CTL_DIR COORDINATOR WORKER SERVE_POKE SERVE_LIB
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
SPOKE=$4
SLIB=$5
TMP=$(mktemp -d /tmp/epmoe_serve_XXXXXX)
PIDS=()
fails=0

# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

# client_endpoint NAME R: the endpoint worker wR of cluster NAME bound (its log says)
client_endpoint() {
    local i
    for i in $(seq 100); do
        local ep
        ep=$(sed -n 's/.*client endpoint \(tcp:[^ ]*\).*/\1/p' "$TMP/$1.w$2.log" | tail -1)
        [ -n "$ep" ] && { echo "$ep"; return; }
        sleep 0.1
    done
}

for dt in fp4 fp8; do
    "$CTL" mkmodel --out "$TMP/$dt" --expert-dtype "$dt" --experts 12 --layers 2 --hash-layers 1 \
        --mtp 1 --seed 7 >/dev/null || { fail "mkmodel $dt"; exit 1; }
done
for t in 1 7 64; do
    "$CTL" mkinput --model "$TMP/fp4" --tokens "$t" --seed "$t" --out "$TMP/in_$t.st" >/dev/null ||
        fail "mkinput $t"
done

# wm R SERIES...: the values of series (name{labels} as exposed) on worker wR's /metrics, 0 when
# absent, one line each
wm() {
    local r=$1
    shift
    curl -s "http://${METRICS[$r]}/metrics" >"$TMP/wm.txt"
    for k in "$@"; do awk -v k="$k" '$1 == k { v = $2 } END { print v + 0 }' "$TMP/wm.txt"; done
}
# wm_wait R WANT SERIES...: wait (2 s at most) until wm R SERIES... prints WANT (the worker counts
# an answer just after sending it); the last values in $wm_got
wm_wait() {
    local r=$1 want=$2
    shift 2
    for _ in $(seq 20); do
        wm_got=$(wm "$r" "$@" | tr '\n' ' ')
        [ "$wm_got" = "$want" ] && return 0
        sleep 0.1
    done
    return 1
}
REQ='epmoe_worker_requests_total{kind="%s",result="%s",code="%s"}'
# the entry's counters of the malformed requests below: routed ERR_BAD_REQUEST (zero, many, nan),
# unknown ERR_BAD_REQUEST (layer), hash ERR_BAD_REQUEST (noids), routed ERR_CONFIG_HASH (hash)
# shellcheck disable=SC2059
BADS=("$(printf "$REQ" routed failed ERR_BAD_REQUEST)" "$(printf "$REQ" unknown failed ERR_BAD_REQUEST)"
    "$(printf "$REQ" hash failed ERR_BAD_REQUEST)" "$(printf "$REQ" routed failed ERR_CONFIG_HASH)")

# payload_bytes SOCKET: the coordinator's epmoe_coordinator_payload_bytes_total{socket}
payload_bytes() {
    curl -s "http://$CMETRICS/metrics" |
        sed -n "s/^epmoe_coordinator_payload_bytes_total{socket=\"$1\"} \([0-9.e+]*\)$/\1/p"
}

for dt in fp4 fp8; do
    name=serve_$dt
    read -r mport <<<"$(free_ports 1)"
    CMETRICS=127.0.0.1:$mport
    start_cluster "$name" "$TMP/$dt" 4 fp8 "placement: contiguous" "metrics: \"$CMETRICS\"" 1 || continue
    a0=$(payload_bytes admin)
    w0=$(payload_bytes workers)
    EP=()
    for r in 0 1 2 3; do EP+=("$(client_endpoint "$name" "$r")"); done
    [ -n "${EP[3]}" ] || { fail "$name: no client endpoint in the worker logs"; continue; }
    bad=0
    # every layer (0: hash, 1: score, 2: mtp.0) and token count, each through another entry
    for layer in 0 1 2; do
        lname=$layer
        [ "$layer" = 2 ] && lname=mtp.0
        for t in 1 7 64; do
            ref=$(local_ref "$TMP/$dt" "$lname" "$TMP/in_$t.st")
            r=$(((layer + t) % 4))
            out=$TMP/$name.$layer.$t.st
            if ! "$SPOKE" "${EP[$r]}" "$TMP/$dt" "$layer" "$TMP/in_$t.st" "$out" 2 4 \
                >"$TMP/$name.poke.log" 2>&1; then
                fail "$name: layer $lname T=$t at w$r: $(cat "$TMP/$name.poke.log")"
                bad=$((bad + 1))
            elif ! cmp -s "$out" "$ref"; then
                fail "$name: layer $lname T=$t at w$r differs from forward --local"
                bad=$((bad + 1))
            fi
        done
    done
    [ $bad -eq 0 ] && ok "$name: every layer x T in {1, 7, 64} at every entry is bit-identical to forward --local"
    # 3 client processes, 4 requests in flight each, 16 requests each, at three entries
    ref=$(local_ref "$TMP/$dt" 1 "$TMP/in_7.st")
    cpids=()
    for c in 0 1 2; do
        "$SPOKE" "${EP[$c]}" "$TMP/$dt" 1 "$TMP/in_7.st" "$TMP/$name.c$c.st" 4 16 \
            >"$TMP/$name.c$c.log" 2>&1 &
        cpids+=($!)
    done
    bad=0
    for c in 0 1 2; do
        if ! wait "${cpids[$c]}"; then
            fail "$name: client $c: $(cat "$TMP/$name.c$c.log")"
            bad=1
        elif ! cmp -s "$TMP/$name.c$c.st" "$ref"; then
            fail "$name: client $c differs from forward --local"
            bad=1
        fi
    done
    [ $bad -eq 0 ] && ok "$name: 3 clients x 4 in flight x 16 requests, every answer bit-identical"
    # the same through libepmoe: 3 client processes x 4 in flight, every layer
    bad=0
    for lname in 0 1 mtp.0; do
        lref=$(local_ref "$TMP/$dt" "$lname" "$TMP/in_7.st")
        lpids=()
        for c in 0 1 2; do
            "$SLIB" "$ADMIN" "$lname" "$TMP/in_7.st" "$TMP/$name.l$c.st" 4 12 \
                >"$TMP/$name.l$c.log" 2>&1 &
            lpids+=($!)
        done
        for c in 0 1 2; do
            if ! wait "${lpids[$c]}"; then
                fail "$name: libepmoe client $c, layer $lname: $(cat "$TMP/$name.l$c.log")"
                bad=1
            elif ! cmp -s "$TMP/$name.l$c.st" "$lref"; then
                fail "$name: libepmoe client $c, layer $lname differs from forward --local"
                bad=1
            fi
        done
    done
    [ $bad -eq 0 ] && ok "$name: libepmoe, 3 clients x 4 in flight x 12 requests on every layer, bit-identical"
    # the coordinator carried none of those tokens (its payload counter is live: see below)
    a1=$(payload_bytes admin)
    w1=$(payload_bytes workers)
    if [ -n "$a0" ] && [ "$a0" = "$a1" ] && [ "$w0" = "$w1" ] && [ "${a1%.*}" = 0 ] && [ "${w1%.*}" = 0 ]; then
        ok "$name: the coordinator received 0 payload bytes during $((9 * 4 + 48 + 108)) client requests"
    else
        fail "$name: coordinator payload bytes admin $a0 -> $a1, workers $w0 -> $w1 (expected 0)"
    fi
    # malformed requests: an explicit error each, naming what was wrong, counted at the entry by
    # layer kind and code (issue 23)
    read -r -a bad0 <<<"$(wm 1 "${BADS[@]}" | tr '\n' ' ')"
    for kind in layer:ERR_BAD_REQUEST:"does not exist" zero:ERR_BAD_REQUEST:"1..65536" \
        many:ERR_BAD_REQUEST:"tokens" noids:ERR_BAD_REQUEST:"hash-routed" \
        hash:ERR_CONFIG_HASH:"config hash" nan:ERR_BAD_REQUEST:"token"; do
        IFS=: read -r k code text <<<"$kind"
        got=$("$SPOKE" "${EP[1]}" "$TMP/$dt" 1 "$TMP/in_7.st" - bad "$k" 2>&1)
        case $got in
        "$code "*"$text"*) ok "$name: bad request '$k' -> $code" ;;
        *) fail "$name: bad request '$k' got: $got" ;;
        esac
    done
    # strangers announcing big frames at a client endpoint: refused above the model's bound
    # before they are buffered, dropped when they stall mid-frame (the model: H 256)
    if [ "$dt" = fp4 ]; then
        if python3 "$(dirname "$0")/client_slowloris.py" "${EP[2]}" "${CPIDS[3]}" 256 \
            >"$TMP/$name.slowloris.log" 2>&1; then
            ok "$name: client endpoint: $(tr '\n' ';' <"$TMP/$name.slowloris.log")"
        else
            fail "$name: client endpoint slowloris: $(cat "$TMP/$name.slowloris.log")"
        fi
    fi
    want="$((bad0[0] + 3)) $((bad0[1] + 1)) $((bad0[2] + 1)) $((bad0[3] + 1)) "
    wm_wait 1 "$want" "${BADS[@]}" &&
        ok "$name: the malformed requests counted at their entry by kind and code (routed/unknown/hash ERR_BAD_REQUEST +3/+1/+1, ERR_CONFIG_HASH +1)" ||
        fail "$name: epmoe_worker_requests_total of the malformed requests at w1: $wm_got (want $want)"
    # one client past its limit of requests in flight at an entry, one request resent while in
    # flight: the entry's busy refusals, resends and requests by result match what the client got
    # shellcheck disable=SC2059
    FLOOD=('epmoe_worker_busy_refusals_total{limit="client"}' 'epmoe_worker_resends_total'
        "$(printf "$REQ" routed ok ERR_NONE)" "$(printf "$REQ" routed failed ERR_BUSY)")
    read -r -a f0 <<<"$(wm 1 "${FLOOD[@]}" | tr '\n' ' ')"
    got=$("$SPOKE" "${EP[1]}" "$TMP/$dt" 1 "$TMP/in_64.st" - flood 200 2>&1)
    read -r _ n_ok _ n_busy _ _ <<<"$got"
    want="$((f0[0] + ${n_busy:-0})) $((f0[1] + 1)) $((f0[2] + ${n_ok:-0})) $((f0[3] + ${n_busy:-0})) "
    if [[ "$got" != ok* ]] || [ "${n_busy:-0}" -lt 1 ]; then
        fail "$name: 200 requests from one client at once: $got (want some ERR_BUSY)"
    elif wm_wait 1 "$want" "${FLOOD[@]}"; then
        ok "$name: 200 requests from one client at once ($got): busy refusals{client}, resends (1), requests{ok} and {ERR_BUSY} counted as answered"
    else
        fail "$name: after 200 requests from one client ($got): busy{client}, resends, ok, ERR_BUSY at w1: $wm_got (want $want)"
    fi
    # a worker away for thousands of requests (a maintenance drain) serves its first request
    # back at once, as entry and as owner of experts (no window of ids left behind while it
    # was out; each request is answered in well under its deadline)
    if [ "$dt" = fp4 ]; then
        away_ok=1
        "$CTL" --coordinator "$ADMIN" drain w3 --wait-timeout 30 >"$TMP/$name.drain.log" 2>&1 ||
            { fail "$name: drain w3: $(cat "$TMP/$name.drain.log")"; away_ok=0; }
        # the entry's gauges while they run: requests in flight and DISPATCH credits in use
        # (scraped until the client is done; at rest both are 0, test_metrics.sh)
        "$SPOKE" "${EP[0]}" "$TMP/$dt" 1 "$TMP/in_1.st" "$TMP/$name.away.st" 8 3000 \
            >"$TMP/$name.away.log" 2>&1 &
        spid=$!
        g_run=0 g_cred=0
        while kill -0 $spid 2>/dev/null; do
            read -r run cred <<<"$(wm 0 'epmoe_worker_requests_in_flight{phase="running"}' \
                'epmoe_worker_credits_in_use{kind="dispatch"}' | tr '\n' ' ')"
            [ "${run%.*}" -gt "$g_run" ] && g_run=${run%.*}
            [ "${cred%.*}" -gt "$g_cred" ] && g_cred=${cred%.*}
        done
        wait $spid || { fail "$name: 3000 requests with w3 drained: $(cat "$TMP/$name.away.log")"; away_ok=0; }
        if [ "$g_run" -ge 1 ] && [ "$g_run" -le 8 ] && [ "$g_cred" -ge 1 ]; then
            ok "$name: under 8 requests in flight, w0's gauges showed up to $g_run running and $g_cred DISPATCH credits in use"
        else
            fail "$name: under 8 requests in flight, w0's gauges showed at most $g_run running (want 1..8), $g_cred credits in use (want >= 1)"
        fi
        "$CTL" --coordinator "$ADMIN" undrain w3 >/dev/null 2>&1 || { fail "$name: undrain w3"; away_ok=0; }
        for _ in $(seq 150); do
            "$CTL" --coordinator "$ADMIN" shards 2>/dev/null | grep -qE "^3 +w3 +[1-9]" && break
            sleep 0.2
        done
        "$CTL" --coordinator "$ADMIN" shards 2>/dev/null | grep -qE "^3 +w3 +[1-9]" ||
            { fail "$name: w3 owns no experts 30 s after undrain"; away_ok=0; }
        for r in 3 0; do
            t0=$(date +%s%N)
            "$SPOKE" "${EP[$r]}" "$TMP/$dt" 1 "$TMP/in_7.st" "$TMP/$name.back$r.st" \
                >"$TMP/$name.back$r.log" 2>&1
            rc=$? ms=$((($(date +%s%N) - t0) / 1000000))
            if [ $rc -ne 0 ] || ! cmp -s "$TMP/$name.back$r.st" "$ref" || [ $ms -ge 2000 ]; then
                fail "$name: first request at w$r after w3's drain: rc $rc, $ms ms: $(cat "$TMP/$name.back$r.log")"
                away_ok=0
            fi
        done
        [ $away_ok -eq 1 ] && ok "$name: w3 drained for 3000 requests, undrained: the first requests back (at w3, at w0) answered at once, bit-identical"
    fi
    # the coordinator down for longer than liveness x heartbeat: the workers serve on in their
    # epoch (requests need no coordinator), and register again when it is back
    if [ "$dt" = fp4 ]; then
        kill -9 "${CPIDS[0]}"
        wait "${CPIDS[0]}" 2>/dev/null
        sleep 3 # liveness 10 x heartbeat 200 ms: every worker has noticed
        if "$SPOKE" "${EP[3]}" "$TMP/$dt" 1 "$TMP/in_7.st" "$TMP/$name.down.st" 4 16 \
            >"$TMP/$name.down.log" 2>&1 && cmp -s "$TMP/$name.down.st" "$ref"; then
            ok "$name: with the coordinator down 3 s, 16 requests answered bit-identically"
        else
            fail "$name: with the coordinator down: $(cat "$TMP/$name.down.log")"
        fi
        "$COORD" --cluster "$SPEC" >>"$TMP/$name.coord.log" 2>&1 &
        CPIDS[0]=$!
        PIDS+=($!)
        "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 60 >/dev/null 2>&1 ||
            fail "$name: not ready again after the coordinator came back"
    fi
    out=$TMP/$name.after.st
    if "$SPOKE" "${EP[2]}" "$TMP/$dt" 1 "$TMP/in_7.st" "$out" >/dev/null 2>&1 && cmp -s "$out" "$ref"; then
        ok "$name: after the bad requests the cluster answers bit-identically"
    else
        fail "$name: after the bad requests the answer is wrong or missing"
    fi
    stop_cluster "$name"
    # the answers above were bit-identical with the shared expert batched over requests: say
    # that it was (a worker's exit line counts its shared-expert batches and their requests)
    b=$(grep -ho "shared-expert batches of [0-9.]*" "$TMP/$name".w*.log | awk '$4 > m { m = $4 } END { print m + 0 }')
    if awk -v b="$b" 'BEGIN { exit !(b > 1) }'; then
        ok "$name: the shared expert ran batched over requests (up to $b requests a batch on average at a worker)"
    else
        fail "$name: no worker batched its requests' shared expert (\"$b\"): the bit-identity above did not cover it"
    fi
done

echo "$((fails == 0 ? 1 : 0)) passed, $((fails == 0 ? 0 : 1)) failed"
[ $fails -eq 0 ]
