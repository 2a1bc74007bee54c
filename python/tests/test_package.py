"""The package itself: its version is the library's, its ctypes structs are <epmoe.h>'s."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import epmoe
from epmoe import _lib

REPO = Path(__file__).resolve().parents[2]


def test_version_is_the_library_header_version() -> None:
    h = (REPO / "client" / "epmoe.h").read_text()
    parts = [re.search(rf"#define EPMOE_VERSION_{p} (\d+)", h) for p in ("MAJOR", "MINOR", "PATCH")]
    assert all(parts)
    want = ".".join(m.group(1) for m in parts if m)
    assert epmoe.__version__ == want
    pyproject = (REPO / "python" / "pyproject.toml").read_text()
    assert f'version = "{want}"' in pyproject, "pyproject.toml's version is not libepmoe's"


def test_the_library_loaded_is_checked_at_import(tmp_path: Path) -> None:
    """epmoe_version_number() of the library is the header's, and the import refuses a library
    of another minor version (a fake libepmoe.so.0 saying 0.3.0)."""
    h = (REPO / "client" / "epmoe.h").read_text()
    nums = [int(re.search(rf"#define EPMOE_VERSION_{p} (\d+)", h).group(1))  # type: ignore[union-attr]
            for p in ("MAJOR", "MINOR", "PATCH")]
    assert _lib.EPMOE_VERSION_NUMBER == nums[0] * 10000 + nums[1] * 100 + nums[2]
    assert _lib.lib.epmoe_version_number() == _lib.EPMOE_VERSION_NUMBER
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the fake library")
    src = tmp_path / "old.c"
    src.write_text("int epmoe_version_number(void) { return 300; }\n")
    so = tmp_path / "libepmoe.so.0"
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    import os
    import sys

    env = dict(os.environ, EPMOE_LIBRARY=str(so))
    r = subprocess.run([sys.executable, "-c", "import epmoe"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "is libepmoe 0.3.0" in r.stderr, r.stderr


def test_import_star_leaves_the_builtin_timeout_error() -> None:
    import builtins

    ns: dict = {}
    exec("from epmoe import *", ns)
    assert "TimeoutError" not in ns and "RequestTimeoutError" in ns
    assert epmoe.TimeoutError is epmoe.RequestTimeoutError  # the old name still works
    assert issubclass(epmoe.RequestTimeoutError, builtins.TimeoutError)


def test_typed() -> None:
    assert (Path(epmoe.__file__).parent / "py.typed").exists()


def test_ctypes_structs_match_the_header(tmp_path: Path) -> None:
    """Every struct's size and every field's offset, from a C program compiled against epmoe.h."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to read the header's layouts")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <epmoe.h>", "int main(void){"]
    for cname, st in _lib.STRUCTS.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        for f in st._fields_:
            lines.append(f'printf("{cname}.{f[0]} %zu\\n", offsetof({cname}, {f[0]}));')
    lines.append("return 0;}")
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "abi"
    subprocess.run([cc, "-std=c11", "-I", str(REPO / "client"), str(src), "-o", str(exe)], check=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                        check=True).stdout.splitlines())
    for cname, st in _lib.STRUCTS.items():
        assert int(got[cname]) == _lib.ctypes.sizeof(st), cname
        for f in st._fields_:
            assert int(got[f"{cname}.{f[0]}"]) == getattr(st, f[0]).offset, f"{cname}.{f[0]}"


def test_errors_follow_the_status_codes() -> None:
    from epmoe.errors import from_status

    assert isinstance(from_status(_lib.EINVAL, "x"), ValueError)
    assert isinstance(from_status(_lib.ETIMEDOUT, "x"), TimeoutError)
    assert isinstance(from_status(_lib.EWAITTIMEOUT, "x"), epmoe.RequestTimeoutError)
    assert isinstance(from_status(_lib.EAGAIN, "x"), epmoe.BusyError)
    assert isinstance(from_status(_lib.EUNAVAILABLE, "x"), ConnectionError)
    e = from_status(_lib.ESTALE, "config hash 1 != 2", 7)
    assert isinstance(e, epmoe.StaleError) and e.code == -6 and e.remote_code == 7
    assert e.name == "EPMOE_ESTALE" and "config hash" in str(e)


def test_bf16_conversion_round_trips() -> None:
    import numpy as np

    bits = np.arange(0, 0x7F80, 7, dtype=np.uint16)  # every finite positive exponent
    f = epmoe.bf16_to_float32(bits)
    assert np.array_equal(epmoe.float32_to_bf16(f).view(np.uint16), bits)
    # nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1 (even mantissa)
    assert epmoe.float32_to_bf16(np.float32(1 + 2**-8)).view(np.uint16) == 0x3F80
    assert epmoe.float32_to_bf16(np.float32(1 + 3 * 2**-8)).view(np.uint16) == 0x3F82
