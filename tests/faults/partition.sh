#!/usr/bin/env bash
# partition.sh — issue 26 defect 3: one worker's data port is cut (TCP 7500 dropped both ways
# on its host, fl_cut_data) for CUT_S seconds (default 20) while three clients keep requests in
# flight; its control connection stays healthy, so only the data plane can tell. The origins
# must find the peer silent within the progress timeout (liveness x heartbeat), report it, and
# the coordinator must take it out of the epoch (a data-plane quarantine), so that:
#
#   - no request is lost or wrong, and every failure is an explicit ERR_WORKER_LOST naming w3
#     (there are no replicas here: a request may wait for the verdict, never for the deadline)
#   - the longest pause with no answer is at most PAUSE_BOUND_MS = 2 x liveness x heartbeat +
#     2 heartbeats + 1 s (suspicion, the verdict a heartbeat later, the survivors loading w3's
#     experts), far below the 20 s the cut lasts
#   - the coordinator logs the verdict about w3 and only about w3
#   - after the cut heals, w3 owns experts again (its quarantine ends) within REJOIN_S
#   - no sanitizer report in the daemons' logs (they stop in order; for the ASan build)
#
# Before the fix nothing completed for the whole cut and the requests were lost. Prints the
# four numbers (fault_numbers.py). Needs root and iproute2 (skips with 77 otherwise).
#
# With REPLICAS (the 5th argument, "replicas"): placement eplb with 8 redundant slots, so every
# expert has a replica on another worker; the origins replay w3's pairs there at once.
#
#   partition.sh CTL_DIR COORDINATOR WORKER [CUT_S [replicas]]
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
CUT_S=${4:-20}
. "$(dirname "$0")/lib.sh"
[ "${5:-}" != replicas ] || FL_SPEC_EXTRA="expert_parallel: {placement: eplb, redundant_experts: 8}"

fl_init
fl_inputs
LIVE_MS=$((FL_HB * FL_LIVENESS))
PAUSE_BOUND_MS=$((2 * LIVE_MS + 2 * FL_HB + 1000))
REJOIN_S=90
fails=0
bad() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

fl_start_coord
for ((r = 0; r < FL_P; r++)); do fl_start_worker "$r"; done
fl_wait_ready 1 60 >/dev/null || { echo "FAIL: the cluster did not become ready"; tail -30 "$TMP"/*.log; exit 1; }
fl_start_clients
sleep 6 # the rate before the cut (fault_numbers.py looks 5 s back)
L0=$(($(wc -l <"$TMP/coord.log") + 1))
t0=$(fl_now)
fl_cut_data 4 || fl_skip "tc cannot drop a port here (htb, pfifo, u32)"
echo "w3's data port cut at +0 ms"
sleep "$CUT_S"
t1=$(fl_now)
fl_heal_data 4
echo "w3's data port back at +$((t1 - t0)) ms"
# w3 owns experts again once its quarantine is over (or at once when it never was quarantined)
end=$(($(fl_now) + REJOIN_S * 1000))
until fl_ctl shards 2>/dev/null | grep -qE "^3 +w3 +[1-9]" || [ "$(fl_now)" -ge "$end" ]; do sleep 0.2; done
fl_ctl shards | grep -qE "^3 +w3 +[1-9]" || bad "w3 owns no experts $REJOIN_S s after the cut healed"
sleep 3
t_end=$(fl_now)
fl_stop_clients

read -r pause back95 reint rate <<<"$(fl_numbers "$t0" "$t1" "$t_end")"
fl_report
echo "partition of w3's data port for ${CUT_S} s: longest pause ${pause} ms (bound" \
    "${PAUSE_BOUND_MS} ms), back to 95 % of ${rate}/s after ${back95} ms, reintegration pause" \
    "${reint} ms"
[ "$LOST" -eq 0 ] || bad "$LOST requests lost"
[ "$WRONG" -eq 0 ] || bad "$WRONG requests wrong"
[ "$OK" -gt 0 ] || bad "no request answered"
n_bad=$(grep -h "^FAIL" "$TMP"/client?.log | grep -vc "ERR_WORKER_LOST.*w3")
[ "$n_bad" -eq 0 ] || bad "$n_bad failures do not name w3: $(grep -h "^FAIL" "$TMP"/client?.log | grep -v "ERR_WORKER_LOST.*w3" | head -2)"
[ "$pause" -le "$PAUSE_BOUND_MS" ] || bad "no answer for $pause ms (bound $PAUSE_BOUND_MS ms)"
v=$(tail -n +"$L0" "$TMP/coord.log" | grep "is dead for the data plane")
echo "$v" | grep -q "worker w3 is dead for the data plane" || bad "no data-plane verdict about w3"
! echo "$v" | grep -v "worker w3 " | grep -q . || bad "a verdict about another worker: $(echo "$v" | grep -v "worker w3 " | head -1)"
for p in "$FL_COORD_PID" "${FL_WPID[@]}"; do kill -0 "$p" 2>/dev/null || bad "process $p died"; done
# stopped in order, so that an ASan build's reports (leaks at exit) reach the logs
for p in "${FL_WPID[@]}" "$FL_COORD_PID"; do kill "$p" 2>/dev/null; done
for ((i = 0; i < 100; i++)); do
    alive=0
    for p in "${FL_WPID[@]}" "$FL_COORD_PID"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" -eq 1 ] || break
    sleep 0.1
done
! grep -l "Sanitizer\|runtime error" "$TMP"/*.log >/dev/null ||
    bad "sanitizer reports in $(grep -l "Sanitizer\|runtime error" "$TMP"/*.log | xargs -n1 basename | tr '\n' ' ')"
if [ "$fails" -ne 0 ]; then
    FL_KEEP=1
    echo "logs kept in $TMP"
    exit 1
fi
echo "partition: ok"
