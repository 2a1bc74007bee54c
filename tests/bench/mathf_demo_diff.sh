#!/usr/bin/env bash
# mathf_demo_diff.sh OLD_EPMOECTL NEW_EPMOECTL [OUT_DIR] — the demo model (deploy/demo.sh's
# mkmodel parameters, both expert dtypes, 64 tokens, seed 7) through every layer with
# `forward --local` of two builds, and `epmoectl diff` of each pair: how the layer's output
# changed between them (docs/numerics.md §6: glibc's expf/log1pf replaced by kernels/mathf.c).
set -euo pipefail
old=$1 new=$2 out=${3:-$(mktemp -d /tmp/epmoe_mathf_demo_XXXXXX)}
mkdir -p "$out"
status=0
for dt in fp4 fp8; do
    m="$out/model-$dt"
    "$new" mkmodel --out "$m" --expert-dtype "$dt" --force --hidden 1024 --inter 512 \
        --experts 16 --layers 4 --hash-layers 1 --mtp 1 --seed 2026 >/dev/null
    "$new" mkinput --model "$m" --tokens 64 --seed 7 --out "$out/in.st" >/dev/null
    for layer in 0 1 2 3 mtp.0; do
        "$old" forward --local --model "$m" --layer "$layer" --input "$out/in.st" \
            --output "$out/old-$dt-$layer.st" >/dev/null
        "$new" forward --local --model "$m" --layer "$layer" --input "$out/in.st" \
            --output "$out/new-$dt-$layer.st" >/dev/null
        if cmp -s "$out/old-$dt-$layer.st" "$out/new-$dt-$layer.st"; then
            echo "$dt layer $layer: identical"
        else
            echo "$dt layer $layer: differs"
            "$new" diff "$out/old-$dt-$layer.st" "$out/new-$dt-$layer.st" || true
            status=1
        fi
    done
done
exit $status
