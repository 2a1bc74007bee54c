#!/usr/bin/env bash
# ab_layer.sh OLD_BENCH_LAYER NEW_BENCH_LAYER [ROUNDS] [bench_layer args...] — two builds of
# bench_layer run alternately in one script (ROUNDS rounds, default 3), so both see the same
# machine; prints per (dtype, T) the best old and new ms/layer, their ratio and the route and
# SwiGLU shares (docs/performance.md). Default args: --threads 1 --cpu-time 1 --runs 3
# --tokens 1,8,64.
set -euo pipefail
old=$1 new=$2 rounds=${3:-3}
shift $(($# < 3 ? $# : 3))
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--threads 1 --cpu-time 1 --runs 3 --tokens 1,8,64)
out=$(mktemp -d /tmp/epmoe_ab_layer_XXXXXX)
for r in $(seq "$rounds"); do
    "$old" "${args[@]}" >"$out/old-$r.txt"
    "$new" "${args[@]}" >"$out/new-$r.txt"
done
python3 - "$out" "$rounds" <<'PY'
import sys, glob, collections
out, rounds = sys.argv[1], int(sys.argv[2])
best = collections.defaultdict(dict)
for which in ("old", "new"):
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{which}-{r}.txt"):
            c = [x.strip() for x in line.split("|")]
            if len(c) > 6 and c[1] in ("fp4", "fp8"):
                key = (c[1], int(c[2]))
                ms, route, swi = float(c[5]), float(c[6]), float(c[-3])
                prev = best[key].get(which)
                if prev is None or ms < prev[0]:
                    best[key][which] = (ms, route, swi)
print("| dtype | T | old ms/layer | new ms/layer | new / old | route % old / new | SwiGLU % old / new |")
print("|---|---|---|---|---|---|---|")
for key in sorted(best):
    o, n = best[key]["old"], best[key]["new"]
    print(f"| {key[0]} | {key[1]} | {o[0]:.2f} | {n[0]:.2f} | {n[0] / o[0]:.3f} | "
          f"{o[1]:.1f} / {n[1]:.1f} | {o[2]:.1f} / {n[2]:.1f} |")
PY
rm -rf "$out"
