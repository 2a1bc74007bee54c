"""client — the serving API: one MoE layer call per request, several in flight (docs/python.md).

    with epmoe.Client("tcp://127.0.0.1:7401") as c:
        out, topk_ids, topk_weights = c.submit(3, hidden, token_ids).result()
        out, ids, w = await c.forward("mtp.0", hidden, token_ids)     # asyncio

A Client wraps one epmoe_client (its own I/O thread in the library); it may be used from any
number of threads at once. A Request is one epmoe_request: it keeps the input and output arrays
alive until the library has let go of them (the library reads the inputs and writes the
outputs in place: no copy on either side when the layouts allow). Waiting (Request.result)
blocks in epmoe_wait with the GIL released. Client.forward waits on the library's completion
descriptor with loop.add_reader: no thread per request.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _lib, _tensor
from .errors import EpmoeError, InFlightLimitError, RequestTimeoutError, from_status

Layer = Union[int, str]
Result = Tuple[np.ndarray, np.ndarray, np.ndarray]

_L = _lib.lib
_BF16 = _tensor.BF16
_BITS16 = (np.dtype(np.uint16), np.dtype(np.int16), _tensor.BF16)
_I64, _I32, _F32 = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.float32)
_POLL_MAX = 64


@dataclass(frozen=True)
class Member:
    """A member of the cluster as the client last heard (CLIENT_INFO)."""

    name: str
    rank: int
    client_endpoint: str
    ready: bool


@dataclass(frozen=True)
class Info:
    """The model's shape and the cluster as last heard (epmoe_info)."""

    hidden_size: int
    n_layers: int  # MoE layers: main then MTP
    n_main_layers: int  # num_hidden_layers; layer L >= this is mtp.(L - n_main_layers)
    n_hash_layers: int  # layers below this need token ids
    topk: int
    n_experts: int
    vocab_size: int
    expert_dtype: str  # "fp4" or "fp8"
    config_hash: int
    epoch: int
    max_tokens: int
    members: Tuple[Member, ...]

    def layer_name(self, layer: int) -> str:
        """The CLI's name of a layer index: "3" or "mtp.0"."""
        if layer >= self.n_main_layers:
            return f"mtp.{layer - self.n_main_layers}"
        return str(layer)

    @property
    def layers(self) -> List[str]:
        """Every layer's CLI name, in index order."""
        return [self.layer_name(i) for i in range(self.n_layers)]


@dataclass(frozen=True)
class RequestInfo:
    """How a finished request went (epmoe_request_info)."""

    status: int
    remote_code: int
    message: str
    epoch: int
    entry_rank: int
    entry: str
    replayed: bool
    resent: bool
    queued_s: float
    dispatch_s: float
    experts_s: float
    combine_s: float
    total_s: float


_Z85_LINE = re.compile(r'^\s*(secret|public)-key\s*=\s*"([^"]+)"', re.M)


def read_key(key: Optional[str], which: str) -> Optional[bytes]:
    """A Z85 key from a key file (epmoectl keygen's NAME.key / NAME.pub) or the key itself.

    which: "secret" or "public". A 40-character string that is not a file is the key."""
    if key is None:
        return None
    if len(key) == 40 and not os.path.exists(key):
        return key.encode()
    with open(key, encoding="ascii") as f:
        text = f.read()
    for kind, z85 in _Z85_LINE.findall(text):
        if kind == which:
            return str(z85).encode()
    line = text.strip().splitlines()[0] if text.strip() else ""
    if which == "public" and len(line) == 40:
        return line.encode()
    raise ValueError(f"key file {key}: no {which}-key")


def _ms(seconds: Optional[float]) -> int:
    if seconds is None:
        return 0
    return max(1, int(seconds * 1000 + 0.5))


