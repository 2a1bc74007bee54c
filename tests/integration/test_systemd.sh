#!/usr/bin/env bash
# test_systemd.sh — the shipped systemd units (deploy/systemd/) hold up as systemd reads them:
#   - `systemd-analyze verify` passes both, without a warning (ExecStart pointed at this build);
#   - `systemd-analyze security --offline`: exposure at most 2.0 for both units;
#   - the coordinator's ExecReload= sends SIGHUP (run, it makes the coordinator re-read its
#     spec) and it has a RuntimeDirectory for ipc:// endpoints; the worker has one per instance
#     and reads a per-instance EnvironmentFile;
#   - the worker's ExecStart, expanded as systemd expands it (unit_exec.py) from the shipped
#     example environment files (deploy/worker.env.example, worker-instance.env.example):
#       a keyed worker (EPMOE_WORKER_OPTS=--key ... --coordinator-key ...) registers with a
#       security: cluster, which becomes ready;
#       a cuda:0 worker is started with --device cuda:0: on a host that can serve it, it
#       becomes ready; elsewhere it exits 78 saying it cannot serve cuda:0 — never refused by
#       the coordinator as a cpu worker, which is what the units shipped before did.
# Needs systemd-analyze (Debian: the systemd package; no running systemd): skipped (77) without.
#
# usage: test_systemd.sh BINDIR_OF_epmoectl PATH/TO/epmoe-coordinator PATH/TO/epmoe-worker
set -u
BIN=$(realpath "${1:?usage: $0 BINDIR COORD WORKER}")
COORD=$(realpath "${2:?}")
WORKER=$(realpath "${3:?}")
CTL=$BIN/epmoectl
SRC=${EPMOE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
UNITS=$SRC/deploy/systemd
command -v systemd-analyze >/dev/null || { echo "skip: systemd-analyze not installed"; exit 77; }
TMP=$(mktemp -d /tmp/test_systemd.XXXXXX)
PIDS=()
fails=0
# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"
UEXEC="$PY $(dirname "$0")/unit_exec.py"

# ---- verify and security ----------------------------------------------------------------------
# the units as shipped, their binaries replaced by this build's (verify checks they exist)
mkdir -p "$TMP/units"
for u in epmoe-coordinator.service epmoe-worker@.service; do
    sed -e "s#/usr/bin/epmoe-coordinator#$COORD#" -e "s#/usr/bin/epmoe-worker#$WORKER#" \
        "$UNITS/$u" >"$TMP/units/$u"
done
if systemd-analyze verify "$TMP/units/epmoe-coordinator.service" \
    "$TMP/units/epmoe-worker@a0.service" >"$TMP/verify.log" 2>&1 && [ ! -s "$TMP/verify.log" ]; then
    ok "systemd-analyze verify: both units, no warning"
else
    fail "systemd-analyze verify: $(head -5 "$TMP/verify.log")"
fi
for u in epmoe-coordinator.service epmoe-worker@a0.service; do
    systemd-analyze security --offline=yes "$TMP/units/$u" >"$TMP/sec.log" 2>&1
    level=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$TMP/sec.log")
    if [ -z "$level" ]; then
        fail "security --offline $u: no exposure level: $(tail -3 "$TMP/sec.log")"
    elif awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }'; then
        ok "security --offline $u: exposure $level <= 2.0"
    else
        fail "security --offline $u: exposure $level > 2.0: $(grep '✗' "$TMP/sec.log" | head -5)"
    fi
done

# ---- what the units say -----------------------------------------------------------------------
before=$fails
grep -qx 'RuntimeDirectory=epmoe' "$UNITS/epmoe-coordinator.service" ||
    fail "coordinator unit: no RuntimeDirectory=epmoe (ipc:// endpoints)"
grep -qx 'RuntimeDirectory=epmoe-worker/%i' "$UNITS/epmoe-worker@.service" ||
    fail "worker unit: no RuntimeDirectory=epmoe-worker/%i"
grep -qx 'EnvironmentFile=-/etc/epmoe/worker-%i.env' "$UNITS/epmoe-worker@.service" ||
    fail "worker unit: no optional per-instance EnvironmentFile"
[ $fails -eq $before ] &&
    ok "RuntimeDirectory in both units, a per-instance EnvironmentFile in the worker's"

# ---- ExecReload: SIGHUP makes the coordinator re-read its spec ------------------------------------
M=$TMP/model
"$CTL" mkmodel --out "$M" --expert-dtype fp4 --layers 2 --hash-layers 1 --mtp 0 --shards 1 \
    --force >/dev/null || fail "mkmodel"
read -r -a ports <<<"$(free_ports 6)"
LISTEN="tcp://127.0.0.1:${ports[0]}"
ADMIN="tcp://127.0.0.1:${ports[1]}"
KEYS=$TMP/keys
cluster_keys w0 w1 op
cat >"$TMP/spec.yaml" <<EOF
cluster: {name: unitcheck}
coordinator: {listen: "$LISTEN", admin: "$ADMIN", heartbeat_ms: 200, liveness: 10}
model: {path: $M}
expert_parallel: {placement: contiguous}
nodes:
  - name: local
    workers:
      - {name: w0, device: cpu, data: "tcp://127.0.0.1:${ports[2]}"}
      - {name: w1, device: "cuda:0", data: "tcp://127.0.0.1:${ports[3]}"}
