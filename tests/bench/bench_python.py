#!/usr/bin/env python3
"""bench_python.py — what the Python package adds to a single-token request, side by side with
the C client (docs/performance.md "Python over libepmoe"; issue 16's goal: <= 1.2x).

Starts a local cluster (epmoe.local: the real daemons on loopback) and opens one
epmoe.Client. In this one process, on that one client (the same sockets, entry worker and
I/O thread), it then alternates in chunks of CHUNK calls, each chunk in another order:
  C:            bench_single_loop (tests/bench/bench_single.c, a C loop in a module loaded
                with ctypes; the GIL is released for the whole chunk): epmoe_submit +
                epmoe_wait + epmoe_request_free, outputs into buffers allocated once, timed
                in C;
  Python:       client.submit(layer, hidden, ids).result(), new output arrays per call (the
                API's default);
  Python out=:  the same with caller-provided out/topk arrays;
  ctypes floor: the three library calls straight through ctypes, arguments built once;
one request at a time, the same layer and tokens, each call timed from before submit to
after the answer is in hand. Short interleaved chunks because the load of a shared machine
drifts by more than the difference measured here between two runs of a few hundred ms.
Prints p50 / p90 / mean of every mode over all its calls and the ratios to C.

    python3 tests/bench/bench_python.py [--model DIR | --demo] [--tokens 1] [--n 3000]
                                        [--chunk 20] [--workers 2] [--layer 1]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("EPMOE_BUILD_DIR", str(REPO / "build"))
os.environ.setdefault("EPMOE_LIBRARY", os.path.join(os.environ["EPMOE_BUILD_DIR"], "client", "libepmoe.so.0"))
sys.path.insert(0, str(REPO / "python"))
import epmoe  # noqa: E402
from epmoe import _lib, local  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint (default: a small one generated here, H 256)")
    ap.add_argument("--demo", action="store_true", help="generate the demo model's shape instead (H 1024)")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--n", type=int, default=3000, help="calls per mode")
    ap.add_argument("--chunk", type=int, default=20, help="calls per chunk")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--layer", default="1")
    args = ap.parse_args()
    bins = local.Binaries()
    mod = ctypes.CDLL(os.path.join(os.environ["EPMOE_BUILD_DIR"], "tests", "bench", "libbench_single.so"))
    mod.bench_single_loop.restype = ctypes.c_int
    mod.bench_single_loop.argtypes = [ctypes.c_void_p, ctypes.POINTER(_lib.SubmitArgs), ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_double)]
    with tempfile.TemporaryDirectory(prefix="bench_python-") as tmp:
        model = args.model
        if model is None:
            model = os.path.join(tmp, "model")
            extra = (["--hidden", "1024", "--inter", "512", "--experts", "16", "--layers", "4",
                      "--seed", "2026"] if args.demo else ["--experts", "12", "--layers", "2", "--seed", "7"])
            bins.mkmodel(model, "fp4", "--hash-layers", "1", "--mtp", "1", *extra)
        inp = os.path.join(tmp, "in.st")
        bins.ctl_run("mkinput", "--model", model, "--tokens", str(args.tokens), "--seed", "1", "--out", inp)
        t = local.read_safetensors(inp)
        h = t["hidden_states"].copy()
        ids = t["input_ids"].astype(np.int64)
        with local.LocalCluster(model, workers=args.workers) as cl, epmoe.Client(cl.admin) as c:
            i = c.info
            li = c.layer_index(args.layer)
            T, k = h.shape[0], i.topk
            out, tid, tw = np.empty_like(h), np.empty((T, k), np.int32), np.empty((T, k), np.float32)
            a = _lib.SubmitArgs(li, T, h.ctypes.data, ids.ctypes.data, out.ctypes.data, tid.ctypes.data,
                                tw.ctypes.data, 0, None)
            cbuf = (ctypes.c_double * args.chunk)()
            clock = time.perf_counter_ns

            def c_chunk(n: int) -> List[float]:
                rc = mod.bench_single_loop(c._handle, ctypes.byref(a), n, cbuf)
                if rc != 0:
                    raise epmoe.errors.from_status(rc, "bench_single_loop")
                return list(cbuf[:n])

            def py_chunk(n: int) -> List[float]:
                us = []
                for _ in range(n):
                    t0 = clock()
                    c.submit(li, h, ids).result()
                    us.append((clock() - t0) / 1e3)
                return us

            def py_out_chunk(n: int) -> List[float]:
                us = []
                for _ in range(n):
                    t0 = clock()
                    c.submit(li, h, ids, out=out, topk_ids=tid, topk_weights=tw).result()
                    us.append((clock() - t0) / 1e3)
                return us

            L = _lib.lib
            r, e = ctypes.c_void_p(), _lib.Error()
            ra, rr, re_ = ctypes.byref(a), ctypes.byref(r), ctypes.byref(e)

            def floor_chunk(n: int) -> List[float]:
                us = []
                for _ in range(n):
                    t0 = clock()
                    L.epmoe_submit(c._handle, ra, rr, re_)
                    L.epmoe_wait(r, -1, re_)
                    L.epmoe_request_free(rr)
                    us.append((clock() - t0) / 1e3)
                return us

            modes: Dict[str, Callable[[int], List[float]]] = {
                "C": c_chunk, "Python": py_chunk, "Python out=": py_out_chunk, "ctypes floor": floor_chunk}
            names = list(modes)
            for name in names:  # warm-up
                modes[name](args.chunk)
            res: Dict[str, List[float]] = {n: [] for n in names}
            chunks = max(1, args.n // args.chunk)
            t_start = time.monotonic()
            for j in range(chunks):
                for name in names[j % len(names):] + names[: j % len(names)]:
                    res[name] += modes[name](args.chunk)
            wall = time.monotonic() - t_start
            print(f"cluster: {args.workers} workers x 1 thread, H {i.hidden_size}, {i.n_experts} experts "
                  f"top-{i.topk}, {i.expert_dtype}; layer {args.layer}, T = {T}; {chunks} chunks of "
                  f"{args.chunk} calls per mode, interleaved, {wall:.1f} s; load average "
                  f"{os.getloadavg()[0]:.2f}")
        st = {n: (np.percentile(v, 50), np.percentile(v, 90), float(np.mean(v))) for n, v in res.items()}
        c50, _, cmean = st["C"]
        print("| client | p50 µs | p90 µs | mean µs | p50 / C | mean / C |")
        print("|---|---|---|---|---|---|")
        for n, (p50, p90, mean) in st.items():
            print(f"| {n} | {p50:.1f} | {p90:.1f} | {mean:.1f} | {p50 / c50:.3f} | {mean / cmean:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