class Request:
    """One layer call in flight; result() gives (out, topk_ids, topk_weights)."""

    __slots__ = (
        "_client",
        "_h",
        "_id",
        "_lock",
        "_status",
        "_remote",
        "_message",
        "_raw",
        "layer",
        "hidden",
        "token_ids",
        "out",
        "topk_ids",
        "topk_weights",
        "__weakref__",
    )

    hidden: np.ndarray
    token_ids: Optional[np.ndarray]
    out: np.ndarray
    topk_ids: np.ndarray
    topk_weights: np.ndarray

    def __init__(self, client: "Client", layer: int) -> None:
        self._client = client
        self._h = ctypes.c_void_p()
        self._id = 0
        self._lock = threading.Lock()
        self._status: Optional[int] = None
        self._remote = 0
        self._message = ""
        self._raw: Optional[_lib.RequestInfo] = None
        self.layer = layer

    def _finish(self) -> None:
        """Read the finished handle's status and return its slot (under self._lock)."""
        ri = _lib.RequestInfo()
        _L.epmoe_request_status(self._h, ctypes.byref(ri))
        self._status = ri.status
        self._remote = ri.remote_code
        self._message = ri.message.decode(errors="replace") if ri.message else ""
        self._raw = ri  # RequestInfo is built on demand: the hot path only needs the status
        _L.epmoe_request_free(ctypes.byref(self._h))

    def done(self) -> bool:
        """Whether the request has finished (answered, failed or canceled)."""
        if self._status is not None:
            return True
        with self._lock:
            if self._status is None and not self._client._handle:
                self._closed()
            if self._status is None and self._h:
                ri = _lib.RequestInfo()
                _L.epmoe_request_status(self._h, ctypes.byref(ri))
                if ri.status != _lib.EINPROGRESS:
                    self._finish()
        return self._status is not None

    def _outcome(self) -> Result:
        if self._status != _lib.OK:
            raise from_status(self._status or _lib.EFAILED, self._message, self._remote)
        return self.out, self.topk_ids, self.topk_weights

    def result(self, timeout: Optional[float] = None) -> Result:
        """Wait (GIL released) and return (out bf16 [T, H], topk_ids int32 [T, k],
        topk_weights float32 [T, k]), or raise the request's error.

        timeout: seconds to wait at most (None: until the request's own deadline); when it
        passes first, epmoe.RequestTimeoutError is raised and the request stays in flight."""
        if self._status is None:
            with self._lock:
                if self._status is None and not self._client._handle:
                    self._closed()
                if self._status is None:
                    ms = -1 if timeout is None else max(0, int(timeout * 1000))
                    err = _lib.Error()
                    rc = _L.epmoe_wait(self._h, ms, ctypes.byref(err))
                    if rc == _lib.EWAITTIMEOUT:
                        raise RequestTimeoutError(
                            rc,
                            f"layer {self.layer}: still in flight after {ms} ms (it goes on)",
                            summary="EPMOE_EWAITTIMEOUT: result(timeout) passed first",
                        )
                    self._finish()
        return self._outcome()

    def cancel(self) -> None:
        """Give the request up (its buffers are released when this returns)."""
        with self._lock:
            if self._status is None and not self._client._handle:
                self._closed()
            if self._status is None and self._h:
                _L.epmoe_cancel(self._h)
                self._finish()

    @property
    def info(self) -> Optional[RequestInfo]:
        """The finished request's status, entry worker and times (None while in flight)."""
        if not self.done() or self._raw is None:
            return None
        ri = self._raw
        return RequestInfo(
            ri.status,
            ri.remote_code,
            self._message,
            ri.epoch,
            ri.entry_rank,
            ri.entry.decode(errors="replace"),
            bool(ri.replayed),
            bool(ri.resent),
            ri.queued_s,
            ri.dispatch_s,
            ri.experts_s,
            ri.combine_s,
            ri.total_s,
        )

    def _closed(self) -> None:
        """The client was closed with this request in flight: epmoe_close canceled it."""
        self._status = _lib.ECANCELED
        self._message = f"layer {self.layer}: the client was closed"
        self._h = ctypes.c_void_p()

    def __del__(self) -> None:
        # a request dropped in flight: give it up without blocking the collector (a blocking
        # free may wait for a send); the library may still read the input until its send is
        # over, so the client keeps the input arrays alive until it is closed
        if self._status is None and self._h and self._client._handle:
            self._client._orphans.append((self.hidden, self.token_ids))
            _L.epmoe_request_free_nowait(ctypes.byref(self._h))


