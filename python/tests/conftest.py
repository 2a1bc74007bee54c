"""Fixtures: real clusters (epmoe.local.LocalCluster: the real daemons on free loopback ports,
killed in a finally even when a test fails), synthetic checkpoints and inputs made by
`epmoectl mkmodel`/`mkinput`, and reference outputs from `epmoectl forward --local` (an
independent path: this process runs the layer, no cluster, no libepmoe).

The binaries come from $EPMOE_BUILD_DIR (ctest sets it) or ../../build; the library from
$EPMOE_LIBRARY (ctest sets it) or the package's own search.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterator, Tuple

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if "EPMOE_BUILD_DIR" not in os.environ and (REPO / "build" / "ctl" / "epmoectl").exists():
    os.environ["EPMOE_BUILD_DIR"] = str(REPO / "build")
if "EPMOE_LIBRARY" not in os.environ and "EPMOE_BUILD_DIR" in os.environ:
    lib = Path(os.environ["EPMOE_BUILD_DIR"]) / "client" / "libepmoe.so.0"
    if lib.exists():
        os.environ["EPMOE_LIBRARY"] = str(lib)

import epmoe  # noqa: E402
from epmoe import local  # noqa: E402

TOKENS = (1, 7, 64)
# 12 experts, 2 main layers (the first hash-routed) and 1 MTP layer: every kind of layer
MODEL_ARGS = ("--experts", "12", "--layers", "2", "--hash-layers", "1", "--mtp", "1", "--seed", "7")


class Models:
    """Checkpoints, inputs and forward --local references, made once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = local.Binaries()
        self._refs: Dict[Tuple[str, str, str], Dict[str, np.ndarray]] = {}
        for dt in ("fp4", "fp8"):
            self.bin.mkmodel(str(root / dt), dt, *MODEL_ARGS)
        for t in TOKENS:
            self.bin.ctl_run("mkinput", "--model", str(root / "fp4"), "--tokens", str(t),
                             "--seed", str(t), "--out", self.input_path(t))

    def model(self, dt: str) -> str:
        return str(self.root / dt)

    def input_path(self, t: int) -> str:
        return str(self.root / f"in_{t}.st")

    def input(self, t: int) -> Dict[str, np.ndarray]:
        return local.read_safetensors(self.input_path(t))

    def ref(self, dt: str, layer: str, t: int) -> Dict[str, np.ndarray]:
        key = (dt, layer, self.input_path(t))
        if key not in self._refs:
            out = str(self.root / f"ref_{dt}_{layer}_{t}.st")
            self._refs[key] = self.bin.forward_local(self.model(dt), layer, self.input_path(t), out)
        return self._refs[key]


def assert_same(got: Tuple[np.ndarray, np.ndarray, np.ndarray], ref: Dict[str, np.ndarray], what: str) -> None:
    """Bit-identical: out's bf16 bits, topk ids and topk weights' float32 bits."""
    out, ids, w = got
    checks = (
        ("out", np.ascontiguousarray(out).view(np.uint16), ref["out"].view(np.uint16)),
        ("topk_ids", np.asarray(ids, dtype=np.int32), ref["topk_ids"]),
        ("topk_weights", np.ascontiguousarray(w).view(np.uint32), ref["topk_weights"].view(np.uint32)),
    )
    for name, a, b in checks:
        if a.shape != b.shape:
            raise AssertionError(f"{what}: {name} shape {a.shape}, forward --local {b.shape}")
        diff = np.flatnonzero(a.reshape(-1) != b.reshape(-1))
        if diff.size:
            i = int(diff[0])
            raise AssertionError(
                f"{what}: {name} differs from forward --local in {diff.size} elements, first at "
                f"flat index {i}: {a.reshape(-1)[i]:#x} vs {b.reshape(-1)[i]:#x}"
            )


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return Models(tmp_path_factory.mktemp("models"))


def _cluster(models: Models, dt: str, **kw: object) -> Iterator[local.LocalCluster]:
    cl = local.LocalCluster(models.model(dt), **kw)  # type: ignore[arg-type]
    try:
        cl.start()
        yield cl
    finally:
        try:
            cl.stop()
        finally:
            cl.cleanup()


@pytest.fixture(scope="session", params=["fp4", "fp8"])
def cluster(request: pytest.FixtureRequest, models: Models) -> Iterator[local.LocalCluster]:
    """A 3-worker cluster serving the fp4 or the fp8 checkpoint (every test runs on both)."""
    yield from _cluster(models, request.param, workers=3)


@pytest.fixture()
def client(cluster: local.LocalCluster) -> Iterator[epmoe.Client]:
    with epmoe.Client(cluster.admin) as c:
        yield c


@pytest.fixture(scope="module")
def lone_cluster(models: Models) -> Iterator[local.LocalCluster]:
    """A 2-worker fp4 cluster a module may pause, drain or stop."""
    yield from _cluster(models, "fp4", workers=2)


@pytest.fixture(scope="module")
def secure_cluster(models: Models) -> Iterator[local.LocalCluster]:
    """A 2-worker fp8 cluster with a security: section (CURVE everywhere, ZAP allow-lists)."""
    yield from _cluster(models, "fp8", workers=2, secure=True)


def dtype_of(cluster: local.LocalCluster) -> str:
    return os.path.basename(cluster.model)
