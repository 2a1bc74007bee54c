#!/usr/bin/env bash
# test_client_install.sh — libepmoe as an engine gets it (docs/client.md "Building against
# libepmoe"): `cmake --install` into a temporary prefix puts <epmoe.h>, libepmoe.so.0 and
# epmoe.pc and share/doc/epmoe/examples/client_example.c there; the installed example compiles
# with `pkg-config --cflags --libs epmoe` alone and links the installed library (SONAME
# libepmoe.so.0); then it runs against a real cluster (cluster_lib.sh: a coordinator and 2
# workers on loopback) and must answer every layer, found through LD_LIBRARY_PATH and, built
# with an rpath (docs/client.md "Building against libepmoe"), with no environment at all. The
# daemons and the library say one version.
#
#   test_client_install.sh BUILD_DIR CTL_DIR COORDINATOR WORKER
set -u
BUILD=$1
CTL=$2/epmoectl
COORD=$3
WORKER=$4
SRC=${EPMOE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
TMP=$(mktemp -d /tmp/epmoe_client_install_XXXXXX)
PIDS=()
fails=0
# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"
command -v pkg-config >/dev/null || { echo "skip: pkg-config not installed"; exit 77; }

PREFIX=$TMP/prefix
cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" 2>&1 ||
    { cat "$TMP/install.log"; fail "cmake --install"; exit 1; }
[ -f "$PREFIX/include/epmoe.h" ] && ok "installed include/epmoe.h" || fail "no include/epmoe.h"
PC=$(find "$PREFIX" -name epmoe.pc | head -1)
LIB=$(find "$PREFIX" -name 'libepmoe.so.0' | head -1)
[ -n "$PC" ] && [ -n "$LIB" ] && ok "installed $(basename "$LIB") and epmoe.pc" ||
    { fail "no epmoe.pc or libepmoe.so.0 under $PREFIX"; exit 1; }
# the installed epmoectl (a libepmoe client itself) finds the installed library on its own
"$PREFIX/bin/epmoectl" --version >/dev/null 2>"$TMP/ver.err" && ok "the installed epmoectl finds libepmoe" ||
    fail "the installed epmoectl does not start: $(cat "$TMP/ver.err")"
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$PC")
[ "$(pkg-config --modversion epmoe)" = 0.4.0 ] && ok "pkg-config --modversion epmoe: 0.4.0" ||
    fail "pkg-config --modversion epmoe: $(pkg-config --modversion epmoe 2>&1)"
# the .pc finds the prefix it was installed to, wherever that is (${pcfiledir})
inc=$(pkg-config --variable=includedir epmoe)
[ "$(realpath "$inc")" = "$(realpath "$PREFIX/include")" ] &&
    ok "pkg-config's includedir is the prefix's" || fail "pkg-config includedir: $inc"
# shellcheck disable=SC2046
# a sanitizer build's library needs a program built the same way (ASan's runtime comes first)
SAN=
readelf -d "$LIB" | grep -q 'NEEDED.*libasan' && SAN="-fsanitize=address,undefined"
EXAMPLE=$PREFIX/share/doc/epmoe/examples/client_example.c
[ -f "$EXAMPLE" ] && cmp -s "$EXAMPLE" "$SRC/examples/client_example.c" &&
    ok "installed share/doc/epmoe/examples/client_example.c" ||
    { fail "no share/doc/epmoe/examples/client_example.c under $PREFIX"; EXAMPLE=$SRC/examples/client_example.c; }
# docs/client.md's complete example is this file
sed -n '/^## Example/,$p' "$SRC/docs/client.md" | sed -n '/^```c$/,/^```$/p' | sed '1d;$d' >"$TMP/doc_example.c"
cmp -s "$TMP/doc_example.c" "$SRC/examples/client_example.c" &&
    ok "docs/client.md's example is examples/client_example.c" ||
    fail "docs/client.md's example differs from examples/client_example.c"
for bin in epmoectl epmoe-coordinator epmoe-worker; do
    v=$("$PREFIX/bin/$bin" --version 2>/dev/null | head -1)
    [[ "$v" == "$bin $(pkg-config --modversion epmoe) "* ]] && ok "$bin --version: $v" ||
        fail "$bin --version says \"$v\", libepmoe $(pkg-config --modversion epmoe)"
done
if cc -std=c11 -Wall -Wextra -Werror $SAN "$EXAMPLE" \
    $(pkg-config --cflags --libs epmoe) -o "$TMP/client_example" 2>"$TMP/cc.log" &&
    cc -std=c11 -Wall -Wextra -Werror $SAN "$EXAMPLE" $(pkg-config --cflags --libs epmoe) \
        -Wl,-rpath,"$(pkg-config --variable=libdir epmoe)" -o "$TMP/client_example_rpath" \
        2>>"$TMP/cc.log"; then
    ok "client_example builds with pkg-config --cflags --libs epmoe"
else
    cat "$TMP/cc.log"
    fail "client_example does not build against the installed library"
    exit 1
fi
readelf -d "$TMP/client_example" | grep -q 'NEEDED.*\[libepmoe.so.0\]' &&
    ok "client_example needs libepmoe.so.0" || fail "client_example does not need libepmoe.so.0"

# ---- against a cluster -------------------------------------------------------------------
"$CTL" mkmodel --out "$TMP/model" --expert-dtype fp4 --experts 8 --layers 2 --hash-layers 1 \
    --mtp 1 --topk 2 --seed 3 >/dev/null || { fail "mkmodel"; exit 1; }
start_cluster install "$TMP/model" 2 fp8 || exit 1
LD_LIBRARY_PATH=$(dirname "$LIB") "$TMP/client_example" "$ADMIN" 4 >"$TMP/run.log" 2>&1
rc=$?
cat "$TMP/run.log"
[ $rc -eq 0 ] && ok "client_example answered every layer" || fail "client_example exited $rc"
env -u LD_LIBRARY_PATH "$TMP/client_example_rpath" "$ADMIN" 2 >"$TMP/run2.log" 2>&1 &&
    ok "client_example built with -Wl,-rpath finds the library with no LD_LIBRARY_PATH" ||
    { cat "$TMP/run2.log"; fail "client_example with an rpath exited $?"; }
stop_cluster install
[ $fails -eq 0 ] && echo "all ok" || echo "$fails failed"
[ $fails -eq 0 ]
