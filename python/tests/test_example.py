"""examples/engine_decode.py runs briefly (its own local cluster, both micro-batches, the
sample check against forward --local) and says every checked call is bit-identical."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import Models

REPO = Path(__file__).resolve().parents[2]


def test_engine_decode_runs(models: Models) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")]))
    p = subprocess.run(
        [sys.executable, str(REPO / "examples" / "engine_decode.py"), "--model", models.model("fp8"),
         "--ranks", "2", "--batch", "6", "--steps", "3", "--workers", "2", "--check", "6"],
        capture_output=True, text=True, timeout=240, env=env, check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "tokens/s" in p.stdout and "p99" in p.stdout
    assert "checked 12 sampled layer calls against forward --local: all bit-identical" in p.stdout, p.stdout
