#!/usr/bin/env bash
# test_outage.sh — a long coordinator outage: the cluster is ready again within a few
# heartbeats of the coordinator's return, and stays ready (issue 17, defect 3).
#
# Two workers, heartbeat_ms 100, liveness 3. The coordinator is killed (-9) and started again
# OUTAGE_S seconds later (20 s: 200 heartbeats; the workers have given up and re-registered
# many times, their backoff has grown to 16 s). The old worker waited out its backoff (up to
# 32 s) before it registered again, and the REGISTER its retired connection still held was
# welcomed and then declared dead 3 heartbeats later. Checks: ready within READY_BOUND_MS of the
# start of the new coordinator (its own start-up included), no worker declared dead after it,
# still ready and bit-identical to --local a second later.
#
#   test_outage.sh CTL_DIR COORDINATOR WORKER [OUTAGE_S]
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
OUTAGE_S=${4:-20}
TMP=$(mktemp -d /tmp/epmoe_outage_XXXXXX)
PIDS=()
fails=0
# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

HB=100
READY_BOUND_MS=2000
export CL_HEARTBEAT_MS=$HB CL_LIVENESS=3

"$CTL" mkmodel --out "$TMP/m" --expert-dtype fp4 --experts 8 --layers 2 --seed 4 >/dev/null ||
    { echo "FAIL: mkmodel"; exit 1; }
"$CTL" mkinput --model "$TMP/m" --tokens 32 --seed 2 --out "$TMP/in.st" >/dev/null ||
    { echo "FAIL: mkinput"; exit 1; }

now_ms() { echo $(($(date +%s%N) / 1000000)); }

if start_cluster out "$TMP/m" 2 fp8; then
    forward_check before "$TMP/m" 1 "$TMP/in.st" || fail "forward before the outage"
    kill -9 "${CPIDS[0]}"
    wait "${CPIDS[0]}" 2>/dev/null
    echo "coordinator down for $OUTAGE_S s ($((OUTAGE_S * 1000 / HB)) heartbeats of $HB ms)"
    sleep "$OUTAGE_S"
    t0=$(now_ms)
    "$COORD" --cluster "$SPEC" >"$TMP/out.coord2.log" 2>&1 &
    CPIDS[0]=$!
    PIDS+=($!)
    if "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 60 >"$TMP/st" 2>&1; then
        ttr=$(($(now_ms) - t0))
        echo "ready $ttr ms ($((ttr / HB)) heartbeats) after the coordinator was started again"
        [ "$ttr" -le $READY_BOUND_MS ] ||
            fail "ready only $ttr ms after the coordinator's return (bound $READY_BOUND_MS ms)"
    else
        fail "not ready within 60 s of the coordinator's return: $(cat "$TMP/st")"
    fi
    sleep 1 # 10 heartbeats: a welcomed registration nobody answers for is declared dead in 3
    if grep -q " is dead" "$TMP/out.coord2.log"; then
        fail "the new coordinator declared a worker dead: $(grep " is dead" "$TMP/out.coord2.log" | head -2)"
    fi
    "$CTL" --coordinator "$ADMIN" status >"$TMP/st2" 2>&1
    grep -q "ready" "$TMP/st2" || fail "not ready 1 s later: $(cat "$TMP/st2")"
    forward_check after "$TMP/m" 1 "$TMP/in.st" || fail "forward after the outage"
    [ $fails -eq 0 ] && ok "after a $OUTAGE_S s outage the cluster is ready in $ttr ms and stays ready"
    stop_cluster out
fi

if [ $fails -ne 0 ]; then
    echo "$fails failure(s)"
    for f in "$TMP"/out.*.log; do echo "== $f"; tail -n 5 "$f"; done
    exit 1
fi
echo "all ok"
