#!/usr/bin/env python3
"""measure_scale_fmt.py — what reading quantization_config.scale_fmt as transformers means it
would change in epmoe's layer (docs/numerics.md §9-§10): the relative L2 distance between
epmoe's output with power-of-two activation scales ("ue8m0") and with plain ones (what "float"
or an absent scale_fmt selects), on every layer kind of an `epmoectl mkmodel` checkpoint, FP8
and FP4 experts, 256 random tokens (N(0, 1) hidden states, seed 24). Needs numpy.

usage: measure_scale_fmt.py EPMOECTL
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

T, H, V = 256, 256, 1000  # mkmodel's default hidden size and vocabulary


def write_input(path):
    rng = np.random.default_rng(24)
    u = rng.standard_normal((T, H)).astype(np.float32).view(np.uint32)
    bf16 = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    ids = rng.integers(0, V, T).astype(np.int64)
    tensors = {"hidden_states": ("BF16", [T, H], bf16.tobytes()),
               "input_ids": ("I64", [T], ids.tobytes())}
    hdr, off = {}, 0
    for name, (dt, shape, b) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(t[2] for t in tensors.values()))


def read(path, name):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + n])[name]
    s, e = t["data_offsets"]
    raw = b[8 + n + s:8 + n + e]
    if t["dtype"] == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, np.int32)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ctl = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        write_input(f"{d}/in.st")
        for dt in ("fp8", "fp4"):
            ue, plain = f"{d}/{dt}-ue8m0", f"{d}/{dt}-plain"
            subprocess.run([ctl, "mkmodel", "--out", ue, "--expert-dtype", dt, "--shards", "1"],
                           check=True, stdout=subprocess.DEVNULL)
            os.mkdir(plain)
            for f in os.listdir(ue):
                if f.endswith(".safetensors"):
                    os.symlink(f"{ue}/{f}", f"{plain}/{f}")
            cfg = json.load(open(f"{ue}/config.json"))
            del cfg["quantization_config"]["scale_fmt"]  # plain activation scales
            json.dump(cfg, open(f"{plain}/config.json", "w"))
            for layer in ("0", "1", "mtp.0"):
                outs = []
                for m in (ue, plain):
                    out = f"{m}-{layer}.st"
                    subprocess.run([ctl, "forward", "--local", "--model", m, "--layer", layer,
                                    "--input", f"{d}/in.st", "--output", out, "--threads", "1"],
                                   check=True, stdout=subprocess.DEVNULL)
                    outs.append(out)
                a, b = (read(o, "out").astype(np.float64) for o in outs)
                same = np.array_equal(read(outs[0], "topk_ids"), read(outs[1], "topk_ids"))
                print(f"{dt} layer {layer:5s}: relative L2 {np.linalg.norm(a - b) / np.linalg.norm(a):.4f}"
                      f", routing ids {'equal' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
