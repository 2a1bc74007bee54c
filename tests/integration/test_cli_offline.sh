#!/usr/bin/env bash
# test_cli_offline.sh — epmoectl's offline tools end to end: mkmodel writes checkpoints, inspect
# reads them back (JSON, --map, table), and both report bad input with the documented exit codes
# and messages that name the problem.
#
# usage: test_cli_offline.sh PATH/TO/epmoectl
set -u
CTL=${1:?usage: $0 PATH/TO/epmoectl}
command -v python3 >/dev/null || { echo "skip: python3 is needed to read JSON"; exit 77; }
T=$(mktemp -d /tmp/test_cli_offline.XXXXXX)
trap 'rm -rf "$T"' EXIT
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run EXPECTED_RC DESCRIPTION CMD...: stdout -> $T/out, stderr -> $T/err
run() {
    local want=$1 desc=$2
    shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "$desc: exit $rc, expected $want"
        sed 's/^/    stderr: /' "$T/err" | head -5
    else
        echo "ok   $desc"
    fi
}

# has FILE NEEDLE DESCRIPTION: FILE contains NEEDLE (fixed string)
has() {
    grep -qF -- "$2" "$1" || { fail "$3: \"$2\" not in $(basename "$1"):"; head -5 "$1" | sed 's/^/    /'; }
}

# json EXPR DESCRIPTION: python3 expression over d = the JSON in $T/out must be true
json() {
    python3 - "$T/out" "$1" <<'PY' || fail "$2: $1"
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if eval('(' + sys.argv[2] + ')') else 1)
PY
}

# ---- mkmodel + inspect, both expert dtypes ----------------------------------------------------
for dt in fp4 fp8; do
    M=$T/$dt
    run 0 "mkmodel $dt" "$CTL" mkmodel --out "$M" --expert-dtype $dt
    has "$T/out" "$M" "mkmodel $dt summary names the directory"
    has "$T/out" "expert_dtype $dt" "mkmodel $dt summary names the dtype"
    has "$T/out" "559 tensors" "mkmodel $dt summary counts tensors"
    has "$T/out" "2 shards" "mkmodel $dt summary counts shards"

    run 0 "inspect -o json ($dt)" "$CTL" -o json inspect --model "$M"
    e8m0=$([ $dt = fp4 ] && echo True || echo False)
    json "d['schema'] == 1 and d['expert_dtype'] == '$dt' and d['expert_dtype_given'] is True" \
        "inspect $dt: dtype"
    json "d['scale_e8m0'] is $e8m0 and d['act_ue8m0'] is True" "inspect $dt: scale_e8m0 $e8m0"
    json "d['check'] == {'ok': True, 'error': None}" "inspect $dt: check ok"
    json "d['config']['hidden_size'] == 256 and d['config']['moe_intermediate_size'] == 128 and
          d['config']['n_routed_experts'] == 16 and d['config']['num_experts_per_tok'] == 6 and
          d['config']['num_hidden_layers'] == 4 and d['config']['num_hash_layers'] == 1 and
          d['config']['num_nextn_predict_layers'] == 1 and d['config']['vocab_size'] == 1000" \
        "inspect $dt: config sizes"
    json "[l['name'] for l in d['layers']] == ['layers.0', 'layers.1', 'layers.2', 'layers.3', 'mtp.0']
          and [l['kind'] for l in d['layers']] == ['hash', 'score', 'score', 'score', 'mtp']
          and all(l['tensors'] == 9 + 6 * 16 for l in d['layers'])" "inspect $dt: layers"
    if [ $dt = fp4 ]; then
        json "all(l['routed_experts'] == 'MXFP4 (I8 + E8M0/32)' and
                  l['shared_expert'] == 'FP8 block (F8_E4M3 + E8M0/128x128)' for l in d['layers'])" \
            "inspect fp4: formats"
    else
        json "all(l['routed_experts'] == 'FP8 block (F8_E4M3 + F32/128x128)' and
                  l['shared_expert'] == 'FP8 block (F8_E4M3 + F32/128x128)' for l in d['layers'])" \
            "inspect fp8: formats"
    fi
    json "d['tensors'] == 559 and d['files'] == 2 and d['other']['tensors'] == 34 and
          d['bytes'] == d['other']['bytes'] + sum(l['bytes'] for l in d['layers'])" \
        "inspect $dt: totals"

    run 0 "inspect table ($dt)" "$CTL" inspect --model "$M"
    has "$T/out" "expert_dtype  $dt (given in config.json)" "inspect $dt table: dtype"
    has "$T/out" "check         ok" "inspect $dt table: check"

    run 0 "inspect --model DIR -o json ($dt, option after the command)" \
        "$CTL" inspect --model "$M" -o json
    json "d['expert_dtype'] == '$dt'" "inspect $dt: -o after the command"
