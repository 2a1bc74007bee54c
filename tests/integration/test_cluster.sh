#!/usr/bin/env bash
# test_cluster.sh — the whole system as operators run it: a real epmoe-coordinator and 1, 2, 3
# and 4 real epmoe-worker processes on tcp loopback, driven by epmoectl.
#
# Proves, for both expert dtypes, a hash layer, a score layer and the MTP layer, and 1, 7, 64
# and 300 tokens (fewer tokens than workers included): the cluster's `forward` output file is
# byte-identical to `forward --local` in one process (out, topk_ids, topk_weights); with bf16
# dispatch too; concurrent forwards from several clients each get their own right answer; a
# worker whose name is not in the spec is refused (exit 78); malformed ZeroMQ messages to the
# coordinator's two sockets are answered with an Error and to each worker's data endpoint are
# dropped, and the cluster goes on serving bit-identical results; shutdown stops every daemon
# with exit 0.
#
# With "secure" (ctest test_cluster_secure) everything runs with a security: section: CURVE on
# every socket, keys from epmoectl keygen, the operator's through $EPMOE_KEY; the intruder then
# has a key of its own that no list admits, and the malformed messages come from a client with
# an admitted key (a stranger's bytes never get past the handshake).
#
#   test_cluster.sh CTL_DIR COORDINATOR WORKER ZMQ_POKE [secure]
set -u
CTL=$1/epmoectl
COORD=$2
WORKER=$3
POKE=$4
SECURE=${5:-}
TMP=$(mktemp -d /tmp/epmoe_cluster_XXXXXX)
PIDS=()
fails=0

# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

# keys for the secure run: the coordinator, the workers (w0..w3), an operator, an intruder
KEYS=$TMP/keys
[ -n "$SECURE" ] && cluster_keys w0 w1 w2 w3 op1 intruder

# poke_as KEY SERVER ENDPOINT MODE KIND: zmq_poke, with security as KEY towards SERVER's key
poke_as() {
    local z85=() k
    if [ -n "$SECURE" ]; then
        for k in "public-key $KEYS/$1.key" "secret-key $KEYS/$1.key" "public-key $KEYS/$2.pub"; do
            z85+=("$(sed -n "s/.*${k%% *} = \"\(.*\)\"/\1/p" "${k#* }")")
        done
    fi
    POKE_PUBLIC=${z85[0]:-} POKE_SECRET=${z85[1]:-} POKE_SERVER=${z85[2]:-} "$POKE" "${@:3}"
}

# check_forwards NAME MODEL: every layer kind and token count through the cluster
check_forwards() {
    local name=$1 model=$2 n=0 bad=0
    for layer in 0 1 mtp.0; do
        for t in 1 7 64 300; do
            local out=$TMP/$name.$layer.$t.st ref
            ref=$(local_ref "$model" "$layer" "$TMP/in_$t.st")
            if ! "$CTL" --coordinator "$ADMIN" forward --layer "$layer" --input "$TMP/in_$t.st" \
                --output "$out" >"$TMP/$name.fwd.log" 2>&1; then
                fail "$name: forward layer $layer T=$t: $(cat "$TMP/$name.fwd.log")"
                bad=$((bad + 1))
            elif ! cmp -s "$out" "$ref"; then
                fail "$name: layer $layer T=$t differs from forward --local"
                "$CTL" diff "$out" "$ref"
                bad=$((bad + 1))
            fi
            n=$((n + 1))
        done
    done
    [ $bad -eq 0 ] && ok "$name: $n forwards (layers 0 hash, 1 score, mtp.0; T 1 7 64 300) bit-identical to --local"
}

# ---- models and inputs ----
for dt in fp4 fp8; do
    "$CTL" mkmodel --out "$TMP/$dt" --expert-dtype "$dt" --experts 12 --layers 2 --hash-layers 1 \
        --mtp 1 --seed 7 >/dev/null || { fail "mkmodel $dt"; exit 1; }
done
for t in 1 7 64 300; do
    "$CTL" mkinput --model "$TMP/fp4" --tokens "$t" --seed "$t" --out "$TMP/in_$t.st" >/dev/null ||
        fail "mkinput $t"
done

# ---- 1..4 workers, both dtypes ----
for dt in fp4 fp8; do
    for p in 1 2 3 4; do
        start_cluster "$dt-p$p" "$TMP/$dt" "$p" fp8 || continue
        check_forwards "$dt-p$p" "$TMP/$dt"
        stop_cluster "$dt-p$p"
    done
done

# ---- bf16 dispatch ----
if start_cluster bf16-p3 "$TMP/fp4" 3 bf16; then
    check_forwards bf16-p3 "$TMP/fp4"
    stop_cluster bf16-p3
fi

