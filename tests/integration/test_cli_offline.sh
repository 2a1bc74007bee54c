#!/usr/bin/env bash
# test_cli_offline.sh — epmoectl's offline tools end to end: mkmodel writes checkpoints, inspect
# reads them back (JSON, --map, table), and both report bad input with the documented exit codes
# and messages that name the problem. One value policy: a NaN scale code or a NaN/Inf weight is
# refused by inspect and by forward --local's loader with the same message, a NaN or Inf input
# by forward naming the token and channel; a FIFO where a file should be is refused at once;
# -o json after the command works for every offline command; diff -o json keeps tensors whose
# difference is infinite; keygen writes a 0600 secret and a public key and never overwrites;
# every binary has --version; --output=json and -ojson work before the command; the
# operations check's messages (issue 17) read right; cmake --install installs bash and zsh
# completions, and the bash one completes commands, formats, options and values.
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
json "d['schema'] == 1 and d['expert_dtype'] == 'fp4' and len(d['tensors']) == 559 and
      {'name': 'layers.1.ffn.experts.0.w3.scale',
       'mapped': 'layers.1.ffn.experts.0.w3.weight_scale'} in d['tensors'] and
      all(set(e) == {'name', 'mapped'} for e in d['tensors'])" "map fp4 json (an object with schema)"

# ---- fp8 experts, expert_dtype omitted: assumed fp4, the check explains -------------------------
run 0 "mkmodel fp8 --omit-expert-dtype" "$CTL" mkmodel --out "$T/omit" --expert-dtype fp8 \
    --omit-expert-dtype --shards 1
run 65 "inspect omitted fp8" "$CTL" inspect --model "$T/omit"
has "$T/err" 'set "expert_dtype": "fp8"' "inspect omitted: says to set expert_dtype fp8"
has "$T/err" "no expert_dtype" "inspect omitted: says it is missing"
has "$T/out" "fp4 (defaulted: config.json has no expert_dtype, top level or in quantization_config)" \
    "inspect omitted table: fp4 defaulted"
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
json "d == {'schema': 1, 'dir': '$T/fp4', 'expert_dtype': 'fp4', 'expert_dtype_in_config': True, 'full': False,
      'tensors': 559, 'bytes': d['bytes'], 'shards': 1} and d['bytes'] > 0" "mkmodel json summary"
[ -e "$T/fp4/model.safetensors.index.json" ] && fail "--force --shards 1 left the old index"
[ -e "$T/fp4/model-00001-of-00002.safetensors" ] && fail "--force --shards 1 left an old shard"
run 0 "inspect after --force" "$CTL" inspect --model "$T/fp4"

# ---- one value policy: inspect, the loader, forward --local ------------------------------------
# patch DIR TENSOR ELEMENT HEXBYTES: overwrite element ELEMENT of TENSOR in DIR's checkpoint
patch() {
    python3 - "$@" <<'PY'
import json, os, struct, sys
d, name, elem, raw = sys.argv[1], sys.argv[2], int(sys.argv[3]), bytes.fromhex(sys.argv[4])
idx = os.path.join(d, "model.safetensors.index.json")
f = json.load(open(idx))["weight_map"][name] if os.path.exists(idx) else "model.safetensors"
path = os.path.join(d, f)
with open(path, "r+b") as fp:
    n = struct.unpack("<Q", fp.read(8))[0]
    begin = json.loads(fp.read(n))[name]["data_offsets"][0]
    fp.seek(8 + n + begin + elem * len(raw))
    fp.write(raw)
PY
}
V=$T/values
"$CTL" mkmodel --out "$V" --expert-dtype fp4 --seed 3 >/dev/null || fail "mkmodel values"
"$CTL" mkinput --model "$V" --tokens 5 --out "$T/in5.st" >/dev/null || fail "mkinput values"
run 0 "forward --local on an intact checkpoint" "$CTL" forward --local --model "$V" --layer 1 \
    --input "$T/in5.st" --output "$T/o1.st"
patch "$V" layers.1.ffn.experts.3.w2.scale 7 ff
run 65 "inspect: an E8M0 scale code 255" "$CTL" inspect --model "$V"
has "$T/err" '"layers.1.ffn.experts.3.w2.scale": element [1, 3] is scale code 255 (NaN)' \
    "inspect names the NaN scale"
run 65 "forward --local refuses the same scale" "$CTL" forward --local --model "$V" --layer 1 \
    --input "$T/in5.st" --output "$T/o2.st"
has "$T/err" '"layers.1.ffn.experts.3.w2.scale": element [1, 3] is scale code 255 (NaN)' \
    "forward --local names the NaN scale"
