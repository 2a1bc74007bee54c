#!/usr/bin/env bash
# run_faults.sh — the fault-injection suite (docs/operations.md "Failures"): a coordinator and
# four workers, each in its own network namespace (lib.sh), serve three client processes that
# issue forwards continuously and count every request as answered bit-identical to
# `forward --local`, failed with an explicit error, lost (no answer within step_timeout_ms + 5 s)
# or wrong (client.sh). Meanwhile, one after the other:
#
#   kill9_worker      kill -9 a worker mid-step (three clients keep a step in flight nearly all
#                     the time); the survivors serve in a new epoch within
#                     liveness x heartbeat + the time to load the gained experts + 1 s; the
#                     worker restarts and rejoins (rejoin: restore)
#   kill9_entry       kill -9 the entry worker of a fourth client (every request of it prefers
#                     w1): the library sends its requests to another member, none is lost; w1
#                     restarts and rejoins
#   sigstop_worker    SIGSTOP a worker for 2 x liveness x heartbeat, then SIGCONT: declared dead,
#                     its experts move, it registers again and rejoins
#   link_down         ip link set eth0 down on a worker's host for 2 x liveness x heartbeat, then
#                     up: the same
#   partition         w3's data port cut (fl_cut_data) for 10 s, its control connection healthy:
#                     the origins find it silent, the coordinator quarantines it from the data
#                     plane (a new epoch without it); every failure names w3; it owns experts
#                     again after its quarantine
#   drain             drain a worker under load (no step fails), stop it, start it, undrain it
#   kill9_coordinator kill -9 the coordinator and start it again: the workers register again and
#                     keep their shards (no expert is read again)
#   coordinator_outage the coordinator down for 20 s with the clients running (issue 26 defect 1:
#                     the goal is no failed request; placement changes wait for it)
#   coordinator_60s   the coordinator down for 60 s (300 heartbeats; per-request clients paused,
#                     the open clients running): ready
#                     within 10 heartbeats of its return, no worker declared dead afterwards
#   reload_rewelcome  epmoectl reload of a spec whose step_timeout_ms changed (the workers are
#                     welcomed again), and back, three times under load (issue 26 defect 4: the goal is no
#                     failed request)
#   reload_broken     epmoectl reload and SIGHUP with a spec that fails: the old spec serves on,
#                     the error names file:line:column (exit 78)
#   duplicate_name    a second worker process under a live worker's name, from another host: it
#                     is refused (ERR_DUPLICATE), the live worker and the epoch are untouched
#   garbage           malformed ZeroMQ messages and raw bytes to every socket: the cluster serves
#                     on in the same epoch
#
# Each case is bounded in time and says what it checked. For each it reports, from the clients'
# timelines (fault_numbers.py), the numbers fault-tolerant MoE serving is compared by (EEP's):
# the longest pause with no answer, the time until the answer rate is back to 95 % of the rate
# before the fault, and the reintegration pause when the lost process returns; at the end, the
# steady-state rate with the fault tolerance on against a run with it off
# (EPMOE_TEST_NO_FAILOVER=1 on the workers and clients), alternated twice. The goals (issue 26):
# no request failed or lost (checked), and a pause <= liveness x heartbeat + 0.5 s for a worker
# loss, 0.5 s for a coordinator restart (reported: GOALS "slow" when missed, a time on a shared
# machine). A case whose goal another branch is fixing is listed in FL_GOALS_PENDING (its miss
# is reported, not failed; a pending case that meets its goal says so). The suite ends with the table and the
# line "faults survived N/N, requests lost L, wrong W"; it exits 0 only when every case survived
# and L = W = 0. Needs root and iproute2 (skips with 77 otherwise).
#
#
# A new client needs the coordinator: it opens with CLIENT_INFO. The per-request clients
# (client.sh: one `epmoectl forward`, a new libepmoe client, per request) cannot open while the
# coordinator is down. So the cases that kill or stop the coordinator (kill9_coordinator,
# coordinator_outage, coordinator_60s) are judged on three clients that stay open through them
# (serve_load, one per input, OPEN_D requests in flight each, every answer compared bit for bit;
# its timeline gives the numbers); what the per-request clients saw there is reported in the
# row's note and not counted against the suite.
#
#   run_faults.sh CTL_DIR COORDINATOR WORKER ZMQ_POKE SERVE_LOAD
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
POKE=$4
LOAD=$5
. "$(dirname "$0")/lib.sh"

