#!/usr/bin/env bash
# sim.sh — the real coordinator with N simulated workers (sim_workers): the numbers of
# docs/performance.md "Coordinator at scale" (issue 9). Not a ctest; run by hand:
#
#   tests/bench/sim/sim.sh BUILD_DIR flash|pro N [CPU_SECONDS [CLIENTS]]
#
# flash: DeepSeek-V4-Flash's MoE shape (256 routed experts x 43 layers, hidden 4096, top-6);
# pro: V4-Pro's (384 x 61, hidden 7168). The placement is eplb with enough redundant experts
# that each of the N workers holds a slot (E + redundant = max(N, E + 32)); heartbeat 1000 ms,
# liveness 3. Measured, in order:
#   1. start to ready: the coordinator and sim_workers start, until STATUS says ready
#   2. coordinator CPU over CPU_SECONDS (default 30) of an idle ready cluster at 1 Hz heartbeats
#   3. 2 forwards of 256 tokens per layer (Zipf 1.2 load from the simulated routers), median ms
#   4. rebalance --dry-run: EPLB plan time for N workers x all layers, balance before/after
#   5. rebalance: staged EPOCH to every worker, prepared, committed; command to served (ms)
#   6. drain of one worker: a plain EPOCH broadcast to N workers until all are READY (ms)
#   7. one worker goes silent (SIGUSR1 to sim_workers): silence to the new epoch acknowledged
#      by all (goal: < liveness x heartbeat + 1 s)
# With CLIENTS (issue 23 point 6), after 2 and instead of 3-7: CLIENTS simulated libepmoe clients
# (sim_clients) asking CLIENT_INFO as the library did before issue 23 while busy (every 500 ms)
# and as it does after (only when an answer says the epoch changed), each for CPU_SECONDS with
# the same two epoch changes in the window (a drain and an undrain of one worker): the
# coordinator's CPU, and the answers and bytes per second it sent them. SIM_CLIENT_MODES picks
# the modes, in order (default "news poll:500": polling may bring the coordinator down, see
# docs/performance.md; sim_clients --mode). SIM_LIVENESS (default 3): the spec's
# liveness, more on a machine so shared that 1,024 simulated workers miss heartbeats.
set -u
B=${1:?build dir}
MODEL=${2:?flash or pro}
N=${3:?workers}
CPU_S=${4:-30}
CLIENTS=${5:-0}
CTL=$B/ctl/epmoectl
COORD=$B/coordinator/epmoe-coordinator
SIM=$B/tests/bench/sim_workers
SCL=$B/tests/bench/sim_clients
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
TMP=$(mktemp -d /tmp/epmoe_sim_XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT
now() { date +%s%3N; }
jget() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

case $MODEL in
flash) E=256 L=43 H=4096 I=2048 ;;
pro) E=384 L=61 H=7168 I=3072 ;;
*) echo "model: flash or pro" >&2; exit 64 ;;
esac
RED=$((N > E + 32 ? N - E : 32))
mkdir -p "$TMP/model"
"$CTL" mkmodel --out "$TMP/tiny" --expert-dtype fp4 --experts 8 --layers 2 --mtp 0 --seed 1 \
    >/dev/null || exit 1
"$PY" - "$TMP/tiny/config.json" "$TMP/model/config.json" $E $L $H $I <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(n_routed_experts=int(sys.argv[3]), num_hidden_layers=int(sys.argv[4]),
         hidden_size=int(sys.argv[5]), moe_intermediate_size=int(sys.argv[6]),
         num_hash_layers=0, num_nextn_predict_layers=0, vocab_size=129280,
         compress_ratios=[0] * int(sys.argv[4]))
