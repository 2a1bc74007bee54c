#!/usr/bin/env python3
"""engine_decode.py — an engine-shaped epmoe client: data-parallel ranks decoding through every
MoE layer, two micro-batches in flight per rank (ping-pong), results checked bit for bit.

    python3 examples/engine_decode.py                      # a local cluster on the demo model
    python3 examples/engine_decode.py --coordinator tcp://127.0.0.1:7401 --model out/demo-model

What a rank does, per decode step and MoE layer L (the model's main layers, then its MTP
layers, in index order), for its two micro-batches A and B:

    wait A's layer L-1 answer -> h_A;  x_A = attention_stand_in(L, h_A);  submit(L, x_A)
    wait B's layer L-1 answer -> h_B;  x_B = attention_stand_in(L, h_B);  submit(L, x_B)

so one micro-batch's MoE call is in flight at the cluster while the rank computes the other's
"attention" (MegaScale-Infer's ping-pong, m = 2). The attention here is a STAND-IN, not a
model: a fixed numpy transform (a per-layer orthogonal-ish mix and tanh, residual added) that
keeps the hidden states finite and data-dependent. The MoE part is real: each call goes to
the cluster through libepmoe and comes back bit-identical to `epmoectl forward --local`, which
the example checks on a sample of calls at the end.

Prints a progress bar, tokens/s, and latency percentiles of the layer calls (submit to answer,
as libepmoe measures it). Without --coordinator it generates the demo model (./dev demo's:
H 1024, 16 experts, 4 layers + 1 MTP) in out/demo-model if absent, starts a coordinator and
4 workers on free loopback ports (epmoe.local, binaries from --build or $EPMOE_BUILD_DIR or
build/), and stops them at the end. Exit 0 when every checked call is bit-identical.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if (REPO / "build" / "client" / "libepmoe.so.0").exists():
    os.environ.setdefault("EPMOE_BUILD_DIR", str(REPO / "build"))
    os.environ.setdefault("EPMOE_LIBRARY", str(REPO / "build" / "client" / "libepmoe.so.0"))
try:
    import epmoe
    from epmoe import local
except ImportError:  # run from a checkout without `pip install ./python`
    sys.path.insert(0, str(REPO / "python"))
    import epmoe
    from epmoe import local

DEMO_MODEL_ARGS = ("--hidden", "1024", "--inter", "512", "--experts", "16", "--layers", "4",
                   "--hash-layers", "1", "--mtp", "1", "--seed", "2026")


def attention_stand_in(layer: int, h: np.ndarray, H: int) -> np.ndarray:
    """STAND-IN for attention (not a model): x = h + 0.25 tanh(h W_L), W_L a fixed per-layer
    matrix. Input and output are bf16 bit patterns [T, H]; deterministic and finite."""
    rng = np.random.default_rng(1000 + layer)
    w = (rng.standard_normal((H, H), dtype=np.float32) / np.float32(np.sqrt(H)))
    x = epmoe.bf16_to_float32(h).reshape(h.shape)
    y = x + np.float32(0.25) * np.tanh(x @ w)
    return epmoe.float32_to_bf16(y).view(np.uint16)


def residual(x: np.ndarray, moe_out: np.ndarray) -> np.ndarray:
    """The next layer's input: the attention output plus the MoE output (bf16)."""
    s = epmoe.bf16_to_float32(x).reshape(x.shape) + epmoe.bf16_to_float32(moe_out).reshape(x.shape)
    return epmoe.float32_to_bf16(np.clip(s, -8, 8)).view(np.uint16)


