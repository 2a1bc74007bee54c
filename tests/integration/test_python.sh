#!/usr/bin/env bash
# test_python.sh — the epmoe Python package (python/, docs/python.md): its pytest suite
# (python/tests) against real clusters that its fixtures start on free loopback ports: every
# layer of fp4 and fp8 checkpoints bit-identical to `epmoectl forward --local`, requests in
# flight from threads and asyncio tasks, numpy/buffer/DLPack inputs, every error class from a
# real failure, the admin verbs, examples/engine_decode.py.
#
#   test_python.sh LIBEPMOE BUILD_DIR
#
# Skipped (77) without python3-numpy and python3-pytest (./dev setup installs both), and in a
# sanitizer build: that libepmoe needs ASan's runtime loaded before anything else, which a
# Python interpreter (not built with ASan) can only get through LD_PRELOAD, and then ASan
# reports CPython's and numpy's own allocations at exit; the C tests cover the library there.
set -u
LIB=$1
BUILD=$2
SRC=${EPMOE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3 # Debian's, with python3-numpy, not a pyenv shim
if ! "$PY" -c "import numpy, pytest" 2>/dev/null; then
    echo "skip: $PY lacks numpy or pytest (apt-get install python3-numpy python3-pytest)"
    exit 77
fi
if readelf -d "$LIB" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
    echo "skip: $LIB is built with AddressSanitizer; the Python tests run in the normal build"
    exit 77
fi
TMP=$(mktemp -d /tmp/epmoe_python_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export EPMOE_LIBRARY=$LIB EPMOE_BUILD_DIR=$BUILD PYTHONPATH=$SRC/python PYTHONDONTWRITEBYTECODE=1
"$PY" -m pytest -q -p no:cacheprovider --basetemp="$TMP/pytest" -o addopts="" "$SRC/python/tests"