fl_init
fl_inputs
RESULTS=()
SURVIVED=0
N_CASES=0
LIVE_MS=$((FL_HB * FL_LIVENESS))

# Cases whose goals (no failed request; the pause bound) wait for another branch's fix (none now:
# the coordinator cases are judged on the open clients, see the header).
FL_GOALS_PENDING=${FL_GOALS_PENDING-""}
OPEN_D=2              # requests in flight per open client
OPEN=0                # 1 while the open clients run: case_end judges on them
NEW_CLIENT_LOST=0     # per-request clients' lost requests where the open clients judge
# The answers after a case's fault that its numbers need (back95 looks for a 2 s window).
SETTLE_S=3
PENDING_LOST=0 # requests lost in cases whose goals are pending (not counted against the suite)

# One case: case_begin NAME; the fault at fault_at, the lost process back at restore_at; checks
# call bad "why", goals goal "why"; case_end TTR_MS BOUND_MS NOTE
case_begin() {
    CASE=$1
    CASE_OK=1
    CASE_GOAL=met
    CASE_T0=$(fl_now)
    CASE_FAIL0=$(fl_count FAIL)
    CASE_LOST0=$(($(fl_count LOST) + $(fl_count WRONG)))
    CASE_L0=$(fl_count LOST)
    CASE_ALL0=$(fl_count)
    FAULT_AT=$CASE_T0
    RESTORE_AT=-
    echo "---- $CASE"
}
fault_at() { FAULT_AT=$(fl_now); }
restore_at() { RESTORE_AT=$(fl_now); }
bad() {
    echo "  FAIL $CASE: $*"
    CASE_OK=0
}
goal() {
    if [[ " $FL_GOALS_PENDING " == *" $CASE "* ]]; then
        echo "  goal missed by $CASE (pending another branch's fix): $*"
        CASE_GOAL=pending
    else
        bad "goal: $*"
        CASE_GOAL=missed
    fi
}
# case_end TTR BOUND NOTE [PAUSE_GOAL_MS]: the numbers over the case, its goals checked
case_end() {
    sleep "$SETTLE_S"
    local failed=$(($(fl_count FAIL) - CASE_FAIL0)) issued=$(($(fl_count) - CASE_ALL0))
    local lw=$(($(fl_count LOST) + $(fl_count WRONG) - CASE_LOST0)) pause back95 reint rate
    local end note=$3
    end=$(fl_now)
    read -r pause back95 reint rate <<<"$(fl_numbers "$FAULT_AT" "$RESTORE_AT" "$end")"
    if [ "$OPEN" -eq 1 ]; then # judged on the open clients; the per-request ones reported
        note="$note; per-request clients (a new client needs the coordinator to open):"
        note="$note $issued issued, $failed failed, $lw lost/wrong, pause $pause ms"
        NEW_CLIENT_LOST=$((NEW_CLIENT_LOST + $(fl_count LOST) - CASE_L0))
        read -r issued failed lw <<<"$(open_counts "$CASE_T0" "$end")"
        read -r pause back95 reint rate <<<"$(python3 "$(dirname "$0")/fault_numbers.py" \
            "$FAULT_AT" "$RESTORE_AT" "$end" "$TMP"/open?.t)"
        note="open clients: $note"
    fi
    [ "$failed" -eq 0 ] || goal "$failed requests failed"
    if [ "$lw" -ne 0 ]; then
        goal "$lw requests lost or wrong"
        [ "$CASE_GOAL" != pending ] || [ "$OPEN" -eq 1 ] ||
            PENDING_LOST=$((PENDING_LOST + $(fl_count LOST) - CASE_L0))
    fi
    # a time on a shared machine: reported in the table, not failed (the counts above are)
    if [ -n "${4:-}" ] && [ "$pause" -gt "$4" ]; then
        echo "  goal missed by $CASE: no answer for $pause ms (goal <= $4 ms)"
        [ "$CASE_GOAL" != met ] || CASE_GOAL=slow
    fi
    [[ " $FL_GOALS_PENDING " != *" $CASE "* ]] || [ "$CASE_GOAL" != met ] ||
        echo "  $CASE meets its goals: take it out of FL_GOALS_PENDING"
    N_CASES=$((N_CASES + 1))
    [ "$CASE_OK" -eq 1 ] && SURVIVED=$((SURVIVED + 1))
    RESULTS+=("$(printf '%-18s %8s %8s %6d %6d %4d %8s %8s %8s %7s  %s' "$CASE" "$1" "$2" \
        "$issued" "$failed" "$lw" "$pause" "$back95" "$reint" "$CASE_GOAL" \
        "$([ "$CASE_OK" -eq 1 ] && echo ok || echo FAILED): $note")")
    echo "  $CASE: $([ "$CASE_OK" -eq 1 ] && echo survived || echo FAILED) ($(($(fl_now) - CASE_T0)) ms;" \
        "pause $pause ms, back to 95 % of $rate/s after $back95 ms, reintegration pause $reint ms)"
}