def rank_main(rank: int, args: argparse.Namespace, admin: str, progress: Any, results: Any) -> None:
    """One data-parallel rank: its own Client, `batch` sequences split into two micro-batches."""
    try:
        with epmoe.Client(admin, max_in_flight=4) as c:
            info = c.info
            H, B = info.hidden_size, args.batch
            rng = np.random.default_rng(rank)
            h0 = epmoe.float32_to_bf16(rng.standard_normal((B, H), dtype=np.float32) * 0.5)
            h0 = h0.view(np.uint16)
            ids0 = rng.integers(0, info.vocab_size, B, dtype=np.int64)
            half = (B + 1) // 2
            mbs = [(h0[:half].copy(), ids0[:half].copy()), (h0[half:].copy(), ids0[half:].copy())]
            mbs = [m for m in mbs if m[0].shape[0] > 0]
            n_calls = args.steps * info.n_layers * len(mbs)
            srng = np.random.default_rng(100 + rank)
            pick = set(srng.choice(n_calls, size=min(args.check, n_calls), replace=False).tolist())
            lat: List[float] = []
            sampled: List[Tuple[int, np.ndarray, np.ndarray, epmoe.Request]] = []
            call = 0
            t0 = time.perf_counter()
            for _step in range(args.steps):
                h = [m[0] for m in mbs]
                ids = [m[1] for m in mbs]
                pending: List[Any] = [None] * len(mbs)
                xs: List[Any] = [None] * len(mbs)
                for layer in range(info.n_layers):
                    for m in range(len(mbs)):
                        if pending[m] is not None:  # the other micro-batch is in flight meanwhile
                            out = pending[m].result()[0]
                            lat.append(pending[m].info.total_s)
                            h[m] = residual(xs[m], out.view(np.uint16))
                        xs[m] = attention_stand_in(layer, h[m], H)
                        pending[m] = c.submit(layer, xs[m], ids[m])
                        if call in pick:
                            sampled.append((layer, xs[m], ids[m], pending[m]))
                        call += 1
                for m in range(len(mbs)):
                    out = pending[m].result()[0]
                    lat.append(pending[m].info.total_s)
                    nxt = (ids[m] * 7 + 1) % info.vocab_size  # the stand-in's "next token"
                    mbs[m] = (residual(xs[m], out.view(np.uint16)), nxt)
                progress.put(1)
            wall = time.perf_counter() - t0
            samples = []
            for layer, x, i, r in sampled:
                out, tid, tw = r.result()
                samples.append((layer, x, i, out.view(np.uint16).copy(), tid.copy(), tw.copy()))
            results.put((rank, B * args.steps, wall, lat, samples, None))
    except BaseException as e:  # the parent reports it
        results.put((rank, 0, 0.0, [], [], f"{type(e).__name__}: {e}"))


def bar(done: int, total: int, t0: float, width: int = 32) -> str:
    f = done / total if total else 1.0
    n = int(f * width)
    return f"\r[{'#' * n}{'.' * (width - n)}] {done}/{total} rank-steps  {time.monotonic() - t0:5.1f} s"


