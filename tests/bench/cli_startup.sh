#!/usr/bin/env bash
# cli_startup.sh — what one `epmoectl status` costs (wall time, peak RSS) in the default build
# against a CPU-only build of the same sources (-DEPMOE_CUDA=OFF), both asking one real
# coordinator in the same run, interleaved, N times each (docs/performance.md "CLI start-up").
# The CUDA module is opened only for a cuda:N device, so the two should cost the same; before
# it, the default build's epmoectl linked cuBLASLt (issue 17: 103 ms vs 12 ms).
#
#   tests/bench/cli_startup.sh BUILD CPU_BUILD [N]     (N default 40)
#
# BUILD: a default (CUDA) build dir with epmoectl and epmoe-coordinator; CPU_BUILD: a build dir
# with epmoectl configured -DEPMOE_CUDA=OFF. Prints the medians, their ratio and the peak RSS.
set -euo pipefail
B=$(realpath "${1:?usage: $0 BUILD CPU_BUILD [N]}")
C=$(realpath "${2:?usage: $0 BUILD CPU_BUILD [N]}")
N=${3:-40}
T=$(mktemp -d /tmp/cli_startup.XXXXXX)
cleanup() {
    [ -n "${CPID:-}" ] && kill "$CPID" 2>/dev/null && wait "$CPID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
read -r P0 P1 P2 < <(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
"$B/ctl/epmoectl" mkmodel --out "$T/m" --expert-dtype fp4 --layers 2 --hash-layers 1 --mtp 0 \
    --shards 1 --force >/dev/null
cat >"$T/spec.yaml" <<EOF
cluster: {name: startup}
coordinator: {listen: "tcp://127.0.0.1:$P0", admin: "tcp://127.0.0.1:$P1"}
model: {path: $T/m}
expert_parallel: {placement: contiguous}
nodes:
  - name: local
    workers:
      - {name: w0, device: cpu, data: "tcp://127.0.0.1:$P2"}
EOF
"$B/coordinator/epmoe-coordinator" --cluster "$T/spec.yaml" >"$T/coord.log" 2>&1 &
CPID=$!
"$B/ctl/epmoectl" --coordinator "tcp://127.0.0.1:$P1" status >/dev/null # answering
echo "default build: $(ldd "$B/ctl/epmoectl" | grep -ciE 'libcu|nccl') CUDA libraries linked; cpu-only build: $(ldd "$C/ctl/epmoectl" | grep -ciE 'libcu|nccl')"
python3 - "$B/ctl/epmoectl" "$C/ctl/epmoectl" "tcp://127.0.0.1:$P1" "$N" <<'PY'
import os, statistics, subprocess, sys, time
default, cpu, admin, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def once(ctl):
    t0 = time.perf_counter()
    p = subprocess.Popen([ctl, "--coordinator", admin, "status"], stdout=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit("%s status: exit %d" % (ctl, p.returncode))
    return dt * 1e3, ru.ru_maxrss / 1024.0

runs = {default: [], cpu: []}
for _ in range(n):  # interleaved: load on the machine hits both alike
    for ctl in (default, cpu):
        runs[ctl].append(once(ctl))
med = {k: statistics.median(t for t, _ in v) for k, v in runs.items()}
rss = {k: max(r for _, r in v) for k, v in runs.items()}
print("| build | epmoectl status, median of %d | peak RSS |" % n)
print("|---|---|---|")
print("| default (CUDA module) | %.1f ms | %.1f MiB |" % (med[default], rss[default]))
print("| cpu-only (-DEPMOE_CUDA=OFF) | %.1f ms | %.1f MiB |" % (med[cpu], rss[cpu]))
print("ratio default / cpu-only: %.2f (acceptance: <= 1.2)" % (med[default] / med[cpu]))
PY
