#!/usr/bin/env bash
# test_flow.sh — flow control is libepmoe's (issue 23 point 2; docs/client.md "Flow control"):
# a real coordinator and 3 real workers, each entry taking at most 64 requests of one client
# (SRV_MAX_CLIENT_REQUESTS, told in every Result). Through libepmoe (serve_lib, C):
#
#   - one client with 300 requests in flight by rotation (more than the 3 x 64 the entries
#     take from it), 900 requests;
#   - one client pinned to entry w1 (options.entry) with 200 in flight (64 at that entry), 600;
#
# every answer is bit-identical to forward --local and none is EPMOE_EBUSY (serve_lib fails on
# any status but EPMOE_OK). On the code before issue 23 both failed with EPMOE_EBUSY.
#
#   test_flow.sh CTL_DIR COORDINATOR WORKER SERVE_LIB
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
SLIB=$4
TMP=$(mktemp -d /tmp/epmoe_flow_XXXXXX)
PIDS=()
fails=0

# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

"$CTL" mkmodel --out "$TMP/m" --expert-dtype fp4 --experts 12 --layers 2 --hash-layers 1 \
    --mtp 1 --seed 7 >/dev/null || { fail "mkmodel"; exit 1; }
"$CTL" mkinput --model "$TMP/m" --tokens 2 --seed 3 --out "$TMP/in.st" >/dev/null ||
    { fail "mkinput"; exit 1; }
start_cluster flow "$TMP/m" 3 fp8 "placement: contiguous" || exit 1
ref=$(local_ref "$TMP/m" 1 "$TMP/in.st")

# run TAG INFLIGHT REPEAT [ENTRY]
run() {
    local tag=$1 d=$2 n=$3 entry=${4:-} t0
    t0=$(date +%s%3N)
    if ! "$SLIB" "$ADMIN" 1 "$TMP/in.st" "$TMP/$tag.st" "$d" "$n" ${entry:+"$entry"} >"$TMP/$tag.log" 2>&1; then
        fail "$tag: $(head -3 "$TMP/$tag.log")"
    elif ! cmp -s "$TMP/$tag.st" "$ref"; then
        fail "$tag: the answers differ from forward --local"
    else
        ok "$tag: $n requests, $d in flight${entry:+ pinned to $entry}: no EPMOE_EBUSY, bit-identical ($(($(date +%s%3N) - t0)) ms)"
    fi
}
run rotation 300 900
run pinned 200 600 w1
stop_cluster flow
# the workers did refuse past their credit at the first burst (the library learns the credit
# from the answers): say how often, so a change in the credit's telling shows
busy=$(grep -ho "[0-9]* busy" "$TMP"/flow.w*.log | awk '{ s += $1 } END { print s + 0 }')
echo "     (the entries refused $busy SUBMITs for load in all; none reached the caller)"

echo "$((fails == 0 ? 1 : 0)) passed, $((fails == 0 ? 0 : 1)) failed"
[ $fails -eq 0 ]
