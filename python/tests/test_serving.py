"""The serving API against real clusters (fp4 and fp8): every layer and token count is
bit-identical to `epmoectl forward --local`; many requests in flight from threads and from
asyncio tasks; inputs from numpy, the buffer protocol and DLPack producers; caller outputs."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest
from conftest import TOKENS, Models, assert_same, dtype_of
from dlpack_producer import KDL_BFLOAT, KDL_UINT, Producer

import epmoe
from epmoe import local


def test_info_is_the_checkpoints_config(client: epmoe.Client, cluster: local.LocalCluster) -> None:
    cfg = json.loads((Path(cluster.model) / "config.json").read_text())
    i = client.info
    assert i.hidden_size == cfg["hidden_size"]
    assert i.n_main_layers == cfg["num_hidden_layers"]
    assert i.n_layers == cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]
    assert i.n_hash_layers == cfg["num_hash_layers"]
    assert i.topk == cfg["num_experts_per_tok"] and i.n_experts == cfg["n_routed_experts"]
    assert i.vocab_size == cfg["vocab_size"] and i.expert_dtype == cfg["expert_dtype"]
    assert i.config_hash != 0 and i.epoch > 0
    assert sorted(m.name for m in i.members) == ["w0", "w1", "w2"] and all(m.ready for m in i.members)
    assert i.layers == ["0", "1", "mtp.0"]


def test_every_layer_is_bit_identical_to_forward_local(
    client: epmoe.Client, cluster: local.LocalCluster, models: Models
) -> None:
    dt = dtype_of(cluster)
    n = 0
    for li, name in enumerate(client.info.layers):
        for t in TOKENS:
            inp = models.input(t)
            ref = models.ref(dt, name, t)
            # by index and by the CLI's name: the same layer
            assert_same(client.submit(li, inp["hidden_states"], inp["input_ids"]).result(),
                        ref, f"{dt} layer {li} T={t}")
            assert_same(client.submit(name, inp["hidden_states"], inp["input_ids"]).result(),
                        ref, f"{dt} layer '{name}' T={t}")
            n += 2
    assert n == 18


def test_a_one_bit_difference_fails(models: Models) -> None:
    """The comparison the other tests use catches a single flipped bit in any output."""
    ref = models.ref("fp4", "1", 7)
    for name, view in (("out", np.uint16), ("topk_ids", np.int32), ("topk_weights", np.uint32)):
        got = [ref["out"].copy(), ref["topk_ids"].copy(), ref["topk_weights"].copy()]
        k = ["out", "topk_ids", "topk_weights"].index(name)
        flat = got[k].view(view).reshape(-1)
        flat[len(flat) // 2] ^= 1
        with pytest.raises(AssertionError, match=name):
            assert_same((got[0], got[1], got[2]), ref, "flipped")


def test_many_in_flight_from_threads(client: epmoe.Client, cluster: local.LocalCluster, models: Models) -> None:
    dt = dtype_of(cluster)
    layers = client.info.layers
    inp = models.input(7)
    refs = {name: models.ref(dt, name, 7) for name in layers}

    def worker(k: int) -> int:
        done = 0
        for rnd in range(4):  # 4 rounds of 3 requests in flight per thread
            reqs = [client.submit(layers[(k + rnd + j) % 3], inp["hidden_states"], inp["input_ids"])
                    for j in range(3)]
            for j, r in enumerate(reqs):
                name = layers[(k + rnd + j) % 3]
                assert_same(r.result(timeout=60), refs[name], f"thread {k} layer {name}")
                done += 1
        return done

    with ThreadPoolExecutor(8) as ex:
        assert sum(ex.map(worker, range(8))) == 96


def test_many_in_flight_from_asyncio(client: epmoe.Client, cluster: local.LocalCluster, models: Models) -> None:
    dt = dtype_of(cluster)
    layers = client.info.layers
    ins = {t: models.input(t) for t in TOKENS}

    async def main() -> List[int]:
        threads_before = threading.active_count()
        calls = [(layers[i % 3], TOKENS[i % len(TOKENS)]) for i in range(48)]
        tasks = [asyncio.create_task(client.forward(name, ins[t]["hidden_states"], ins[t]["input_ids"]))
                 for name, t in calls]
        await asyncio.sleep(0)
        # no thread per request: the loop waits on the library's completion descriptor
        assert threading.active_count() == threads_before
        res = await asyncio.gather(*tasks)
        for (name, t), r in zip(calls, res):
            assert_same(r, models.ref(dt, name, t), f"asyncio {name} T={t}")
        return [len(res)]

    assert asyncio.run(main()) == [48]


def test_asyncio_waits_for_a_slot(cluster: local.LocalCluster, models: Models) -> None:
    """More tasks than max_in_flight: forward waits for slots instead of failing."""
    inp = models.input(1)
    ref = models.ref(dtype_of(cluster), "1", 1)
    with epmoe.Client(cluster.admin, max_in_flight=2) as c:

        async def main() -> None:
            res = await asyncio.gather(*(c.forward(1, inp["hidden_states"]) for _ in range(10)))
            for r in res:
                assert_same(r, ref, "slot-limited asyncio")

        asyncio.run(main())


@pytest.mark.parametrize("in_flight,entry", [(300, None), (200, "w1")])
def test_flow_control_is_the_librarys(cluster: local.LocalCluster, models: Models, in_flight: int,
                                      entry: Optional[str]) -> None:
    """Issue 23 point 2: an entry takes 64 requests of a client at once; within max_in_flight
    the library queues the rest. 300 in flight by rotation over 3 workers and 200 pinned to one
    entry: every answer right, none a BusyError."""
    inp = models.input(1)
    ref = models.ref(dtype_of(cluster), "1", 1)
    with epmoe.Client(cluster.admin, max_in_flight=in_flight, entry=entry) as c:
        for _ in range(2):
            reqs = [c.submit(1, inp["hidden_states"]) for _ in range(in_flight)]
            for r in reqs:
                assert_same(r.result(), ref, f"{in_flight} in flight, entry {entry}")
                if entry:
                    assert r.info is not None and r.info.entry == entry


def test_caller_outputs_are_written_in_place(client: epmoe.Client, cluster: local.LocalCluster, models: Models) -> None:
    inp = models.input(7)
    k = client.info.topk
    out = np.zeros((7, client.info.hidden_size), dtype=np.uint16)
    ids = np.zeros((7, k), dtype=np.int32)
    w = np.zeros((7, k), dtype=np.float32)
    r = client.submit(2, inp["hidden_states"], inp["input_ids"], out=out, topk_ids=ids, topk_weights=w)
    got = r.result()
    assert got[0] is out or np.shares_memory(got[0], out)
    assert got[1] is ids and got[2] is w
    assert_same((out, ids, w), models.ref(dtype_of(cluster), "mtp.0", 7), "caller outputs")
    assert r.info is not None and r.info.entry in ("w0", "w1", "w2") and r.info.total_s > 0


def test_numpy_input_is_not_copied(client: epmoe.Client, models: Models) -> None:
    inp = models.input(7)
    h = np.ascontiguousarray(inp["hidden_states"])
    r = client.submit(1, h, inp["input_ids"])
    assert np.shares_memory(r.hidden, h)
    r.result()


def test_buffer_protocol_and_float32_inputs(client: epmoe.Client, cluster: local.LocalCluster, models: Models) -> None:
    inp = models.input(7)
    ref = models.ref(dtype_of(cluster), "1", 7)
    h = np.ascontiguousarray(inp["hidden_states"])
    assert_same(client.submit(1, memoryview(h)).result(), ref, "memoryview input")  # type: ignore[arg-type, unused-ignore]
    # bf16 -> float32 is exact, float32 -> bf16 (nearest even) gives the same bits back
    assert_same(client.submit(1, epmoe.bf16_to_float32(h).reshape(7, -1)).result(), ref, "float32 input")
    # a strided view is copied into a contiguous one, same answer
    wide = np.zeros((7, 2 * h.shape[1]), dtype=np.uint16)
    wide[:, ::2] = h
    assert_same(client.submit(1, wide[:, ::2]).result(), ref, "strided input")


def test_dlpack_from_numpy(client: epmoe.Client, cluster: local.LocalCluster, models: Models) -> None:
    """A DLPack producer that is not an ndarray (numpy's own __dlpack__, uint16)."""
    inp = models.input(64)
    h = inp["hidden_states"].copy()  # numpy exports only writable arrays

    class Wrapped:
        def __dlpack__(self, stream: object = None) -> object:
            return h.__dlpack__()

        def __dlpack_device__(self) -> tuple:
            return h.__dlpack_device__()

    r = client.submit(0, Wrapped(), inp["input_ids"])
    assert np.shares_memory(r.hidden, h)
    assert_same(r.result(), models.ref(dtype_of(cluster), "0", 64), "DLPack (numpy) input")


def test_dlpack_bf16_producer(client: epmoe.Client, cluster: local.LocalCluster, models: Models) -> None:
    """A bf16 DLPack tensor (what torch.bfloat16 exports), used in place; its deleter runs
    once the request no longer needs it. Token ids come as DLPack int64 too."""
    inp = models.input(7)
    h = np.ascontiguousarray(inp["hidden_states"])
    ids = np.ascontiguousarray(inp["input_ids"])
    ph, pi = Producer(h, KDL_BFLOAT, 16), Producer(ids, 0, 64)
    r = client.submit(0, ph, pi)
    assert np.shares_memory(r.hidden, h)
    assert_same(r.result(), models.ref(dtype_of(cluster), "0", 7), "DLPack bf16 input")
    del r
    gc.collect()
    assert ph.deleted == 1 and pi.deleted == 1


def test_dlpack_refuses_what_it_cannot_read(client: epmoe.Client, models: Models) -> None:
    h = np.ascontiguousarray(models.input(7)["hidden_states"])
    p = Producer(h.view(np.uint8), KDL_UINT, 8)
    with pytest.raises(ValueError):
        client.submit(1, p)
    gc.collect()
    assert p.deleted == 1


def test_torch_cpu_tensors(client: epmoe.Client, cluster: local.LocalCluster, models: Models) -> None:
    torch = pytest.importorskip("torch")
    inp = models.input(7)
    h = torch.from_numpy(inp["hidden_states"].astype(np.int16)).view(torch.bfloat16)
    ids = torch.from_numpy(inp["input_ids"].copy())
    assert_same(client.submit(0, h, ids).result(), models.ref(dtype_of(cluster), "0", 7), "torch input")


def test_bf16_dtype(client: epmoe.Client, cluster: local.LocalCluster, models: Models) -> None:
    """Outputs are ml_dtypes.bfloat16 when it is importable, uint16 bit patterns otherwise;
    bfloat16 inputs are taken as they are."""
    inp = models.input(7)
    out, _, _ = client.submit(1, inp["hidden_states"]).result()
    try:
        import ml_dtypes
    except ImportError:
        assert not epmoe.HAVE_ML_DTYPES and out.dtype == np.uint16
        return
    assert epmoe.HAVE_ML_DTYPES and out.dtype == np.dtype(ml_dtypes.bfloat16)
    h = inp["hidden_states"].view(ml_dtypes.bfloat16)
    r = client.submit(1, h)
    assert np.shares_memory(r.hidden, h)
    assert_same(r.result(), models.ref(dtype_of(cluster), "1", 7), "ml_dtypes.bfloat16 input")


def test_asyncio_cancel(lone_cluster: local.LocalCluster, models: Models) -> None:
    """A cancelled task cancels its request; the client serves the next event loop."""
    inp = models.input(7)
    with epmoe.Client(lone_cluster.admin) as c:

        async def cancel_one() -> None:
            lone_cluster.pause_workers()
            try:
                t = asyncio.create_task(c.forward(1, inp["hidden_states"]))
                await asyncio.sleep(0.05)
                t.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await t
            finally:
                lone_cluster.resume_workers()

        asyncio.run(cancel_one())
        res = asyncio.run(c.forward(1, inp["hidden_states"]))
        assert_same(res, models.ref("fp4", "1", 7), "after a cancelled task, in a new loop")


def test_a_dropped_request_is_given_up_without_blocking(lone_cluster: local.LocalCluster, models: Models) -> None:
    """Request.__del__ of a request in flight frees it with epmoe_request_free_nowait: its slot
    comes back (max_in_flight 1) and the next request answers right."""
    inp = models.input(7)
    with epmoe.Client(lone_cluster.admin, max_in_flight=1) as c:
        lone_cluster.pause_workers()
        try:
            r = c.submit(1, inp["hidden_states"], timeout=20)
            del r
            gc.collect()
        finally:
            lone_cluster.resume_workers()
        deadline = time.monotonic() + 10
        while True:  # the slot returns once the library's send is over
            try:
                res = c.submit(1, inp["hidden_states"]).result()
                break
            except epmoe.InFlightLimitError:
                assert time.monotonic() < deadline, "the dropped request's slot never came back"
                time.sleep(0.01)
        assert_same(res, models.ref("fp4", "1", 7), "after a dropped request")
