#!/usr/bin/env bash
# check_getenv.sh — the environment is read in one place: common/knobs.c, called once from each
# program's main (common/knobs.h). A getenv anywhere else in the product code fails the check,
# naming the file and line: a new variable gets a row in knobs.c's table (and docs/operations.md's
# Environment table, which test_knobs holds to it) and reaches its module as an option.
set -u
SRC=${EPMOE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$SRC" || exit 1
fails=0

# Files still reading the environment themselves, until their knobs arrive through their
# options. None is left: the kernels' ISA cap and the CUDA backend's tuning arrive through their
# options. An entry must still hold a getenv: one that no longer does fails too, so the list only
# shrinks.
PENDING=""

hits=$(grep -rnE '\b(secure_)?getenv[[:space:]]*\(' --include='*.c' --include='*.h' \
    --include='*.cu' --include='*.cuh' --include='*.cpp' \
    common coordinator worker ctl client shard kernels proto | grep -v '^common/knobs\.c:')
for f in $PENDING; do
    if ! grep -q "^$f:" <<<"$hits"; then
        echo "FAIL $f reads no environment any more: take it off check_getenv.sh's PENDING list"
        fails=$((fails + 1))
    fi
done
for f in $PENDING; do
    hits=$(grep -v "^$f:" <<<"$hits")
done
if [ -n "$hits" ]; then
    echo "FAIL getenv outside common/knobs.c (give the variable a row in knobs.c and pass it down):"
    echo "$hits" | sed 's/^/    /'
    fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] && echo "ok: the environment is read only by common/knobs.c"
exit $((fails > 0))
