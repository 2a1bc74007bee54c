#!/usr/bin/env bash
# test_cuda_module.sh — the binaries link no CUDA library; a cuda:N device opens the CUDA module
# (libepmoe_cuda.so) at run time (kernels/cuda/cuda_module.c), and when it cannot, says which
# library and why:
#   - ldd of epmoectl, epmoe-worker and epmoe-coordinator shows no libcuda*, libcublas*,
#     libcudart* or libnccl* (the default build linked cuBLASLt into epmoectl and the worker:
#     each start paid for it, and neither ran on a host without CUDA 13);
#   - in a CUDA build the module exports exactly one symbol (epmoe_cudev_module) and is the one
#     that links cuBLASLt;
#   - a cuda:0 request with the module missing (EPMOE_CUDA_MODULE=/nonexistent/...) or a file
#     that is not the module fails naming it: epmoectl forward --local exits with the message,
#     epmoe-worker exits 78 before it registers; in a build without CUDA the message says the
#     build has none;
#   - installed (cmake --install), the module lands in <libdir>/epmoe and the installed
#     epmoectl finds it through its $ORIGIN RUNPATH.
#
# usage: test_cuda_module.sh PATH/TO/epmoectl PATH/TO/epmoe-worker PATH/TO/epmoe-coordinator
#                            MODULE|none
set -u
CTL=${1:?usage: $0 CTL WORKER COORD MODULE|none}
WORKER=${2:?}
COORD=${3:?}
MODULE=${4:?}
T=$(mktemp -d /tmp/test_cuda_module.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }
CUDA_LIBS='lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|nvJitLink)[^ ]*\.so'

for b in "$CTL" "$WORKER" "$COORD"; do
    linked=$(ldd "$b" | grep -E "$CUDA_LIBS" | awk '{print $1}' | tr '\n' ' ')
    [ -z "$linked" ] && ok "$(basename "$b") links no CUDA library" ||
        fail "$(basename "$b") links $linked"
done

if [ "$MODULE" != none ]; then
    syms=$(nm -D --defined-only "$MODULE" | awk '$2 ~ /^[TDBR]$/ {print $3}' | tr '\n' ' ')
    [ "$syms" = "epmoe_cudev_module " ] && ok "the module exports only epmoe_cudev_module" ||
        fail "the module exports: $syms"
    ldd "$MODULE" | grep -q libcublasLt && ok "the module links cuBLASLt" ||
        fail "the module does not link cuBLASLt: $(ldd "$MODULE" | head -5)"
fi

"$CTL" mkmodel --out "$T/m" --expert-dtype fp4 --layers 2 --hash-layers 1 --mtp 0 --shards 1 \
    --force >/dev/null || fail "mkmodel"
"$CTL" mkinput --model "$T/m" --tokens 4 --out "$T/in.st" >/dev/null || fail "mkinput"

# local_cuda ENV...: forward --local on cuda:0 with ENV; its stderr in $T/err, exit code echoed
local_cuda() {
    env "$@" "$CTL" forward --local --device cuda:0 --model "$T/m" --layer 0 --input "$T/in.st" \
        --output "$T/out.st" >/dev/null 2>"$T/err"
    echo $?
}
if [ "$MODULE" = none ]; then
    rc=$(local_cuda EPMOE_CUDA_MODULE=)
    [ "$rc" -ne 0 ] && grep -q "this build of epmoe has no CUDA support" "$T/err" &&
        ok "a build without CUDA says so for cuda:0 (exit $rc)" ||
        fail "cuda:0 in a build without CUDA: exit $rc: $(cat "$T/err")"
else
    rc=$(local_cuda EPMOE_CUDA_MODULE=/nonexistent/libepmoe_cuda.so)
    [ "$rc" -ne 0 ] && grep -q "/nonexistent/libepmoe_cuda.so cannot be loaded" "$T/err" &&
        ok "missing module: forward --local exits $rc naming it: $(cut -c1-110 "$T/err")..." ||
        fail "missing module: exit $rc: $(cat "$T/err")"
    # a shared library that is not the module (libzmq: every build has it)
    other=$(ldd "$CTL" | awk '/libzmq/ {print $3}')
    rc=$(local_cuda EPMOE_CUDA_MODULE="$other")
    [ "$rc" -ne 0 ] && grep -q "has no epmoe_cudev_module: not epmoe's CUDA module" "$T/err" &&
        ok "a library that is not the module is refused (exit $rc)" ||
        fail "not the module ($other): exit $rc: $(cat "$T/err")"
    # the worker checks its device before it registers: exit 78, no coordinator needed
    EPMOE_CUDA_MODULE=/nonexistent/libepmoe_cuda.so timeout 20 "$WORKER" \
        --coordinator tcp://127.0.0.1:9 --name w0 --device cuda:0 >"$T/w.log" 2>&1
    rc=$?
    [ $rc -eq 78 ] && grep -q "/nonexistent/libepmoe_cuda.so cannot be loaded" "$T/w.log" &&
        ok "missing module: epmoe-worker --device cuda:0 exits 78 naming it" ||
        fail "missing module: worker exit $rc: $(tail -2 "$T/w.log")"
    # and the module found the normal way: loaded (then the device answers, or the host has none)
    rc=$(local_cuda EPMOE_CUDA_MODULE=)
    if [ "$rc" -eq 0 ]; then
        ok "cuda:0 forward --local ran through the module (this host has a GPU)"
    elif grep -q "cannot be loaded" "$T/err"; then
        fail "the build's own module was not found: $(cat "$T/err")"
    else
        ok "the build's module loads (this host has no usable GPU: $(cut -c1-90 "$T/err")...)"
    fi
fi

# installed (cmake --install): the module in <libdir>/epmoe, found through $ORIGIN, no env
if [ "$MODULE" != none ] && [ -n "${EPMOE_BINARY_DIR:-}" ]; then
    if cmake --install "$EPMOE_BINARY_DIR" --prefix "$T/inst" >"$T/install.log" 2>&1; then
        inst=$(find "$T/inst" -path '*/epmoe/libepmoe_cuda.so' | head -1)
        [ -n "$inst" ] && ok "cmake --install puts the module in ${inst#"$T"/inst/}" ||
            fail "the module is not installed: $(find "$T/inst" -name '*.so')"
        CTL=$T/inst/bin/epmoectl
        rc=$(local_cuda EPMOE_CUDA_MODULE= LD_LIBRARY_PATH=)
        if [ "$rc" -ne 0 ] && grep -q "cannot be loaded" "$T/err"; then
            fail "the installed epmoectl does not find the installed module: $(cat "$T/err")"
        else
            ok "the installed epmoectl finds the installed module (\$ORIGIN RUNPATH)"
        fi
    else
        fail "cmake --install: $(tail -3 "$T/install.log")"
    fi
fi

[ $fails -eq 0 ] && echo "test_cuda_module: all checks passed" || echo "test_cuda_module: $fails failed"
[ $fails -eq 0 ]
