#!/usr/bin/env bash
# test_metrics.sh — both daemons serve Prometheus metrics that a real parser accepts, and the
# counters move with traffic (issue 9), by the conventions operators expect (issue 17, point 10).
#
# A 2-worker cluster with coordinator.metrics and a metrics address per worker (free ports),
# heartbeat 3 s. Each endpoint is scraped and validated by check_metrics.py (prometheus_client's
# parser plus naming and histogram rules) and by `promtool check metrics` (Debian's prometheus
# package; skipped where it is not installed). Before any step: every counter exists at 0 for
# every label value (steps_total{failed} for each error code, rebalances_total, loads_total,
# placement_changes_total), "no data yet" is no series (epmoe_balance_ratio, a staged epoch),
# epmoe_build_info and the info series name worker, rank and device, and the coordinator's
# view of workers shares no name with a worker's own metrics. Then N forwards of T tokens run
# (the serving path: each at an entry worker, which reports its requests' load to the
# coordinator at most once a second) and a second scrape must show: coordinator
# steps_total{ok} +N and expert_tokens_total +N*T*k, the cluster ready with its epoch; the
# workers' steps_total{ok} +N in all (a request counts at its entry), their data-plane messages
# and expert pairs up. A forward of layer mtp.0 is labelled "mtp.0". A drain changes the
# per-worker gauges at once (not at the next heartbeat, 3 s away); concurrent forwards are all
# counted ok; a request that times out (a worker stopped) is counted failed at its entry and
# the client names ERR_TIMEOUT. Every metric
# deploy/grafana/epmoe.json draws is among those served. Slowloris cannot blind /metrics.
#
# Then the cardinality budget at V4-Flash layer count (43 layers + 1 MTP, 256 experts): after
# forwards through a hash layer, a middle layer, the last layer and mtp.0, each worker serves at
# most 300 series (docs/operations.md "Metrics"), and the coordinator's series that grow with the
# workers stay within its stated budget per worker.
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

COORD_FAMS="epmoe_build_info epmoe_cluster_state epmoe_placement_epoch epmoe_workers
epmoe_workers_dead epmoe_workers_masked epmoe_cluster_worker_info epmoe_cluster_worker_up
epmoe_cluster_worker_load_progress_ratio epmoe_cluster_worker_experts epmoe_steps_total
epmoe_step_duration_seconds epmoe_layer_dispatch_seconds epmoe_layer_expert_seconds
epmoe_layer_combine_seconds epmoe_dataplane_bytes_total epmoe_expert_tokens_total
epmoe_layer_balance_ratio epmoe_layer_worker_load_ratio epmoe_rebalances_total
epmoe_rebalance_duration_seconds"
WORKER_FAMS="epmoe_build_info epmoe_worker_info epmoe_worker_state epmoe_worker_epoch
epmoe_worker_steps_total epmoe_worker_step_duration_seconds epmoe_worker_dispatch_seconds
epmoe_worker_expert_seconds epmoe_worker_combine_seconds epmoe_worker_dataplane_messages_total
epmoe_worker_expert_pairs_total epmoe_worker_weight_bytes epmoe_worker_load_read_bytes_total
epmoe_worker_loads_total epmoe_worker_requests_total epmoe_worker_request_duration_seconds
epmoe_worker_request_queue_seconds epmoe_worker_busy_refusals_total epmoe_worker_replays_total
epmoe_worker_resends_total epmoe_worker_requests_in_flight epmoe_worker_credits_in_use
epmoe_worker_expert_batch_pairs epmoe_worker_expert_batch_jobs_total
epmoe_worker_expert_reads_total"

PROMTOOL=$(command -v promtool)
[ -n "$PROMTOOL" ] || echo "note: promtool not found (apt install prometheus): its check is skipped"

