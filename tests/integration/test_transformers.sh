#!/usr/bin/env bash
# test_transformers.sh — Hugging Face transformers' DeepSeek V4 on epmoe (issue 24; docs/python.md,
# "Engines"): python/tests/test_transformers.py with a Python that has torch and transformers —
# `epmoectl mkmodel --full` checkpoints loaded by transformers with nothing missing, each MoE layer
# kind against transformers' modules, generate() of a batch through a real cluster with the MoE
# bit-identical per row, logits.
#
#   test_transformers.sh LIBEPMOE BUILD_DIR
#
# The Python: $EPMOE_HF_PYTHON, else that of the venv .ci/hf_venv.sh makes ($EPMOE_HF_VENV, else
# /var/cache/epmoe/venv-hf, else ~/.cache/epmoe/venv-hf). Skipped (77) with the reason where it
# lacks torch or transformers (a plain ./dev test), and in a sanitizer build (see test_python.sh).
set -u
LIB=$1
BUILD=$2
SRC=${EPMOE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
V=${EPMOE_HF_VENV:-/var/cache/epmoe/venv-hf}
[ -n "${EPMOE_HF_VENV:-}" ] || [ -x "$V/bin/python" ] || V=$HOME/.cache/epmoe/venv-hf
PY=${EPMOE_HF_PYTHON:-$V/bin/python}
if ! [ -x "$PY" ] || ! "$PY" -c "import torch, transformers, accelerate, numpy, pytest" 2>/dev/null; then
    echo "skip: $PY lacks torch, transformers, accelerate, numpy or pytest (.ci/run makes that venv)"
    exit 77
fi
if readelf -d "$LIB" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
    echo "skip: $LIB is built with AddressSanitizer; the Python tests run in the normal build"
    exit 77
fi
TMP=$(mktemp -d /tmp/epmoe_transformers_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export EPMOE_LIBRARY=$LIB EPMOE_BUILD_DIR=$BUILD PYTHONPATH=$SRC/python PYTHONDONTWRITEBYTECODE=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
"$PY" -m pytest -q -s -p no:cacheprovider --basetemp="$TMP/pytest" -o addopts="" \
    "$SRC/python/tests/test_transformers.py"
