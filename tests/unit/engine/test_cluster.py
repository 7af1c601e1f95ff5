"""The Ray cluster a run starts or joins: nothing listens beyond loopback, nothing the user did not ask
for runs, and a start that cannot succeed is refused in seconds, before the run directory is written.
Placement: a demand no node can meet is refused by name."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlc.config.load import load_recipe
from dlc.errors import UserError
from tests.helpers import REPO, TINY, assert_user_error, free_metrics_port, invoke

# Started the way `dlc train` starts it, then every process of the cluster looked at with psutil.
EMBEDDED = """
import json, time, psutil, ray
from dlc.config.job import ClusterConfig
from dlc.engine import cluster
cluster.start_cluster(ClusterConfig(), 2)
time.sleep(3)  # the raylet's agents bind a moment after it starts
session = ray._private.worker._global_node.get_session_dir_path()
found = {p.pid: p for p in psutil.process_iter(["cmdline"]) if session in " ".join(p.info["cmdline"] or [])}
found[psutil.Process().pid] = psutil.Process()
for p in list(found.values()):
    found.update({c.pid: c for c in p.children(recursive=True)})
procs = []
for p in found.values():
    try:
        listen = [c.laddr.ip for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        procs.append({"cmd": " ".join(p.cmdline()), "listen": listen})
    except psutil.Error:
        pass
print(json.dumps({"nodes": [n["NodeManagerAddress"] for n in ray.nodes()], "procs": procs}))
cluster.stop_cluster()
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_embedded_cluster_runs_no_dashboard_and_listens_only_on_loopback():
    # RAY_ADDRESS names a cluster nobody runs: the embedded start must not try to join it.
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "127.0.0.1:1"}
    result = subprocess.run([sys.executable, "-c", EMBEDDED], env=env, capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["nodes"] == ["127.0.0.1"]
    commands = [p["cmd"] for p in seen["procs"]]
    assert any("raylet" in c for c in commands) and any("gcs_server" in c for c in commands)
    # No dashboard (API server) process and no autoscaler monitor: nobody asked for them.
    assert not [c for c in commands if "dashboard/dashboard.py" in c or "autoscaler/_private/monitor.py" in c]
    listening = [(p["cmd"][:60], ip) for p in seen["procs"] for ip in p["listen"]]
    assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for _, ip in listening), listening
    # With no metrics.port, the node's agent is a minimal one (no HTTP server, no exporter), whatever
    # Ray's extras are installed.
    agents = [c for c in commands if "dashboard/agent.py" in c]
    assert agents and all("--minimal" in c for c in agents), agents


def test_a_cluster_address_nobody_listens_on_is_refused_in_seconds(tmp_path: Path):
    run_dir = tmp_path / "run"
    began = time.monotonic()
    small = "data.max_corpus_bytes=300000"
    result = invoke("train", str(TINY), "cluster.address=127.0.0.1:1", f"run.dir={run_dir}", small)
    assert_user_error(result, "cannot reach the Ray cluster at cluster.address=127.0.0.1:1", "ray start --head")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not run_dir.exists() and time.monotonic() - began < 30


def test_an_address_where_no_ray_cluster_answers_is_refused_in_seconds(tmp_path: Path):
    # Something listens there, but it is no Ray GCS (Ray's own client would retry for 40 s).
    run_dir = tmp_path / "run"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        began = time.monotonic()
        result = invoke("train", str(TINY), f"cluster.address={address}", f"run.dir={run_dir}")
    assert_user_error(result, f"something listens at cluster.address={address}, but no Ray GCS answers there")
    assert not run_dir.exists() and time.monotonic() - began < 30


