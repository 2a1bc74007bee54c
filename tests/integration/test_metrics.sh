#!/usr/bin/env bash
# test_metrics.sh — both daemons serve Prometheus metrics that a real parser accepts, and the
# counters move with traffic (issue 9).
#
# A 2-worker cluster with coordinator.metrics and a metrics address per worker (free ports).
# Each endpoint is scraped and validated by check_metrics.py (prometheus_client's parser plus
# naming and histogram rules); then N forwards of T tokens run and a second scrape must show:
# coordinator steps_total{ok} +N, expert_tokens_total +N*T*k, step latency count +N, the
# cluster ready with its epoch; each worker's steps_total{ok} +N and its data-plane messages
# and expert pairs up. Every metric deploy/grafana/epmoe.json draws is among those served.
#
#   test_metrics.sh CTL_DIR COORDINATOR WORKER
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
TMP=$(mktemp -d /tmp/epmoe_metrics_XXXXXX)
PIDS=()
fails=0
CHECK=$(dirname "$0")/check_metrics.py

# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

"$PY" -c "import prometheus_client.parser" 2>/dev/null ||
    { echo "skip: prometheus_client is not installed (apt install python3-prometheus-client)"; exit 77; }

"$CTL" mkmodel --out "$TMP/m" --expert-dtype fp4 --experts 8 --layers 2 --hash-layers 1 --mtp 1 \
    --seed 9 >/dev/null || { echo "FAIL: mkmodel"; exit 1; }
"$CTL" mkinput --model "$TMP/m" --tokens 32 --seed 1 --out "$TMP/in.st" >/dev/null ||
    { echo "FAIL: mkinput"; exit 1; }
read -r cport <<<"$(free_ports 1)"
CM=127.0.0.1:$cport

COORD_FAMS="epmoe_cluster_state epmoe_placement_epoch epmoe_workers epmoe_workers_dead
epmoe_workers_masked epmoe_worker_up epmoe_worker_load_progress_ratio epmoe_steps_total
epmoe_step_duration_seconds epmoe_layer_dispatch_seconds epmoe_layer_expert_seconds
epmoe_layer_combine_seconds epmoe_dataplane_bytes_total epmoe_expert_tokens_total
epmoe_layer_balance_ratio epmoe_layer_worker_load_ratio epmoe_rebalances_total
epmoe_rebalance_duration_seconds"
WORKER_FAMS="epmoe_worker_state epmoe_worker_epoch epmoe_worker_steps_total
epmoe_worker_step_duration_seconds epmoe_worker_dispatch_seconds epmoe_worker_expert_seconds
epmoe_worker_combine_seconds epmoe_worker_dataplane_messages_total
epmoe_worker_expert_tokens_total epmoe_worker_weight_bytes epmoe_worker_load_read_bytes_total"

# scrape TAG ADDR FAMILIES...: validate, keep $TMP/TAG.json
scrape() {
    local tag=$1 addr=$2
    shift 2
    # shellcheck disable=SC2086
    "$PY" "$CHECK" "http://$addr/metrics" "$TMP/$tag.json" "$@" || fail "scrape $tag"
}

# get TAG FAMILY LABELS: a value of a scrape ("" when absent)
get() { json_get "$TMP/$1.json" "d.get('$2', {}).get('$3', '')"; }
total() { json_get "$TMP/$1.json" "sum(d.get('$2', {}).values())"; }

