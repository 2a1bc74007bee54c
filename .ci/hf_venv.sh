#!/usr/bin/env bash
# hf_venv.sh — make or refresh the virtual environment with torch and transformers that ctest
# test_transformers runs in (issue 24; docs/python.md, "Engines"), and print its path.
#
#   .ci/hf_venv.sh            -> /var/cache/epmoe/venv-hf (root) or ~/.cache/epmoe/venv-hf
#
# It lives outside the checkout ($EPMOE_HF_VENV overrides), so fresh clones on one machine reuse
# it; Debian's python3 with --system-site-packages, so python3-numpy and python3-pytest stay
# visible. Idempotent: when the pinned versions are installed it only reads their metadata (about 2 s); otherwise it
# creates the venv and pip-installs the pins from PyPI. On a fresh machine that is about 7 minutes
# and 5.5 GB (torch 2.15 from PyPI pulls its CUDA runtime wheels, ~5 GB, which import fine without
# a GPU; measured on the 2-core build VM at ~100 MB/s).
set -euo pipefail
PINS=(torch==2.15.0 transformers==5.23.0 accelerate==1.15.0)
if [ -n "${EPMOE_HF_VENV:-}" ]; then
    V=$EPMOE_HF_VENV
elif [ "$(id -u)" -eq 0 ] || [ -w /var/cache/epmoe ]; then
    V=/var/cache/epmoe/venv-hf
else
    V=$HOME/.cache/epmoe/venv-hf
fi
check() {
    [ -x "$V/bin/python" ] || return 1
    "$V/bin/python" - "${PINS[@]}" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if version(name) != want:
        sys.exit(1)
import numpy, pytest  # noqa: F401,E401  (Debian's, through --system-site-packages)
PY
}
if ! check; then
    echo "hf_venv: installing ${PINS[*]} into $V" >&2
    mkdir -p "$(dirname "$V")"
    /usr/bin/python3 -m venv --system-site-packages "$V"
    "$V/bin/pip" install -q --no-cache-dir "${PINS[@]}" >&2
    check || { echo "hf_venv: $V still lacks ${PINS[*]}" >&2; exit 1; }
fi
echo "$V"
