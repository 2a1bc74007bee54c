#!/usr/bin/env bash
# test_client_exports.sh — libepmoe exports epmoe_* and nothing else (client/epmoe.map,
# -fvisibility=hidden): the project's static libraries linked into it (wire_*, auth_*, ep_*,
# protobuf-c descriptors) must stay local, or an engine linking its own copy of them would
# bind to ours. Also checks the SONAME.
#
#   test_client_exports.sh PATH/libepmoe.so
set -u
lib=$1
command -v nm >/dev/null || { echo "skip: nm not installed"; exit 77; }
syms=$(nm -D --defined-only "$lib" | awk '{print $NF}')
[ -n "$syms" ] || { echo "FAIL: $lib exports nothing"; exit 1; }
bad=$(echo "$syms" | grep -v '^epmoe_' || true)
if [ -n "$bad" ]; then
    echo "FAIL: $lib exports symbols outside epmoe_*:"
    echo "$bad" | head -20
    exit 1
fi
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libepmoe.so.0 ] || { echo "FAIL: SONAME is \"$soname\", expected libepmoe.so.0"; exit 1; }
echo "ok: $(echo "$syms" | wc -l) symbols, all epmoe_*; SONAME $soname"
