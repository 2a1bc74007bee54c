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
#   - the same-host ipc:// client entry (issue 23, point 4): the spec example's socket directory is
#     one the worker unit may write, the sysusers/tmpfiles snippets (applied to a scratch root)
#     make it with a group of its own, and a worker run with the unit's user, group and umask
#     answers an engine user in that group and nobody else (see ipc_entry below).
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

# ---- the same-host ipc:// client entry, as the units run it (issue 23, point 4) ------------------
# No systemd runs here (PID 1 is not systemd, so no systemd-run or nspawn): what the units and
# snippets produce is checked instead. The shipped sysusers.d and tmpfiles.d snippets are applied
# to a scratch root (systemd-sysusers / systemd-tmpfiles --root: the users, groups, directory,
# mode and owner a host gets at boot); the spec example's client socket must lie in a directory
# the worker unit may write under ProtectSystem=strict; a worker runs with the unit's User=,
# Group= and UMask= (setpriv, as root) and binds the example's socket; an engine running as
# another user in the directory's group is answered byte-identical to forward --local, and a
# user outside it is not. Needs root (setpriv); skipped otherwise.
ipc_entry() {
    local root=$TMP/iroot ex dir p writable=0 uid gid dgid dgroup ports2 spec2 mode
    ex=$(grep -o 'client: "ipc://[^"]*"' "$SRC/docs/cluster-spec.md" | head -1 | sed 's#client: "ipc://\(.*\)"#\1#')
    dir=$(dirname "$ex")
    [ -n "$ex" ] || { fail "docs/cluster-spec.md has no ipc:// client example"; return; }
    for p in $(sed -n 's/^ReadWritePaths=//p' "$UNITS/epmoe-worker@.service"); do
        p=${p#-}
        [[ "$dir/" == "$p/"* ]] && writable=1
    done
    for p in $(sed -n 's/^RuntimeDirectory=//p' "$UNITS/epmoe-worker@.service"); do
        p=/run/${p//%i/$(basename "$ex" .client)}
        [[ "$dir/" == "$p/"* ]] && writable=1
    done
    [ $writable = 1 ] && ok "the spec example's client socket $ex: the worker unit may write $dir (ReadWritePaths/RuntimeDirectory under ProtectSystem=strict)" ||
        fail "the spec example's client socket $ex: the worker unit cannot write $dir (ProtectSystem=strict; ReadWritePaths: $(sed -n 's/^ReadWritePaths=//p' "$UNITS/epmoe-worker@.service" | tr '\n' ' '), RuntimeDirectory: $(sed -n 's/^RuntimeDirectory=//p' "$UNITS/epmoe-worker@.service"))"
    mkdir -p "$root/etc"
    systemd-sysusers --root="$root" "$SRC/deploy/sysusers.d/epmoe.conf" >"$TMP/sysusers.log" 2>&1 ||
        fail "systemd-sysusers: $(tail -2 "$TMP/sysusers.log")"
    systemd-tmpfiles --create --root="$root" "$SRC/deploy/tmpfiles.d/epmoe.conf" >"$TMP/tmpfiles.log" 2>&1 ||
        fail "systemd-tmpfiles: $(tail -2 "$TMP/tmpfiles.log")"
    uid=$(awk -F: -v u="$(sed -n 's/^User=//p' "$UNITS/epmoe-worker@.service")" '$1 == u { print $3 }' "$root/etc/passwd")
    gid=$(awk -F: -v g="$(sed -n 's/^Group=//p' "$UNITS/epmoe-worker@.service")" '$1 == g { print $3 }' "$root/etc/group")
    [ -n "$uid" ] && [ -n "$gid" ] || { fail "the unit's User/Group are not made by sysusers.d"; return; }
    if [ ! -d "$root$dir" ]; then
        fail "no shipped tmpfiles.d line makes $dir: created here 0755 for the unit's user, as a RuntimeDirectory would be"
        mkdir -p "$root$dir"
        chown "$uid:$gid" "$root$dir"
    fi
    dgid=$(stat -c %g "$root$dir")
    dgroup=$(awk -F: -v g="$dgid" '$3 == g { print $1 }' "$root/etc/group")
    echo "     $dir: $(stat -c '%A' "$root$dir") $(awk -F: -v u="$(stat -c %u "$root$dir")" '$3 == u { print $1 }' "$root/etc/passwd"):$dgroup"
    [ "$dgid" != "$gid" ] || fail "$dir belongs to the daemons' own group $dgroup: an engine in it could read /etc/epmoe and its keys"
    # a cluster whose worker a0 binds the example's socket (under the scratch root)
    chmod 0755 "$TMP" # the worker's user reads the model
    mkdir -p "$TMP/engine" && chmod 0777 "$TMP/engine"
    "$CTL" mkinput --model "$M" --tokens 16 --seed 3 --out "$TMP/engine/in.st" >/dev/null || fail "mkinput"
    "$CTL" forward --local --model "$M" --layer 1 --input "$TMP/engine/in.st" --output "$TMP/engine/ref.st" >/dev/null ||
        fail "forward --local"
    read -r -a ports2 <<<"$(free_ports 3)"
    spec2=$TMP/ipc.yaml
    cat >"$spec2" <<EOF2
cluster: {name: ipcentry}
coordinator: {listen: "tcp://127.0.0.1:${ports2[0]}", admin: "tcp://127.0.0.1:${ports2[1]}", heartbeat_ms: 200, liveness: 10}
model: {path: $M}
expert_parallel: {placement: contiguous}
nodes:
  - name: local
    workers:
      - {name: a0, device: cpu, data: "tcp://127.0.0.1:${ports2[2]}", client: "ipc://$root$ex"}
EOF2
    env -u EPMOE_KEY -u EPMOE_SERVER_KEY "$COORD" --cluster "$spec2" >"$TMP/ipc.coord.log" 2>&1 &
    PIDS+=($!)
    (
        umask "$(sed -n 's/^UMask=//p' "$UNITS/epmoe-worker@.service")"
        exec setpriv --reuid="$uid" --regid="$gid" --clear-groups "$WORKER" \
            --coordinator "tcp://127.0.0.1:${ports2[0]}" --name a0 --threads 1
    ) >"$TMP/ipc.a0.log" 2>&1 &
    PIDS+=($!)
    local adm="tcp://127.0.0.1:${ports2[1]}"
    env -u EPMOE_KEY -u EPMOE_SERVER_KEY "$CTL" --coordinator "$adm" status --wait-ready --wait-timeout 60 \
        >"$TMP/ipc.status" 2>&1 || { fail "ipc cluster not ready: $(tail -3 "$TMP/ipc.a0.log")"; return; }
    mode=$(stat -c '%A %u:%g' "$root$ex" 2>/dev/null) # as the scratch root names them:
    mode=$(echo "$mode" | awk -v p="$root/etc/passwd" -v g="$root/etc/group" '
        BEGIN { FS = ":"; while ((getline l < p) > 0) { split(l, f, ":"); u[f[3]] = f[1] }
                while ((getline l < g) > 0) { split(l, f, ":"); gr[f[3]] = f[1] } }
        { split($0, a, " "); split(a[2], o, ":"); print a[1], (o[1] in u ? u[o[1]] : o[1]) ":" (o[2] in gr ? gr[o[2]] : o[2]) }')
    echo "     $ex: $mode"
    # the engine: another user, in the directory's group
    if setpriv --reuid=4242 --regid=4242 --groups="$dgid" env -u EPMOE_KEY -u EPMOE_SERVER_KEY \
        "$CTL" --coordinator "$adm" --timeout 5000 forward --entry a0 --layer 1 \
        --input "$TMP/engine/in.st" --output "$TMP/engine/out.st" >"$TMP/engine.log" 2>&1 &&
        cmp -s "$TMP/engine/out.st" "$TMP/engine/ref.st"; then
        ok "an engine user in $dgroup submits at $ex (socket $mode): byte-identical to forward --local"
    else
        fail "an engine user in group $dgroup cannot submit at $ex (socket $mode): $(tail -2 "$TMP/engine.log")"
    fi
    # a user outside the group: connect is refused (ZeroMQ retries it in silence: a timeout)
    if setpriv --reuid=4343 --regid=4343 --clear-groups env -u EPMOE_KEY -u EPMOE_SERVER_KEY \
        "$CTL" --coordinator "$adm" --timeout 1500 forward --entry a0 --layer 1 \
        --input "$TMP/engine/in.st" --output "$TMP/engine/out2.st" >"$TMP/stranger.log" 2>&1; then
        fail "a user outside $dgroup was answered at $ex (socket $mode)"
    else
        ok "a user outside $dgroup is not answered at $ex: $(tail -1 "$TMP/stranger.log" | cut -c1-100)"
    fi
    env -u EPMOE_KEY -u EPMOE_SERVER_KEY "$CTL" --coordinator "$adm" shutdown >/dev/null 2>&1
}
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && command -v systemd-tmpfiles >/dev/null; then
    ipc_entry
else
    echo "skip: the ipc:// entry check needs root, setpriv and systemd-tmpfiles"
fi

[ $fails -eq 0 ] && echo "test_systemd: all checks passed" || echo "test_systemd: $fails failed"
[ $fails -eq 0 ]
