#!/usr/bin/env bash
# test_model_change.sh — a model change under an open libepmoe client (issue 23, defect 1): a
# real cluster (a coordinator and 2 workers on loopback) serves model A; stale_lib opens a
# client, sizes its buffers for A (guard bytes around each) and gets an answer; the coordinator
# is then stopped and started again on model B (the workers register again and load B), and
# stale_lib submits again. Every later request must fail with EPMOE_ESTALE, no guard byte may
# change, and epmoe_info_get must still give model A. Twice: an H change (256 -> 512) and a
# same-H vocabulary change (600 -> 512). Heartbeat 100 ms, liveness 3: the workers notice the
# outage and register again within a second of the new coordinator. Under the ASan build (build-asan) the same run also
# fails on any read or write past the caller's buffers.
#
#   test_model_change.sh CTL_DIR COORDINATOR WORKER STALE_LIB
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
SLIB=$4
TMP=$(mktemp -d /tmp/epmoe_model_change_XXXXXX)
PIDS=()
fails=0
# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

export CL_HEARTBEAT_MS=100 CL_LIVENESS=3

mk() { # mk NAME HIDDEN VOCAB
    "$CTL" mkmodel --out "$TMP/$1" --expert-dtype fp4 --experts 8 --layers 2 --topk 2 \
        --hidden "$2" --vocab "$3" --seed 5 >/dev/null || { fail "mkmodel $1"; exit 1; }
}
mk a 256 600
mk b 512 600
mk c 256 512

# change NAME FROM TO: serve FROM, open a client, restart the coordinator on TO, check
change() {
    local name=$1 from=$2 to=$3
    rm -f "$TMP/ready" "$TMP/go"
    start_cluster "$name" "$TMP/$from" 2 fp8 || return
    "$SLIB" "$ADMIN" 1 "$TMP/ready" "$TMP/go" >"$TMP/$name.lib.log" 2>&1 &
    local lib=$!
    wait_grep 60 "$TMP/$name.lib.log" "stale_lib: open" || {
        fail "$name: the client did not open: $(cat "$TMP/$name.lib.log")"; kill "$lib"; return; }
    # killed, not stopped: a coordinator that shuts down stops its workers; these stay, register
    # with the new one and load its model
    kill -9 "${CPIDS[0]}"
    wait "${CPIDS[0]}" 2>/dev/null
    KILLED+=("${CPIDS[0]}")
    sed -i "s|model: {path: $TMP/$from}|model: {path: $TMP/$to}|" "$SPEC"
    "$COORD" --cluster "$SPEC" >"$TMP/$name.coord2.log" 2>&1 &
    CPIDS[0]=$!
    PIDS+=($!)
    "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 120 >"$TMP/$name.status2" 2>&1 ||
        fail "$name: not ready on $to: $(tail -3 "$TMP/$name.status2")"
    touch "$TMP/go"
    wait "$lib"
    local rc=$?
    cat "$TMP/$name.lib.log"
    [ $rc -eq 0 ] && ok "$name: $from -> $to: EPMOE_ESTALE, nothing past the buffers" ||
        fail "$name: $from -> $to: stale_lib exited $rc"
    stop_cluster "$name"
}

change h a b     # H 256 -> 512
change vocab a c # the same H, vocabulary 600 -> 512
[ $fails -eq 0 ] && echo "all ok" || echo "$fails failed"
[ $fails -eq 0 ]
