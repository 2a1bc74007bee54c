"""_tensor — caller tensors as numpy arrays the library can read or write in place.

Inputs come as numpy arrays, objects with the buffer protocol (memoryview, array.array, bytes)
or DLPack producers (`__dlpack__`: torch CPU tensors, JAX/CuPy host arrays, numpy itself).
A C-contiguous array of the right element size is used as it is (the library reads the
caller's memory, no copy); anything else is copied once into a C-contiguous array.

bf16: numpy has no bfloat16. With ml_dtypes importable, BF16 is ml_dtypes.bfloat16 and outputs
are arrays of it; without, BF16 is uint16 and outputs hold the bf16 bit patterns (convert with
bf16_to_float32). Either way inputs may be bf16 (ml_dtypes), uint16/int16 bit patterns, or
float32/float64 (rounded to bf16, nearest even: a copy).

DLPack: numpy's own from_dlpack refuses bf16 (numpy has no such dtype), so capsules are read
here through the DLPack C struct (v0.8 DLManagedTensor, capsule name "dltensor"), which gives
bf16 tensors without a copy; the producer's deleter runs when the last view is gone.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Optional, Tuple

import numpy as np

from . import _lib
from .errors import BadRequestError

try:  # pragma: no cover - depends on the machine
    import ml_dtypes  # type: ignore[import-not-found, unused-ignore]

    BF16: np.dtype = np.dtype(ml_dtypes.bfloat16)
    HAVE_ML_DTYPES = True
except ImportError:
    BF16 = np.dtype(np.uint16)
    HAVE_ML_DTYPES = False


def _bad(message: str) -> BadRequestError:
    """A tensor the library cannot take: BadRequestError (EPMOE_EINVAL), a ValueError."""
    return BadRequestError(_lib.EINVAL, message)


_c_char = ctypes.c_char
_addressof = ctypes.addressof


def address(a: np.ndarray) -> int:
    """The address of a C-contiguous array's first element (c_char.from_buffer is 2-3x faster
    than ndarray.ctypes.data; it needs a writable buffer, so read-only arrays take the latter)."""
    try:
        return _addressof(_c_char.from_buffer(a))  # type: ignore[arg-type, unused-ignore]
    except (TypeError, ValueError, BufferError):
        return int(a.ctypes.data)


def float32_to_bf16(x: Any) -> np.ndarray:
    """bf16 (as BF16) of float values, rounded to nearest even (NaN stays NaN)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(
        np.uint16
    )
    nan = np.isnan(f)
    if nan.any():
        r[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return r.view(BF16)


def bf16_to_float32(x: Any) -> np.ndarray:
    """float32 of bf16 values (BF16, ml_dtypes.bfloat16 or uint16 bit patterns): exact."""
    a = np.asarray(x)
    u = np.ascontiguousarray(a).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return u.view(np.float32)


# ---- DLPack (dlpack.h v0.8) ---------------------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

_KDL_CPU, _KDL_CUDA_HOST = 1, 3
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_BFLOAT = 0, 1, 2, 4
_DL_TYPES = {
    (_KDL_INT, 8): "|i1",
    (_KDL_INT, 16): "<i2",
    (_KDL_INT, 32): "<i4",
    (_KDL_INT, 64): "<i8",
    (_KDL_UINT, 8): "|u1",
    (_KDL_UINT, 16): "<u2",
    (_KDL_UINT, 32): "<u4",
    (_KDL_UINT, 64): "<u8",
    (_KDL_FLOAT, 16): "<f2",
    (_KDL_FLOAT, 32): "<f4",
    (_KDL_FLOAT, 64): "<f8",
    (_KDL_BFLOAT, 16): "<u2",  # bit patterns; marked bf16 below
}

_capi = ctypes.pythonapi
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _DLPackView:
    """Owns one consumed DLManagedTensor; numpy arrays over it keep this as their base."""

    def __init__(self, managed: Any, iface: dict) -> None:
        self._managed = managed
        self.__array_interface__ = iface

    def __del__(self) -> None:
        m = self._managed
        if m and m.contents.deleter:
            m.contents.deleter(m)
        self._managed = None


def _from_dlpack(obj: Any) -> Tuple[np.ndarray, bool]:
    """A numpy view of a DLPack producer's CPU tensor, and whether it is bf16."""
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None:
        dtype, _ = dev()
        if int(dtype) not in (_KDL_CPU, _KDL_CUDA_HOST):
            raise _bad(f"a DLPack tensor on device type {int(dtype)}: epmoe needs host memory")
    cap = obj.__dlpack__()
    if not _capi.PyCapsule_IsValid(cap, b"dltensor"):
        raise _bad("__dlpack__ did not return an unconsumed 'dltensor' capsule")
    ptr = _capi.PyCapsule_GetPointer(cap, b"dltensor")
    managed = ctypes.cast(ptr, ctypes.POINTER(_DLManagedTensor))
    # consumed: the capsule's destructor now leaves the tensor to us (the DLPack protocol)
    _capi.PyCapsule_SetName(cap, b"used_dltensor")
    t = managed.contents.dl_tensor
    ok_dev = t.device.device_type in (_KDL_CPU, _KDL_CUDA_HOST)
    key = (t.dtype.code, t.dtype.bits)
    if not ok_dev or t.dtype.lanes != 1 or key not in _DL_TYPES:
        view = _DLPackView(managed, {"version": 3, "shape": (0,), "typestr": "|u1", "data": (0, True)})
        del view  # runs the deleter
        raise _bad(
            f"a DLPack tensor of device type {t.device.device_type}, dtype code {t.dtype.code} "
            f"bits {t.dtype.bits} lanes {t.dtype.lanes}: not a host tensor epmoe can read"
        )
    shape = tuple(t.shape[i] for i in range(t.ndim))
    item = t.dtype.bits // 8
    strides = None
    if t.strides:
        strides = tuple(t.strides[i] * item for i in range(t.ndim))
    iface = {
        "version": 3,
        "shape": shape,
        "typestr": _DL_TYPES[key],
        "data": ((t.data or 0) + t.byte_offset, False),
        "strides": strides,
    }
    arr = np.asarray(_DLPackView(managed, iface))
    return arr, t.dtype.code == _KDL_BFLOAT


def as_array(obj: Any) -> Tuple[np.ndarray, bool]:
    """A numpy view of obj (no copy), and whether it is known to be bf16."""
    if isinstance(obj, np.ndarray):
        return obj, obj.dtype == BF16 and HAVE_ML_DTYPES
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj)
    return np.asarray(memoryview(obj)), False