security: {coordinator_key: $KEYS/coordinator.key, worker_keys: $KEYS/workers, operator_keys: $KEYS/operators}
EOF
"$COORD" --cluster "$TMP/spec.yaml" >"$TMP/coord.log" 2>&1 &
CPID=$!
PIDS+=($CPID)
sleep 0.5
mapfile -t reload < <(MAINPID=$CPID $UEXEC "$UNITS/epmoe-coordinator.service" "" ExecReload "$TMP/root")
if [ "${reload[*]}" = "/bin/kill -HUP $CPID" ] && "${reload[@]}"; then
    for _ in $(seq 50); do grep -q "SIGHUP: cluster spec" "$TMP/coord.log" && break; sleep 0.1; done
    grep -q "SIGHUP: cluster spec" "$TMP/coord.log" &&
        ok "ExecReload (${reload[*]}) makes the coordinator re-read its spec" ||
        fail "ExecReload ran, but the coordinator did not log the reload: $(tail -3 "$TMP/coord.log")"
else
    fail "coordinator ExecReload is \"${reload[*]}\", expected /bin/kill -HUP \$MAINPID"
fi

# ---- the worker unit's ExecStart, from the shipped example files ---------------------------------
# /etc/epmoe/worker.env and worker-NAME.env as the examples show them, with this test's
# endpoint and key paths: the keyed worker w0 (a cpu worker: its device line removed) and the
# GPU worker w1 (the example's EPMOE_DEVICE=cuda:0 kept).
ETC=$TMP/root/etc/epmoe
mkdir -p "$ETC"
sed "s#^EPMOE_COORDINATOR_LISTEN=.*#EPMOE_COORDINATOR_LISTEN=$LISTEN#" \
    "$SRC/deploy/worker.env.example" >"$ETC/worker.env"
for w in w0 w1; do
    sed -e "s#/etc/epmoe/keys/a0.key#$KEYS/$w.key#" \
        -e "s#/etc/epmoe/keys/coordinator.pub#$KEYS/coordinator.pub#" \
        "$SRC/deploy/worker-instance.env.example" >"$ETC/worker-$w.env"
done
sed -i '/^EPMOE_DEVICE=/d' "$ETC/worker-w0.env"
for w in w0 w1; do
    mapfile -t argv < <($UEXEC "$UNITS/epmoe-worker@.service" $w ExecStart "$TMP/root")
    echo "     $w: ${argv[*]}" | sed "s#$TMP#\$TMP#g"
    argv[0]=$WORKER # /usr/bin/epmoe-worker: this build's
    "${argv[@]}" >"$TMP/$w.log" 2>&1 &
    PIDS+=($!)
    eval "P_$w=$!"
done
# the keyed cpu worker registers and loads; the cuda:0 one is ready or says it cannot serve cuda:0
ready=0
for _ in $(seq 100); do
    "$CTL" --coordinator "$ADMIN" -o json workers >"$TMP/workers.json" 2>"$TMP/workers.err" &&
        [ "$(json_get "$TMP/workers.json" "[w['state'] for w in d['workers'] if w['name'] == 'w0'][0]")" = ready ] &&
        { ready=1; break; }
    sleep 0.2
done
[ $ready -eq 1 ] && ok "keyed worker w0 from the unit's ExecStart (--key, --coordinator-key from EPMOE_WORKER_OPTS) is ready" ||
    fail "keyed worker w0 not ready: $(tail -3 "$TMP/w0.log") $(cat "$TMP/workers.err")"
grep -q -- "--device cuda:0" < <($UEXEC "$UNITS/epmoe-worker@.service" w1 ExecStart "$TMP/root" | tr '\n' ' ') ||
    fail "w1's ExecStart has no --device cuda:0"
for _ in $(seq 100); do kill -0 "$P_w1" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$P_w1" 2>/dev/null; then
    # a host that serves cuda:0: the worker registered as cuda:0 and the cluster gets ready
    "$CTL" --coordinator "$ADMIN" status --wait-ready --wait-timeout 120 >"$TMP/status.log" 2>&1 &&
        ok "cuda:0 worker from the unit's ExecStart (EPMOE_DEVICE) is ready" ||
        fail "cuda:0 worker not ready: $(tail -3 "$TMP/status.log")"
else
    wait "$P_w1"
    rc=$?
    if [ $rc -eq 78 ] && grep -q "cannot serve device cuda:0" "$TMP/w1.log" &&
        ! grep -q 'registered with device "cpu"' "$TMP/coord.log"; then
        ok "cuda:0 worker from the unit's ExecStart runs with --device cuda:0 (this host cannot serve it: exit 78, $(grep -o 'cannot serve device cuda:0: .\{0,60\}' "$TMP/w1.log" | head -1)...)"
    else
        fail "cuda:0 worker: exit $rc: $(tail -3 "$TMP/w1.log")"
    fi
fi

[ $fails -eq 0 ] && echo "test_systemd: all checks passed" || echo "test_systemd: $fails failed"
[ $fails -eq 0 ]
