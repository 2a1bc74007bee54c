#!/usr/bin/env bash
# soak.sh — the soak of issue 8: forwards from three clients for SECONDS (default 120) while one
# worker is killed (kill -9) and started again twice, in the network namespaces of lib.sh. Meant
# for the ASan build (./dev build --asan): every daemon is stopped in order at the end, so
# LeakSanitizer reports any leak at exit, and the logs are searched for sanitizer reports.
#
# Passes when: no request is lost or wrong; every failure is an explicit epoch-change failure of
# the step in flight (ERR_WORKER_LOST naming the worker and the placement epoch) or a request
# that waited step_timeout_ms for the epoch (ERR_TIMEOUT); no sanitizer report; every daemon
# exits 0. Not in ctest (it takes minutes); docs/performance.md records a run.
#
#   soak.sh BUILD_DIR [SECONDS]      e.g. tests/faults/soak.sh build-asan 120
set -u
B=$(cd "$1" && pwd)
SECONDS_TOTAL=${2:-120}
CTL=$B/ctl/epmoectl
COORD=$B/coordinator/epmoe-coordinator
WORKER=$B/worker/epmoe-worker
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
. "$(dirname "$0")/lib.sh"

fl_init
fl_inputs
fl_start_coord
for ((r = 0; r < FL_P; r++)); do fl_start_worker "$r"; done
fl_wait_ready 1 120 >/dev/null || { echo "FAIL: the cluster did not become ready"; exit 1; }
fl_start_clients
t_start=$(fl_now)
fails=0
# two kill-and-restart cycles spread over the run
for cycle in 1 2; do
    sleep $((SECONDS_TOTAL / 3 - 10))
    ep0=$(fl_state | cut -d' ' -f2)
    t0=$(fl_now)
    kill -9 "${FL_WPID[2]}"
    wait "${FL_WPID[2]}" 2>/dev/null
    if ep=$(fl_wait_ready $((ep0 + 1)) 60); then
        echo "cycle $cycle: w2 killed; ready in epoch $ep after $(($(fl_now) - t0)) ms"
    else
        echo "FAIL: cycle $cycle: not ready in a new epoch"
        fails=$((fails + 1))
    fi
    sleep 5
    fl_start_worker 2
    if ep=$(fl_wait_ready $((ep0 + 2)) 60); then
        echo "cycle $cycle: w2 restarted; ready in epoch $ep"
    else
        echo "FAIL: cycle $cycle: w2 did not rejoin"
        fails=$((fails + 1))
    fi
done
left=$((SECONDS_TOTAL * 1000 - ($(fl_now) - t_start)))
[ "$left" -gt 0 ] && sleep "$(awk "BEGIN{print $left/1000}")"
fl_stop_clients
echo "soak: $((($(fl_now) - t_start) / 1000)) s"
fl_report
OTHER=$(cat "$TMP"/client?.log | grep "^FAIL" | grep -v "was lost during step .*placement epoch" |
    grep -vc "ERR_TIMEOUT: the request waited step_timeout_ms")
# stop in order: the coordinator sends SHUTDOWN, every daemon exits (LeakSanitizer runs at exit)
fl_ctl shutdown >/dev/null
for p in "$FL_COORD_PID" "${FL_WPID[@]}"; do
    wait "$p"
    rc=$?
    [ "$rc" -eq 0 ] || { echo "FAIL: process $p exited $rc"; fails=$((fails + 1)); }
done
SAN=$(grep -l "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:" "$TMP"/*.log 2>/dev/null)
echo "failures other than the explicit epoch-change ones: $OTHER"
if [ -n "$SAN" ]; then
    echo "FAIL: sanitizer reports in: $SAN"
    grep -h -A20 "ERROR: \(Address\|Leak\)Sanitizer\|runtime error:" $SAN | head -60
    fails=$((fails + 1))
else
    echo "sanitizers: no report in $(ls "$TMP"/*.log | wc -l) daemon and client logs"
fi
if [ "$fails" -ne 0 ] || [ "$LOST" -ne 0 ] || [ "$WRONG" -ne 0 ] || [ "$OTHER" -ne 0 ]; then
    FL_KEEP=1
    echo "soak FAILED (logs in $TMP)"
    exit 1
fi
echo "soak passed"
