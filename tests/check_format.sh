#!/usr/bin/env bash
# check_format.sh — every C, CUDA and C++ file tracked by git is formatted as .clang-format says
# (the style is enforced mechanically, not by review). Exits 77 (skipped) without clang-format
# or outside a git checkout.
set -u
cd "${EPMOE_SOURCE_DIR:-$(dirname "$0")/..}" || exit 1
command -v clang-format >/dev/null || { echo "skip: clang-format not installed"; exit 77; }
files=$(git ls-files '*.c' '*.h' '*.cu' '*.cpp' 2>/dev/null) || { echo "skip: not a git checkout"; exit 77; }
[ -n "$files" ] || { echo "skip: no files"; exit 77; }
bad=0
for f in $files; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "not formatted: $f (run clang-format -i $f)"
        bad=1
    fi
done
[ $bad -eq 0 ] && echo "all $(echo "$files" | wc -w) files formatted"
exit $bad