def test_fewer_embedded_cpus_than_the_recipe_reserves_is_refused(tmp_path: Path):
    # tiny: 4 learners x 1 CPU + 2 join streams x 1 + the syncer's 1 = 7 CPUs.
    run_dir = tmp_path / "run"
    result = invoke("train", str(TINY), "cluster.num_cpus=3", f"run.dir={run_dir}")
    assert_user_error(result, "cluster.num_cpus=3 but the recipe reserves 7 CPUs", "raise cluster.num_cpus to 7")
    assert not run_dir.exists()
    # Joining a cluster, num_cpus is the cluster's business: not checked against the recipe here.
    assert load_recipe(TINY, ["cluster.num_cpus=3", "cluster.address=10.0.0.5:6379"]).cluster.num_cpus == 3


def test_a_metrics_port_in_use_or_a_ray_without_its_metrics_agent_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    run_dir = tmp_path / "run"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("train", str(TINY), f"metrics.port={port}", f"run.dir={run_dir}")
    assert_user_error(result, f"metrics.port={port}: 127.0.0.1:{port} cannot be listened on", "choose a free port")
    assert not run_dir.exists()
    from ray._private import utils

    monkeypatch.setattr(utils, "get_dashboard_dependency_error", lambda: ImportError("No module named 'aiohttp'"))
    # A port below the ephemeral range: the one above, free again, may be handed meanwhile to a process
    # of a run beside this test (a Ray cluster of the end-to-end tests), and refused for that instead.
    result = invoke("train", str(TINY), f"metrics.port={free_metrics_port()}", f"run.dir={run_dir}")
    assert_user_error(result, "needs Ray's metrics agent", "No module named 'aiohttp'", "pip install 'dlc[metrics]'")
    assert not run_dir.exists()
    # Joining a cluster, the endpoint is the cluster's: metrics.enabled, not metrics.port.
    assert load_recipe(TINY, ["metrics.enabled=true", "cluster.address=10.0.0.5:6379"]).metrics.on


def _node(node_id: str, cpus: float, labels: dict | None = None, **custom: float) -> dict:
    return {
        "node_id": node_id,
        "ip": "10.0.0." + node_id[-1],
        "resources": {"CPU": cpus, "memory": 1e9, f"node:10.0.0.{node_id[-1]}": 1.0, **custom},
        "labels": {"ray.io/node-id": node_id, **(labels or {})},
    }


def test_placement_refuses_a_learner_no_node_can_hold():
    from dlc.engine.placement import check

    nodes = [_node("n1", 2, {"zone": "a"}), _node("n2", 2, {"zone": "b"}, node_b=4)]
    pinned = "learners.overrides=[{index: 1, resources: {node_b: 1}}, {index: 2, label_selector: {zone: b}}]"
    check(load_recipe(TINY, [pinned]), nodes, "n1")  # node_b and zone b are on n2
    check(load_recipe(TINY, ["learners.overrides=[{index: 0, label_selector: {zone: '!a'}}]"]), nodes, "n1")
    with pytest.raises(UserError, match=r"learner 3 asks for CPU 1, node_c 1, which no node") as err:
        check(load_recipe(TINY, ["learners.overrides=[{index: 3, resources: {node_c: 1}}]"]), nodes, "n1")
    assert "10.0.0.2 [CPU 2, node_b 4, label zone=b]" in str(err.value)
    with pytest.raises(UserError, match="learner 0 asks for CPU 1, label zone=in\\(c,d\\)"):
        check(load_recipe(TINY, ["learners.overrides=[{index: 0, label_selector: {zone: 'in(c,d)'}}]"]), nodes, "n1")
    with pytest.raises(UserError, match="learner 2 asks for CPU 3"):
        check(load_recipe(TINY, ["learners.overrides=[{index: 2, num_cpus: 3}]"]), nodes, "n1")
    # The syncer runs on the driver's node: a head started with --num-cpus=0 cannot hold it.
    with pytest.raises(UserError, match="the syncer runs on the driver's node .* syncer.num_cpus=1"):
        check(load_recipe(TINY, []), [_node("n0", 0), *nodes], "n0")
    check(load_recipe(TINY, ["syncer.num_cpus=0"]), [_node("n0", 0), *nodes], "n0")


