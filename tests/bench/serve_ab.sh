#!/usr/bin/env bash
# serve_ab.sh — A/B of the serving path's per-request cost between two builds (before and after
# a change on the hot path, e.g. issue 23's metrics), interleaved in one run so that both see
# the same machine: for each of ROUNDS rounds, a 2-worker cluster (one compute thread each) of
# build A, then one of build B, serves the same load from bench_serve (build B's client, the
# same for both): a tiny model (16 experts, one layer), where the work outside the kernels is
# the largest share of a request:
#   (a) 4 clients x 16 single-token requests in flight, 512 calls each: tokens/s and p50;
#   (d) one single-token request at a time, 1000 calls: p50 (the round trip).
# Prints every run, then per load the medians and B / A.
#
#   tests/bench/serve_ab.sh BUILD_A BUILD_B [ROUNDS]
set -u
A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
ROUNDS=${3:-5}
BENCH=$B/tests/bench/bench_serve
CTL=$B/ctl/epmoectl
TMP=$(mktemp -d /tmp/epmoe_serve_ab_XXXXXX)
PIDS=()
fails=0
. "$(dirname "$0")/../integration/cluster_lib.sh"

"$CTL" mkmodel --out "$TMP/tiny" --expert-dtype fp4 --experts 16 --layers 1 --hash-layers 0 \
    --shards 1 --mtp 0 >/dev/null || exit 1

# one TAG BUILD: a cluster of BUILD's daemons, both loads; appends "TAG load tokens/s p50" lines
one() {
    COORD=$2/coordinator/epmoe-coordinator WORKER=$2/worker/epmoe-worker
    start_cluster "$1" "$TMP/tiny" 2 fp8 || exit 1
    "$BENCH" --coordinator "$ADMIN" --model "$TMP/tiny" --layers 0-0 --clients 4 --inflight 16 \
        --tokens 1 --calls 512 --threads 2 --batch-local 64 >"$TMP/a.log" 2>&1
    "$BENCH" --coordinator "$ADMIN" --model "$TMP/tiny" --layers 0-0 --clients 1 --inflight 1 \
        --tokens 1 --calls 1000 --threads 2 --batch-local 1 >"$TMP/d.log" 2>&1
    stop_cluster "$1"
    for g in a d; do
        awk -v t="${1%%[0-9]*}" -v g=$g '$1 == "serve" { print t, g, $2, $5 }' "$TMP/$g.log" |
            tee -a "$TMP/runs"
    done
}
for r in $(seq "$ROUNDS"); do
    one "A$r" "$A"
    one "B$r" "$B"
done
"$PY" - "$TMP/runs" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
def med(t, g, i):
    return statistics.median(float(r[i]) for r in runs if r[0] == t and r[1] == g)
for g, what in (("a", "4 clients x 16 in flight"), ("d", "one at a time")):
    ta, tb, pa, pb = med("A", g, 2), med("B", g, 2), med("A", g, 3), med("B", g, 3)
    print("(%s) %s: tokens/s A %.0f B %.0f (B/A %.3f); p50 A %.3f ms B %.3f ms (B/A %.3f)" %
          (g, what, ta, tb, tb / ta, pa, pb, pb / pa))
PY
[ $fails -eq 0 ]
