#!/usr/bin/env bash
# dataplane.sh — data-plane messages and step time with P real CPU workers on this machine
# (issue 9: the O(P^2) empty messages). Not a ctest; run by hand:
#
#   tests/bench/sim/dataplane.sh BIN_DIR P [STEPS] [TOKENS] [old]
#
# BIN_DIR holds epmoectl, epmoe-coordinator and epmoe-worker (a build's ctl/, coordinator/ and
# worker/ binaries copied together, or any build of an older commit: pass "old" for a build
# without the metrics spec key). A tiny model with P routed experts (hidden 256, top-6, one
# score layer), contiguous placement, P workers with one GEMM thread each, STEPS forwards of
# TOKENS tokens (default 20 x 64). Prints the median step time the coordinator reports and, for
# a build with metrics, the data-plane messages per step per worker it counted.
set -u
BIN=${1:?bin dir}
P=${2:?workers}
STEPS=${3:-20}
T=${4:-64}
OLD=${5:-}
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
TMP=$(mktemp -d /tmp/epmoe_dp_XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
"$BIN/epmoectl" mkmodel --out "$TMP/m" --expert-dtype fp8 --experts "$P" --layers 1 \
    --hash-layers 0 --mtp 0 --shards 1 --seed 3 >/dev/null || exit 1
"$BIN/epmoectl" mkinput --model "$TMP/m" --tokens "$T" --seed 1 --out "$TMP/in.st" >/dev/null || exit 1
read -r -a ports <<<"$("$PY" -c "
import socket; s=[socket.socket() for _ in range($P + 3)]
[x.bind(('127.0.0.1',0)) for x in s]; print(*[x.getsockname()[1] for x in s])")"
ADMIN=tcp://127.0.0.1:${ports[1]}
M=""
[ -z "$OLD" ] && M=", metrics: \"127.0.0.1:${ports[2]}\""
{
    echo "cluster: {name: dp}"
    echo "coordinator: {listen: \"tcp://127.0.0.1:${ports[0]}\", admin: \"$ADMIN\", heartbeat_ms: 2000, liveness: 10, step_timeout_ms: 60000$M}"
    echo "model: {path: $TMP/m}"
    echo "nodes:"
    echo "  - name: local"
    echo "    workers:"
    for ((r = 0; r < P; r++)); do
        echo "      - {name: w$r, device: cpu, data: \"tcp://127.0.0.1:${ports[$((r + 3))]}\"}"
    done
} >"$TMP/dp.yaml"
"$BIN/epmoe-coordinator" --cluster "$TMP/dp.yaml" >"$TMP/coord.log" 2>&1 &
PIDS+=($!)
for ((r = 0; r < P; r++)); do
    "$BIN/epmoe-worker" --coordinator "tcp://127.0.0.1:${ports[0]}" --name "w$r" --threads 1 \
        >"$TMP/w$r.log" 2>&1 &
    PIDS+=($!)
done
"$BIN/epmoectl" --coordinator "$ADMIN" status --wait-ready --wait-timeout 600 >/dev/null ||
    { echo "not ready"; tail "$TMP/coord.log"; exit 1; }
scrape() {
    "$PY" -c "
import urllib.request, re
t = urllib.request.urlopen('http://127.0.0.1:${ports[2]}/metrics').read().decode()
m = re.search(r'^epmoe_dataplane_messages_total (\S+)', t, re.M)
print(int(float(m.group(1))) if m else 0)"
}
m0=0
[ -z "$OLD" ] && m0=$(scrape)
: >"$TMP/s.txt"
for ((i = 0; i < STEPS; i++)); do
    "$BIN/epmoectl" --coordinator "$ADMIN" --timeout 120000 -o json forward --layer 0 \
        --input "$TMP/in.st" --output "$TMP/out.st" >"$TMP/f.json" 2>&1 || { cat "$TMP/f.json"; exit 1; }
    "$PY" -c "import json; print(json.load(open('$TMP/f.json'))['forward_seconds'])" >>"$TMP/s.txt"
done
med=$(sort -g "$TMP/s.txt" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
if [ -z "$OLD" ]; then
    m1=$(scrape)
    per=$("$PY" -c "print('%.2f' % (($m1 - $m0) / $STEPS / $P))")
    echo "$P workers, $STEPS steps of $T tokens: median step $med s; data-plane messages per step per worker $per (2(P-1) = $((2 * (P - 1))) with one DISPATCH and one COMBINE to every peer)"
else
    echo "$P workers, $STEPS steps of $T tokens: median step $med s; data-plane messages per step per worker $((2 * (P - 1))) (one DISPATCH and one COMBINE to every peer, by that protocol)"
fi
"$BIN/epmoectl" --coordinator "$ADMIN" shutdown >/dev/null