patch "$V" layers.1.ffn.experts.3.w2.scale 7 7f
patch "$V" layers.2.ffn_norm.weight 9 c07f
run 65 "inspect: a NaN norm weight" "$CTL" inspect --model "$V"
has "$T/err" '"layers.2.ffn_norm.weight": element 9 is NaN' "inspect names the NaN weight"
run 65 "forward --local refuses the NaN norm weight" "$CTL" forward --local --model "$V" \
    --layer 2 --input "$T/in5.st" --output "$T/o2.st"
has "$T/err" '"layers.2.ffn_norm.weight": element 9 is NaN' "forward names the NaN weight"
patch "$V" layers.2.ffn_norm.weight 9 807f
run 65 "inspect: an Inf norm weight" "$CTL" inspect --model "$V"
has "$T/err" "element 9 is Inf" "inspect names the Inf weight"
patch "$V" layers.2.ffn_norm.weight 9 803f
run 0 "inspect after the repair" "$CTL" inspect --model "$V"
# inputs: a NaN in token 3, channel 17 of hidden_states
cp "$T/in5.st" "$T/nan5.st"
python3 - "$T/nan5.st" <<'PY'
import json, struct, sys
with open(sys.argv[1], "r+b") as fp:
    n = struct.unpack("<Q", fp.read(8))[0]
    h = json.loads(fp.read(n))["hidden_states"]
    H = h["shape"][1]
    fp.seek(8 + n + h["data_offsets"][0] + 2 * (3 * H + 17))
    fp.write(bytes.fromhex("c0ff"))
PY
run 65 "forward --local: a NaN input" "$CTL" forward --local --model "$V" --layer 1 \
    --input "$T/nan5.st" --output "$T/o3.st"
has "$T/err" 'token 3, channel 17: the hidden state is NaN' "forward names token and channel"

