"""Every error class raised by a real failure: a bad layer or argument, the in-flight limit, a
deadline (the workers stopped with SIGSTOP), a stopped cluster, a key the cluster refuses."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import Models, assert_same

import epmoe
from epmoe import local


def test_bad_requests(lone_cluster: local.LocalCluster, models: Models) -> None:
    inp = models.input(7)
    h, ids = inp["hidden_states"], inp["input_ids"]
    with epmoe.Client(lone_cluster.admin) as c:
        n = c.info.n_layers
        with pytest.raises(epmoe.BadRequestError) as e:
            c.submit(n + 5, h, ids)
        assert e.value.code == -1 and e.value.name == "EPMOE_EINVAL" and str(n + 5) in e.value.message
        with pytest.raises(ValueError):  # a BadRequestError is a ValueError too
            c.submit("mtp.9", h, ids)
        with pytest.raises(epmoe.BadRequestError, match="hash"):
            c.submit(0, h)  # a hash-routed layer needs token ids
        with pytest.raises(epmoe.BadRequestError):
            c.submit(1, np.zeros((7, 128), dtype=np.uint16))  # H is 256
        bad_ids = ids.copy()
        bad_ids[3] = c.info.vocab_size
        with pytest.raises(epmoe.BadRequestError):
            c.submit(0, h, bad_ids)
        # and the client goes on serving right
        assert_same(c.submit(1, h, ids).result(), models.ref("fp4", "1", 7), "after bad requests")


def test_in_flight_limit(lone_cluster: local.LocalCluster, models: Models) -> None:
    inp = models.input(1)
    with epmoe.Client(lone_cluster.admin, max_in_flight=1) as c:
        r = c.submit(1, inp["hidden_states"])
        with pytest.raises(epmoe.InFlightLimitError) as e:
            c.submit(1, inp["hidden_states"])
        assert isinstance(e.value, epmoe.BusyError) and e.value.code == -2
        r.result()  # takes the answer and returns the slot
        c.submit(1, inp["hidden_states"]).result()


def test_deadline(lone_cluster: local.LocalCluster, models: Models) -> None:
    """Workers stopped (SIGSTOP) for less than the liveness window: a request's own deadline
    passes (TimeoutError, ETIMEDOUT), result(timeout) gives up first without losing the
    request (RequestTimeoutError, EWAITTIMEOUT), and both an async forward and the cluster recover."""
    inp = models.input(7)
    ref = models.ref("fp4", "1", 7)
    with epmoe.Client(lone_cluster.admin) as c:
        lone_cluster.pause_workers()
        try:
            t0 = time.monotonic()
            r = c.submit(1, inp["hidden_states"], timeout=0.3)
            with pytest.raises(epmoe.TimeoutError) as e:
                r.result()
            assert e.value.code == -3 and isinstance(e.value, TimeoutError)
            assert 0.25 < time.monotonic() - t0 < 5
            slow = c.submit(1, inp["hidden_states"], timeout=20)
            with pytest.raises(epmoe.TimeoutError) as e:
                slow.result(timeout=0.2)
            assert e.value.code == epmoe._lib.EWAITTIMEOUT and not slow.done()
        finally:
            lone_cluster.resume_workers()
        assert_same(slow.result(timeout=30), ref, "the request that outlived result(timeout)")
        assert_same(c.submit(1, inp["hidden_states"]).result(), ref, "after the workers resumed")


def test_async_deadline(lone_cluster: local.LocalCluster, models: Models) -> None:
    import asyncio

    inp = models.input(1)
    with epmoe.Client(lone_cluster.admin) as c:
        lone_cluster.pause_workers()
        try:
            with pytest.raises(epmoe.TimeoutError):
                asyncio.run(c.forward(1, inp["hidden_states"], timeout=0.3))
        finally:
            lone_cluster.resume_workers()


def test_stopped_cluster(models: Models) -> None:
    """After shutdown: a client in flight times out, a new client and Admin cannot connect."""
    inp = models.input(1)
    cl = local.LocalCluster(models.model("fp4"), workers=2)
    try:
        cl.start()
        c = epmoe.Client(cl.admin, timeout=1.0)
        c.submit(1, inp["hidden_states"]).result()
        codes = cl.stop()
        assert codes == [0, 0, 0], f"daemons' exit codes after shutdown: {codes}"
        with pytest.raises((epmoe.TimeoutError, epmoe.NotReadyError, epmoe.UnavailableError)):
            c.submit(1, inp["hidden_states"]).result()
        c.close()
        with pytest.raises(epmoe.UnavailableError) as e:
            epmoe.Client(cl.admin, connect_timeout=0.5)
        assert e.value.code == -8 and cl.admin in e.value.message
        with pytest.raises(epmoe.UnavailableError) as ea:
            epmoe.Admin(cl.admin, timeout=0.5).status()
        assert isinstance(ea.value, epmoe.AdminError) and ea.value.exit_code == 69
    finally:
        cl.cleanup()


def test_keys(secure_cluster: local.LocalCluster, models: Models) -> None:
    cl = secure_cluster
    inp = models.input(7)
    coord = cl.pub("coordinator")
    # the client key in client_keys: served, bit-identical
    with epmoe.Client(cl.admin, key=cl.key("engine"), server_key=coord) as c:
        assert_same(c.submit(1, inp["hidden_states"]).result(), models.ref("fp8", "1", 7), "secure")
    # a key in no allow-list: refused at open
    with pytest.raises(epmoe.RefusedError) as e:
        epmoe.Client(cl.admin, key=cl.key("stranger"), server_key=coord, connect_timeout=2)
    assert e.value.code == -7
    # no key at all on a secure cluster: the handshake never completes
    with pytest.raises((epmoe.UnavailableError, epmoe.RefusedError)):
        epmoe.Client(cl.admin, connect_timeout=0.5)
    # keys as Z85 text instead of files
    sec = [ln for ln in open(cl.key("engine")) if ln.strip().startswith("secret-key")][0].split('"')[1]
    with epmoe.Client(cl.admin, key=sec, server_key=coord) as c:
        c.submit(1, inp["hidden_states"]).result()
    # the admin API: the operator's key works, a stranger's is refused (epmoectl exit 77)
    assert epmoe.Admin(cl.admin, key=cl.key("op"), server_key=coord).status()["schema"]
    with pytest.raises(epmoe.RefusedError) as ea:
        epmoe.Admin(cl.admin, key=cl.key("stranger"), server_key=coord, timeout=2).status()
    assert ea.value.exit_code == 77  # type: ignore[attr-defined]


def test_the_gil_is_released_while_waiting(lone_cluster: local.LocalCluster, models: Models) -> None:
    """A thread blocked in result() (workers stopped) lets another Python thread run."""
    import threading

    inp = models.input(1)
    with epmoe.Client(lone_cluster.admin) as c:
        lone_cluster.pause_workers()
        try:
            r = c.submit(1, inp["hidden_states"], timeout=5)
            errs: list = []

            def wait() -> None:
                try:
                    r.result(timeout=0.5)
                except epmoe.TimeoutError as e:
                    errs.append(e)

            t = threading.Thread(target=wait)
            t0 = time.monotonic()
            t.start()
            spins = 0
            while t.is_alive() and time.monotonic() - t0 < 0.4:
                spins += 1  # pure Python: runs only while the waiter does not hold the GIL
            assert t.is_alive() and spins > 10000, spins
            t.join()
            assert len(errs) == 1 and errs[0].code == epmoe._lib.EWAITTIMEOUT and "result(timeout)" in str(errs[0])
        finally:
            lone_cluster.resume_workers()
        r.result(timeout=30)
