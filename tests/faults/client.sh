#!/usr/bin/env bash
# client.sh — one client of the fault suite: issues forwards through epmoectl, one after the
# other, until the file STOP exists, and writes one line per request to LOG:
#
#   OK                 answered, and the output file is byte-identical to REF (forward --local)
#   FAIL <message>     answered with an explicit error (epmoectl exit 1, an ERR_* code)
#   LOST               no answer within step_timeout_ms + 5 s, tries included
#   WRONG <why>        answered, but not bit-identical; or an answer that is no answer at all
#
# and one line "<ms since the Unix epoch> <kind>" per request to LOG.t, when it ended.
#
# A try that gets no answer within a third of that bound (the coordinator died with the
# request) is sent again on a new connection while the bound allows: a forward is a pure
# function of its input, so resending it is safe, and a request is lost only when the cluster
# gave no answer in time at all.
#
# With ENTRY (a worker's name) every request prefers that entry worker (libepmoe sends it to
# another member when the entry does not answer).
#
#   client.sh CTL ADMIN LAYER INPUT REF STEP_TIMEOUT_MS LOG STOP [ENTRY]
set -u
CTL=$1 ADMIN=$2 LAYER=$3 IN=$4 REF=$5 STEP_MS=$6 LOG=$7 STOP=$8 ENTRY=${9:-}
OUT=$LOG.out
ERR=$LOG.err
now_ms() { date +%s%3N; }

one_request() {
    local deadline=$(($(now_ms) + STEP_MS + 5000))
    while :; do
        local left=$((deadline - $(now_ms)))
        [ "$left" -gt 0 ] || { echo "LOST"; return; }
        # per try: a third of the bound, so that a request the coordinator took down with it
        # (kill -9) is sent again in time; a slow answer to an earlier try is simply lost with
        # that epmoectl process (the coordinator computes it twice, harmlessly)
        local try=$(((STEP_MS + 5000) / 3))
        [ "$try" -le "$left" ] || try=$left
        rm -f "$OUT"
        timeout $((try / 1000 + 2)) "$CTL" --coordinator "$ADMIN" --timeout "$try" forward \
            --layer "$LAYER" --input "$IN" --output "$OUT" ${ENTRY:+--entry "$ENTRY"} \
            >/dev/null 2>"$ERR"
        local rc=$?
        case $rc in
        0)
            if cmp -s "$OUT" "$REF"; then echo "OK"; else echo "WRONG output differs from --local"; fi
            return
            ;;
        1)
            if grep -q "ERR_" "$ERR"; then
                echo "FAIL $(tr '\n' ' ' <"$ERR")"
            else
                echo "WRONG exit 1 without an error code: $(tr '\n' ' ' <"$ERR")"
            fi
            return
            ;;
        69 | 124) ;; # no answer (or killed by timeout): try again while the bound allows
        *)
            echo "WRONG exit $rc: $(tr '\n' ' ' <"$ERR")"
            return
            ;;
        esac
    done
}

# appended to when it exists: the suite pauses its clients for a long outage and starts them
# again, and every request counts
[ -e "$LOG" ] || : >"$LOG"
while [ ! -e "$STOP" ]; do
    line=$(one_request)
    echo "$line" >>"$LOG"
    # the timeline the suite's numbers come from (fault_numbers.py): when each request ended
    echo "$(now_ms) ${line%% *}" >>"$LOG.t"
    sleep 0.05
done
rm -f "$OUT" "$ERR"
