"""admin — the operator's verbs (docs/operations.md) from Python: the installed `epmoectl`.

Admin runs `epmoectl -o json` for each call and returns its JSON: the very objects the CLI
prints (dicts with "schema"), so scripts written against either read the same fields. The
admin RPC stays in one place (ctl/, over common/wire); this package adds no protocol code.

epmoectl is found, in this order: the `ctl` argument; $EPMOE_CTL; $EPMOE_BUILD_DIR/ctl/epmoectl; the
epmoectl the package was built beside (recorded at `pip install`); `epmoectl` on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Any, Dict, List, Optional

from . import _paths
from .client import read_key
from .errors import from_exit


def find_ctl(ctl: Optional[str] = None) -> str:
    """The epmoectl to run."""
    build = os.environ.get("EPMOE_BUILD_DIR")
    in_build = os.path.join(build, "ctl", "epmoectl") if build else None
    for c in (ctl, os.environ.get("EPMOE_CTL"), in_build, _paths.CTL):
        if c and os.access(c, os.X_OK):
            return c
    w = shutil.which("epmoectl")
    if w:
        return w
    raise FileNotFoundError(
        "epmoe.Admin: no epmoectl (set EPMOE_CTL, put it on PATH, or pass ctl=...)"
    )


class Admin:
    """The coordinator's admin RPC through `epmoectl -o json`.

    key: this operator's secret key file (epmoectl keygen's NAME.key) or its Z85 text;
    server_key: the coordinator's .pub file or Z85 text. timeout: epmoectl's --timeout (s)."""

    def __init__(
        self,
        coordinator: str,
        key: Optional[str] = None,
        server_key: Optional[str] = None,
        timeout: Optional[float] = None,
        ctl: Optional[str] = None,
    ) -> None:
        self.coordinator = coordinator
        self.ctl = find_ctl(ctl)
        self.timeout = timeout
        self._tmp: Optional[tempfile.TemporaryDirectory[str]] = None
        self._key = self._key_file(key, "secret", "operator.key")
        self._server_key = self._key_file(server_key, "public", "coordinator.pub")

    def _key_file(self, key: Optional[str], which: str, name: str) -> Optional[str]:
        """epmoectl takes key files: Z85 text given here is written to a private one."""
        if key is None or os.path.exists(key):
            return key
        z85 = read_key(key, which)
        assert z85 is not None
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="epmoe-admin-")
        path = os.path.join(self._tmp.name, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'{which}-key = "{z85.decode()}"\n')
        return path

    def run(self, *args: str, wait: Optional[float] = None) -> Dict[str, Any]:
        """`epmoectl -o json ARGS...`: its JSON object; AdminError on a non-zero exit."""
        cmd: List[str] = [self.ctl, "-o", "json", "--coordinator", self.coordinator]
        if self.timeout is not None:
            cmd += ["--timeout", str(max(1, int(self.timeout * 1000)))]
        if self._key:
            cmd += ["--key", self._key]
        if self._server_key:
            cmd += ["--server-key", self._server_key]
        cmd += list(args)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=wait, check=False)
        if p.returncode != 0:
            msg = (p.stderr.strip() or p.stdout.strip()).splitlines()
            raise from_exit(p.returncode, f"epmoectl {' '.join(args)}: " + " / ".join(msg))
        out: Dict[str, Any] = json.loads(p.stdout)
        return out

    def status(self, wait_ready: bool = False, wait_timeout: Optional[float] = None) -> Dict[str, Any]:
        """`epmoectl status` (--wait-ready [--wait-timeout S])."""
        a = ["status"]
        if wait_ready:
            a.append("--wait-ready")
        if wait_timeout is not None:
            a += ["--wait-timeout", str(int(wait_timeout))]
        return self.run(*a)

    def workers(self) -> Dict[str, Any]:
        return self.run("workers")

    def shards(self) -> Dict[str, Any]:
        return self.run("shards")

    def config(self) -> Dict[str, Any]:
        return self.run("config")

    def drain(self, name: str, wait: bool = True, wait_timeout: Optional[float] = None) -> Dict[str, Any]:
        """`epmoectl drain NAME` (waits until the drained epoch is current unless wait=False)."""
        a = ["drain", name]
        if not wait:
            a.append("--no-wait")
        if wait_timeout is not None:
            a += ["--wait-timeout", str(int(wait_timeout))]
        return self.run(*a)

    def undrain(self, name: str) -> Dict[str, Any]:
        return self.run("undrain", name)

    def rebalance(
        self, dry_run: bool = False, wait: bool = True, wait_timeout: Optional[float] = None
    ) -> Dict[str, Any]:
        """`epmoectl rebalance` [--dry-run] [--no-wait] [--wait-timeout S]."""
        a = ["rebalance"]
        if dry_run:
            a.append("--dry-run")
        if not wait:
            a.append("--no-wait")
        if wait_timeout is not None:
            a += ["--wait-timeout", str(int(wait_timeout))]
        return self.run(*a)

    def reload(self) -> Dict[str, Any]:
        return self.run("reload")

    def shutdown(self) -> Dict[str, Any]:
        return self.run("shutdown")

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