# scrape TAG ADDR FAMILIES...: validate (check_metrics.py, promtool), keep $TMP/TAG.json and the
# exposition in $TMP/TAG.txt
scrape() {
    local tag=$1 addr=$2
    shift 2
    # shellcheck disable=SC2086
    "$PY" "$CHECK" "http://$addr/metrics" "$TMP/$tag.json" "$@" || fail "scrape $tag"
    "$PY" -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" \
        "http://$addr/metrics" >"$TMP/$tag.txt" || fail "scrape $tag: fetch"
    if [ -n "$PROMTOOL" ] && ! "$PROMTOOL" check metrics <"$TMP/$tag.txt" >"$TMP/$tag.promtool" 2>&1; then
        fail "promtool check metrics $tag ($addr): $(head -5 "$TMP/$tag.promtool")"
    fi
}

# has TAG FAMILY LABELS: the series is in the scrape
has() { [ "$(json_get "$TMP/$1.json" "'$3' in d.get('$2', {})")" = True ]; }
# series TAG: the samples of a scrape (exposition lines that are not comments)
series() { grep -vc '^#' "$TMP/$1.txt"; }

# get TAG FAMILY LABELS: a value of a scrape ("" when absent)
get() { json_get "$TMP/$1.json" "d.get('$2', {}).get('$3', '')"; }
total() { json_get "$TMP/$1.json" "sum(d.get('$2', {}).values())"; }