# The open clients (see the header): serve_load per input, in the clients' host, its timeline
# in open<i>.t. open_stop judges what they saw at the end: each exits 0 only with every answer
# identical to its first and none failed; the first must equal forward --local.
open_start() {
    rm -f "$TMP/open.stop"
    for i in 0 1 2; do
        ip netns exec "${FL_PFX}h0" "$LOAD" "$ADMIN" "${FL_LAYER[$i]}" "$TMP/in$i.st" \
            "$TMP/open$i.out.st" "$OPEN_D" "$TMP/open.stop" $((FL_STEP_MS + 5000)) \
            "$TMP/open$i.t" >"$TMP/open$i.log" 2>&1 &
        OPEN_PIDS+=($!)
        FL_PIDS+=($!)
    done
    OPEN=1
}
open_stop() {
    touch "$TMP/open.stop"
    local k=0 rc
    for p in "${OPEN_PIDS[@]}"; do
        wait "$p"
        rc=$?
        echo "  open client $k: $(tail -1 "$TMP/open$k.log")"
        [ "$rc" -eq 0 ] || { echo "  FAIL open client $k: exit $rc"; grep -v "^serve_load: pause" "$TMP/open$k.log" | head -5; OPEN_OK=0; }
        cmp -s "$TMP/open$k.out.st" "$TMP/ref$k.st" ||
            { echo "  FAIL open client $k: its answers differ from forward --local"; OPEN_OK=0; }
        k=$((k + 1))
    done
    OPEN_PIDS=()
    OPEN=0
}
OPEN_PIDS=()
OPEN_OK=1
# open_counts FROM TO: "issued failed wrong" in the open clients' timelines over [FROM, TO]
open_counts() {
    cat "$TMP"/open?.t | awk -v a="$1" -v b="$2" '$1 >= a && $1 <= b {n++; f += $2 == "FAIL";
        w += $2 == "WRONG"} END {print n + 0, f + 0, w + 0}'
}

# The epoch the cluster is ready in now (waits up to 30 s for it).
ready_epoch() { fl_wait_ready "${1:-1}" "${2:-30}"; }

# Longest "placement epoch N applied ... X ms after the change began" since line $1 of the log.
apply_ms() {
    tail -n +"$1" "$TMP/coord.log" | sed -n 's/.*applied by its .* members, \([0-9]*\) ms after.*/\1/p' |
        sort -n | tail -1
}