if "mlp_layer_types" in c:  # one per layer, all routed (num_hash_layers 0)
    c["mlp_layer_types"] = ["moe"] * int(sys.argv[4])
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
read -r lport aport <<<"$("$PY" -c "
import socket; s=[socket.socket() for _ in range(2)]
[x.bind(('127.0.0.1',0)) for x in s]; print(*[x.getsockname()[1] for x in s])")"
LISTEN=tcp://127.0.0.1:$lport
ADMIN=tcp://127.0.0.1:$aport
{
    echo "cluster: {name: sim}"
    echo "coordinator: {listen: \"$LISTEN\", admin: \"$ADMIN\", heartbeat_ms: 1000, liveness: ${SIM_LIVENESS:-3}, step_timeout_ms: 60000}"
    echo "model: {path: $TMP/model}"
    echo "expert_parallel: {placement: eplb, redundant_experts: $RED, window_steps: 1000}"
    echo "nodes:"
    for ((r = 0; r < N; r++)); do
        [ $((r % 8)) -eq 0 ] && printf '  - name: n%03d\n    workers:\n' $((r / 8))
        printf '      - {name: w%04d, device: cpu, data: "tcp://127.0.0.1:%d"}\n' $r $((20000 + r))
    done
} >"$TMP/sim.yaml"
"$CTL" mkinput --model "$TMP/model" --tokens 256 --seed 1 --out "$TMP/in.st" >/dev/null || exit 1
A=(--coordinator "$ADMIN" --timeout 120000)

echo "model $MODEL ($E routed experts x $L MoE layers, hidden $H), $N simulated workers," \
    "eplb with $RED redundant experts"
t0=$(now)
"$COORD" --cluster "$TMP/sim.yaml" >"$TMP/coord.log" 2>&1 &
CPID=$!
PIDS+=($CPID)
"$SIM" --coordinator "$LISTEN" --count "$N" --silence w0005 >"$TMP/sim.out" 2>"$TMP/sim.err" &
SPID=$!
PIDS+=($SPID)
"$CTL" "${A[@]}" status --wait-ready --wait-timeout 600 >/dev/null || { tail "$TMP/coord.log"; exit 1; }
echo "1. start to ready: $(($(now) - t0)) ms"

tick() { awk '{print $14 + $15}' "/proc/$CPID/stat"; }
c0=$(tick)
sleep "$CPU_S"
c1=$(tick)
hz=$(getconf CLK_TCK)
echo "2. coordinator CPU, idle and ready at 1 Hz heartbeats from $N workers:" \
    "$("$PY" -c "print('%.2f %% of one core' % (100.0 * ($c1 - $c0) / $hz / $CPU_S))") (over ${CPU_S} s)"

# clients MODE TAG: CLIENTS simulated clients in MODE for CPU_S seconds, two epoch changes
clients() {
    local mode=$1 tag=$2 out=$TMP/sc.$2.out pid i a0 b0 a1 b1 c0 c1 t0 t1 third
    "$SCL" --coordinator "$ADMIN" --count "$CLIENTS" --mode "$mode" >"$out" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    for ((i = 0; i < 6000; i++)); do
        grep -q "^ready" "$out" && break
        sleep 0.1
    done
    grep -q "^ready" "$out" || { echo "$tag: the clients did not all get a first answer"; return 1; }
    sleep 2
    counts() { kill -USR1 "$pid"; sleep 0.3; awk '/^answers/ {a = $2; b = $4} END {print a, b}' "$out"; }
    read -r a0 b0 <<<"$(counts)"
    c0=$(tick)
    t0=$(now)
    third=$("$PY" -c "print($CPU_S / 3)")
    sleep "$third"
    "$CTL" "${A[@]}" drain w0003 --wait-timeout 600 >/dev/null 2>"$TMP/drain.err" ||
        echo "   $tag: drain failed: $(cat "$TMP/drain.err")"
    kill -USR2 "$pid" # the news each client reads in its next answer's serving epoch
    sleep "$third"
    "$CTL" "${A[@]}" -o json status >"$TMP/s0.json"
    "$CTL" "${A[@]}" undrain w0003 >/dev/null 2>"$TMP/drain.err" ||
        echo "   $tag: undrain failed: $(cat "$TMP/drain.err")"
    for ((i = 0; i < 6000; i++)); do # until the undrain's epoch is current
        "$CTL" "${A[@]}" -o json status >"$TMP/s1.json" 2>/dev/null
        [ "$(jget "$TMP/s1.json" "d['state'] == 'ready' and d['current_epoch'] > $(jget "$TMP/s0.json" "d['current_epoch']")")" = True ] && break
        sleep 0.1
    done
    kill -USR2 "$pid"
    sleep 5 # the answers to that news are in the window, however late the undrain came
    while [ $(($(now) - t0)) -lt $((CPU_S * 1000)) ]; do sleep 0.1; done
    c1=$(tick)
    t1=$(now)
    read -r a1 b1 <<<"$(counts)"
    kill "$pid"
    wait "$pid" 2>/dev/null
    grep "applied by its" "$TMP/coord.log" | tail -2 | sed 's/^/   coordinator: /'
    "$PY" -c "
s = ($t1 - $t0) / 1000.0
print('   %-34s coordinator CPU %6.2f %% of one core, %8.1f answers/s, %9.3f MB/s (%d answers, %.1f MB in %.1f s)' % (
    '$tag', 100.0 * ($c1 - $c0) / $hz / s, ($a1 - $a0) / s, ($b1 - $b0) / s / 1e6, $a1 - $a0, ($b1 - $b0) / 1e6, s))"
}
if [ "$CLIENTS" -gt 0 ]; then
    echo "2c. $CLIENTS simulated clients, CLIENT_INFO over ${CPU_S} s with two epoch changes (drain, undrain of w0003):"
    for m in ${SIM_CLIENT_MODES:-news poll:500}; do
        case $m in
        poll:500) clients "$m" "before (every 500 ms while busy)" || exit 1 ;;
        news) clients "$m" "after (on news of an epoch only)" || exit 1 ;;
        *) clients "$m" "$m" || exit 1 ;;
        esac
        sleep 2 # the clients are gone: does the coordinator survive their leaving?
        kill -0 $CPID 2>/dev/null || { echo "   the coordinator died: $(tail -1 "$TMP/coord.log")"; exit 1; }
    done
    "$CTL" "${A[@]}" shutdown >/dev/null
    wait $CPID
    exit 0
