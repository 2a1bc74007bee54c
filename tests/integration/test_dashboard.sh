#!/usr/bin/env bash
# test_dashboard.sh — every panel of the shipped Grafana dashboard (deploy/grafana/epmoe.json)
# shows data for a serving cluster, as a real Prometheus computes it (issue 23, point 3).
#
# A 2-worker cluster on the serving path (data_plane zmq: clients submit at the entries; no
# collective step), placement eplb with redundant experts, the coordinator and both workers
# serving /metrics. A real Prometheus (Debian's prometheus package; skipped, 77, without it)
# scrapes the three every second while clients forward layers 0 (hash), 1 and mtp.0 for a few
# seconds and an operator applies a rebalance. Then every target of every panel is evaluated
# by Prometheus's query API as Grafana would send it ($job = all jobs, $__rate_interval 30s,
# $__range 5m; $job and $worker_job all jobs): each panel must give at least one finite value
# above 0 (a rate of 0, a NaN quantile or no series at all is the empty panel an operator saw
# before issue 23; counts that are legitimately 0, such as dead workers, sit next to a positive
# one in their panel), but a panel described as "0 on a healthy cluster" (busy refusals,
# replays, resends) needs series with finite values only.
# `promtool check config` accepts the scrape configuration this test writes.
#
#   test_dashboard.sh CTL_DIR COORDINATOR WORKER
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
TMP=$(mktemp -d /tmp/epmoe_dashboard_XXXXXX)
PIDS=()
fails=0
DASH=$(dirname "$0")/../../deploy/grafana/epmoe.json

# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

PROM=$(command -v prometheus) || { echo "skip: prometheus is not installed (apt install prometheus)"; exit 77; }

"$CTL" mkmodel --out "$TMP/m" --expert-dtype fp4 --experts 8 --layers 2 --hash-layers 1 --mtp 1 \
    --seed 9 >/dev/null || { echo "FAIL: mkmodel"; exit 1; }
"$CTL" mkinput --model "$TMP/m" --tokens 32 --seed 1 --out "$TMP/in.st" >/dev/null ||
    { echo "FAIL: mkinput"; exit 1; }
read -r cport pport <<<"$(free_ports 2)"
CM=127.0.0.1:$cport
PROM_ADDR=127.0.0.1:$pport

start_cluster dash "$TMP/m" 2 fp8 "placement: eplb, redundant_experts: 2, window_steps: 400" \
    "metrics: \"$CM\"" 1 || exit 1

cat >"$TMP/prometheus.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: epmoe-coordinator
    static_configs: [{targets: ["$CM"]}]
  - job_name: epmoe-worker
    static_configs: [{targets: ["${METRICS[0]}", "${METRICS[1]}"]}]
EOF
if command -v promtool >/dev/null && ! promtool check config "$TMP/prometheus.yml" >"$TMP/promtool.log" 2>&1; then
    fail "promtool check config: $(tail -3 "$TMP/promtool.log")"
fi
"$PROM" --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
    --web.listen-address="$PROM_ADDR" --log.level=warn >"$TMP/prometheus.log" 2>&1 &
PIDS+=($!)
ready=0
for _ in $(seq 100); do
    "$PY" -c "import urllib.request, sys; urllib.request.urlopen('http://$PROM_ADDR/-/ready', timeout=2)" \
        2>/dev/null && { ready=1; break; }
    sleep 0.2
done
[ $ready = 1 ] || { fail "prometheus not ready: $(tail -5 "$TMP/prometheus.log")"; exit 1; }
# its first scrapes (Prometheus applies discovered targets every 5 s): the counters' values before
# any traffic are in, so that what follows is an increase
up=0
for _ in $(seq 100); do
    up=$("$PY" -c "import json, urllib.request; print(int(json.load(urllib.request.urlopen('http://$PROM_ADDR/api/v1/query?query=sum(up)', timeout=2))['data']['result'][0]['value'][1]))" 2>/dev/null)
    [ "${up:-0}" = 3 ] && break
    sleep 0.2
