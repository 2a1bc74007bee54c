"""epmoe — Python over libepmoe: call an epmoe cluster's MoE layers, and administer it.

    import epmoe
    with epmoe.Client("tcp://127.0.0.1:7401") as c:
        out, topk_ids, topk_weights = c.submit("mtp.0", hidden, token_ids).result()
    epmoe.Admin("tcp://127.0.0.1:7401").status()

The serving API is libepmoe's, through ctypes (no protocol code here); the admin API runs
`epmoectl -o json`. docs/python.md has the whole story.
"""

from ._lib import LIBRARY_NAME as library
from ._lib import version as _version
from ._tensor import BF16, HAVE_ML_DTYPES, bf16_to_float32, float32_to_bf16
from .admin import Admin
from .client import Client, Info, Member, Request, RequestInfo
from .errors import (
    AdminError,
    BadRequestError,
    BusyError,
    CanceledError,
    EpmoeError,
    FailedError,
    InFlightLimitError,
    NotReadyError,
    NotSupportedError,
    OutOfMemoryError,
    ProtocolError,
    RefusedError,
    RequestTimeoutError,
    StaleError,
    TimeoutError,  # the old name of RequestTimeoutError, not in __all__ (the builtin's name)
    UnavailableError,
)

__version__: str = _version()  # the library's: "0.4.0"

__all__ = [
    "Admin",
    "AdminError",
    "BF16",
    "BadRequestError",
    "BusyError",
    "CanceledError",
    "Client",
    "EpmoeError",
    "FailedError",
    "HAVE_ML_DTYPES",
    "InFlightLimitError",
    "Info",
    "Member",
    "NotReadyError",
    "NotSupportedError",
    "OutOfMemoryError",
    "ProtocolError",
    "RefusedError",
    "Request",
    "RequestInfo",
    "RequestTimeoutError",
    "StaleError",
    "UnavailableError",
    "__version__",
    "bf16_to_float32",
    "float32_to_bf16",
    "library",
]