def test_spread_placement_options_and_a_lost_nodes_learner(monkeypatch):
    from dlc.engine import cluster
    from dlc.engine.placement import Placement

    pinned = "learners.overrides=[{index: 1, resources: {node_b: 1}}, {index: 2, label_selector: {zone: b}}]"
    driver = "ab" * 28  # a node id as Ray writes them
    placement = Placement(load_recipe(TINY, [pinned]), driver_node=driver)  # spread: no placement group
    assert placement.learner(0) == {"scheduling_strategy": "SPREAD"}
    assert placement.learner(1) == {"scheduling_strategy": "SPREAD", "resources": {"node_b": 1.0}}
    assert placement.learner(2) == {"scheduling_strategy": "SPREAD", "label_selector": {"zone": "b"}}
    assert placement.learner(None) == {"scheduling_strategy": "SPREAD"}  # a hot spare
    syncer = placement.syncer()["scheduling_strategy"]
    assert (syncer.node_id, syncer.soft) == (driver, False)  # on the driver's node, where its journal is
    # Learner 1 is pinned to the node that has node_b: while it lives a restart may wait for room
    # there; once it is gone no restart could ever be placed.
    monkeypatch.setattr(cluster, "draining_nodes", lambda: {})
    monkeypatch.setattr(cluster, "nodes", lambda: [_node("n1", 2), _node("n2", 2, node_b=4)])
    assert placement.feasible(1) is None and placement.feasible(0) is None
    monkeypatch.setattr(cluster, "nodes", lambda: [_node("n1", 2)])
    assert placement.feasible(0) is None
    lost = "no live node that is not draining has what learner 1 asks for (CPU 1, node_b 1); it is not restarted"
    assert placement.feasible(1) == lost
    # A node Ray is draining takes nothing new: as good as gone already.
    monkeypatch.setattr(cluster, "nodes", lambda: [_node("n1", 2), _node("n2", 2, node_b=4)])
    monkeypatch.setattr(cluster, "draining_nodes", lambda: {"n2": None})
    assert placement.feasible(1) == lost and placement.feasible(0) is None


PACKED = """
import ray
from dlc.config.load import load_recipe
from dlc.config.job import ClusterConfig
from dlc.engine import cluster, placement
from dlc.errors import UserError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from tests.helpers import TINY
import time
def cpus_free(n):  # the cluster's view of free resources catches up within a moment
    deadline = time.time() + 20
    while ray.available_resources().get("CPU", 0) != n and time.time() < deadline:
        time.sleep(0.1)
    return ray.available_resources().get("CPU", 0) == n
cluster.start_cluster(ClusterConfig(num_cpus=6), 6)
driver = ray.get_runtime_context().get_node_id()
packed = placement.Placement(load_recipe(TINY, ["learners.placement=pack"]), driver)
strategies = [packed.learner(i)["scheduling_strategy"] for i in range(4)]
assert all(isinstance(s, PlacementGroupSchedulingStrategy) for s in strategies)
assert [s.placement_group_bundle_index for s in strategies] == [0, 1, 2, 3]
assert packed.learner(None) == {"scheduling_strategy": "DEFAULT"}  # spares and joiners: where there is room
assert cpus_free(2)  # 4 of 6 CPUs reserved for the learners' slots
packed.close()
assert cpus_free(6)
placement.PACK_READY_TIMEOUT_S = 2.0
try:
    placement.Placement(load_recipe(TINY, ["learners.placement=pack", "learners.count=8"]), driver)
except UserError as exc:
    assert "could not reserve the learners' 8 slots within 2 s" in str(exc), exc
else:
    raise AssertionError("8 one-CPU slots on 6 CPUs were reserved")
cluster.stop_cluster()
print("ok")
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_pack_placement_reserves_one_slot_per_learner_or_says_why_not():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", PACKED], env=env, capture_output=True, text=True, timeout=150)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
