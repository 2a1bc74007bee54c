"""The admin API returns what `epmoectl -o json` prints, and its verbs act on the cluster."""

from __future__ import annotations

import json
import subprocess

from conftest import Models, assert_same

import epmoe
from epmoe import local


def _ctl_json(cl: local.LocalCluster, *args: str) -> dict:
    p = subprocess.run([cl.bin.ctl, "-o", "json", "--coordinator", cl.admin, *args],
                       capture_output=True, text=True, check=True)
    out: dict = json.loads(p.stdout)
    return out


def _stable(d: object) -> object:
    """The parts of an answer that do not move between two calls (no clocks or counters)."""
    if isinstance(d, dict):
        return {k: _stable(v) for k, v in d.items()
                if not any(s in k for s in ("age", "_s", "seen", "uptime", "load", "steps", "ms", "time", "rate", "bytes", "tokens"))}
    if isinstance(d, list):
        return [_stable(v) for v in d]
    return d


def test_read_verbs_are_epmoectls_json(lone_cluster: local.LocalCluster) -> None:
    a = epmoe.Admin(lone_cluster.admin)
    for verb in ("status", "workers", "shards", "config"):
        got = getattr(a, verb)()
        assert isinstance(got, dict) and "schema" in got, verb
        assert _stable(got) == _stable(_ctl_json(lone_cluster, verb)), verb


def test_drain_undrain_rebalance_reload(lone_cluster: local.LocalCluster, models: Models) -> None:
    a = epmoe.Admin(lone_cluster.admin)
    inp = models.input(7)
    ref = models.ref("fp4", "1", 7)
    epoch0 = a.status().get("current_epoch")
    a.drain("w1")
    st = a.workers()
    w1 = [w for w in st["workers"] if w["name"] == "w1"][0]
    assert w1["drained"] is True
    with epmoe.Client(lone_cluster.admin) as c:  # served by the placement without w1
        assert_same(c.submit(1, inp["hidden_states"]).result(), ref, "after drain")
    a.undrain("w1")
    assert a.status().get("current_epoch") != epoch0
    try:  # EPLB plans from the coordinator's step window, which serving requests do not fill
        assert "schema" in a.rebalance(dry_run=True)
    except epmoe.AdminError as e:
        assert "load statistics" in e.message, e.message
    assert "schema" in a.reload()
    a.status(wait_ready=True, wait_timeout=60)
    with epmoe.Client(lone_cluster.admin) as c:
        assert_same(c.submit(1, inp["hidden_states"]).result(), ref, "after undrain and reload")


def test_admin_errors(lone_cluster: local.LocalCluster) -> None:
    a = epmoe.Admin(lone_cluster.admin)
    try:
        a.drain("nobody")
    except epmoe.AdminError as e:
        assert e.exit_code != 0 and "nobody" in e.message
    else:
        raise AssertionError("drain of an unknown worker succeeded")