# ---- FIFOs where files should be: refused, never waited on ------------------------------------
F=$T/fifo
mkdir "$F"
cp "$V"/*.safetensors "$V/model.safetensors.index.json" "$F/"
mkfifo "$F/config.json"
run 78 "inspect: config.json is a FIFO" timeout 20 "$CTL" inspect --model "$F"
has "$T/err" "not a regular file" "the FIFO config.json is named"
rm "$F/config.json"
cp "$V/config.json" "$F/"
rm "$F/model-00002-of-00002.safetensors"
mkfifo "$F/model-00002-of-00002.safetensors"
run 65 "inspect: a shard is a FIFO" timeout 20 "$CTL" inspect --model "$F"
has "$T/err" "model-00002-of-00002.safetensors: not a regular file" "the FIFO shard is named"

# ---- -o json after the command ------------------------------------------------------------------
run 0 "mkinput ... -o json" "$CTL" mkinput --model "$V" --tokens 2 --out "$T/in2.st" -o json
json "d['schema'] == 1 and d['tokens'] == 2" "mkinput json after the verb"
run 0 "forward --local ... -o json" "$CTL" forward --local --model "$V" --layer 1 \
    --input "$T/in2.st" --output "$T/o4.st" -o json
json "d['schema'] == 1 and d['tokens'] == 2" "forward json after the verb"
run 0 "diff ... -o json" "$CTL" diff "$T/o4.st" "$T/o4.st" -o json
json "d['identical'] is True and len(d['tensors']) == 3" "diff json after the verb"
run 0 "mkmodel ... -o json" "$CTL" mkmodel --out "$T/m3" --expert-dtype fp8 --shards 1 -o json
json "d['schema'] == 1 and d['shards'] == 1" "mkmodel json after the verb"
run 64 "-o yaml after the verb" "$CTL" diff "$T/o4.st" "$T/o4.st" -o yaml
has "$T/err" "-o yaml: expected table or json" "a bad -o names the value"

# ---- diff -o json with an infinite difference -----------------------------------------------------
cp "$T/o4.st" "$T/o5.st"
python3 - "$T/o5.st" <<'PY'
import json, struct, sys
with open(sys.argv[1], "r+b") as fp:
    n = struct.unpack("<Q", fp.read(8))[0]
    fp.seek(8 + n + json.loads(fp.read(n))["out"]["data_offsets"][0] + 2)
    fp.write(bytes.fromhex("c07f"))
PY
run 1 "diff -o json: one NaN element" "$CTL" -o json diff "$T/o4.st" "$T/o5.st"
json "[t['name'] for t in d['tensors']] == ['out', 'topk_ids', 'topk_weights']" \
    "diff json keeps the tensor whose difference is NaN"
json "d['tensors'][0]['max_abs'] == 'inf' and d['tensors'][0]['differ'] == 1" \
    "diff json says inf"

# ---- keygen -----------------------------------------------------------------------------------------
K=$T/keys
mkdir "$K"
run 0 "keygen" "$CTL" keygen --out "$K" --name a0
[ "$(stat -c %a "$K/a0.key")" = 600 ] || fail "keygen: a0.key is not mode 0600"
grep -q 'secret-key = "' "$K/a0.key" || fail "keygen: a0.key has no secret-key"
grep -q 'public-key = "' "$K/a0.pub" || fail "keygen: a0.pub has no public-key"
grep -q 'secret-key' "$K/a0.pub" && fail "keygen: a0.pub holds the secret"
cp "$K/a0.pub" "$T/a0.pub.before"
run 73 "keygen never overwrites" "$CTL" keygen --out "$K" --name a0
cmp -s "$K/a0.pub" "$T/a0.pub.before" || fail "keygen changed an existing key"
run 64 "keygen --name with a slash" "$CTL" keygen --out "$K" --name ../x
run 0 "keygen -o json" "$CTL" keygen --out "$K" --name op1 -o json
json "d['name'] == 'op1' and len(d['public_key']) == 40" "keygen json"

# ---- the cluster path without a coordinator: one deadline for the whole command --------------------
PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
t0=$(date +%s%N)
run 69 "forward --timeout 2000, nobody listening" "$CTL" --coordinator "tcp://127.0.0.1:$PORT" \
    --timeout 2000 forward --layer 1 --input "$T/in5.st" --output "$T/o6.st"
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$ms" -lt 4500 ] || fail "forward --timeout 2000 took $ms ms: the command must keep one deadline (it took 6 s with a deadline per request)"
has "$T/err" "no answer to CLIENT_INFO in 2000 ms" "the deadline is named"
run 64 "status --coordinator with port 99999" "$CTL" --coordinator tcp://127.0.0.1:99999 status
has "$T/err" 'port "99999" is not in 1..65535' "the bad port is named"
run 64 "--key without --server-key" "$CTL" --coordinator "tcp://127.0.0.1:$PORT" \
    --key "$K/a0.key" status
has "$T/err" "--key and --server-key" "the missing half is named"
chmod 644 "$K/a0.key"
run 64 "a secret key others can read" env EPMOE_KEY="$K/a0.key" EPMOE_SERVER_KEY="$K/op1.pub" \
    "$CTL" --coordinator "tcp://127.0.0.1:$PORT" status
has "$T/err" "chmod 600" "the loose key file is refused"

# ---- --version on every binary; global options as --option=VALUE and -oFORMAT -----------------
BUILD=${EPMOE_BINARY_DIR:-$(dirname "$CTL")/..}
COORD=$BUILD/coordinator/epmoe-coordinator
WORKER=$BUILD/worker/epmoe-worker
for b in "$CTL" "$COORD" "$WORKER"; do
    run 0 "$(basename "$b") --version" "$b" --version
    grep -qE "^$(basename "$b") [0-9]+\.[0-9]+\.[0-9]+ \(cpu" "$T/out" ||
        fail "$(basename "$b") --version: \"$(cat "$T/out")\""
done
run 0 "--output=json before the command" "$CTL" --output=json inspect --model "$T/fp4"
json "d['schema'] == 1 and d['expert_dtype'] == 'fp4'" "--output=json inspect"
run 0 "-ojson before the command" "$CTL" -ojson inspect --model "$T/fp4"
json "d['schema'] == 1" "-ojson inspect"
run 0 "--output=json after the command" "$CTL" inspect --model "$T/fp4" --output=json
json "d['schema'] == 1" "inspect --output=json"
run 64 "-o yaml on an offline command" "$CTL" -o yaml inspect --model "$T/fp4"
has "$T/err" "epmoectl inspect: -o yaml: expected table or json" "offline -o yaml refused, named"

# ---- configs as transformers writes them (issue 24): inspect and coordinator --check -----------
# tests/data/hf-configs holds config.json files saved by transformers 5.23 (make_hf_configs.py
# there); each is put beside an mkmodel checkpoint of the defaults' sizes.
HF=${EPMOE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/data/hf-configs
for dt in fp4 fp8; do
    "$CTL" mkmodel --out "$T/hfck-$dt" --expert-dtype $dt --shards 1 >/dev/null ||
        fail "mkmodel $dt for the transformers configs"
done
# hfmodel NAME DTYPE: makes $T/hf/NAME-DTYPE, the DTYPE checkpoint under NAME's config.json,
# and the cluster spec $T/hf.yaml over it for --check; prints the directory
hfmodel() {
    local d=$T/hf/$1-$2
    mkdir -p "$d"
    ln -sf "$T/hfck-$2"/*.safetensors "$d/"
    cp "$HF/$1/config.json" "$d/config.json"
    hfspec "$d"
    echo "$d"
}
hfspec() {
    cat >"$T/hf.yaml" <<EOF
cluster: {name: hf}
coordinator: {listen: "tcp://127.0.0.1:1", admin: "tcp://127.0.0.1:2"}
model: {path: "$1"}
nodes:
  - name: n
    workers:
      - {name: w0, device: cpu, data: "tcp://127.0.0.1:3"}
      - {name: w1, device: cpu, data: "tcp://127.0.0.1:4"}
EOF
}
d=$(hfmodel v4-fp8 fp8)
run 0 "inspect transformers' FP8 config" "$CTL" -o json inspect --model "$d"
json "d['expert_dtype'] == 'fp8' and d['expert_dtype_given'] is True and
      d['config']['num_hash_layers'] == 1 and d['act_ue8m0'] is False and d['check']['ok']" \
    "transformers' FP8 config: fp8 from quantization_config, 1 hash layer from mlp_layer_types"
run 0 "--check transformers' FP8 config" "$COORD" --cluster "$T/hf.yaml" --check
has "$T/out" "expert_dtype fp8 (given)" "--check transformers' FP8 config: dtype"
has "$T/out" "hash layers 1" "--check transformers' FP8 config: hash layers"
for dt in fp4 fp8; do
    run 0 "inspect mkmodel $dt" "$CTL" -o json inspect --model "$T/hfck-$dt"
    want=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['config']['hash'])" \
        "$T/out")
    d=$(hfmodel "mkmodel-$dt-autoconfig" $dt)
    run 0 "inspect mkmodel $dt through AutoConfig" "$CTL" -o json inspect --model "$d"
    json "d['expert_dtype'] == '$dt' and d['config']['num_hash_layers'] == 1 and
          d['config']['hash'] == '$want' and d['check']['ok']" \
        "mkmodel $dt through AutoConfig: same dtype, hash layers and config hash"
    run 0 "--check mkmodel $dt through AutoConfig" "$COORD" --cluster "$T/hf.yaml" --check
done
# the checkpoint's experts are not the config's dtype: --check (and a start) refuse before
# anything starts, with the loader's message
d=$(hfmodel v4-fp8 fp4)
run 78 "--check FP8 config over FP4 experts" "$COORD" --cluster "$T/hf.yaml" --check
has "$T/err" "model.path: no worker could load this checkpoint with its config.json" \
    "--check dtype mismatch: says no worker could load it"
has "$T/err" "experts look like fp4 experts but config.json says expert_dtype \"fp8\"" \
    "--check dtype mismatch: the loader's explanation"
run 78 "a coordinator start over FP4 experts with an FP8 config" "$COORD" --cluster "$T/hf.yaml"
has "$T/err" "no worker could load this checkpoint" "a start refuses the dtype mismatch too"
hfspec "$T/omit"
run 78 "--check FP8 experts, expert_dtype omitted" "$COORD" --cluster "$T/hf.yaml" --check
has "$T/err" 'set "expert_dtype": "fp8"' "--check omitted dtype: says to set fp8"
# refused configs, each with what is wrong
REFUSED=(
    'dtype-conflict|field "expert_dtype" is "fp4" but field "quantization_config.expert_dtype" is "fp8"'
    'hash-after-moe|field "mlp_layer_types"[1]: "hash_moe" after "moe" at [0]'
    'hash-conflict|field "num_hash_layers" is 2 but field "mlp_layer_types" starts with 1 "hash_moe"'
    'fp4-scale-float|"float" is refused with expert_dtype fp4'
    'norm-topk-false|field "norm_topk_prob": false is refused'
    'deepseek-v41|model_type "deepseek_v41" is not served: epmoe serves the MoE layers of DeepSeek V4'
)
for r in "${REFUSED[@]}"; do
    name=${r%%|*} msg=${r#*|}
    d=$(hfmodel "$name" fp4)
    run 78 "inspect $name" "$CTL" inspect --model "$d"
    has "$T/err" "$msg" "inspect $name: the message"
    run 78 "--check $name" "$COORD" --cluster "$T/hf.yaml" --check
    has "$T/err" "$msg" "--check $name: the message"
done

# ---- the operations check: messages that read wrong, each fixed (issue 17) ---------------------
# EXPECTED_RC | COMMAND (words; @T@ is $T) | what stderr must say | what it must not say
OPS=(
    "0|$CTL --version|||option --version needs a value"
    "64|$CTL --timeout= status|--timeout \"\": expected milliseconds|--timeout : "
    "64|$CTL --bogus status|unknown option --bogus|needs a value"
    "64|$CTL --coordinator=tcp://127.0.0.1:1 status --wait-timeout|--wait-timeout needs a value|unexpected argument"
    "64|$CTL --coordinator=tcp://127.0.0.1:1 shards --layer|--layer needs a value|unexpected argument"
    "66|$CTL diff @T@/in5.st @T@/fp4/config.json|config.json: not a safetensors file|"
    "73|$CTL mkinput --model @T@/fp4 --tokens 2 --out @T@/nodir/x.st|@T@/nodir/x.st: cannot be written (through @T@/nodir/x.st.tmp)|"
    "66|$CTL mkinput --model @T@/nomodel --tokens 2 --out @T@/x.st|--model @T@/nomodel: @T@/nomodel/config.json: No such file|"
    "64|$WORKER --bogus|unknown option --bogus|needs a value"
    "64|$WORKER --name w0|--coordinator is required|--coordinator and --name"
    "64|$WORKER --coordinator tcp://127.0.0.1:1|--name is required|--coordinator and --name"
    "64|$COORD --cluster|--cluster needs a value|unexpected argument"
)
for row in "${OPS[@]}"; do
    IFS='|' read -r want cmd must mustnot <<<"${row//@T@/$T}"
    # shellcheck disable=SC2086
    run "$want" "ops check: $cmd" env EPMOE_COORDINATOR_LISTEN= $cmd
    [ -z "$must" ] || has "$T/err" "$must" "ops check: $cmd"
    if [ -n "$mustnot" ] && grep -qF -- "$mustnot" "$T/err"; then
        fail "ops check: $cmd still says \"$mustnot\": $(head -2 "$T/err")"
    fi
done

# undrain --help is undrain's own usage, not drain's (issue 23)
run 0 "undrain --help" "$CTL" undrain --help
has "$T/out" "usage: epmoectl [-o table|wide|json|yaml] undrain NAME" "undrain --help"
grep -qF -- "--no-wait" "$T/out" && fail "undrain --help shows drain's options: $(head -2 "$T/out")"
run 0 "drain --help" "$CTL" drain --help
has "$T/out" "usage: epmoectl [-o table|wide|json|yaml] drain NAME [--no-wait]" "drain --help"

# ---- shell completion: installed by cmake --install, and it completes ---------------------------
INST=$T/inst
if cmake --install "$BUILD" --prefix "$INST" >"$T/install.log" 2>&1; then
    BC=$INST/share/bash-completion/completions/epmoectl
    ZC=$INST/share/zsh/site-functions/_epmoectl
    [ -f "$BC" ] && [ -f "$ZC" ] && echo "ok   cmake --install puts the bash and zsh completions in share/" ||
        fail "completions not installed: $(find "$INST/share" -maxdepth 3 | head)"
    # complete_words WORD...: what the bash completion offers for the last word
    complete_words() {
        bash -c '. "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
                 _epmoectl; printf "%s\n" "${COMPREPLY[@]}"' _ "$BC" "$@"
    }
    PATH_CTL=$(dirname "$CTL")
    [ "$(PATH=$PATH_CTL:$PATH complete_words epmoectl sta | tr '\n' ' ')" = "status " ] ||
        fail "bash completion of 'sta': $(complete_words epmoectl sta | tr '\n' ' ')"
    [ "$(complete_words epmoectl -o y)" = yaml ] || fail "bash completion of -o y"
    got=$(complete_words "$CTL" status --wait | tr '\n' ' ')
    [ "$got" = "--wait-ready --wait-timeout " ] ||
        fail "bash completion of status --wait (from status --help): \"$got\""
    got=$(complete_words "$CTL" forward --gpu-gemm "")
    [ "$(echo $got)" = "exact fast" ] || fail "bash completion of forward --gpu-gemm: \"$got\""
    echo "ok   bash completion: commands, -o formats, a command's options, option values"
    if command -v zsh >/dev/null; then
        zsh -n "$ZC" && echo "ok   zsh completion parses (zsh -n)" || fail "zsh -n $ZC"
    else
        echo "skip zsh completion check: zsh not installed"
    fi
else
    fail "cmake --install: $(tail -3 "$T/install.log")"
fi

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "all passed"
