"""local — a throw-away epmoe cluster on this machine, for tests, examples and notebooks.

    with epmoe.local.LocalCluster(model_dir, workers=3) as cl:
        client = epmoe.Client(cl.admin)

starts the real daemons (epmoe-coordinator, epmoe-worker, from a build tree or PATH) on free
loopback ports with a generated cluster spec, waits until `epmoectl status --wait-ready`,
and stops them on exit: an admin shutdown, then SIGKILL for any daemon still there, even when
the body raised. Also the safetensors files `epmoectl forward`/`mkinput` read and write.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from . import _paths

_ST_DTYPES = {"BF16": np.uint16, "F32": np.float32, "I32": np.int32, "I64": np.int64,
              "F16": np.float16, "U8": np.uint8, "I8": np.int8}


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Every tensor of a safetensors file (BF16 as uint16 bit patterns)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out: Dict[str, np.ndarray] = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        arr = np.frombuffer(data[8 + n + a : 8 + n + b], dtype=_ST_DTYPES[t["dtype"]])
        out[name] = arr.reshape(t["shape"])
    return out


def write_safetensors(path: str, tensors: Dict[str, np.ndarray], dtypes: Dict[str, str]) -> None:
    """Write tensors (in order) with their safetensors dtypes ("BF16" for uint16 bits)."""
    header: Dict[str, Any] = {}
    off = 0
    blobs = []
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtypes[name], "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def free_ports(n: int) -> List[int]:
    """n free tcp ports on 127.0.0.1 (bound to port 0 and released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies (Linux
    PR_SET_PDEATHSIG), so that a test runner killed at its timeout leaves no daemon behind."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the finally blocks still stop them
        pass


class Binaries:
    """Where epmoectl, epmoe-coordinator and epmoe-worker are."""

    def __init__(self, build_dir: Optional[str] = None) -> None:
        b = build_dir or os.environ.get("EPMOE_BUILD_DIR")
        if not b and _paths.LIBRARY:
            cand = Path(_paths.LIBRARY).resolve().parent.parent
            if (cand / "ctl" / "epmoectl").exists():
                b = str(cand)
        if b:
            self.ctl = str(Path(b) / "ctl" / "epmoectl")
            self.coordinator = str(Path(b) / "coordinator" / "epmoe-coordinator")
            self.worker = str(Path(b) / "worker" / "epmoe-worker")
        else:
            self.ctl = shutil.which("epmoectl") or "epmoectl"
            self.coordinator = shutil.which("epmoe-coordinator") or "epmoe-coordinator"
            self.worker = shutil.which("epmoe-worker") or "epmoe-worker"
        for p in (self.ctl, self.coordinator, self.worker):
            if not os.access(p, os.X_OK):
                raise FileNotFoundError(f"epmoe.local: {p} is not an executable (set EPMOE_BUILD_DIR)")

    def ctl_run(self, *args: str) -> str:
        p = subprocess.run([self.ctl, *args], capture_output=True, text=True, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"epmoectl {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    def mkmodel(self, out: str, expert_dtype: str, *extra: str) -> str:
        self.ctl_run("mkmodel", "--out", out, "--expert-dtype", expert_dtype, "--force", *extra)
        return out

    def forward_local(self, model: str, layer: str, inp: str, out: str) -> Dict[str, np.ndarray]:
        """`epmoectl forward --local`: the reference output of one layer."""
        self.ctl_run("forward", "--local", "--model", model, "--layer", layer, "--input", inp, "--output", out)
        return read_safetensors(out)


class LocalCluster:
    """A coordinator and `workers` CPU workers on loopback serving `model`.

    secure=True writes a security: section: keys from `epmoectl keygen` in self.keys
    (coordinator, w0.., operator "op", client "engine"), client_keys admitted."""

    def __init__(
        self,
        model: str,
        workers: int = 3,
        dispatch: str = "fp8",
        secure: bool = False,
        build_dir: Optional[str] = None,
        threads: int = 1,
        workdir: Optional[str] = None,
    ) -> None:
        self.bin = Binaries(build_dir)
        self.model = model
        self.n_workers = workers
        self.dispatch = dispatch
        self.secure = secure
        self.threads = threads
        self._own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="epmoe-local-")
        self.procs: List[subprocess.Popen[bytes]] = []
        self.admin = ""
        self.listen = ""
        self.keys = os.path.join(self.dir, "keys")

    # ---- keys ----

    def _keygen(self, name: str, sub: Optional[str]) -> None:
        self.bin.ctl_run("keygen", "--out", self.keys, "--name", name)
        if sub:
            shutil.copy(os.path.join(self.keys, f"{name}.pub"), os.path.join(self.keys, sub))

    def key(self, name: str) -> str:
        return os.path.join(self.keys, f"{name}.key")

    def pub(self, name: str) -> str:
        return os.path.join(self.keys, f"{name}.pub")

    # ---- lifetime ----

    def start(self) -> "LocalCluster":
        p = free_ports(2 + self.n_workers)
        self.listen = f"tcp://127.0.0.1:{p[0]}"
        self.admin = f"tcp://127.0.0.1:{p[1]}"
        lines = [
            f"cluster: {{name: py{p[0]}}}",
            f'coordinator: {{listen: "{self.listen}", admin: "{self.admin}", heartbeat_ms: 200, liveness: 10}}',
            f"model: {{path: {self.model}}}",
            f"expert_parallel: {{placement: contiguous, dispatch: {self.dispatch}}}",
            "nodes:",
            "  - name: local",
            "    workers:",
        ]
        for r in range(self.n_workers):
            lines.append(f'      - {{name: w{r}, device: cpu, data: "tcp://127.0.0.1:{p[2 + r]}"}}')
        if self.secure:
            for d in ("workers", "operators", "clients"):
                os.makedirs(os.path.join(self.keys, d), exist_ok=True)
            self._keygen("coordinator", None)
            for r in range(self.n_workers):
                self._keygen(f"w{r}", "workers")
            self._keygen("op", "operators")
            self._keygen("engine", "clients")
            self._keygen("stranger", None)  # a key in no list
            k = self.keys
            lines.append(f"security: {{coordinator_key: {k}/coordinator.key, worker_keys: {k}/workers,")
            lines.append(f"           operator_keys: {k}/operators, client_keys: {k}/clients}}")
        spec = os.path.join(self.dir, "cluster.yaml")
        Path(spec).write_text("\n".join(lines) + "\n")
        self.spec = spec
        try:
            self._spawn([self.bin.coordinator, "--cluster", spec], "coord")
            for r in range(self.n_workers):
                cmd = [self.bin.worker, "--coordinator", self.listen, "--name", f"w{r}", "--threads", str(self.threads)]
                if self.secure:
                    cmd += ["--key", self.key(f"w{r}"), "--coordinator-key", self.pub("coordinator")]
                self._spawn(cmd, f"w{r}")
            self.ctl("status", "--wait-ready", "--wait-timeout", "120")
        except BaseException:
            self.kill()
            raise
        return self

    def _spawn(self, cmd: List[str], tag: str) -> None:
        log = open(os.path.join(self.dir, f"{tag}.log"), "wb")
        self.procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             preexec_fn=_die_with_parent)
        )
        log.close()

    def ctl(self, *args: str) -> str:
        """epmoectl against this cluster (with the operator key when secure)."""
        a = ["--coordinator", self.admin]
        if self.secure:
            a += ["--key", self.key("op"), "--server-key", self.pub("coordinator")]
        try:
            return self.bin.ctl_run(*a, *args)
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{self.logs()}") from None

    def logs(self, tail: int = 10) -> str:
        out = []
        for f in sorted(Path(self.dir).glob("*.log")):
            lines = f.read_text(errors="replace").splitlines()[-tail:]
            out.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def worker_pids(self) -> List[int]:
        return [p.pid for p in self.procs[1:]]

    def pause_workers(self) -> None:
        for p in self.procs[1:]:
            os.kill(p.pid, signal.SIGSTOP)

    def resume_workers(self) -> None:
        for p in self.procs[1:]:
            os.kill(p.pid, signal.SIGCONT)

    def stop(self, timeout: float = 20.0) -> List[Optional[int]]:
        """Admin shutdown; every daemon gets `timeout` s to exit, then SIGKILL. The exit codes."""
        if any(p.poll() is None for p in self.procs):
            try:
                self.ctl("shutdown")
            except RuntimeError:
                pass
        end = time.monotonic() + timeout
        codes: List[Optional[int]] = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        self.kill()
        return codes

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
                p.wait()

    def cleanup(self) -> None:
        self.kill()
        if self._own_dir and not os.environ.get("EPMOE_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        try:
            self.stop()
        finally:
            self.cleanup()