N=5
T=32
if start_cluster met "$TMP/m" 2 fp8 "placement: contiguous" "metrics: \"$CM\"" 1; then
    forward_check warm "$TMP/m" 1 "$TMP/in.st" || fail "first forward"
    sleep 0.5 # the worker gauges refresh every heartbeat
    # shellcheck disable=SC2086
    scrape c1 "$CM" $COORD_FAMS
    # shellcheck disable=SC2086
    for r in 0 1; do scrape "w${r}_1" "${METRICS[$r]}" $WORKER_FAMS; done
    for i in $(seq 1 $N); do
        forward_check "f$i" "$TMP/m" 1 "$TMP/in.st" || fail "forward $i"
    done
    sleep 0.5
    scrape c2 "$CM"
    for r in 0 1; do scrape "w${r}_2" "${METRICS[$r]}"; done
    k=$(json_get "$TMP/m/config.json" "d['num_experts_per_tok']")
    d_ok=$(("$(get c2 epmoe_steps_total 'code=ERR_NONE,result=ok' | cut -d. -f1)" -
        "$(get c1 epmoe_steps_total 'code=ERR_NONE,result=ok' | cut -d. -f1)"))
    d_tok=$(json_get "$TMP/c2.json" "int(sum(d['epmoe_expert_tokens_total'].values()) - sum(json.load(open('$TMP/c1.json'))['epmoe_expert_tokens_total'].values()))")
    d_lat=$(json_get "$TMP/c2.json" "int(d['epmoe_step_duration_seconds'][''] - json.load(open('$TMP/c1.json'))['epmoe_step_duration_seconds'][''])")
    if [ "$d_ok" = $N ] && [ "$d_tok" = $((N * T * k)) ] && [ "$d_lat" = $N ]; then
        ok "coordinator counters moved with $N forwards: steps_total{ok} +$d_ok, expert_tokens_total +$d_tok (N*T*k), step latency count +$d_lat"
    else
        fail "coordinator counters: steps +$d_ok (want $N), expert tokens +$d_tok (want $((N * T * k))), latency count +$d_lat"
    fi
    [ "$(get c2 epmoe_cluster_state state=ready)" = 1.0 ] || fail "epmoe_cluster_state{state=ready} is not 1"
    [ "$(get c2 epmoe_workers state=ready)" = 2.0 ] || fail "epmoe_workers{state=ready} is not 2"
    # epochs start at the wall clock in ms (ids keep increasing across coordinator restarts)
    "$CTL" --coordinator "$ADMIN" -o json status >"$TMP/status.json" || fail "status"
    cur=$(json_get "$TMP/status.json" "d['current_epoch']")
    gauge=$(json_get "$TMP/c2.json" "int(d.get('epmoe_placement_epoch', {}).get('kind=current', -1))")
    [ "$gauge" = "$cur" ] || fail "epmoe_placement_epoch{current} is $gauge, status says $cur"
    for r in 0 1; do
        ws=$(("$(get "w${r}_2" epmoe_worker_steps_total result=ok | cut -d. -f1)" -
            "$(get "w${r}_1" epmoe_worker_steps_total result=ok | cut -d. -f1)"))
        wp=$(json_get "$TMP/w${r}_2.json" "int(sum(d['epmoe_worker_expert_tokens_total'].values()) - sum(json.load(open('$TMP/w${r}_1.json'))['epmoe_worker_expert_tokens_total'].values()))")
        [ "$ws" = $N ] && [ "$wp" -gt 0 ] || fail "worker w$r: steps_total{ok} +$ws (want $N), expert pairs +$wp"
        [ "$(get "w${r}_2" epmoe_worker_state state=ready)" = 1.0 ] || fail "worker w$r not ready in its metrics"
    done
    msgs=$(json_get "$TMP/w0_2.json" "int(sum(d['epmoe_worker_dataplane_messages_total'].values()))")
    [ "$msgs" -gt 0 ] || fail "worker w0 sent no data-plane message"
    ok "worker counters moved: steps_total{ok} +$N on both, expert pairs and data-plane messages ($msgs from w0) up"
    # the Grafana dashboard draws only metrics the coordinator serves
    missing=$("$PY" - "$(dirname "$0")/../../deploy/grafana/epmoe.json" "$TMP/c2.json" <<'PY'
import json, re, sys
dash, have = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
names = set()
for p in dash["panels"]:
    for t in p["targets"]:
        names |= set(re.sub(r"_bucket$", "", n) for n in re.findall(r"epmoe_\w+", t["expr"]))
print(" ".join(sorted(n for n in names if n not in have)))
PY
)
    [ -z "$missing" ] && ok "deploy/grafana/epmoe.json: every metric it draws is served" ||
        fail "the dashboard draws metrics the coordinator does not serve: $missing"
    # slowloris: strangers trickling half-open requests do not blind the endpoint, and the
    # server closes them at its total request deadline (10 s, common/metrics_http.c)
    "$PY" "$(dirname "$0")/slowloris.py" "$CM" 10 && ok "/metrics serves a scrape while strangers hold connections" ||
        fail "slowloris on the coordinator's /metrics"
    stop_cluster met
fi

if [ $fails -ne 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "all ok"