# conventions before any step (scrapes c0, w0_0, w1_0)
check_conventions() {
    local bad=$fails code
    for code in $(json_get "$TMP/c0.json" "' '.join(sorted(k.split(',')[0][5:] for k in d['epmoe_steps_total'] if 'result=failed' in k))"); do
        [ "$(get c0 epmoe_steps_total "code=$code,result=failed")" = 0.0 ] || fail "steps_total{failed,$code} is not 0"
    done
    for code in ERR_TIMEOUT ERR_WORKER_LOST ERR_STEP_FAILED ERR_NOT_READY; do
        has c0 epmoe_steps_total "code=$code,result=failed" || fail "epmoe_steps_total{result=failed,code=$code} is not there at 0"
    done
    for r in applied unchanged failed abandoned; do
        [ "$(get c0 epmoe_rebalances_total "result=$r")" = 0.0 ] || fail "epmoe_rebalances_total{result=$r} is not there at 0"
    done
    for k in epoch staged abandoned; do
        has c0 epmoe_placement_changes_total "kind=$k" || fail "epmoe_placement_changes_total{kind=$k} is not there"
    done
    [ "$(get c0 epmoe_rebalance_moved_experts_total '')" = 0.0 ] || fail "epmoe_rebalance_moved_experts_total is not there at 0"
    has c0 epmoe_balance_ratio '' && fail "epmoe_balance_ratio is there before any step (no data must be no series)"
    has c0 epmoe_placement_epoch kind=staged && fail "epmoe_placement_epoch{kind=staged} is there with nothing staged"
    [ "$(json_get "$TMP/c0.json" "len(d.get('epmoe_build_info', {}))")" = 1 ] || fail "coordinator: no epmoe_build_info{version}"
    for r in 0 1; do
        has c0 epmoe_cluster_worker_info "device=cpu,rank=$r,worker=w$r" || fail "no epmoe_cluster_worker_info for w$r"
        has "w${r}_0" epmoe_worker_info "device=cpu,rank=$r,worker=w$r" || fail "w$r: no epmoe_worker_info{worker,rank,device}"
        [ "$(json_get "$TMP/w${r}_0.json" "len(d.get('epmoe_build_info', {}))")" = 1 ] || fail "w$r: no epmoe_build_info{version}"
        for k in load epoch staged commit; do
            has "w${r}_0" epmoe_worker_loads_total "kind=$k" || fail "w$r: epmoe_worker_loads_total{kind=$k} is not there"
        done
        # the serving path's series, at 0 for every label value (issue 23)
        for k in routed hash mtp unknown; do
            for code in ERR_MALFORMED ERR_BAD_REQUEST ERR_CONFIG_HASH ERR_NOT_READY ERR_STEP_FAILED \
                ERR_TIMEOUT ERR_SHUTTING_DOWN ERR_BUSY; do
                [ "$(get "w${r}_0" epmoe_worker_requests_total "code=$code,kind=$k,result=failed")" = 0.0 ] ||
                    fail "w$r: epmoe_worker_requests_total{kind=$k,result=failed,code=$code} is not there at 0"
            done
            [ "$(get "w${r}_0" epmoe_worker_requests_total "code=ERR_NONE,kind=$k,result=ok")" = 0.0 ] ||
                fail "w$r: epmoe_worker_requests_total{kind=$k,result=ok} is not there at 0"
        done
        for lv in epmoe_worker_busy_refusals_total:limit=entry epmoe_worker_busy_refusals_total:limit=client \
            epmoe_worker_replays_total:reason=refused epmoe_worker_replays_total:reason=epoch \
            epmoe_worker_resends_total: epmoe_worker_requests_in_flight:phase=waiting \
            epmoe_worker_requests_in_flight:phase=running epmoe_worker_credits_in_use:kind=dispatch \
            epmoe_worker_request_duration_seconds: epmoe_worker_request_queue_seconds: \
            epmoe_worker_expert_batch_pairs: epmoe_worker_expert_batch_jobs_total: \
            epmoe_worker_expert_reads_total:; do
            [ "$(get "w${r}_0" "${lv%%:*}" "${lv#*:}")" = 0.0 ] || fail "w$r: ${lv%%:*}{${lv#*:}} is not there at 0"
        done
    done
    # the coordinator's view of workers and a worker's own metrics share no name (only the
    # per-process families do)
    shared=$("$PY" - "$TMP/c0.json" "$TMP/w0_0.json" <<'PY'
import json, sys
c, w = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(" ".join(sorted(set(c) & set(w) - {"epmoe_build_info", "epmoe_handshakes_refused_total"})))
PY
)
    [ -z "$shared" ] || fail "names served by both the coordinator and a worker: $shared"
    [ $fails -eq "$bad" ] && ok "before any step: every counter at 0 for every label value, no series for no data, build and worker info, no shared names"
}

# delta TAG_BEFORE TAG_AFTER FAMILY LABELS: the growth of a series (histograms: their count)
delta() {
    "$PY" - "$TMP/$1.json" "$TMP/$2.json" "$3" "$4" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(int(b.get(sys.argv[3], {}).get(sys.argv[4], 0) - a.get(sys.argv[3], {}).get(sys.argv[4], 0)))
PY
}
# delta_workers FAMILY LABELS: its growth over both workers from scrape 1 to 2
delta_workers() { echo $(($(delta w0_1 w0_2 "$1" "$2") + $(delta w1_1 w1_2 "$1" "$2"))); }

# the serving path's metrics after the N forwards of layer 1 (score-routed) (issue 23): each
# request counted at its entry with its kind, result and code, its latency and queue time;
# expert batches and reads on the workers; on the coordinator the step latency, the per-layer
# request latency and all-to-all histograms and the data-plane counters (from LOAD_REPORT), and
# epmoectl status's served requests and their rate
check_serving() {
    local bad=$fails d
    d=$(delta_workers epmoe_worker_requests_total code=ERR_NONE,kind=routed,result=ok)
    [ "$d" = $N ] || fail "workers: epmoe_worker_requests_total{kind=routed,result=ok} +$d (want $N)"
    for f in epmoe_worker_request_duration_seconds epmoe_worker_request_queue_seconds; do
        d=$(delta_workers $f '')
        [ "$d" = $N ] || fail "workers: $f count +$d (want $N)"
    done
    for r in 0 1; do
        for f in epmoe_worker_expert_batch_pairs epmoe_worker_expert_batch_jobs_total \
            epmoe_worker_expert_reads_total; do
            d=$(delta "w${r}_1" "w${r}_2" $f '')
            [ "$d" -gt 0 ] || fail "w$r: $f +$d after $N forwards (it serves experts of layer 1)"
        done
        [ "$(get "w${r}_2" epmoe_worker_requests_in_flight phase=running)" = 0.0 ] ||
            fail "w$r: requests in flight at rest"
        [ "$(get "w${r}_2" epmoe_worker_credits_in_use kind=dispatch)" = 0.0 ] ||
            fail "w$r: dispatch credits in use at rest"
    done
    for f in epmoe_step_duration_seconds: epmoe_layer_request_duration_seconds:layer=1 \
        epmoe_layer_dispatch_seconds:layer=1 epmoe_layer_expert_seconds:layer=1 \
        epmoe_layer_combine_seconds:layer=1; do
        d=$(delta c1 c2 "${f%%:*}" "${f#*:}")
        [ "$d" = $N ] || fail "coordinator: ${f%%:*}{${f#*:}} count +$d (want $N)"
    done
    for k in dispatch combine; do
        d=$(delta c1 c2 epmoe_dataplane_bytes_total kind=$k)
        [ "$d" -gt 0 ] || fail "coordinator: epmoe_dataplane_bytes_total{kind=$k} +$d"
    done
    d=$(delta c1 c2 epmoe_dataplane_messages_total '')
    [ "$d" -gt 0 ] || fail "coordinator: epmoe_dataplane_messages_total +$d"
    "$CTL" --coordinator "$ADMIN" -o json status >"$TMP/status_s.json" || fail "status"
    local served rate
    served=$(json_get "$TMP/status_s.json" "d.get('requests_served', -1)")
    rate=$(json_get "$TMP/status_s.json" "d.get('request_rate', 0) > 0")
    [ "$served" = $((N + 1)) ] && [ "$rate" = True ] ||
        fail "epmoectl status: requests_served $served (want $((N + 1))), rate > 0: $rate"
    "$CTL" --coordinator "$ADMIN" status >"$TMP/status_s.txt" || fail "status"
    grep -Eq "^requests +$((N + 1)) served \([0-9.]+/s over the last 10 s\), 0 failed" "$TMP/status_s.txt" ||
        fail "epmoectl status does not show the served requests: $(grep -E '^(steps|requests)' "$TMP/status_s.txt")"
    [ $fails -eq "$bad" ] &&
        ok "serving path: requests{routed,ok} +$N at the entries with latency and queue time, expert batches and reads; coordinator step, request and all-to-all histograms +$N, data-plane counters; status: $served served"
}

N=5
T=32
export CL_HEARTBEAT_MS=3000 # per-worker gauges must not wait for a heartbeat
# wait_steps BEFORE AFTER N: scrape the coordinator into AFTER until steps_total{ok} has grown
# by N over BEFORE (the entries report at most once a second; 6 s at most); d_ok is the growth
wait_steps() {
    for _ in $(seq 30); do
        sleep 0.2
        scrape "$2" "$CM" >/dev/null
        d_ok=$(("$(get "$2" epmoe_steps_total 'code=ERR_NONE,result=ok' | cut -d. -f1)" -
            "$(get "$1" epmoe_steps_total 'code=ERR_NONE,result=ok' | cut -d. -f1)"))
        [ "$d_ok" -ge "$3" ] && return
    done
}

if start_cluster met "$TMP/m" 2 fp8 "placement: contiguous" "metrics: \"$CM\", step_timeout_ms: 1500" 1; then
    # shellcheck disable=SC2086
    scrape c0 "$CM" $COORD_FAMS
    # shellcheck disable=SC2086
    for r in 0 1; do scrape "w${r}_0" "${METRICS[$r]}" $WORKER_FAMS; done
    check_conventions
    forward_check warm "$TMP/m" 1 "$TMP/in.st" || fail "first forward"
    wait_steps c0 c1 1 # its load report is in before the counting starts
    # shellcheck disable=SC2086
    scrape c1 "$CM" $COORD_FAMS
    # shellcheck disable=SC2086
    for r in 0 1; do scrape "w${r}_1" "${METRICS[$r]}" $WORKER_FAMS; done
    for i in $(seq 1 $N); do
        forward_check "f$i" "$TMP/m" 1 "$TMP/in.st" || fail "forward $i"
    done
    k=$(json_get "$TMP/m/config.json" "d['num_experts_per_tok']")
    wait_steps c1 c2 $N
    for r in 0 1; do scrape "w${r}_2" "${METRICS[$r]}"; done
    d_tok=$(json_get "$TMP/c2.json" "int(sum(d['epmoe_expert_tokens_total'].values()) - sum(json.load(open('$TMP/c1.json'))['epmoe_expert_tokens_total'].values()))")
    if [ "$d_ok" = $N ] && [ "$d_tok" = $((N * T * k)) ]; then
        ok "coordinator counters moved with $N forwards: steps_total{ok} +$d_ok, expert_tokens_total +$d_tok (N*T*k)"
    else
        fail "coordinator counters: steps +$d_ok (want $N), expert tokens +$d_tok (want $((N * T * k)))"
    fi
    [ "$(get c2 epmoe_cluster_state state=ready)" = 1.0 ] || fail "epmoe_cluster_state{state=ready} is not 1"
    [ "$(get c2 epmoe_workers state=ready)" = 2.0 ] || fail "epmoe_workers{state=ready} is not 2"
    # epochs start at the wall clock in ms (ids keep increasing across coordinator restarts)
    "$CTL" --coordinator "$ADMIN" -o json status >"$TMP/status.json" || fail "status"
    cur=$(json_get "$TMP/status.json" "d['current_epoch']")
    gauge=$(json_get "$TMP/c2.json" "int(d.get('epmoe_placement_epoch', {}).get('kind=current', -1))")
    [ "$gauge" = "$cur" ] || fail "epmoe_placement_epoch{current} is $gauge, status says $cur"
    ws_all=0
    msgs=0
    for r in 0 1; do
        ws=$(("$(get "w${r}_2" epmoe_worker_steps_total result=ok | cut -d. -f1)" -
            "$(get "w${r}_1" epmoe_worker_steps_total result=ok | cut -d. -f1)"))
        ws_all=$((ws_all + ws))
        wp=$(json_get "$TMP/w${r}_2.json" "int(d['epmoe_worker_expert_pairs_total'][''] - json.load(open('$TMP/w${r}_1.json'))['epmoe_worker_expert_pairs_total'][''])")
        [ "$wp" -gt 0 ] || fail "worker w$r: expert pairs +$wp (it holds experts the tokens go to)"
        [ "$(get "w${r}_2" epmoe_worker_state state=ready)" = 1.0 ] || fail "worker w$r not ready in its metrics"
        msgs=$((msgs + $(json_get "$TMP/w${r}_2.json" "int(sum(d['epmoe_worker_dataplane_messages_total'].values()))")))
    done
    [ "$ws_all" = $N ] || fail "workers: steps_total{ok} +$ws_all in all (want $N: one per request, at its entry)"
    [ "$msgs" -gt 0 ] || fail "no worker sent a data-plane message"
    [ "$ws_all" = $N ] && [ "$msgs" -gt 0 ] &&
        ok "worker counters moved: steps_total{ok} +$N in all, expert pairs on both, $msgs data-plane messages"
    check_serving
    # the Grafana dashboard draws only metrics the coordinator or a worker serves
    missing=$("$PY" - "$(dirname "$0")/../../deploy/grafana/epmoe.json" "$TMP/c2.json" "$TMP/w0_2.json" <<'PY'
import json, re, sys
dash = json.load(open(sys.argv[1]))
have = set(json.load(open(sys.argv[2]))) | set(json.load(open(sys.argv[3])))
names = set()
for p in dash["panels"]:
    for t in p["targets"]:
        names |= set(re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"epmoe_\w+", t["expr"]))
print(" ".join(sorted(n for n in names if n not in have)))
PY
)
    [ -z "$missing" ] && ok "deploy/grafana/epmoe.json: every metric it draws is served" ||
        fail "the dashboard draws metrics no daemon serves: $missing"
    # layers are labelled as epmoectl names them
    scrape c2b "$CM"
    forward_check mtp "$TMP/m" mtp.0 "$TMP/in.st" || fail "forward of mtp.0"
    wait_steps c2b c3 1
    mtp=$(json_get "$TMP/c3.json" "sum(1 for k in d['epmoe_expert_tokens_total'] if 'layer=mtp.0' in k)")
    one=$(json_get "$TMP/c3.json" "sum(1 for k in d['epmoe_expert_tokens_total'] if 'layer=1,' in k or k.endswith('layer=1'))")
    [ "$mtp" -gt 0 ] && [ "$one" -gt 0 ] &&
        ok "layers labelled as the CLI names them: layer=\"1\", layer=\"mtp.0\"" ||
        fail "no epmoe_expert_tokens_total{layer=\"mtp.0\"}: $(json_get "$TMP/c3.json" "list(d['epmoe_expert_tokens_total'])[:8]")"
    # a drain changes the per-worker gauges at once (the next heartbeat is up to 3 s away)
    "$CTL" --coordinator "$ADMIN" drain w1 >"$TMP/drain.log" 2>&1 || fail "drain w1: $(cat "$TMP/drain.log")"
    scrape c4 "$CM"
    if [ "$(get c4 epmoe_cluster_worker_experts worker=w1)" = 0.0 ] && [ "$(get c4 epmoe_workers_masked '')" = 1.0 ]; then
        ok "drain w1: epmoe_cluster_worker_experts{w1} 0 and epmoe_workers_masked 1 at once"
    else
        fail "drain w1: experts{w1} $(get c4 epmoe_cluster_worker_experts worker=w1), masked $(get c4 epmoe_workers_masked '') right after the drain (heartbeat 3 s)"
    fi
    "$CTL" --coordinator "$ADMIN" undrain w1 >/dev/null 2>&1 || fail "undrain w1"
    "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 60 >/dev/null 2>&1 || fail "not ready after undrain"
    # steps that queue behind one another are each counted as what they were (the next step
    # used to start, and reset the record, before the closed one was counted: every step with
    # a request waiting behind it was counted as failed with code ERR_NONE)
    scrape q0 "$CM"
    qpids=()
    for i in 1 2 3 4 5 6; do
        "$CTL" --coordinator "$ADMIN" forward --layer 1 --input "$TMP/in.st" --output "$TMP/q$i.st" \
            >"$TMP/q$i.log" 2>&1 &
        qpids+=($!)
    done
    qbad=0
    for p in "${qpids[@]}"; do wait "$p" || qbad=$((qbad + 1)); done
    wait_steps q0 q1 6
    d_q=$d_ok
    if [ $qbad -eq 0 ] && [ "$d_q" = 6 ] && [ -z "$(get q1 epmoe_steps_total code=ERR_NONE,result=failed)" ]; then
        ok "6 concurrent forwards: steps_total{ok} +6, none failed"
    else
        fail "6 concurrent forwards ($qbad failed): steps_total{ok} +$d_q; counted: $(json_get "$TMP/q1.json" "{k: v for k, v in d['epmoe_steps_total'].items() if v}")"
    fi
    # a request that times out (w1 stopped) fails with its code at the client and is counted
    # failed at its entry (w0), not ok
    scrape w0_5a "${METRICS[0]}"
    kill -STOP "${CPIDS[2]}"
    "$CTL" --coordinator "$ADMIN" --timeout 1500 forward --entry w0 --layer 1 --input "$TMP/in.st" \
        --output "$TMP/to.st" >"$TMP/to.log" 2>&1
    kill -CONT "${CPIDS[2]}"
    grep -q ERR_TIMEOUT "$TMP/to.log" || fail "a forward with w1 stopped: $(cat "$TMP/to.log")"
    scrape w0_5 "${METRICS[0]}"
    d_f=$(("$(get w0_5 epmoe_worker_steps_total result=failed | cut -d. -f1)" -
        "$(get w0_5a epmoe_worker_steps_total result=failed | cut -d. -f1)"))
    if [ "$d_f" = 1 ]; then
        ok "a request that timed out is counted as epmoe_worker_steps_total{result=failed} at its entry"
    else
        fail "after a timeout: the entry counted $d_f failed requests (want 1)"
    fi
    d_f=$(delta w0_5a w0_5 epmoe_worker_requests_total code=ERR_TIMEOUT,kind=routed,result=failed)
    [ "$d_f" = 1 ] || fail "after a timeout: epmoe_worker_requests_total{routed,failed,ERR_TIMEOUT} +$d_f at the entry (want 1)"
    # and reaches the coordinator's steps_total{failed,ERR_TIMEOUT} and status (LOAD_REPORT)
    for _ in $(seq 30); do
        scrape c5 "$CM" >/dev/null
        [ "$(get c5 epmoe_steps_total code=ERR_TIMEOUT,result=failed | cut -d. -f1)" -ge 1 ] && break
        sleep 0.2
    done
    "$CTL" --coordinator "$ADMIN" -o json status >"$TMP/status_f.json" || fail "status"
    if [ "$(get c5 epmoe_steps_total code=ERR_TIMEOUT,result=failed)" = 1.0 ] &&
        [ "$(json_get "$TMP/status_f.json" "d.get('requests_failed')")" = 1 ]; then
        ok "the timed-out request: coordinator steps_total{failed,ERR_TIMEOUT} 1, status requests_failed 1"
    else
        fail "the timed-out request at the coordinator: steps_total{failed,ERR_TIMEOUT} $(get c5 epmoe_steps_total code=ERR_TIMEOUT,result=failed), status requests_failed $(json_get "$TMP/status_f.json" "d.get('requests_failed')")"
    fi
    "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 60 >/dev/null 2>&1 || fail "not ready after the timeout"
    # slowloris: strangers trickling half-open requests do not blind the endpoint, and the
    # server closes them at its total request deadline (10 s, common/metrics_http.c)
    "$PY" "$(dirname "$0")/slowloris.py" "$CM" 10 && ok "/metrics serves a scrape while strangers hold connections" ||
        fail "slowloris on the coordinator's /metrics"
    stop_cluster met
fi

# ---- the cardinality budget at V4-Flash layer count ----
unset CL_HEARTBEAT_MS
"$CTL" mkmodel --out "$TMP/v4" --expert-dtype fp4 --hidden 128 --inter 128 --experts 256 --topk 8 \
    --layers 43 --hash-layers 3 --mtp 1 --shards 4 --seed 3 >/dev/null || { echo "FAIL: mkmodel v4"; exit 1; }
"$CTL" mkinput --model "$TMP/v4" --tokens 32 --seed 1 --out "$TMP/in4.st" >/dev/null ||
    { echo "FAIL: mkinput v4"; exit 1; }
read -r cport <<<"$(free_ports 1)"
CM=127.0.0.1:$cport
if start_cluster v4 "$TMP/v4" 2 fp8 "placement: contiguous" "metrics: \"$CM\"" 1; then
    for l in 0 21 42 mtp.0; do
        forward_check "v4_$l" "$TMP/v4" $l "$TMP/in4.st" || fail "v4: forward of layer $l"
    done
    scrape v4c "$CM"
    for r in 0 1; do scrape "v4w$r" "${METRICS[$r]}"; done
    n0=$(series v4w0) n1=$(series v4w1) nc=$(series v4c)
    per=$(($(grep -v '^#' "$TMP/v4c.txt" | grep -c 'worker="') / 2))
    echo "series at 43 layers + MTP, 256 experts: worker w0 $n0, w1 $n1; coordinator $nc, of which $per per worker"
    [ "$n0" -le 300 ] && [ "$n1" -le 300 ] || fail "a worker serves more than 300 series: w0 $n0, w1 $n1"
    [ "$per" -le 50 ] || fail "the coordinator serves $per series per worker (budget 50)"
    stop_cluster v4
fi

if [ $fails -ne 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "all ok"
