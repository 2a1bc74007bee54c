#!/usr/bin/env python3
"""transformers_generate.py — Hugging Face transformers' DeepSeek V4 generating through epmoe.

    python3 examples/transformers_generate.py                  # tiny checkpoint, local cluster
    python3 examples/transformers_generate.py --model DIR --coordinator tcp://127.0.0.1:7401

transformers (>= 5.23, with torch and accelerate) loads the checkpoint; epmoe's cluster serves the
same checkpoint's MoE layers; epmoe.integrations.transformers.attach routes every decoder layer's
MoE block to the cluster, and model.generate() runs a batch of prompts (left-padded, greedy).
Prints tokens/s, how many generated tokens agree with transformers' own MoE (they differ where
epmoe's FP8 activation quantization, DeepSeek's reference numerics, tips a near-tie), and the
bit-identity check: every MoE call of the batched run is resubmitted row by row, alone, and each
row's output must be bit-identical to what it got inside the batch. Exit 0 when it is.

Without --model it writes a tiny complete checkpoint (`epmoectl mkmodel --full`: H 256, 16
experts, 4 layers + 1 MTP) to out/transformers-model if absent; without --coordinator it starts a
coordinator and --workers workers on free loopback ports (epmoe.local) and stops them at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, List, Optional, Tuple

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
from epmoe.integrations import transformers as hf

try:
    import torch
    import transformers
except ImportError as e:
    sys.exit(f"transformers_generate.py needs torch, transformers and accelerate (pip install): {e}")

Call = Tuple[int, Any, Optional[Any], Any]


def prompts(batch: int, vocab: int, seed: int) -> Tuple[Any, Any]:
    """batch random prompts of 3..12 tokens, left-padded with 0, and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(2, vocab, (int(torch.randint(3, 13, (1,), generator=g)),), generator=g).tolist()
            for _ in range(batch)]
    n = max(map(len, rows))
    ids = torch.tensor([[0] * (n - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def check_rows(client: epmoe.Client, calls: List[Call]) -> Tuple[int, int]:
    """Resubmit every row of every recorded call alone: (rows, bf16 elements that changed)."""
    rows = changed = 0
    for li, h, t, out in calls:
        for r in range(h.shape[0]):
            o = torch.empty_like(h[r : r + 1])
            client.submit(li, h[r : r + 1], None if t is None else t[r : r + 1], out=o).result()
            changed += int((o.view(torch.int16) != out[r : r + 1].view(torch.int16)).sum())
            rows += 1
    return rows, changed


def run(args: argparse.Namespace, model: Any, client: epmoe.Client) -> int:
    ids, mask = prompts(args.batch, model.config.vocab_size, args.seed)
    kw = dict(attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        own = model.generate(ids, **kw)
    calls: List[Call] = []
    hf.attach(model, client, record=lambda li, h, t, o: calls.append(
        (li, h.clone(), None if t is None else t.clone(), o.clone())))
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            got = model.generate(ids, **kw)
        dt = time.perf_counter() - t0
    finally:
        hf.detach(model)
    new = got[:, ids.shape[1] :]
    agree = float((new == own[:, ids.shape[1] :]).float().mean())
    print(f"generated {new.numel()} tokens ({args.batch} prompts x {args.new_tokens}) through epmoe in "
          f"{dt:.2f} s: {new.numel() / dt:.1f} tokens/s, {len(calls)} MoE calls")
    print(f"tokens equal to transformers' own MoE: {agree:.1%}")
    for r in range(min(args.batch, 3)):
        print(f"  prompt {r}: {new[r].tolist()}")
    rows, changed = check_rows(client, calls)
    if changed:
        print(f"bit-identity: {rows} rows resubmitted alone: {changed} bf16 elements changed")
        return 1
    print(f"bit-identity: {len(calls)} MoE calls, {rows} rows resubmitted alone: all bit-identical")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint (default: out/transformers-model, made if absent)")
    ap.add_argument("--expert-dtype", default="fp4", choices=("fp4", "fp8"), help="for the made checkpoint")
    ap.add_argument("--coordinator", help="an epmoe cluster serving --model (default: start one)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    path = args.model
    if path is None:
        path = str(REPO / "out" / "transformers-model")
        if not (Path(path) / "config.json").exists():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            local.Binaries().mkmodel(path, args.expert_dtype, "--full", "--seed", "24")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    if args.coordinator:
        with epmoe.Client(args.coordinator) as client:
            return run(args, model, client)
    with local.LocalCluster(path, workers=args.workers) as cl, epmoe.Client(cl.admin) as client:
        return run(args, model, client)


if __name__ == "__main__":
    sys.exit(main())
