"""A DLPack producer for the tests (no torch needed): exports a numpy buffer as a 'dltensor'
capsule with any DLPack dtype, bf16 included, and records when the consumer's deleter ran."""

from __future__ import annotations

import ctypes
from typing import Any, List, Optional

import numpy as np

from epmoe._tensor import _DELETER, _DLManagedTensor

_capi = ctypes.pythonapi
_capi.PyCapsule_New.restype = ctypes.py_object
_capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

KDL_CPU, KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT = 1, 0, 1, 2, 4


class Producer:
    """Exposes `array`'s memory through __dlpack__ as (code, bits); deleted counts deleter calls."""

    def __init__(self, array: np.ndarray, code: int, bits: int, strides: Optional[List[int]] = None) -> None:
        self.array = array
        self.code, self.bits = code, bits
        self.deleted = 0
        self._keep: List[Any] = []
        self._strides = strides

    def __dlpack_device__(self) -> tuple:
        return (KDL_CPU, 0)

    def __dlpack__(self, stream: Any = None) -> Any:
        a = self.array
        m = _DLManagedTensor()
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        m.dl_tensor.data = a.ctypes.data
        m.dl_tensor.device.device_type = KDL_CPU
        m.dl_tensor.ndim = a.ndim
        m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = self.code, self.bits, 1
        m.dl_tensor.shape = shape
        if self._strides is not None:
            strides = (ctypes.c_int64 * a.ndim)(*self._strides)
            m.dl_tensor.strides = strides
            self._keep.append(strides)

        def deleter(_: Any) -> None:
            self.deleted += 1

        cb = _DELETER(deleter)
        m.deleter = cb
        self._keep += [m, shape, cb]
        return _capi.PyCapsule_New(ctypes.addressof(m), b"dltensor", None)