# ---- start ----
fl_start_coord
for ((r = 0; r < FL_P; r++)); do fl_start_worker "$r"; done
E0=$(ready_epoch 1 60) || { echo "FAIL: the cluster did not become ready"; tail -30 "$TMP"/*.log; exit 1; }
fl_start_clients
sleep 6 # the rate before the first fault (fault_numbers.py looks 5 s back)

# A worker goes away (INJECT, a command), stays away (AWAY_MS), comes back (RESTORE); the
# survivors must be ready in a new epoch within liveness x heartbeat + SLACK_MS + the longest
# load of gained experts + 1 s, and the worker must rejoin (rejoin: restore) within REJOIN_S.
# Sets ttr, bound and ep for case_end.
away_and_back() {
    local inject=$1 away_ms=$2 restore=$3 slack_ms=$4 rejoin_s=$5 what=$6
    local l0=$(($(wc -l <"$TMP/coord.log") + 1)) ep0 t0 left
    ep0=$(fl_state | cut -d' ' -f2)
    t0=$(fl_now)
    FAULT_AT=$t0
    eval "$inject"
    ttr=-; bound=-
    if ep=$(ready_epoch $((ep0 + 1)) 30); then
        ttr=$(($(fl_now) - t0))
        load=$(apply_ms "$l0")
        bound=$((LIVE_MS + slack_ms + ${load:-0} + 1000))
        [ "$ttr" -le "$bound" ] || bad "ready in epoch $ep after $ttr ms, more than $bound ms"
    else
        bad "not ready in a new epoch within 30 s while $what"
    fi
    left=$((away_ms - ($(fl_now) - t0)))
    [ "$left" -gt 0 ] && sleep "$(awk "BEGIN{print $left/1000}")"
    restore_at
    eval "$restore"
    ready_epoch $((ep0 + 2)) "$rejoin_s" >/dev/null || bad "no rejoin within $rejoin_s s after $what"
}

# kill -9 a worker while the clients run (its connection is gone: noticed at the next
# heartbeat, within liveness x heartbeat); then start it again
case_begin kill9_worker
away_and_back 'kill -9 "${FL_WPID[2]}"' 0 'fl_start_worker 2' 0 30 "w2 was killed"
# 8 experts over 3 survivors: two gain one expert each, keeping the two they had
gained=$(grep -c "is ready in epoch ${ep:-0} (.*, 3 experts, 2 kept" "$TMP/coord.log")
[ "$gained" -eq 2 ] || bad "$gained survivors kept 2 and gained 1 expert in epoch ${ep:-?}, expected 2"
fl_ctl shards | grep -qE "^2 +w2 +2 +4-5" || bad "rejoin restore did not give w2 experts 4-5 back"
case_end "$ttr" "$bound" "the survivors served in epoch ${ep:-?}, w2 rejoined" $((LIVE_MS + 500))

# kill -9 the entry worker of a client: its requests in flight are sent to another member by
# libepmoe (the entry's own requests die with it; the experts it owned move as above)
case_begin kill9_entry
rm -f "$TMP/stop4"
ip netns exec "${FL_PFX}h0" bash "$(dirname "$0")/client.sh" "$CTL" "$ADMIN" "${FL_LAYER[1]}" \
    "$TMP/in1.st" "$TMP/ref1.st" "$FL_STEP_MS" "$TMP/client3.log" "$TMP/stop4" w1 &
ENTRY_CLIENT=$!
FL_PIDS+=($!)
sleep 1
ok3=$(grep -c "^OK" "$TMP/client3.log")
[ "$ok3" -gt 0 ] || bad "the client at entry w1 got no answer before the kill"
away_and_back 'kill -9 "${FL_WPID[1]}"' 0 'fl_start_worker 1' 0 30 "w1 (an entry) was killed"
sleep 1
touch "$TMP/stop4"
wait "$ENTRY_CLIENT" 2>/dev/null
after=$(($(grep -c "^OK" "$TMP/client3.log") - ok3))
[ "$after" -gt 0 ] || bad "the client at entry w1 got no answer after the kill"
case_end "$ttr" "$bound" "w1's client went on at another entry ($after answered after the kill)" \
    $((LIVE_MS + 500))

# SIGSTOP a worker for 2 x liveness, then SIGCONT (silence is noticed at a heartbeat tick)
case_begin sigstop_worker
away_and_back 'kill -STOP "${FL_WPID[1]}"' $((2 * LIVE_MS)) 'kill -CONT "${FL_WPID[1]}"' "$FL_HB" 40 \
    "w1 was stopped"
case_end "$ttr" "$bound" "declared dead, experts moved; after SIGCONT it registered again" \
    $((LIVE_MS + 500))

# cut a worker's link for 2 x liveness, then restore it
case_begin link_down
away_and_back 'ip -n "${FL_PFX}h4" link set eth0 down' $((2 * LIVE_MS)) \
    'ip -n "${FL_PFX}h4" link set eth0 up' "$FL_HB" 60 "w3's link was down"
case_end "$ttr" "$bound" "link down: dead, experts moved; link up: w3 registered again" \
    $((LIVE_MS + 500))

# cut w3's data port for 10 s, its control connection healthy: quarantined from the data plane
# (a new epoch without it) within a progress timeout and a heartbeat; back after its quarantine
case_begin partition
fails_naming_w3() { cat "$TMP"/client?.log | grep "^FAIL" | grep -c "ERR_WORKER_LOST.*w3"; }
W3F0=$(fails_naming_w3)
L0=$(($(wc -l <"$TMP/coord.log") + 1))
ep0=$(fl_state | cut -d' ' -f2)
fault_at
fl_cut_data 4 || bad "tc cannot drop the data port here"
ttr=-
if ep=$(ready_epoch $((ep0 + 1)) 30); then ttr=$(($(fl_now) - FAULT_AT)); else bad "no new epoch within 30 s of the cut"; fi
left=$((10000 - ($(fl_now) - FAULT_AT)))
[ "$left" -gt 0 ] && sleep "$(awk "BEGIN{print $left/1000}")"
restore_at
fl_heal_data 4
end=$(($(fl_now) + 60000))
until fl_ctl shards 2>/dev/null | grep -qE "^3 +w3 +[1-9]" || [ "$(fl_now)" -ge "$end" ]; do sleep 0.2; done
fl_ctl shards | grep -qE "^3 +w3 +[1-9]" || bad "w3 owns no experts 60 s after the cut healed"
tail -n +"$L0" "$TMP/coord.log" | grep -q "worker w3 is dead for the data plane" || bad "no data-plane verdict about w3"
! tail -n +"$L0" "$TMP/coord.log" | grep "is dead for the data plane" | grep -vq "worker w3 " ||
    bad "a data-plane verdict about another worker"
n=$(($(fl_count FAIL) - CASE_FAIL0 - ($(fails_naming_w3) - W3F0)))
[ "$n" -eq 0 ] || bad "$n failures do not name w3 (ERR_WORKER_LOST)"
case_end "$ttr" "-" "w3 quarantined from the data plane in epoch ${ep:-?}, back after the cut" \
    $((2 * LIVE_MS + 2 * FL_HB + 1000))

# drain under load: no step may fail while the worker leaves
case_begin drain
ep0=$(fl_state | cut -d' ' -f2)
t0=$(fl_now)
fl_ctl drain w0 --wait-timeout 30 >"$TMP/drain.out" 2>&1 || bad "drain: $(cat "$TMP/drain.out")"
ttr=$(($(fl_now) - t0))
fl_ctl shards | grep -qE "^0 +w0 +0( |$)" || bad "w0 still owns experts after the drain"
kill "${FL_WPID[0]}"
sleep $((2 * LIVE_MS / 1000 + 1))
read -r st ep <<<"$(fl_state)"
[ "$st" = ready ] && [ "$ep" -eq $((ep0 + 1)) ] || bad "stopping the drained w0: cluster $st in epoch $ep"
failed=$(($(fl_count FAIL) - CASE_FAIL0))
[ "$failed" -eq 0 ] || bad "$failed requests failed during the drain"
fl_start_worker 0
fl_ctl undrain w0 >/dev/null || bad "undrain"
ready_epoch $((ep0 + 2)) 30 >/dev/null || bad "w0 did not own experts again after undrain"
case_end "$ttr" "-" "drained under load ($failed failed), stopped, started, undrained"

# kill -9 the coordinator and start it again: workers keep their shards. From here through
# coordinator_60s, the open clients judge (see the header); 6 s of them before the first fault
# (fault_numbers.py's rate looks 5 s back)
open_start
sleep 6
case_begin kill9_coordinator
ready_epoch 1 30 >/dev/null
fl_ctl shards | grep -qE "^0 +w0 +2 +0-1" || bad "the placement is not the spec's before the restart"
L0=$(($(wc -l <"$TMP/coord.log") + 1))
ep0=$(fl_state | cut -d' ' -f2)
t0=$(fl_now)
FAULT_AT=$t0
kill -9 "$FL_COORD_PID"
wait "$FL_COORD_PID" 2>/dev/null # gone, and its sockets with it, as before a service restart
restore_at
fl_start_coord
ttr=-
# epochs keep increasing across the restart (the new coordinator starts at its start time)
if ep1=$(ready_epoch $((ep0 + 1)) 60); then
    ttr=$(($(fl_now) - t0))
    kept=$(tail -n +"$L0" "$TMP/coord.log" | grep -c "is ready in epoch $ep1 (.*, 2 experts, 2 kept")
    [ "$kept" -eq "$FL_P" ] || bad "$kept of $FL_P workers kept their experts"
else
    bad "the restarted coordinator did not become ready within 60 s"
fi
case_end "$ttr" "-" "workers registered again; ${kept:-0}/$FL_P kept their shards (no expert read)" 500

# the coordinator away for 20 s with the clients running: serving goes on in the current epoch
case_begin coordinator_outage
ready_epoch 1 30 >/dev/null
ep0=$(fl_state | cut -d' ' -f2)
fault_at
kill -9 "$FL_COORD_PID"
wait "$FL_COORD_PID" 2>/dev/null
sleep 20
restore_at
fl_start_coord
ttr=-
if ep1=$(ready_epoch $((ep0 + 1)) 60); then ttr=$(($(fl_now) - RESTORE_AT)); else bad "not ready within 60 s of the return"; fi
case_end "$ttr" "-" "20 s without a coordinator under load; ready again" $((LIVE_MS + 500))

# A long coordinator outage: 60 s (300 heartbeats), the workers' backoff grown to 32 s. They
# must register the moment it is back, not at the end of their backoff, and the stale REGISTER
# a retired connection still held must not get them declared dead. The per-request clients
# pause (none of them could open for a minute); the open clients serve on through it.
OUTAGE_S=60
OUTAGE_BOUND_MS=$((10 * FL_HB))
case_begin coordinator_60s
ready_epoch 1 30 >/dev/null
fl_stop_clients
L0=$(($(wc -l <"$TMP/coord.log") + 1))
ep0=$(fl_state | cut -d' ' -f2)
fault_at
kill -9 "$FL_COORD_PID"
wait "$FL_COORD_PID" 2>/dev/null
sleep "$OUTAGE_S"
t0=$(fl_now)
restore_at
fl_start_coord
ttr=-
if ep1=$(ready_epoch $((ep0 + 1)) 60); then
    ttr=$(($(fl_now) - t0))
    [ "$ttr" -le "$OUTAGE_BOUND_MS" ] ||
        bad "ready $ttr ms after the coordinator's return (bound $OUTAGE_BOUND_MS ms)"
    sleep $((3 * LIVE_MS / 1000 + 1))
    ! tail -n +"$L0" "$TMP/coord.log" | grep -q " is dead" ||
        bad "workers declared dead after the return: $(tail -n +"$L0" "$TMP/coord.log" | grep " is dead" | head -2)"
    [ "$(fl_state | cut -d' ' -f1)" = ready ] || bad "not ready $((3 * LIVE_MS)) ms later"
else
    bad "not ready within 60 s of the coordinator's return"
fi
fl_start_clients
case_end "$ttr" "$OUTAGE_BOUND_MS" "a ${OUTAGE_S} s outage ($((OUTAGE_S * 1000 / FL_HB)) heartbeats): ready again, nobody declared dead"
open_stop

# reloads that welcome the workers again (step_timeout_ms changed, then back), under load
case_begin reload_rewelcome
ready_epoch 1 30 >/dev/null
fault_at
for i in 1 2 3; do
    sed -i "s/step_timeout_ms: $FL_STEP_MS/step_timeout_ms: $((FL_STEP_MS + 500))/" "$SPEC"
    fl_ctl reload >"$TMP/reload.out" 2>&1 || bad "reload: $(cat "$TMP/reload.out")"
    sleep 2
    fl_write_spec
    fl_ctl reload >"$TMP/reload.out" 2>&1 || bad "reload back: $(cat "$TMP/reload.out")"
    sleep 2
done
ready_epoch 1 30 >/dev/null || bad "not ready 30 s after the reloads"
case_end 0 "-" "six reloads that change step_timeout_ms and back"

# a broken spec: reload and SIGHUP; the old spec serves on
case_begin reload_broken
ep0=$(fl_state | cut -d' ' -f2)
fl_write_spec 5
fl_ctl reload >"$TMP/reload.out" 2>&1
rc=$?
[ "$rc" -eq 78 ] || bad "reload of a broken spec exited $rc, expected 78"
grep -q "cluster.yaml:5:17: coordinator.heartbeat_ms: 5 is out of range" "$TMP/reload.out" ||
    bad "reload: $(cat "$TMP/reload.out")"
n0=$(grep -c "the old spec keeps serving: .*cluster.yaml:5:17" "$TMP/coord.log")
kill -HUP "$FL_COORD_PID"
sleep 0.5
n1=$(grep -c "the old spec keeps serving: .*cluster.yaml:5:17" "$TMP/coord.log")
[ "$n1" -gt "$n0" ] || bad "SIGHUP: no file:line:column error in the log"
read -r st ep <<<"$(fl_state)"
[ "$st" = ready ] && [ "$ep" -eq "$ep0" ] || bad "after the broken reloads: $st in epoch $ep"
fl_write_spec
fl_ctl reload >/dev/null || bad "reload of the good spec failed"
case_end 0 "-" "old spec kept, error with file:line:column (exit 78)"

# a second worker process under a live worker's name, from the spare host
case_begin duplicate_name
ep0=$(fl_state | cut -d' ' -f2)
fl_start_worker 1 $((FL_P + 1))
imp=${FL_PIDS[-1]}
end=$(($(fl_now) + 10000))
until grep -q "ERR_DUPLICATE" "$TMP/w1.h$((FL_P + 1)).log" 2>/dev/null || [ "$(fl_now)" -ge "$end" ]; do
    sleep 0.1
done
grep -q "ERR_DUPLICATE" "$TMP/w1.h$((FL_P + 1)).log" || bad "the impostor was not refused"
kill "$imp"
sleep 1
read -r st ep <<<"$(fl_state)"
[ "$st" = ready ] && [ "$ep" -eq "$ep0" ] || bad "after the impostor: $st in epoch $ep (was $ep0)"
case_end 0 "-" "refused with ERR_DUPLICATE; w1 and epoch $ep0 untouched"

# garbage to every socket
case_begin garbage
ep0=$(fl_state | cut -d' ' -f2)
for k in badversion notype badtype nobody garbage unknown junk toomany register_empty; do
    fl_on 0 "$POKE" "$LISTEN" dealer "$k" >/dev/null
    fl_on 0 "$POKE" "$ADMIN" dealer "$k" >/dev/null
    for ((r = 0; r < FL_P; r++)); do
        fl_on 0 "$POKE" "tcp://$(fl_addr $((r + 1))):7500" push "$k" >/dev/null
    done
done
for port in "$(fl_addr 0) 7400" "127.0.0.1 7401" "$(fl_addr 1) 7500"; do
    read -r host p <<<"$port"
    fl_on 0 bash -c "head -c 65536 /dev/urandom >/dev/tcp/$host/$p" 2>/dev/null
done
sleep 1
read -r st ep <<<"$(fl_state)"
[ "$st" = ready ] && [ "$ep" -eq "$ep0" ] || bad "after the garbage: $st in epoch $ep (was $ep0)"
for p in "$FL_COORD_PID" "${FL_WPID[@]}"; do kill -0 "$p" 2>/dev/null || bad "process $p died"; done
case_end 0 "-" "every daemon up, same epoch"

# ---- the steady-state cost of the fault tolerance ----
# The clients' answer rate over FT_S s with the fault tolerance on, and with it off
# (EPMOE_TEST_NO_FAILOVER=1 on every worker, started again, and on the clients), in the order
# on off off on on off (drift in the machine's load cancels), each on freshly started workers
# after 3 s of warm-up; the overhead compares the medians.
FT_S=${FL_FT_S:-10}
# ft_rate 0|1: sets FT_R, the answers per second (not in $(...): the clients it starts would
# hold the substitution's pipe open)
ft_rate() {
    local ep0 t0 n0 end
    FT_R=0
    fl_stop_clients
    ep0=$(fl_state | cut -d' ' -f2)
    n0=$(grep -c "is ready in epoch" "$TMP/coord.log")
    for ((r = 0; r < FL_P; r++)); do kill "${FL_WPID[$r]}"; done
    for ((r = 0; r < FL_P; r++)); do wait "${FL_WPID[$r]}" 2>/dev/null; done
    export EPMOE_TEST_NO_FAILOVER=$1
    for ((r = 0; r < FL_P; r++)); do fl_start_worker "$r"; done
    # a quick restart keeps the epoch (the workers register again before they are missed):
    # wait for the four new processes' READY, then for the cluster
    end=$(($(fl_now) + 60000))
    until [ "$(grep -c "is ready in epoch" "$TMP/coord.log")" -ge $((n0 + FL_P)) ] ||
        [ "$(fl_now)" -ge "$end" ]; do sleep 0.1; done
    ready_epoch "$ep0" 60 >/dev/null || { bad "the cluster was not ready again"; return; }
    fl_start_clients
    sleep 3
    t0=$(fl_now)
    sleep "$FT_S"
    FT_R=$(cat "$TMP"/client[012].log.t | awk -v a="$t0" -v b="$((t0 + FT_S * 1000))" -v s="$FT_S" \
        '$2 == "OK" && $1 >= a && $1 < b {n++} END {printf "%.2f\n", n / s}')
}
echo "---- fault tolerance on / off (steady state, ${FT_S} s each)"
FT_ON=()
FT_OFF=()
CASE=fault_tolerance_cost
CASE_OK=1
for off in 0 1 1 0 0 1; do
    ft_rate "$off"
    if [ "$off" = 1 ]; then FT_OFF+=("$FT_R"); else FT_ON+=("$FT_R"); fi
done
export EPMOE_TEST_NO_FAILOVER=0
read -r ft_on ft_off ft_cost <<<"$(python3 -c "
import statistics as s
a, b = s.median([$(IFS=,; echo "${FT_ON[*]}")]), s.median([$(IFS=,; echo "${FT_OFF[*]}")])
print('%.2f %.2f %.1f' % (a, b, (b - a) / b * 100 if b else 0))")"
FT_LINE="steady state, answers/s: on ${FT_ON[*]} (median $ft_on), off ${FT_OFF[*]} (median $ft_off): overhead ${ft_cost} % (goal <= 2 %: $(awk "BEGIN{print ($ft_cost <= 2) ? \"met\" : \"missed\"}"))"
FT_OK=$CASE_OK
echo "  $FT_LINE"

# ---- the end ----
sleep 1
fl_stop_clients
echo
printf '%-18s %8s %8s %6s %6s %4s %8s %8s %8s %7s  %s\n' FAULT READY_MS BOUND_MS ISSUED FAILED L+W \
    PAUSE_MS BACK95_MS REINT_MS GOALS RESULT
for r in "${RESULTS[@]}"; do echo "$r"; done
echo "$FT_LINE"
echo
fl_report
echo "faults survived $SURVIVED/$N_CASES, requests lost $LOST, wrong $WRONG" \
    "($PENDING_LOST lost in cases whose goals are pending: ${FL_GOALS_PENDING:-none};" \
    "$NEW_CLIENT_LOST lost by per-request clients where the open clients judge)"
if [ "$SURVIVED" -ne "$N_CASES" ] || [ $((LOST - PENDING_LOST - NEW_CLIENT_LOST)) -ne 0 ] ||
    [ "$WRONG" -ne 0 ] || [ "$OK" -eq 0 ] || [ "$FT_OK" -ne 1 ] || [ "$OPEN_OK" -ne 1 ]; then
    FL_KEEP=1
    echo "logs kept in $TMP"
    exit 1
fi
exit 0
