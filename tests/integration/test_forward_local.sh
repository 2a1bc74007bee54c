#!/usr/bin/env bash
# test_forward_local.sh — `epmoectl forward --local` end to end on a generated checkpoint:
# outputs byte-identical to moe_forward in-process for hash, score and MTP layers (BF16 and F32
# inputs, I64 and I32 ids, every --layer spelling), and each bad input refused with the right
# exit code and a message naming the problem.
#
#   test_forward_local.sh EPMOECTL FWD_FIXTURE
set -u
EPMOECTL=$1
FIXTURE=$2
TMP=$(mktemp -d /tmp/epmoe_fwd_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0

"$FIXTURE" "$TMP" || { echo "FAIL: fwd_fixture"; exit 1; }
M=$TMP/model

# expect CODE NEEDLE -- ARGS...: run epmoectl forward, check the exit code and that stderr
# (or stdout for code 0) contains NEEDLE.
expect() {
    local code=$1 needle=$2
    shift 3
    local out rc
    out=$("$EPMOECTL" "$@" 2>&1)
    rc=$?
    if [ "$rc" -ne "$code" ]; then
        echo "FAIL: epmoectl $*: exit $rc, expected $code"
        echo "  output: $out"
        fails=$((fails + 1))
    elif [[ "$out" != *"$needle"* ]]; then
        echo "FAIL: epmoectl $*: output lacks \"$needle\""
        echo "  output: $out"
        fails=$((fails + 1))
    else
        echo "ok   [$code] $*"
    fi
}

same() {
    if cmp -s "$1" "$2"; then
        echo "ok   $(basename "$1") == $(basename "$2")"
    else
        echo "FAIL: $1 differs from $2"
        fails=$((fails + 1))
    fi
}

fwd() { echo forward --local --model "$M" "$@"; }

# ---- results ----
expect 0 "5 tokens through layers.0" -- $(fwd --layer 0 --input "$TMP/in_bf16.safetensors" --output "$TMP/o0.safetensors")
same "$TMP/o0.safetensors" "$TMP/expect_layers.0.safetensors"
expect 0 "layers.0" -- $(fwd --layer layers.0 --input "$TMP/in_f32.safetensors" --output "$TMP/o0f.safetensors" --threads 2)
same "$TMP/o0f.safetensors" "$TMP/expect_layers.0.safetensors"
expect 0 "layers.1" -- $(fwd --layer layers.1 --input "$TMP/in_bf16.safetensors" --output "$TMP/o1.safetensors" --threads 1)
same "$TMP/o1.safetensors" "$TMP/expect_layers.1.safetensors"
# score layers need no ids
expect 0 "layers.1" -- $(fwd --layer 1 --input "$TMP/in_noids.safetensors" --output "$TMP/o1n.safetensors")
same "$TMP/o1n.safetensors" "$TMP/expect_layers.1.safetensors"
expect 0 "mtp.0" -- $(fwd --layer mtp.0 --input "$TMP/in_bf16.safetensors" --output "$TMP/om.safetensors")
same "$TMP/om.safetensors" "$TMP/expect_mtp.0.safetensors"
expect 0 "mtp.0" -- $(fwd --layer 3 --input "$TMP/in_noids.safetensors" --output "$TMP/om3.safetensors")
same "$TMP/om3.safetensors" "$TMP/expect_mtp.0.safetensors"
# every instruction set gives the same bytes: EPMOE_ISA caps the choice (a cap above what the CPU
# has runs the widest it has, so every value is a valid run)
for isa in ref avx2 avx512; do
    export EPMOE_ISA=$isa
    expect 0 "layers.0" -- $(fwd --layer 0 --input "$TMP/in_bf16.safetensors" --output "$TMP/o0_$isa.safetensors" --threads 2)
    same "$TMP/o0_$isa.safetensors" "$TMP/expect_layers.0.safetensors"
    expect 0 "layers.1" -- $(fwd --layer 1 --input "$TMP/in_bf16.safetensors" --output "$TMP/o1_$isa.safetensors" --threads 2)
    same "$TMP/o1_$isa.safetensors" "$TMP/expect_layers.1.safetensors"
    unset EPMOE_ISA
done
expect 0 '"schema":1' -- -o json $(fwd --layer 1 --input "$TMP/in_bf16.safetensors" --output "$TMP/oj.safetensors")
expect 0 '"layer":"layers.1"' -- -o json $(fwd --layer 1 --input "$TMP/in_bf16.safetensors" --output "$TMP/oj.safetensors")

# ---- bad input data: 65 ----
expect 65 'tensor "hidden_states" is missing' -- $(fwd --layer 1 --input "$TMP/in_nohidden.safetensors" --output "$TMP/x.safetensors")
expect 65 'tensor "hidden_states": dtype I32, expected BF16 or F32' -- $(fwd --layer 1 --input "$TMP/in_i32hidden.safetensors" --output "$TMP/x.safetensors")
expect 65 "the model's hidden_size is 256, the input has 128 channels" -- $(fwd --layer 1 --input "$TMP/in_badH.safetensors" --output "$TMP/x.safetensors")
expect 65 'tensor "input_ids" is missing: layer layers.0 routes by token id' -- $(fwd --layer 0 --input "$TMP/in_noids.safetensors" --output "$TMP/x.safetensors")
expect 65 'tensor "input_ids": element 2 is 500, outside the vocabulary [0, 500)' -- $(fwd --layer 0 --input "$TMP/in_badid.safetensors" --output "$TMP/x.safetensors")
expect 65 'tensor "input_ids": shape [4], expected [5]' -- $(fwd --layer 0 --input "$TMP/in_idshape.safetensors" --output "$TMP/x.safetensors")
expect 65 "model.safetensors" -- $(fwd --layer 1 --input "$TMP/model/model.safetensors" --output "$TMP/x.safetensors")
[ ! -e "$TMP/x.safetensors" ] || { echo "FAIL: an output was written for a bad input"; fails=$((fails + 1)); }

# ---- missing files: 66; bad config: 78; usage: 64; unwritable output: 73 ----
expect 66 "in_nothere.safetensors" -- $(fwd --layer 1 --input "$TMP/in_nothere.safetensors" --output "$TMP/x.safetensors")
expect 66 "nomodel" -- forward --local --model "$TMP/nomodel" --layer 1 --input "$TMP/in_bf16.safetensors" --output "$TMP/x.safetensors"
expect 66 "config.json" -- forward --local --model "$TMP" --layer 1 --input "$TMP/in_bf16.safetensors" --output "$TMP/x.safetensors"
expect 78 "config.json:2" -- forward --local --model "$TMP/badcfg" --layer 1 --input "$TMP/in_bf16.safetensors" --output "$TMP/x.safetensors"
expect 64 "layers.9" -- $(fwd --layer layers.9 --input "$TMP/in_bf16.safetensors" --output "$TMP/x.safetensors")
# without --local the request goes to the cluster, which takes no --model
expect 64 "--model is for --local only" -- forward --model "$M" --layer 1 --input "$TMP/in_bf16.safetensors" --output "$TMP/x.safetensors"
expect 64 "--output is required" -- $(fwd --layer 1 --input "$TMP/in_bf16.safetensors")
expect 64 "--threads 0" -- $(fwd --layer 1 --input "$TMP/in_bf16.safetensors" --output "$TMP/x.safetensors" --threads 0)
expect 73 "/nonexistent-dir/o.safetensors" -- $(fwd --layer 1 --input "$TMP/in_bf16.safetensors" --output /nonexistent-dir/o.safetensors)
expect 0 "usage: epmoectl forward" -- forward --help

# ---- checkpoints from `epmoectl mkmodel` (sharded, both expert dtypes, expert_dtype omitted) ----
for dt in fp4 fp8; do
    D=$TMP/mk_$dt
    extra=""
    [ "$dt" = fp4 ] && extra=--omit-expert-dtype
    expect 0 "" -- mkmodel --out "$D" --expert-dtype $dt $extra --hidden 256 --inter 256 \
        --experts 8 --topk 4 --layers 2 --hash-layers 1 --mtp 1 --vocab 500 --shards 3
    for L in layers.0 layers.1 mtp.0; do
        expect 0 "$L" -- forward --local --model "$D" --layer $L --input "$TMP/in_bf16.safetensors" --output "$TMP/mk_${dt}_$L.1.safetensors" --threads 1
        expect 0 "$L" -- forward --local --model "$D" --layer $L --input "$TMP/in_f32.safetensors" --output "$TMP/mk_${dt}_$L.2.safetensors" --threads 2
        same "$TMP/mk_${dt}_$L.1.safetensors" "$TMP/mk_${dt}_$L.2.safetensors"
        for isa in ref avx2; do
            export EPMOE_ISA=$isa
            expect 0 "$L" -- forward --local --model "$D" --layer $L --input "$TMP/in_bf16.safetensors" --output "$TMP/mk_${dt}_$L.$isa.safetensors" --threads 2
            same "$TMP/mk_${dt}_$L.1.safetensors" "$TMP/mk_${dt}_$L.$isa.safetensors"
            unset EPMOE_ISA
        done
    done
done

if [ "$fails" -ne 0 ]; then
    echo "$fails failed"
    exit 1
fi
echo "all passed"