done

# ---- --map ------------------------------------------------------------------------------------
run 0 "inspect --map fp4" "$CTL" inspect --model "$T/fp4" --map
grep -qxF $'layers.2.ffn.experts.5.w2.scale\tlayers.2.ffn.experts.5.w2.weight_scale' "$T/out" ||
    fail "map fp4: routed expert scale -> weight_scale"
grep -qxF $'mtp.0.ffn.experts.15.w1.scale\tmtp.0.ffn.experts.15.w1.weight_scale' "$T/out" ||
    fail "map fp4: MTP expert scale -> weight_scale"
grep -qxF $'layers.2.ffn.shared_experts.w2.scale\tlayers.2.ffn.shared_experts.w2.weight_scale_inv' "$T/out" ||
    fail "map fp4: shared expert scale -> weight_scale_inv"
grep -qxF $'layers.2.ffn.experts.5.w2.weight\tlayers.2.ffn.experts.5.w2.weight' "$T/out" ||
    fail "map fp4: weights keep their names"
[ "$(wc -l <"$T/out")" -eq 559 ] || fail "map fp4: $(wc -l <"$T/out") lines, expected 559"
LC_ALL=C sort -c "$T/out" 2>/dev/null || fail "map fp4: not sorted by name"

run 0 "inspect --map fp8" "$CTL" inspect --model "$T/fp8" --map
grep -qxF $'layers.2.ffn.experts.5.w2.scale\tlayers.2.ffn.experts.5.w2.weight_scale_inv' "$T/out" ||
    fail "map fp8: routed expert scale -> weight_scale_inv"
grep -qxF $'layers.2.ffn.shared_experts.w2.scale\tlayers.2.ffn.shared_experts.w2.weight_scale_inv' "$T/out" ||
    fail "map fp8: shared expert scale -> weight_scale_inv"

run 0 "inspect --map -o json fp4" "$CTL" -o json inspect --model "$T/fp4" --map
json "len(d) == 559 and {'name': 'layers.1.ffn.experts.0.w3.scale',
      'mapped': 'layers.1.ffn.experts.0.w3.weight_scale'} in d and
      all(set(e) == {'name', 'mapped'} for e in d)" "map fp4 json"

# ---- fp8 experts, expert_dtype omitted: assumed fp4, the check explains -------------------------
run 0 "mkmodel fp8 --omit-expert-dtype" "$CTL" mkmodel --out "$T/omit" --expert-dtype fp8 \
    --omit-expert-dtype --shards 1
run 65 "inspect omitted fp8" "$CTL" inspect --model "$T/omit"
has "$T/err" 'set "expert_dtype": "fp8"' "inspect omitted: says to set expert_dtype fp8"
has "$T/err" "no expert_dtype" "inspect omitted: says it is missing"
has "$T/out" "fp4 (assumed" "inspect omitted table: fp4 assumed"
run 65 "inspect omitted fp8 -o json" "$CTL" -o json inspect --model "$T/omit"
json "d['expert_dtype'] == 'fp4' and d['expert_dtype_given'] is False and
      d['check']['ok'] is False and 'set \"expert_dtype\": \"fp8\"' in d['check']['error']" \
    "inspect omitted json: check error"
json "d['layers'][1]['routed_experts'] == 'FP8 block (F8_E4M3 + F32/128x128)'" \
    "inspect omitted json: the formats found"

