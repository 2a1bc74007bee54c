#!/usr/bin/env bash
# check_mathf_flags.sh DEFAULT FASTFP — the layer's digests (mathf_flags_run.c) from the normal
# build and from the -ffp-contract=fast -march=native build must be the same lines.
set -euo pipefail
a=$("$1") || { echo "check_mathf_flags: $1 failed"; exit 1; }
b=$("$2") || { echo "check_mathf_flags: $2 failed"; exit 1; }
echo "$a"
if [ "$a" != "$b" ]; then
    echo "check_mathf_flags: the -ffp-contract=fast -march=native build differs:"
    diff <(echo "$a") <(echo "$b") || true
    exit 1
fi
echo "check_mathf_flags: $(echo "$a" | wc -l) digests identical"
