#!/usr/bin/env bash
# serve.sh — the serving path's goals (issue 15; docs/performance.md "Serving path"), each as a
# ratio measured in one run:
#   (a) 64 concurrent single-token requests (4 clients x 16 in flight) vs one forward --local of
#       64 tokens, and vs the same 64 requests one at a time;
#   (b) prefill, 2 clients x 256 tokens, 2 in flight each, vs forward --local of the same tokens;
#   (c) one single-token call vs the forward --local time of that token;
#   (d) client -> entry -> client round trip on a tiny model vs a raw ZeroMQ round trip.
# A cluster of P workers with one compute thread each on loopback; the baseline runs with P
# threads (the same threads in total). V4-Flash shapes: H 4096, I 2048, 256 experts, top-6, two
# MoE layers (generated once into $MODEL, 6.9 GB; reused when present).
#
#   tests/bench/serve.sh BUILD_DIR [P] [GOALS]     GOALS: the goals to run, default abcd
set -u
B=$(cd "$1" && pwd)
P=${2:-2}
GOALS=${3:-abcd}
CTL=$B/ctl/epmoectl COORD=$B/coordinator/epmoe-coordinator WORKER=$B/worker/epmoe-worker
BENCH=$B/tests/bench/bench_serve
MODEL=${MODEL:-/tmp/epmoe_v4flash_2l}
TMP=$(mktemp -d /tmp/epmoe_bench_serve_XXXXXX)
PIDS=()
fails=0
. "$(dirname "$0")/../integration/cluster_lib.sh"
# the workers compute with one thread each (start_cluster starts them with --threads 1)

if [ ! -f "$MODEL/config.json" ]; then
    echo "generating $MODEL (V4-Flash shapes, 2 MoE layers)"
    "$CTL" mkmodel --out "$MODEL" --expert-dtype fp4 --hidden 4096 --inter 2048 --experts 256 \
        --topk 6 --layers 2 --hash-layers 0 --mtp 0 --shards 2 --vocab 1000 --seed 3 >/dev/null ||
        exit 1
fi
"$CTL" mkmodel --out "$TMP/tiny" --expert-dtype fp4 --experts 16 --layers 1 --hash-layers 0 --shards 1 \
    --mtp 0 >/dev/null || exit 1

run() { echo "\$ bench_serve $*"; "$BENCH" --coordinator "$ADMIN" "$@"; echo; }

want() { [[ $GOALS == *$1* ]]; }
if [[ $GOALS == *[abc]* ]]; then
start_cluster v4f "$MODEL" "$P" fp8 || exit 1
want a && {
echo "== (a) decode: 64 single-token requests in flight (4 clients x 16)"
run --model "$MODEL" --layers 0-1 --clients 4 --inflight 16 --tokens 1 --calls 256 \
    --threads "$P" --batch-local 64
echo "== (a') the same requests one at a time"
run --model "$MODEL" --layers 0-1 --clients 1 --inflight 1 --tokens 1 --calls 64 \
    --threads "$P" --batch-local 64
}
want b && {
echo "== (b) prefill: 2 clients x 2 in flight x 256 tokens"
run --model "$MODEL" --layers 0-1 --clients 2 --inflight 2 --tokens 256 --calls 8 \
    --threads "$P" --batch-local 1024
}
want c && {
echo "== (c) one single-token call at a time vs forward --local of that token"
run --model "$MODEL" --layers 0-1 --clients 1 --inflight 1 --tokens 1 --calls 64 \
    --threads "$P" --batch-local 1
}
stop_cluster v4f
# how the workers batched (over the goals run on this cluster: run one goal for its own)
grep -h "serving:" "$TMP"/v4f.w*.log | sed 's/^.*serving:/worker serving:/'
# with EPMOE_DEBUG=step, each entry's timeline of a request (medians over its requests)
cat "$TMP"/v4f.w*.log | python3 -c '
import re, statistics, sys
rows = [re.findall(r"([a-zA-Z ]+?) ([+-][0-9.]+)", l.split("tokens:", 1)[-1]) for l in sys.stdin
        if "own pairs done" in l]
if rows:
    cols = {}
    for r in rows:
        for k, v in r:
            cols.setdefault(k.strip(" ,"), []).append(float(v))
    for r in rows[len(rows) // 2:len(rows) // 2 + 4]:
        print("  a request: " + ", ".join("%s %s" % (k.strip(" ,"), v) for k, v in r))
    print("entry timeline, medians of %d requests (ms after the SUBMIT): " % len(rows) +
          ", ".join("%s %+.3f" % (k, statistics.median(v)) for k, v in cols.items()))
'
fi
want d || exit 0
start_cluster tiny "$TMP/tiny" "$P" fp8 || exit 1
echo "== (d) round trip on a tiny model vs raw ZeroMQ"
run --model "$TMP/tiny" --layers 0-0 --clients 1 --inflight 1 --tokens 1 --calls 2000 \
    --threads "$P" --batch-local 1 --rtt
stop_cluster tiny