def bf16_input(obj: Any, what: str) -> np.ndarray:
    """A C-contiguous 2-D bf16-bits array of obj (no copy where the layout allows)."""
    a, is_bf16 = as_array(obj)
    if a.ndim == 1:
        a = a.reshape(1, -1)
    if a.ndim != 2:
        raise _bad(f"{what}: expected [tokens, hidden], got shape {a.shape}")
    if is_bf16 or a.dtype.kind in "ui" and a.dtype.itemsize == 2:
        a = np.ascontiguousarray(a)
        return a.view(np.uint16)
    if a.dtype.kind == "f":
        return float32_to_bf16(a).view(np.uint16)
    raise _bad(f"{what}: dtype {a.dtype} is not bf16, uint16 bits or float")


def ids_input(obj: Optional[Any], n: int) -> Optional[np.ndarray]:
    """Token ids as C-contiguous int64 [n] (a copy unless already so)."""
    if obj is None:
        return None
    a, _ = as_array(obj)
    a = np.ascontiguousarray(a.reshape(-1), dtype=np.int64)
    if a.shape[0] != n:
        raise _bad(f"token_ids: {a.shape[0]} ids for {n} tokens")
    return a


def output(obj: Optional[Any], shape: Tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    """The caller's output array (C-contiguous, writable, of dtype's size), or a new one."""
    if obj is None:
        return np.empty(shape, dtype)
    if type(obj) is np.ndarray and obj.shape == shape and obj.dtype.itemsize == dtype.itemsize:
        f = obj.flags
        if f.c_contiguous and f.writeable:
            return obj
    a, _ = as_array(obj)
    if not (a.flags.c_contiguous and a.flags.writeable):
        raise _bad(f"{what}: must be a C-contiguous writable array")
    if a.size != math.prod(shape) or a.dtype.itemsize != dtype.itemsize:
        raise _bad(f"{what}: expected {shape} of {dtype}, got {a.shape} of {a.dtype}")
    return a