# ---- one long-lived 4-worker cluster: concurrency, intruders, garbage ----
if start_cluster live "$TMP/fp8" 4 fp8; then
    # concurrent clients, each with its own layer and input
    cpids=()
    i=0
    for layer in 0 1 mtp.0 0 1 mtp.0; do
        t=$([ $((i % 2)) -eq 0 ] && echo 64 || echo 300)
        "$CTL" --coordinator "$ADMIN" forward --layer "$layer" --input "$TMP/in_$t.st" \
            --output "$TMP/conc$i.st" >"$TMP/conc$i.log" 2>&1 &
        cpids+=("$!:$layer:$t:$i")
        i=$((i + 1))
    done
    cbad=0
    for e in "${cpids[@]}"; do
        IFS=: read -r pid layer t i <<<"$e"
        if ! wait "$pid"; then
            fail "concurrent forward $i: $(cat "$TMP/conc$i.log")"
            cbad=1
        elif ! cmp -s "$TMP/conc$i.st" "$(local_ref "$TMP/fp8" "$layer" "$TMP/in_$t.st")"; then
            fail "concurrent forward $i (layer $layer, T $t) differs from --local"
            cbad=1
        fi
    done
    [ $cbad -eq 0 ] && ok "6 concurrent forwards from separate clients, each bit-identical"

    # a worker whose name is not in the spec is refused and exits 78 (with security: its key is
    # in no list, so the handshake is refused before it can even say its name)
    # shellcheck disable=SC2046
    "$WORKER" --coordinator "$LISTEN" --name intruder $(worker_keys intruder) >"$TMP/intruder.log" 2>&1
    rc=$?
    want="not in cluster spec"
    [ -n "$SECURE" ] && want="refused this process's key"
    if [ $rc -eq 78 ] && grep -q "$want" "$TMP/intruder.log"; then
        ok "worker \"intruder\" refused: exit 78 ($want)"
    else
        fail "intruder worker: exit $rc; log: $(tail -3 "$TMP/intruder.log")"
    fi

    # malformed messages: the coordinator answers each with an Error (type 1) on both sockets
    kinds="badversion notype badtype nobody garbage unknown junk toomany register_empty"
    for sock in "$LISTEN" "$ADMIN"; do
        who=w0
        [ "$sock" = "$ADMIN" ] && who=op1
        for k in $kinds; do
            r=$(poke_as "$who" coordinator "$sock" dealer "$k")
            [[ "$r" == "reply: type 1"* ]] || fail "poke $sock $k: $r"
        done
    done
    ok "coordinator answered 18 malformed messages with Error replies"
    # the same through the shell's own TCP: bytes that are not even ZMTP
    exec 3<>"/dev/tcp/127.0.0.1/${ADMIN##*:}" && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && exec 3>&-
    # and each worker's data endpoint drops them
    for ((r = 0; r < 4; r++)); do
        # with security as rank r's peer (admitted, its bytes reach the transport)
        for k in $kinds; do poke_as "w$(((r + 1) % 4))" "w$r" "${DATA[$r]}" push "$k" >/dev/null; done
    done
    # and each worker's client endpoint (the serving path): an admitted client's malformed
    # messages are dropped, a message of another type gets an Error; with security a stranger's
    # key gets no answer at all (the handshake is refused)
    for ((r = 0; r < 4; r++)); do
        cep=$(sed -n 's/.*client endpoint \(tcp:[^ ]*\).*/\1/p' "$TMP/live.w$r.log" | tail -1)
        [ -n "$cep" ] || { fail "worker w$r logged no client endpoint"; continue; }
        for k in $kinds; do poke_as op1 "w$r" "$cep" dealer "$k" >/dev/null; done
        r1=$(poke_as op1 "w$r" "$cep" dealer unknown)
        [[ "$r1" == "reply: type 1"* ]] || fail "client endpoint of w$r, unknown type: $r1"
        if [ -n "$SECURE" ]; then
            r2=$(poke_as intruder "w$r" "$cep" dealer unknown)
            [ "$r2" = "no reply" ] || fail "client endpoint of w$r answered a stranger: $r2"
        fi
    done
    ok "the workers' client endpoints dropped or answered malformed messages${SECURE:+ and refused a stranger key}"
    sleep 0.5
    for ((r = 0; r < 4; r++)); do
        kill -0 "${CPIDS[$((r + 1))]}" 2>/dev/null || fail "worker w$r died after garbage"
        grep -q "data plane: dropped a message" "$TMP/live.w$r.log" ||
            fail "worker w$r logged no dropped data-plane message"
    done
    kill -0 "${CPIDS[0]}" 2>/dev/null || fail "coordinator died after garbage"
    "$CTL" --coordinator "$ADMIN" -o json status >"$TMP/after.json" 2>&1 &&
        grep -q '"state": "ready"' "$TMP/after.json" || fail "not ready after garbage: $(cat "$TMP/after.json")"
    check_forwards after-garbage "$TMP/fp8"
    stop_cluster live
fi

if [ $fails -ne 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "all ok"
