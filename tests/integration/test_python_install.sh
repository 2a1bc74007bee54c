#!/usr/bin/env bash
# test_python_install.sh — `pip install ./python` as docs/python.md tells it: into a venv that
# sees Debian's numpy (--system-site-packages), with no index and no build isolation (nothing
# is downloaded; setuptools and wheel are Debian's). The installed package records the
# library it was built against, so a plain `python -c "import epmoe"` in an empty environment
# finds it and prints libepmoe's version (the header's); then examples/engine_decode.py runs
# briefly with that interpreter against its own local cluster.
#
#   test_python_install.sh LIBEPMOE BUILD_DIR
set -u
LIB=$1
BUILD=$2
SRC=${EPMOE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
"$PY" -c "import numpy, setuptools, wheel" 2>/dev/null ||
    { echo "skip: $PY lacks numpy, setuptools or wheel (./dev setup installs them)"; exit 77; }
if readelf -d "$LIB" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
    echo "skip: $LIB is built with AddressSanitizer (see test_python.sh)"
    exit 77
fi
TMP=$(mktemp -d /tmp/epmoe_pyinstall_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }

"$PY" -m venv --system-site-packages "$TMP/venv" >"$TMP/venv.log" 2>&1 ||
    { cat "$TMP/venv.log"; echo "skip: python3 -m venv does not work (apt-get install python3-venv)"; exit 77; }
cp -r "$SRC/python" "$TMP/src" # build in a copy: the checkout stays clean
if EPMOE_LIBRARY=$LIB EPMOE_CTL=$BUILD/ctl/epmoectl "$TMP/venv/bin/pip" install -q --no-index \
    --no-build-isolation "$TMP/src" >"$TMP/pip.log" 2>&1; then
    ok "pip install ./python (no index, no build isolation)"
else
    cat "$TMP/pip.log"
    fail "pip install"
    exit 1
fi
H=$SRC/client/epmoe.h
want=$(sed -n 's/^#define EPMOE_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$H" | paste -sd.)
got=$(cd "$TMP" && env -i PATH=/usr/bin:/bin "$TMP/venv/bin/python" -c "import epmoe; print(epmoe.__version__)" 2>&1)
[ "$got" = "$want" ] && ok "import epmoe in an empty environment: __version__ $got (epmoe.h: $want)" ||
    fail "epmoe.__version__: '$got', epmoe.h says $want"
where=$(cd "$TMP" && env -i PATH=/usr/bin:/bin "$TMP/venv/bin/python" -c "import epmoe; print(epmoe.__file__)")
case $where in "$TMP/venv/"*) ok "the installed package is imported ($where)" ;; *) fail "imported $where" ;; esac
"$BUILD/ctl/epmoectl" mkmodel --out "$TMP/model" --expert-dtype fp4 --experts 8 --layers 2 \
    --hash-layers 1 --mtp 1 --topk 2 --seed 5 >/dev/null || fail "mkmodel"
if (cd "$TMP" && env -i PATH=/usr/bin:/bin HOME="$TMP" "$TMP/venv/bin/python" "$SRC/examples/engine_decode.py" \
    --build "$BUILD" --model "$TMP/model" --ranks 2 --batch 4 --steps 2 --workers 2) >"$TMP/ex.log" 2>&1 &&
    grep -q "all bit-identical" "$TMP/ex.log"; then
    ok "examples/engine_decode.py with the installed package: $(grep tokens/s "$TMP/ex.log")"
else
    cat "$TMP/ex.log"
    fail "examples/engine_decode.py with the installed package"
fi
echo "$((fails == 0 ? 1 : 0)) passed, $((fails == 0 ? 0 : 1)) failed"
[ $fails -eq 0 ]
