"""_lib — libepmoe through ctypes: the structs of <epmoe.h> and the functions' signatures.

The layouts here mirror client/epmoe.h field for field (tests/test_abi.py compiles a C program
against the header and compares every size and offset). ctypes releases the GIL around every
call into the library, so epmoe_wait blocks without holding it.

The library is found, in this order: $EPMOE_LIBRARY (a path to libepmoe.so.0); the library the
package was built against (recorded at `pip install` in _paths.py); libepmoe.so.0 through the
dynamic loader (an installed prefix: ldconfig, LD_LIBRARY_PATH). The library's
epmoe_version_number() must have the major and minor of EPMOE_VERSION_NUMBER below (the header
these mirrors follow), else the import fails: the layouts would not match.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import List

from . import _paths

EPMOE_VERSION_NUMBER = 400  # client/epmoe.h's: 0.4.0
EPMOE_OPTIONS_VERSION = 1
EPMOE_SUBMIT_ARGS_VERSION = 1
EPMOE_ERROR_MAX = 512
EPMOE_NAME_MAX = 64

# epmoe_status
OK = 0
EINVAL = -1
EAGAIN = -2
ETIMEDOUT = -3
EBUSY = -4
ENOTREADY = -5
ESTALE = -6
EREFUSED = -7
EUNAVAILABLE = -8
EFAILED = -9
ENOMEM = -10
ECANCELED = -11
EPROTO = -12
ENOTSUP = -13
EWAITTIMEOUT = -14
EINPROGRESS = -15


class Options(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint32),
        ("coordinator", c_char_p),
        ("client_secret_key", c_char_p),
        ("client_public_key", c_char_p),
        ("server_key", c_char_p),
        ("entry", c_char_p),
        ("max_in_flight", c_uint32),
        ("timeout_ms", c_uint32),
        ("connect_timeout_ms", c_uint32),
        ("resend_ms", c_uint32),
    ]


class Error(Structure):
    _fields_ = [
        ("code", c_int),
        ("remote_code", c_int),
        ("message", c_char * EPMOE_ERROR_MAX),
    ]


class Member(Structure):
    _fields_ = [
        ("name", c_char * EPMOE_NAME_MAX),
        ("rank", c_uint32),
        ("client_endpoint", c_char * 256),
        ("ready", c_int),
    ]


class Info(Structure):
    _fields_ = [
        ("hidden_size", c_uint32),
        ("n_layers", c_uint32),
        ("n_main_layers", c_uint32),
        ("n_hash_layers", c_uint32),
        ("topk", c_uint32),
        ("n_experts", c_uint32),
        ("vocab_size", c_uint32),
        ("expert_dtype", c_char * 8),
        ("config_hash", c_uint64),
        ("epoch", c_uint64),
        ("n_members", c_uint32),
        ("max_tokens", c_uint32),
    ]


class SubmitArgs(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint32),
        ("layer", c_uint32),
        ("n_tokens", c_uint32),
        ("hidden_size", c_uint32),
        ("hidden", c_void_p),
        ("token_ids", c_void_p),
        ("out", c_void_p),
        ("topk_ids", c_void_p),
        ("topk_weights", c_void_p),
        ("timeout_ms", c_uint32),
        ("user", c_void_p),
        ("config_hash", c_uint64),
    ]


class RequestInfo(Structure):
    _fields_ = [
        ("status", c_int),
        ("remote_code", c_int),
        ("message", c_char_p),
        ("epoch", c_uint64),
        ("entry_rank", c_uint32),
        ("entry", c_char * EPMOE_NAME_MAX),
        ("replayed", c_int),
        ("resent", c_int),
        ("queued_s", c_double),
        ("dispatch_s", c_double),
        ("experts_s", c_double),
        ("combine_s", c_double),
        ("total_s", c_double),
    ]


# the C types the ABI test checks, by their names in <epmoe.h>
STRUCTS = {
    "epmoe_options": Options,
    "epmoe_error": Error,
    "epmoe_member": Member,
    "epmoe_info": Info,
    "epmoe_submit_args": SubmitArgs,
    "epmoe_request_info": RequestInfo,
}


def _candidates() -> List[str]:
    out: List[str] = []
    env = os.environ.get("EPMOE_LIBRARY")
    if env:
        out.append(env)
    if _paths.LIBRARY:
        out.append(_paths.LIBRARY)
    out.append("libepmoe.so.0")
    return out


def _load() -> ctypes.CDLL:
    tried: List[str] = []
    for name in _candidates():
        if os.sep in name and not os.path.exists(name):
            tried.append(f"{name} (no such file)")
            continue
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"{name} ({e})")
    raise ImportError(
        "epmoe: cannot load libepmoe: tried "
        + "; ".join(tried)
        + ". Build it (./dev build) and set EPMOE_LIBRARY=build/client/libepmoe.so.0, or "
        "install it (cmake --install build) where the dynamic loader finds it"
    )


def _check_version(lib: ctypes.CDLL, name: str) -> None:
    f = getattr(lib, "epmoe_version_number", None)
    if f is None:
        raise ImportError(f"epmoe: {name} has no epmoe_version_number: a libepmoe older than 0.4.0")
    f.restype = c_int
    f.argtypes = []
    have = int(f())
    if have // 100 != EPMOE_VERSION_NUMBER // 100:
        raise ImportError(
            f"epmoe: {name} is libepmoe {have // 10000}.{have // 100 % 100}.{have % 100}; this "
            f"package mirrors {EPMOE_VERSION_NUMBER // 10000}.{EPMOE_VERSION_NUMBER // 100 % 100} "
            "(set EPMOE_LIBRARY to the library it was built with)"
        )


lib = _load()
LIBRARY_NAME: str = lib._name  # what was loaded (a path, or the loader's libepmoe.so.0)
_check_version(lib, LIBRARY_NAME)

_req = c_void_p  # epmoe_request *
_cl = c_void_p  # epmoe_client *


def _sig(name: str, res: object, *args: object) -> None:
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)


_sig("epmoe_strerror", c_char_p, c_int)
_sig("epmoe_version", c_char_p)
_sig("epmoe_open", c_int, POINTER(Options), POINTER(_cl), POINTER(Error))
_sig("epmoe_close", None, POINTER(_cl))
_sig("epmoe_info_get", c_int, _cl, POINTER(Info), POINTER(Error))
_sig("epmoe_info_members", c_int, _cl, POINTER(Member), c_uint32, POINTER(c_uint32), POINTER(Error))
_sig("epmoe_layer_index", c_int, POINTER(Info), c_char_p, POINTER(c_uint32), POINTER(Error))
_sig("epmoe_submit", c_int, _cl, POINTER(SubmitArgs), POINTER(_req), POINTER(Error))
_sig("epmoe_wait", c_int, _req, c_int, POINTER(Error))
_sig("epmoe_poll", c_int, _cl, POINTER(_req), POINTER(c_void_p), c_int)
_sig("epmoe_fd", c_int, _cl)
_sig("epmoe_cancel", None, _req)
_sig("epmoe_request_free", None, POINTER(_req))
_sig("epmoe_request_free_nowait", None, POINTER(_req))
_sig("epmoe_request_status", c_int, _req, POINTER(RequestInfo))
_sig("epmoe_request_user", c_void_p, _req)


def version() -> str:
    v: bytes = lib.epmoe_version()
    return v.decode()


def strerror(status: int) -> str:
    s: bytes = lib.epmoe_strerror(status)
    return s.decode()