class Client:
    """A connection to an epmoe cluster's serving path (libepmoe's epmoe_client).

    coordinator: the admin endpoint ("tcp://127.0.0.1:7401"). key: this client's secret key
    (a NAME.key file from `epmoectl keygen`, or the Z85 text); server_key: the coordinator's
    public key (.pub file or Z85). entry: the preferred entry worker (name or client endpoint).
    max_in_flight: request slots (default 64); timeout: a request's default deadline in
    seconds (30); connect_timeout: the wait for the coordinator at open (5)."""

    def __init__(
        self,
        coordinator: str,
        key: Optional[str] = None,
        server_key: Optional[str] = None,
        entry: Optional[str] = None,
        max_in_flight: int = 64,
        timeout: Optional[float] = None,
        connect_timeout: Optional[float] = None,
        resend: Optional[float] = None,
    ) -> None:
        self._handle = ctypes.c_void_p()
        self._ids = itertools.count(1)
        self._async: Dict[int, Tuple[Request, "asyncio.Future[Result]"]] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._slot_waiters: List["asyncio.Future[None]"] = []
        self._orphans: List[Tuple[Any, Any]] = []  # inputs of requests given up in __del__
        o = _lib.Options()
        o.size = ctypes.sizeof(o)
        o.version = _lib.EPMOE_OPTIONS_VERSION
        o.coordinator = coordinator.encode()
        o.client_secret_key = read_key(key, "secret")
        o.server_key = read_key(server_key, "public")
        o.entry = entry.encode() if entry else None
        o.max_in_flight = max_in_flight
        o.timeout_ms = _ms(timeout)
        o.connect_timeout_ms = _ms(connect_timeout)
        o.resend_ms = _ms(resend)
        err = _lib.Error()
        rc = _L.epmoe_open(ctypes.byref(o), ctypes.byref(self._handle), ctypes.byref(err))
        if rc != _lib.OK:
            raise from_status(rc, err.message.decode(errors="replace"), err.remote_code)
        self.coordinator = coordinator
        self.max_in_flight = max_in_flight
        self._fd = _L.epmoe_fd(self._handle)
        self._poll_buf = (ctypes.c_void_p * _POLL_MAX)()
        self._poll_user = (ctypes.c_void_p * _POLL_MAX)()
        self._info_cache = self._read_info()

    # ---- lifetime ----

    def close(self) -> None:
        """Cancel what is in flight, stop the library's I/O thread, free everything."""
        if not self._handle:
            return
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(self._fd)
            except (RuntimeError, ValueError):  # pragma: no cover - loop gone
                pass
        for req, fut in list(self._async.values()):
            req.cancel()
            if not fut.done():
                fut.set_exception(from_status(_lib.ECANCELED, "the client was closed"))
        self._async.clear()
        _L.epmoe_close(ctypes.byref(self._handle))
        self._orphans.clear()  # the library let go of every input

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None):
            self.close()

    def _check_open(self) -> None:
        if not self._handle:
            raise from_status(_lib.EINVAL, "the client is closed")

    # ---- the model ----

    def _read_info(self) -> Info:
        self._check_open()
        i = _lib.Info()
        err = _lib.Error()
        rc = _L.epmoe_info_get(self._handle, ctypes.byref(i), ctypes.byref(err))
        if rc != _lib.OK:
            raise from_status(rc, err.message.decode(errors="replace"), err.remote_code)
        n = ctypes.c_uint32(i.n_members)
        while True:  # the members are copied into our array: no other thread can free them
            buf = (_lib.Member * max(1, n.value))()
            cap = n.value
            rc = _L.epmoe_info_members(self._handle, buf, cap, ctypes.byref(n), ctypes.byref(err))
            if rc != _lib.OK:
                raise from_status(rc, err.message.decode(errors="replace"), err.remote_code)
            if n.value <= cap:
                break
        members = tuple(
            Member(m.name.decode(), m.rank, m.client_endpoint.decode(), bool(m.ready))
            for m in buf[: n.value]
        )
        return Info(
            i.hidden_size,
            i.n_layers,
            i.n_main_layers,
            i.n_hash_layers,
            i.topk,
            i.n_experts,
            i.vocab_size,
            i.expert_dtype.decode(),
            i.config_hash,
            i.epoch,
            i.max_tokens,
            members,
        )

    @property
    def info(self) -> Info:
        """The model's shape, layers, expert dtype, config hash, epoch and members, as the
        library last heard them (it asks again on news of a change, docs/client.md "Epochs")."""
        self._info_cache = self._read_info()
        return self._info_cache

    def layer_index(self, layer: Layer) -> int:
        """A layer's index: an int (MTP layers after the main ones) or the CLI's name
        ("3", "layers.3", "mtp.0")."""
        if isinstance(layer, (int, np.integer)) and not isinstance(layer, bool):
            return int(layer)
        if not isinstance(layer, str):
            raise from_status(_lib.EINVAL, f"layer {layer!r}: not an index or a layer name")
        i = _lib.Info()
        c = self._info_cache
        i.n_layers, i.n_main_layers = c.n_layers, c.n_main_layers
        out = ctypes.c_uint32()
        err = _lib.Error()
        rc = _L.epmoe_layer_index(ctypes.byref(i), layer.encode(), ctypes.byref(out), ctypes.byref(err))
        if rc != _lib.OK:
            raise from_status(rc, err.message.decode(errors="replace"))
        return out.value

    # ---- requests ----

    def submit(
        self,
        layer: Layer,
        hidden: Any,
        token_ids: Optional[Any] = None,
        *,
        out: Optional[Any] = None,
        topk_ids: Optional[Any] = None,
        topk_weights: Optional[Any] = None,
        timeout: Optional[float] = None,
    ) -> Request:
        """Submit one MoE layer call; never blocks. hidden: bf16 [T, H] (the MoE block input,
        before ffn_norm); token_ids: int64 [T] (required on hash layers). out, topk_ids,
        topk_weights: caller arrays the answer is written into (else new ones). timeout:
        this request's deadline in seconds (None: the client's). Raises BadRequestError for
        a bad argument, InFlightLimitError when every slot is held."""
        if not self._handle:
            self._check_open()
        li = layer if type(layer) is int else self.layer_index(layer)
        # the common case (a C-contiguous [T, H] array of bf16 bits) without any conversion
        if (
            type(hidden) is np.ndarray
            and hidden.ndim == 2
            and hidden.dtype in _BITS16
            and hidden.flags.c_contiguous
        ):
            h = hidden
        else:
            h = _tensor.bf16_input(hidden, "hidden")
        T, Hx = h.shape
        info = self._info_cache
        H, k = info.hidden_size, info.topk
        if Hx != H:  # the library reads T x H values from the pointer: check here
            raise from_status(_lib.EINVAL, f"layer {li}: hidden is [{T}, {Hx}], the model's H is {H}")
        if token_ids is None:
            ids = None
        elif (
            type(token_ids) is np.ndarray
            and token_ids.dtype == _I64
            and token_ids.ndim == 1
            and token_ids.flags.c_contiguous
        ):
            ids = token_ids
            if ids.shape[0] != T:
                raise from_status(_lib.EINVAL, f"token_ids: {ids.shape[0]} ids for {T} tokens")
        else:
            ids = _tensor.ids_input(token_ids, T)
        r = Request(self, li)
        r.hidden = h
        r.token_ids = ids
        r.out = o = np.empty((T, H), _BF16) if out is None else _tensor.output(out, (T, H), _BF16, "out")
        r.topk_ids = ti = (
            np.empty((T, k), _I32) if topk_ids is None else _tensor.output(topk_ids, (T, k), _I32, "topk_ids")
        )
        r.topk_weights = tw = (
            np.empty((T, k), _F32)
            if topk_weights is None
            else _tensor.output(topk_weights, (T, k), _F32, "topk_weights")
        )
        rid = next(self._ids)
        r._id = rid
        addr = _tensor.address
        a = _lib.SubmitArgs(
            ctypes.sizeof(_lib.SubmitArgs),
            _lib.EPMOE_SUBMIT_ARGS_VERSION,
            li,
            T,
            H,
            addr(h),
            addr(ids) if ids is not None else None,
            addr(o),
            addr(ti),
            addr(tw),
            _ms(timeout),
            rid,
            info.config_hash,
        )
        err = _lib.Error()
        rc = _L.epmoe_submit(self._handle, ctypes.byref(a), ctypes.byref(r._h), ctypes.byref(err))
        if rc != _lib.OK:
            r._status = rc  # never in flight: nothing to free
            raise from_status(rc, err.message.decode(errors="replace"), err.remote_code)
        return r

    def forward_sync(self, layer: Layer, hidden: Any, token_ids: Optional[Any] = None, **kw: Any) -> Result:
        """submit(...).result(): one layer call, waited for."""
        return self.submit(layer, hidden, token_ids, **kw).result()

    # ---- asyncio ----

    def _on_readable(self) -> None:
        """The completion descriptor is readable: take every finished request."""
        if not self._handle:
            return
        # each request's user (our id) is read by epmoe_poll as it takes the request: a handle
        # freed meanwhile by another thread and given out again cannot be taken for this one
        n = _L.epmoe_poll(self._handle, self._poll_buf, self._poll_user, _POLL_MAX)
        for j in range(n):
            entry = self._async.pop(self._poll_user[j] or 0, None)
            if entry is None:
                continue  # a submit() request: its result() still reads its status
            req, fut = entry
            with req._lock:
                if req._status is None:
                    req._finish()
            if fut.done():
                continue
            try:
                fut.set_result(req._outcome())
            except EpmoeError as e:
                fut.set_exception(e)
        if n:
            waiters, self._slot_waiters = self._slot_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)
        if not self._async and self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None

    async def forward(
        self,
        layer: Layer,
        hidden: Any,
        token_ids: Optional[Any] = None,
        *,
        out: Optional[Any] = None,
        topk_ids: Optional[Any] = None,
        topk_weights: Optional[Any] = None,
        timeout: Optional[float] = None,
    ) -> Result:
        """One layer call for asyncio: submit, then await the answer on the library's
        completion descriptor (loop.add_reader). Waits for a slot when all are held."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                req = self.submit(
                    layer, hidden, token_ids, out=out, topk_ids=topk_ids,
                    topk_weights=topk_weights, timeout=timeout,
                )
                break
            except InFlightLimitError:
                if not self._async:
                    await asyncio.sleep(0.001)  # slots held by submit() requests
                    continue
                w: "asyncio.Future[None]" = loop.create_future()
                self._slot_waiters.append(w)
                await w
        fut: "asyncio.Future[Result]" = loop.create_future()
        self._async[req._id] = (req, fut)
        if self._loop is not None and self._loop.is_closed():
            self._loop = None  # an earlier asyncio.run() ended with requests given up
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self._fd, self._on_readable)
        elif self._loop is not loop:
            self._async.pop(req._id, None)
            req.cancel()
            raise RuntimeError("epmoe.Client.forward: one event loop per client")
        try:
            return await fut
        except asyncio.CancelledError:
            self._async.pop(req._id, None)
            req.cancel()
            if not self._async and self._loop is loop:
                loop.remove_reader(self._fd)
                self._loop = None
            raise
