"""errors — the library's failures as exceptions.

Every exception raised for a libepmoe status is an EpmoeError carrying the library's `code`
(an epmoe_status, e.g. -3), its `name` ("EPMOE_ETIMEDOUT"), the cluster's `remote_code`
(docs/protocol.md's ErrorCode, 0 when the failure is the client's own) and the library's
`message`, which names the layer, token, field, entry worker or endpoint. The subclass follows
the code, so a caller catches what it can act on:

    code                 class                 also a
    EPMOE_EINVAL         BadRequestError       ValueError
    EPMOE_EAGAIN         InFlightLimitError    BusyError (every max_in_flight slot is held)
    EPMOE_ETIMEDOUT      RequestTimeoutError   builtins.TimeoutError
    EPMOE_EWAITTIMEOUT   RequestTimeoutError   (Request.result(timeout) passed first)
    EPMOE_EBUSY          BusyError
    EPMOE_ENOTREADY      NotReadyError
    EPMOE_ESTALE         StaleError            (the model config changed: reopen the client)
    EPMOE_EREFUSED       RefusedError          (a key was refused)
    EPMOE_EUNAVAILABLE   UnavailableError      ConnectionError
    EPMOE_EFAILED        FailedError
    EPMOE_ENOMEM         EpmoeError            MemoryError
    EPMOE_ECANCELED      CanceledError
    EPMOE_EPROTO         ProtocolError
    EPMOE_ENOTSUP        NotSupportedError

Admin calls (epmoectl under the hood) raise AdminError with epmoectl's exit code; exit 69 is
also an UnavailableError, 77 a RefusedError, 64 a BadRequestError.

epmoe.TimeoutError is RequestTimeoutError under its old name; it is not in __all__, so
`from epmoe import *` leaves the builtin TimeoutError alone.
"""

from __future__ import annotations

import builtins
from typing import Dict, Optional, Type

from . import _lib


class EpmoeError(Exception):
    """A libepmoe failure: code (epmoe_status), name, remote_code, message."""

    code: int
    remote_code: int
    message: str

    def __init__(self, code: int, message: str, remote_code: int = 0, summary: Optional[str] = None) -> None:
        self.code = code
        self.remote_code = remote_code
        self.message = message
        head = summary or _lib.strerror(code)  # "EPMOE_ETIMEDOUT: the deadline passed ..."
        super().__init__(f"{head}: {message}" if message else head)

    @property
    def name(self) -> str:
        return _lib.strerror(self.code).split(":", 1)[0]


class BadRequestError(EpmoeError, ValueError):
    """A bad argument (layer, tokens, ids, buffer), or the cluster refused the request."""


class BusyError(EpmoeError):
    """The cluster refused the request for load: retry later."""


class InFlightLimitError(BusyError):
    """Every max_in_flight slot is held: take a finished request, then submit again."""


class RequestTimeoutError(EpmoeError, builtins.TimeoutError):
    """The deadline passed before the answer (or Request.result's own timeout)."""


TimeoutError = RequestTimeoutError  # the old name (not in __all__: it would shadow the builtin)


class NotReadyError(EpmoeError):
    """The cluster is blocked, or no member could take the request until its deadline."""


class StaleError(EpmoeError):
    """The model config changed under a reload (config hash): open a new Client."""


class RefusedError(EpmoeError):
    """A key was refused (CURVE), or the endpoint is not an epmoe admin socket."""


class UnavailableError(EpmoeError, ConnectionError):
    """No coordinator or member could be reached."""


class FailedError(EpmoeError):
    """The request failed in the cluster (the message says where)."""


class OutOfMemoryError(EpmoeError, MemoryError):
    """The library ran out of memory."""


class CanceledError(EpmoeError):
    """The request was canceled (Request.cancel, Client.close)."""


class ProtocolError(EpmoeError):
    """A malformed answer."""


class NotSupportedError(EpmoeError):
    """Not on this cluster's data plane (data_plane: nccl serves no clients)."""


_BY_CODE: Dict[int, Type[EpmoeError]] = {
    _lib.EINVAL: BadRequestError,
    _lib.EAGAIN: InFlightLimitError,
    _lib.ETIMEDOUT: RequestTimeoutError,
    _lib.EWAITTIMEOUT: RequestTimeoutError,
    _lib.EBUSY: BusyError,
    _lib.ENOTREADY: NotReadyError,
    _lib.ESTALE: StaleError,
    _lib.EREFUSED: RefusedError,
    _lib.EUNAVAILABLE: UnavailableError,
    _lib.EFAILED: FailedError,
    _lib.ENOMEM: OutOfMemoryError,
    _lib.ECANCELED: CanceledError,
    _lib.EPROTO: ProtocolError,
    _lib.ENOTSUP: NotSupportedError,
}


def from_status(code: int, message: str, remote_code: int = 0) -> EpmoeError:
    """The exception for a libepmoe status."""
    return _BY_CODE.get(code, EpmoeError)(code, message, remote_code)


class AdminError(EpmoeError):
    """`epmoectl` failed: exit_code and its stderr (code is the closest epmoe_status)."""

    exit_code: int

    def __init__(self, exit_code: int, message: str, code: int = _lib.EFAILED) -> None:
        self.exit_code = exit_code
        super().__init__(code, message)


class AdminUnavailableError(AdminError, UnavailableError):
    """epmoectl exit 69: the coordinator did not answer."""


class AdminRefusedError(AdminError, RefusedError):
    """epmoectl exit 77: the coordinator refused this key."""


class AdminUsageError(AdminError, BadRequestError):
    """epmoectl exit 64: a bad argument (a worker name, an option)."""


def from_exit(exit_code: int, message: str) -> AdminError:
    """The exception for an epmoectl exit code (docs/operations.md)."""
    if exit_code == 69:
        return AdminUnavailableError(exit_code, message, _lib.EUNAVAILABLE)
    if exit_code == 77:
        return AdminRefusedError(exit_code, message, _lib.EREFUSED)
    if exit_code == 64:
        return AdminUsageError(exit_code, message, _lib.EINVAL)
    return AdminError(exit_code, message)
