# lib.sh — what the daemon-driving test scripts share (sourced by test_cluster.sh and
# test_trust.sh): a temporary directory, the daemons started (killed on exit), a failure count.
#
#   . "$(dirname "$0")/lib.sh" PREFIX     sets TMP (mktemp -d /tmp/PREFIX_XXXXXX), PIDS, fails
#
# Append every background daemon's pid to PIDS; end with `[ $fails -eq 0 ]` or similar.

TMP=$(mktemp -d "/tmp/${1:-epmoe_test}_XXXXXX")
PIDS=()
fails=0

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

ok() { echo "ok   $*"; }

# N free tcp ports on 127.0.0.1 (bound to port 0 and released; the race is harmless here)
free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
