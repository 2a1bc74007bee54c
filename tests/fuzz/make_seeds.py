#!/usr/bin/env python3
"""make_seeds.py — seed corpora of the network fuzz targets (welcome, step, dataplane, admin,
submit, serve_data, result).

Writes well-formed messages, in the frame format of fuzz_frames.h, into corpus/NAME/: the
fuzzer starts from inputs that pass the checks and mutates from there. The protobuf bodies
are encoded here by hand (field numbers of proto/epmoe.proto), independently of protobuf-c.

    python3 tests/fuzz/make_seeds.py        (from the repository root; rewrites the seeds)
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def key(field, wt):
    return varint(field << 3 | wt)


def f_varint(field, v):
    return key(field, 0) + varint(v)


def f_fixed64(field, v):
    return key(field, 1) + struct.pack("<Q", v)


def f_float(field, v):
    return key(field, 5) + struct.pack("<f", v)


def f_bytes(field, b):
    return key(field, 2) + varint(len(b)) + b


def f_str(field, s):
    return f_bytes(field, s.encode())


def f_packed(field, values):
    return f_bytes(field, b"".join(varint(v) for v in values))


def frames(*fs):
    return b"".join(struct.pack("<H", len(f)) + f for f in fs)


def message(msg_type, body, *payloads):
    return frames(b"EPMOE1", struct.pack("<H", msg_type), body, *payloads)


MSG_WELCOME, MSG_STEP, MSG_ADMIN_REQUEST, MSG_DISPATCH, MSG_COMBINE, MSG_ERROR = 11, 17, 40, 60, 61, 1
MSG_SUBMIT, MSG_RESULT = 70, 71


def model_config():
    return b"".join([
        f_varint(1, 128), f_varint(2, 128), f_varint(3, 4), f_varint(4, 1), f_varint(5, 2),
        f_varint(6, 2), f_varint(7, 1), f_varint(8, 1), f_varint(9, 64), f_float(10, 1.5),
        f_float(11, 10.0), f_float(12, 1e-6), f_varint(13, 1), f_varint(14, 0), f_varint(15, 1),
        f_varint(16, 1), f_varint(17, 1)])


def welcome(with_keys):
    peers = b""
    for r in range(2):
        p = f_varint(1, r) + f_str(2, "w%d" % r) + f_str(3, "tcp://127.0.0.1:%d" % (7500 + r))
        if with_keys:
            p += f_bytes(4, bytes([0x40 + r]) * 32)
        peers += f_bytes(9, p)
    ckpt = f_bytes(20, f_str(1, "model.safetensors") + f_varint(2, 1000) + f_varint(3, 17) +
                   f_fixed64(4, 0xABCDEF))
    body = (f_str(1, "c") + f_varint(2, 1) + f_varint(3, 2) + f_varint(4, 5) +
            f_bytes(5, model_config()) + f_fixed64(6, 1) + f_str(7, "/m") +
            f_packed(8, [0, 0, 1, 1]) + peers + f_varint(10, 0) + f_varint(11, 1000) +
            f_varint(12, 3) + f_varint(13, 5000) + f_str(14, "tcp://127.0.0.1:7501") +
            f_str(15, "cpu") + f_packed(17, [0, 1]) + f_varint(18, 0) + f_fixed64(19, 0x5E55) + ckpt)
    return message(MSG_WELCOME, body)


STEP_SESSION, STEP_EPOCH = 0x5E5510A5E5510A5E, 1796000000000


def step(step_id, layer, T, ids):
    body = (f_varint(1, step_id) + f_varint(2, STEP_EPOCH) + f_varint(3, layer) +
            f_varint(4, T) + f_varint(5, 1 if ids else 0) + f_fixed64(6, STEP_SESSION))
    pl = [bytes(T * 128 * 2)]
    if ids:
        pl.append(struct.pack("<%dq" % T, *range(T)))
    return message(MSG_STEP, body, *pl)


DP_SESSION, DP_EPOCH = 0xDA7A, 7


def dispatch(step_id, src, rows, pairs):
    body = (f_varint(1, step_id) + f_varint(2, DP_EPOCH) + f_varint(3, 1) + f_varint(4, src) +
            f_varint(5, rows) + f_varint(6, len(pairs)) + f_varint(7, 0) + f_varint(8, 1) +
            f_fixed64(9, DP_SESSION))
    return message(MSG_DISPATCH, body, bytes(rows * 128), bytes(rows),
                   struct.pack("<%dI" % len(pairs), *[p[0] for p in pairs]),
                   struct.pack("<%dI" % len(pairs), *[p[1] for p in pairs]),
                   struct.pack("<%df" % len(pairs), *[0.5] * len(pairs)))


def combine(step_id, src, n):
    body = (f_varint(1, step_id) + f_varint(2, DP_EPOCH) + f_varint(3, src) + f_varint(4, n) +
            f_fixed64(5, DP_SESSION))
    return message(MSG_COMBINE, body, bytes(n * 128 * 2))


def op(code, arg, data=b"", length=None):
    return bytes([code, arg]) + struct.pack("<H", len(data) if length is None else length) + data


def admin(verb, layer=None, T=0, payloads=()):
    body = f_varint(1, 42) + f_varint(2, verb)
    if layer is not None:
        body += f_str(3, layer)
    if T:
        body += f_varint(4, T) + f_varint(5, 1 if len(payloads) > 1 else 0)
    return message(MSG_ADMIN_REQUEST, body, *payloads)


def write(name, seeds):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    for fname, data in seeds.items():
        with open(os.path.join(d, fname), "wb") as f:
            f.write(data)


write("welcome", {
    "plain": b"\x00" + welcome(False),
    "secure": b"\x01" + welcome(True),
    "error_type": b"\x00" + message(MSG_ERROR, f_varint(1, 3)),
})
write("step", {
    "score_layer": b"\x00" + step(9, 1, 2, False),
    "hash_layer": b"\x0b" + step(9, 0, 3, True),
    "empty_chunk": b"\x00" + step(9, 2, 0, False),
})
write("dataplane", {
    "dispatch_then_take": op(0, 0, dispatch(101, 0, 2, [(0, 2), (1, 3)])) + op(3, 1),
    "grant_combine_take": op(1, 0x01, length=3) + op(0, 0, combine(101, 0, 3)) + op(3, 1),
    "stale_then_new": (op(0, 0, dispatch(100, 2, 1, [(0, 2)])) +
                       op(0, 0, dispatch(101, 2, 1, [(0, 3)])) + op(2, 0) + op(3, 1)),
})
write("admin", {
    "forward_score": admin(5, "1", 2, [bytes(2 * 128 * 2)]),
    "forward_hash": admin(5, "layers.0", 2, [bytes(2 * 128 * 2), struct.pack("<2q", 3, 63)]),
    "status": admin(1),
    "shards_mtp": admin(3, "mtp.0"),
})


# The client plane and the serving path (fuzz_submit, fuzz_serve_data, fuzz_result).
SUBMIT_HASH = 0xC0F1C0F1C0F1C0F1


def submit(layer, T, ids, config_hash=SUBMIT_HASH):
    body = (f_fixed64(1, 0x5E5E5E5E12345678) + f_varint(2, 1) + f_varint(3, layer) +
            f_varint(4, T) + f_varint(5, 1 if ids else 0) + f_fixed64(6, config_hash) +
            f_varint(7, 20000))
    pl = [struct.pack("<%dH" % (T * 128), *([0x3F80] * (T * 128)))]  # bf16 1.0
    if ids:
        pl.append(struct.pack("<%dq" % T, *range(T)))
    return message(MSG_SUBMIT, body, *pl)


def rq_dispatch(src, request, attempt, rows, pairs):
    body = (f_varint(2, DP_EPOCH) + f_varint(3, 1) + f_varint(4, src) + f_varint(5, rows) +
            f_varint(6, len(pairs)) + f_varint(7, 0) + f_varint(8, 1) + f_fixed64(9, DP_SESSION) +
            f_fixed64(10, request) + f_varint(11, attempt))
    return message(MSG_DISPATCH, body, bytes(rows * 128), bytes(rows),
                   struct.pack("<%dI" % len(pairs), *[p[0] for p in pairs]),
                   struct.pack("<%dI" % len(pairs), *[p[1] for p in pairs]),
                   struct.pack("<%df" % len(pairs), *[0.5] * len(pairs)))


def rq_combine(src, request, attempt, n, refused=False):
    body = (f_varint(2, DP_EPOCH) + f_varint(3, src) + f_varint(4, n) + f_fixed64(5, DP_SESSION) +
            f_fixed64(6, request) + f_varint(7, attempt) + f_varint(9, DP_EPOCH))
    if refused:
        return message(MSG_COMBINE, body + f_varint(8, 1))
    return message(MSG_COMBINE, body, bytes(n * 128 * 2))


def rq_op(take, data=b""):
    return bytes([1 if take else 0]) + struct.pack("<H", len(data)) + data


def result(client, seq, T, code=0, msg=""):
    body = f_fixed64(1, client) + f_varint(2, seq)
    if code:
        return message(MSG_RESULT, body + f_varint(3, code) + f_str(4, msg))
    body += (f_varint(5, 7) + f_varint(6, 0) + f_varint(7, 0) + f_varint(8, T) +
             f_fixed64(9, 0) + f_fixed64(10, 0) + f_fixed64(11, 0) + f_fixed64(12, 0))
    return message(MSG_RESULT, body, bytes(T * 128 * 2), struct.pack("<%di" % (2 * T), *range(2 * T)),
                   struct.pack("<%df" % (2 * T), *[0.5] * (2 * T)))


write("submit", {
    "score_layer": submit(1, 2, False),
    "hash_layer": submit(0, 3, True),
    "mtp_layer_with_ids": submit(2, 1, True),
})
write("serve_data", {
    "dispatch_then_take": rq_op(False, rq_dispatch(0, 0x1234000500000007, 1, 2,
                                                   [(0, 2), (1, 3), (1, 0)])) + rq_op(True),
    "combine_then_take": rq_op(False, rq_combine(2, 0x1234000500000008, 2, 3)) + rq_op(True),
    "refused_combine": rq_op(False, rq_combine(0, 0x1234000500000009, 1, 2, True)) + rq_op(True),
    # op byte 2: the owner's filter of awaited COMBINEs; the second one is not awaited
    "awaited_then_not": (bytes([2]) + rq_op(False, rq_combine(0, 0x123400050000000A, 1, 3))[1:] +
                         rq_op(False, rq_combine(2, 0x123400050000000B, 1, 3)) + rq_op(True) +
                         rq_op(True)),
})
C = 0xC11E47C11E47
write("result", {
    "ok_two_tokens_topk": b"\x05" + result(C, 7, 2),
    "ok_one_token": b"\x00" + result(C, 7, 1),
    "refused_busy": b"\x00" + result(C, 7, 1, 13, "this entry worker holds 256 requests"),
    "other_seq": b"\x00" + result(C, 8, 1),
})