done
[ "${up:-0}" = 3 ] || { fail "prometheus scrapes ${up:-0} of the 3 daemons"; exit 1; }
sleep 1

# traffic: two clients forwarding three layers until told to stop
client() {
    local i=0
    while [ ! -f "$TMP/stop.traffic" ]; do
        for l in 0 1 mtp.0; do
            "$CTL" --coordinator "$ADMIN" forward --layer $l --input "$TMP/in.st" \
                --output "$TMP/c$1.st" >"$TMP/c$1.log" 2>&1 || echo "$l: $(cat "$TMP/c$1.log")" >>"$TMP/traffic.fail"
            i=$((i + 1))
        done
    done
    echo "$i" >"$TMP/c$1.count"
}
client 1 &
c1=$!
client 2 &
c2=$!
sleep 4
"$CTL" --coordinator "$ADMIN" -o json rebalance --wait-timeout 60 >"$TMP/reb.json" 2>&1 ||
    fail "rebalance: $(cat "$TMP/reb.json")"
sleep 4
touch "$TMP/stop.traffic"
wait $c1 $c2
[ -s "$TMP/traffic.fail" ] && fail "forwards failed: $(head -3 "$TMP/traffic.fail")"
echo "traffic: $(($(cat "$TMP/c1.count") + $(cat "$TMP/c2.count"))) forwards from 2 clients, rebalance moved $(json_get "$TMP/reb.json" "d.get('moved_experts')") replicas"
sleep 3 # the last LOAD_REPORT (at most a second late) and two more scrapes

# every target of every panel, as Grafana sends it
"$PY" - "$DASH" "http://$PROM_ADDR" >"$TMP/panels.log" 2>&1 <<'PY'
import json, math, sys, urllib.parse, urllib.request
dash, base = json.load(open(sys.argv[1])), sys.argv[2]
bad = 0
for p in dash["panels"]:
    best, shown = None, []
    for t in p.get("targets", []):
        q = (t["expr"].replace("$worker_job", ".*").replace("$job", ".*").replace("$__rate_interval", "30s")
             .replace("$__range", "5m"))
        url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
        r = json.load(urllib.request.urlopen(url, timeout=10))
        if r.get("status") != "success":
            print("FAIL: panel %r: query %s: %s" % (p["title"], q, r))
            bad += 1
            continue
        for s in r["data"]["result"]:
            v = float(s["value"][1])
            shown.append(v)
            if math.isfinite(v) and v > 0:
                best = v if best is None else max(best, v)
    if best is None and p.get("description", "").startswith("0 on a healthy cluster") and shown and \
            all(math.isfinite(v) for v in shown):
        print("ok   panel %-60r %d series, all 0 (0 on a healthy cluster)" % (p["title"], len(shown)))
    elif best is None:
        print("FAIL: panel %r shows no data (values %s)" % (p["title"], shown[:6]))
        import re
        for n in set(re.findall(r"epmoe_\w+", " ".join(t["expr"] for t in p["targets"]))):
            url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": n + "[5m]"})
            r = json.load(urllib.request.urlopen(url, timeout=10))
            for s in r["data"]["result"][:2]:
                print("     %s%s: %s" % (n, s["metric"], [v for _, v in s["values"]][:40]))
        bad += 1
    else:
        print("ok   panel %-60r %d series, max %.4g" % (p["title"], len(shown), best))
print("%d panels, %d empty" % (len(dash["panels"]), bad))
sys.exit(1 if bad else 0)
PY
rc=$?
cat "$TMP/panels.log"
[ $rc -eq 0 ] && ok "every panel of deploy/grafana/epmoe.json shows the serving cluster in a real Prometheus" ||
    fail "panels without data (above)"

stop_cluster dash

if [ $fails -ne 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "all ok"