# ---- bad input --------------------------------------------------------------------------------
run 64 "mkmodel --hidden 100" "$CTL" mkmodel --out "$T/bad" --expert-dtype fp4 --hidden 100
has "$T/err" "--hidden 100: expected a positive multiple of 128" "mkmodel --hidden message"
run 64 "mkmodel --topk 20" "$CTL" mkmodel --out "$T/bad" --expert-dtype fp4 --topk 20
has "$T/err" "--topk 20: expected at most --experts (16)" "mkmodel --topk message"
run 64 "mkmodel --hash-layers 9" "$CTL" mkmodel --out "$T/bad" --expert-dtype fp4 --hash-layers 9
has "$T/err" "--hash-layers 9" "mkmodel --hash-layers message"
run 64 "mkmodel --inter abc" "$CTL" mkmodel --out "$T/bad" --expert-dtype fp4 --inter abc
has "$T/err" "--inter abc: expected an integer" "mkmodel --inter message"
run 64 "mkmodel --expert-dtype fp16" "$CTL" mkmodel --out "$T/bad" --expert-dtype fp16
has "$T/err" "--expert-dtype fp16: expected fp4 or fp8" "mkmodel dtype message"
run 64 "mkmodel without --expert-dtype" "$CTL" mkmodel --out "$T/bad"
has "$T/err" "--expert-dtype fp4|fp8 is required" "mkmodel dtype required"
run 64 "mkmodel without --out" "$CTL" mkmodel --expert-dtype fp4
has "$T/err" "--out DIR is required" "mkmodel out required"
run 64 "mkmodel --bogus" "$CTL" mkmodel --out "$T/bad" --expert-dtype fp4 --bogus
has "$T/err" '"--bogus"' "mkmodel unknown option named"
run 64 "mkmodel --shards 0" "$CTL" mkmodel --out "$T/bad" --expert-dtype fp4 --shards 0
[ -e "$T/bad" ] && fail "mkmodel with bad options created its directory"
run 73 "mkmodel into a non-empty directory" "$CTL" mkmodel --out "$T/fp4" --expert-dtype fp4
has "$T/err" "not empty" "mkmodel non-empty message"
run 73 "mkmodel under a missing parent" "$CTL" mkmodel --out "$T/no/such" --expert-dtype fp4
has "$T/err" "$T/no/such" "mkmodel missing parent names the path"

run 66 "inspect a missing directory" "$CTL" inspect --model "$T/missing"
has "$T/err" "$T/missing" "inspect missing dir names it"
mkdir "$T/empty"
run 66 "inspect a directory without config.json" "$CTL" inspect --model "$T/empty"
has "$T/err" "config.json" "inspect no config names config.json"
run 64 "inspect without --model" "$CTL" inspect

mkdir "$T/fp16"
cp "$T/fp4"/*.safetensors "$T/fp4/model.safetensors.index.json" "$T/fp16/"
sed 's/"expert_dtype": "fp4"/"expert_dtype": "fp16"/' "$T/fp4/config.json" >"$T/fp16/config.json"
run 78 "inspect expert_dtype fp16" "$CTL" inspect --model "$T/fp16"
has "$T/err" 'unsupported expert_dtype "fp16"' "inspect fp16 names the value"
has "$T/err" "fp4, fp8" "inspect fp16 names the allowed set"

# ---- mkmodel -o json, --shards 1, --force -----------------------------------------------------
run 0 "mkmodel -o json --shards 1 --force" "$CTL" -o json mkmodel --out "$T/fp4" --expert-dtype fp4 \
    --shards 1 --force --seed 7
json "d == {'schema': 1, 'dir': '$T/fp4', 'expert_dtype': 'fp4', 'expert_dtype_in_config': True,
      'tensors': 559, 'bytes': d['bytes'], 'shards': 1} and d['bytes'] > 0" "mkmodel json summary"
[ -e "$T/fp4/model.safetensors.index.json" ] && fail "--force --shards 1 left the old index"
[ -e "$T/fp4/model-00001-of-00002.safetensors" ] && fail "--force --shards 1 left an old shard"
run 0 "inspect after --force" "$CTL" inspect --model "$T/fp4"

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "all passed"
