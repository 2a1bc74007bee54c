"""setup.py — only to record where libepmoe and epmoectl were at build time (epmoe/_paths.py).

Everything else is in pyproject.toml. The paths come from $EPMOE_LIBRARY / $EPMOE_CTL, else
pkg-config's libdir for epmoe (an installed prefix), else the build tree beside this directory
(../build, what `./dev build` makes). None found: the package uses the dynamic loader's
libepmoe.so.0 and epmoectl on PATH at run time.
"""

import os
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _pkg_config_libdir():
    try:
        p = subprocess.run(["pkg-config", "--variable=libdir", "epmoe"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


def _found():
    lib = os.environ.get("EPMOE_LIBRARY")
    ctl = os.environ.get("EPMOE_CTL")
    if not lib:
        d = _pkg_config_libdir()
        if d and (Path(d) / "libepmoe.so.0").exists():
            lib = str(Path(d) / "libepmoe.so.0")
            c = Path(d).parent / "bin" / "epmoectl"
            ctl = ctl or (str(c) if c.exists() else None)
    build = HERE.parent / "build"
    if not lib and (build / "client" / "libepmoe.so.0").exists():
        lib = str(build / "client" / "libepmoe.so.0")
    if not ctl and lib and (Path(lib).resolve().parent.parent / "ctl" / "epmoectl").exists():
        ctl = str(Path(lib).resolve().parent.parent / "ctl" / "epmoectl")
    return lib, ctl


class BuildPy(build_py):
    def run(self):
        super().run()
        lib, ctl = _found()
        target = Path(self.build_lib) / "epmoe" / "_paths.py"
        text = target.read_text()
        text = text.replace("LIBRARY: Optional[str] = None", f"LIBRARY: Optional[str] = {lib!r}")
        text = text.replace("CTL: Optional[str] = None", f"CTL: Optional[str] = {ctl!r}")
        target.write_text(text)


setup(cmdclass={"build_py": BuildPy})