fi

: >"$TMP/fwd.ms"
for ((l = 0; l < L; l++)); do
    for rep in 1 2; do
        a=$(now)
        "$CTL" "${A[@]}" forward --layer $l --input "$TMP/in.st" --output "$TMP/out.st" \
            >/dev/null 2>"$TMP/fwd.err" || { echo "forward layer $l: $(cat "$TMP/fwd.err")"; exit 1; }
        echo $(($(now) - a)) >>"$TMP/fwd.ms"
    done
done
echo "3. $((2 * L)) forwards of 256 tokens over $N workers: median $(sort -n "$TMP/fwd.ms" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') ms (epmoectl process included)"

"$CTL" "${A[@]}" -o json rebalance --dry-run >"$TMP/dry.json" || exit 1
echo "4. EPLB plan for $N workers x $L layers: $(jget "$TMP/dry.json" "'%.3f s (%s); predicted balance %.3f -> %.3f, %d replicas would move' % (d['plan_seconds'], d['policy'], d['balance_before'], d['balance_after'], d['moved_experts'])")"

a=$(now)
"$CTL" "${A[@]}" -o json rebalance --wait-timeout 600 >"$TMP/reb.json" || exit 1
echo "5. rebalance applied (staged EPOCH to $N workers, prepared, EPOCH_COMMIT, all READY): $(($(now) - a)) ms from the command to the epoch served"

a=$(now)
"$CTL" "${A[@]}" drain w0003 --wait-timeout 600 >/dev/null || exit 1
echo "6. placement broadcast (drain: EPOCH to $N workers until every member is READY): $(($(now) - a)) ms"
grep "applied by its" "$TMP/coord.log" | tail -2 | sed 's/^/   coordinator: /'

"$CTL" "${A[@]}" -o json status >"$TMP/s0.json"
e0=$(jget "$TMP/s0.json" "d['current_epoch']")
kill -USR1 $SPID
for ((i = 0; i < 600; i++)); do
    grep -q silenced "$TMP/sim.out" && break
    sleep 0.01
done
ts=$(awk '/silenced/ {print $4}' "$TMP/sim.out")
while :; do
    "$CTL" "${A[@]}" -o json status >"$TMP/s1.json" 2>/dev/null
    [ "$(jget "$TMP/s1.json" "d['state'] == 'ready' and d['current_epoch'] > $e0")" = True ] && break
    sleep 0.1
done
e1=$(jget "$TMP/s1.json" "d['current_epoch']")
ta=$(awk -v e="$e1" '$1 == "epoch" && $2 == e && /acknowledged/ {print $NF}' "$TMP/sim.out" | tail -1)
echo "7. a worker silent to epoch $e1 acknowledged by all the others: $((ta - ts)) ms (liveness 3 x heartbeat 1000 ms = 3000 ms; goal < 4000 ms)"
grep "lost: silent" "$TMP/coord.log" | tail -1 | sed 's/^/   coordinator: /'
"$CTL" "${A[@]}" shutdown >/dev/null
wait $CPID