def check_samples(bins: Any, model: str, info: Any, samples: List[Any], tmp: str) -> int:
    """Each sampled call against `epmoectl forward --local`: the number that differ."""
    bad = 0
    for n, (rank, (layer, x, ids, out, tid, tw)) in enumerate(samples):
        inp, ref = os.path.join(tmp, f"in{n}.st"), os.path.join(tmp, f"ref{n}.st")
        local.write_safetensors(inp, {"hidden_states": x, "input_ids": ids},
                                {"hidden_states": "BF16", "input_ids": "I64"})
        r = bins.forward_local(model, info.layer_name(layer), inp, ref)
        same = (np.array_equal(out, r["out"]) and np.array_equal(tid, r["topk_ids"])
                and np.array_equal(tw.view(np.uint32), r["topk_weights"].view(np.uint32)))
        if not same:
            print(f"  rank {rank} layer {info.layer_name(layer)} T={x.shape[0]}: DIFFERS from forward --local")
            bad += 1
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coordinator", help="an existing cluster's admin endpoint (else a local one)")
    ap.add_argument("--model", default=str(REPO / "out" / "demo-model"),
                    help="the cluster's checkpoint, for forward --local (default: out/demo-model)")
    ap.add_argument("--expert-dtype", default="fp4", choices=["fp4", "fp8"],
                    help="when the demo model is generated (default fp4)")
    ap.add_argument("--build", help="build directory with the daemons (default $EPMOE_BUILD_DIR, build/)")
    ap.add_argument("--ranks", type=int, default=2, help="data-parallel rank processes P (2)")
    ap.add_argument("--batch", type=int, default=32, help="sequences per rank (32: 2 micro-batches of 16)")
    ap.add_argument("--steps", type=int, default=16, help="decode steps (16)")
    ap.add_argument("--workers", type=int, default=4, help="workers of the local cluster (4)")
    ap.add_argument("--check", type=int, default=4, help="layer calls per rank checked against forward --local (4)")
    args = ap.parse_args()

    bins = local.Binaries(args.build)
    cluster = None
    if not (Path(args.model) / "config.json").exists():
        if args.coordinator:
            print(f"engine_decode: no checkpoint at {args.model} (--model)", file=sys.stderr)
            return 2
        print(f"engine_decode: generating the demo model in {args.model}")
        Path(args.model).parent.mkdir(parents=True, exist_ok=True)
        bins.mkmodel(args.model, args.expert_dtype, *DEMO_MODEL_ARGS)
    admin = args.coordinator
    if admin is None:
        cluster = local.LocalCluster(str(Path(args.model).resolve()), workers=args.workers,
                                     build_dir=args.build)
        cluster.start()
        admin = cluster.admin
        print(f"engine_decode: local cluster of {args.workers} workers at {admin} (logs in {cluster.dir})")
    try:
        with epmoe.Client(admin) as c:
            info = c.info
        print(f"libepmoe {epmoe.__version__}: H {info.hidden_size}, {info.n_layers} MoE layers "
              f"({', '.join(info.layers)}), {info.expert_dtype} experts, top-{info.topk} of "
              f"{info.n_experts}, {len(info.members)} members")
        print(f"{args.ranks} ranks x {args.batch} sequences, 2 micro-batches each in flight "
              f"(ping-pong), {args.steps} decode steps; attention is a numpy STAND-IN")
        ctx = mp.get_context("spawn")  # each rank opens its own client, after the start
        progress, results = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, args, admin, progress, results))
                 for r in range(args.ranks)]
        t0 = time.monotonic()
        for p in procs:
            p.start()
        total, done = args.ranks * args.steps, 0
        got: List[Any] = []
        tty = sys.stdout.isatty()
        while len(got) < args.ranks:
            while not progress.empty():
                progress.get()
                done += 1
                if tty or done == total or done % max(1, total // 8) == 0:
                    print(bar(done, total, t0), end="" if tty else "\n", flush=True)
            try:
                got.append(results.get(timeout=0.1))
            except Exception:  # queue.Empty
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
        for p in procs:
            p.join(10)
        while not progress.empty():
            progress.get()
            done += 1
        print(bar(done, total, t0), flush=True)
        errors = [g for g in got if g[5]]
        for g in errors:
            print(f"rank {g[0]}: {g[5]}", file=sys.stderr)
        if errors or len(got) < args.ranks:
            return 1
        tokens = sum(g[1] for g in got)
        wall = max(g[2] for g in got)  # the ranks decode in parallel: the slowest one's time
        lat = np.array([x for g in got for x in g[3]]) * 1e3
        print(f"decoded {tokens} tokens in {wall:.2f} s: {tokens / wall:.1f} tokens/s "
              f"({len(lat)} layer calls, {tokens * info.n_layers} token-layers)")
        p50, p90, p99 = np.percentile(lat, [50, 90, 99])
        print(f"layer call latency (ms): p50 {p50:.2f}  p90 {p90:.2f}  p99 {p99:.2f}  max {lat.max():.2f}")
        samples = [(g[0], s) for g in got for s in g[4]]
        with tempfile.TemporaryDirectory(prefix="engine_decode-") as tmp:
            bad = check_samples(bins, args.model, info, samples, tmp)
        print(f"checked {len(samples)} sampled layer calls against forward --local: "
              f"{'all bit-identical' if bad == 0 else f'{bad} DIFFER'}")
        return 0 if bad == 0 else 1
    finally:
        if cluster is not None:
            cluster.stop()
            cluster.cleanup()


if __name__ == "__main__":
    sys.exit(main())
