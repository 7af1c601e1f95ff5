"""Several machines, on one host: a two-node Ray cluster on loopback with token auth, learners on both
nodes, a learner on the second node killed through `dlc chaos` and a node's learners killed at once,
then a resume from the checkpoints every node wrote; and a node Ray drains (`ray drain-node`), whose
learners leave on the notice with their progress.

Ray 2.60 rewrites 127.0.0.1 into the machine's external address when it starts a node (ray#59110), so
the two `ray start` processes run through a shim that keeps loopback as given (as dlc's own embedded
cluster does); each node has its own temp dir and custom resource, so placement is deterministic.
Every process the test starts is stopped at teardown, also when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.helpers import REPO, TINY, assert_user_error, kill_tree, read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RAY_LOOPBACK = (
    "import sys\n"
    "import ray._private.services as services\n"
    "services.resolve_ip_for_localhost = lambda host: host\n"
    "from ray.scripts.scripts import main\n"
    "sys.argv = ['ray', *sys.argv[1:]]\n"
    "main()\n"
)
LOOPBACK = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
# Learners 0 and 2 on the head node (with the syncer), 1 and 3 on the second node.
PINNED = (
    "learners.overrides=[{index: 0, resources: {node_a: 1}}, {index: 1, resources: {node_b: 1}}, "
    "{index: 2, resources: {node_a: 1}}, {index: 3, resources: {node_b: 1}}]"
)
RUN = ("learners.count=4", "learners.join_streams=0", "learners.step_time_s=0.25", "data.max_corpus_bytes=3000000")


@dataclass
class Cluster:
    address: str
    env: dict[str, str]  # what a process of this cluster's users needs: RAY_AUTH_MODE and the token
    root: Path  # every node's temp dir is under it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                RAY_LOOPBACK,
                "start",
                "--node-ip-address=127.0.0.1",
                "--disable-usage-stats",
                "--block",
                *args,
            ],  # fmt: skip
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _processes_under(root: Path, extra: list[int]) -> list[psutil.Process]:
    """Every process whose command line names `root` (GCS, raylets, monitors), those in `extra`, and
    all their descendants (workers, agents)."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline"]):
        if str(root) in " ".join(proc.info["cmdline"] or []) or proc.pid in extra:
            found[proc.pid] = proc
    for proc in list(found.values()):
        with contextlib.suppress(psutil.Error):
            found.update({child.pid: child for child in proc.children(recursive=True)})
    return list(found.values())


def _wait_for_nodes(cluster_root: Path, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raylets = [p for p in _processes_under(cluster_root, []) if "raylet" in p.name()]
        if len(raylets) >= count:
            time.sleep(2)  # registered with the GCS a moment after it starts
            return
        time.sleep(0.5)
    raise TimeoutError(f"{count} raylets did not start (logs under {cluster_root})")


ALIVE = (  # joined as dlc joins (Ray's own ray.init would rewrite 127.0.0.1, ray#59110)
    "import sys, time\n"
    "from dlc.config.job import ClusterConfig\n"
    "from dlc.engine import cluster\n"
    "cluster.start_cluster(ClusterConfig(address=sys.argv[1]), 0)\n"
    "deadline = time.time() + 60\n"
    "while len(cluster.nodes()) < int(sys.argv[2]) and time.time() < deadline:\n"
    "    time.sleep(0.5)\n"
    "print(len(cluster.nodes()))\n"
    "cluster.stop_cluster()\n"
)


def _wait_for_registration(address: str, env: dict[str, str], count: int) -> None:
    """Until the GCS counts `count` live nodes: a raylet registers a moment after it starts."""
    probe = subprocess.run([sys.executable, "-c", ALIVE, address, str(count)], env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert probe.stdout.strip().endswith(str(count)), probe.stderr[-2000:]


@pytest.fixture
def two_nodes() -> Iterator[Cluster]:
    # A short path: Ray's unix sockets live under the temp dir, and a socket path may not pass 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="dlc2n-", dir="/tmp"))
    token = root / "token"
    token.write_text(uuid.uuid4().hex)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env.pop("RAY_ADDRESS", None)
    port = _free_port()
    starters: list[subprocess.Popen[bytes]] = []
    try:
        head = ["--head", f"--port={port}", f"--temp-dir={root / 'a'}", "--num-cpus=3", "--include-dashboard=false"]
        starters.append(_ray_start([*head, '--resources={"node_a": 8}'], env, root / "head.log"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.5)
        second = [f"--address=127.0.0.1:{port}", f"--temp-dir={root / 'b'}", "--num-cpus=2"]
        starters.append(_ray_start([*second, '--resources={"node_b": 8}'], env, root / "second.log"))
        _wait_for_nodes(root, 2)
        _wait_for_registration(f"127.0.0.1:{port}", env, 2)
        yield Cluster(f"127.0.0.1:{port}", env, root)
    finally:
        for proc in starters:  # `ray start --block` stops its node's processes on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in starters:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        for proc in _processes_under(root, [p.pid for p in starters]):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for proc in starters:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _train(cluster: Cluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dlc.cli", "train", str(TINY), f"cluster.address={cluster.address}", *args],
        cwd=REPO,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_until_training(run_dir: Path, proc: subprocess.Popen[str], learners: int, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        with contextlib.suppress(OSError, ValueError):
            status = json.loads((run_dir / "status.json").read_text())
            if sum(row["state"] == "training" for row in status["learners"]) == learners:
                return status
        time.sleep(0.5)
    raise TimeoutError("the learners did not all start training")


def test_two_nodes_train_lose_learners_and_resume(two_nodes: Cluster, tmp_path: Path) -> None:
    cluster = two_nodes
    run_dir = tmp_path / "run"

    # Without the cluster's token a driver is refused at once, and nothing is written.
    no_token = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    refused = subprocess.run(
        [sys.executable, "-m", "dlc.cli", "train", str(TINY), f"cluster.address={cluster.address}", *RUN,
         f"run.dir={run_dir}"],  # fmt: skip
        cwd=REPO, env={**no_token, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert_user_error(refused, "requires token authentication", "RAY_AUTH_MODE=token")
    assert not run_dir.exists()

    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "warmup_s: 0\nmin_gap_s: 0\nmax_concurrent: 2\nduration_s: 60\ntimeline:\n"
        "  - {at_s: 1, fault: kill, learner: 1}\n"  # on the second node
        "  - {at_s: 2, fault: kill_node, learner: 0}\n"  # the head node's learners: 0 and 2
    )
    # Learner 3 is never faulted, and each new process copies its state: it must still train when they come
    # up. The faults come once `dlc chaos` has started (learners at step 26 to 46); a new process was up
    # 12-14 s later on 2 idle cores, 17-28 s with one core kept busy. With 120 steps learner 3 finished
    # first and the others took the global model (CI); the 194 steps left here take 48 s at 0.25 s a step.
    train = _train(cluster, *RUN, PINNED, "run.max_steps=240", f"run.dir={run_dir}")
    chaos = None
    try:
        status = _wait_until_training(run_dir, train, 4, timeout_s=300)
        nodes = {row["id"]: row["node_id"] for row in status["learners"]}
        assert nodes[0] == nodes[2] != nodes[1] == nodes[3]
        assert {row["node"] for row in status["learners"]} == {"127.0.0.1"}
        # Every port any process of the cluster or of this run listens on is on loopback.
        listening = {
            (proc.pid, c.laddr.ip, c.laddr.port)
            for proc in _processes_under(cluster.root, [train.pid])
            for c in _connections(proc)
            if c.status == psutil.CONN_LISTEN
        }
        assert listening and all(ip in LOOPBACK for _, ip, _ in listening), listening
        chaos = subprocess.Popen(
            [sys.executable, "-m", "dlc.cli", "chaos", str(run_dir), "--plan", str(plan)],
            cwd=REPO, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _, stderr = train.communicate(timeout=600)
        assert train.returncode == 0, stderr[-3000:]
        chaos_out, chaos_err = chaos.communicate(timeout=60)
    finally:
        kill_tree(train)
        if chaos is not None and chaos.poll() is None:
            chaos.kill()
            chaos.wait(timeout=10)

    events = read_jsonl(run_dir / "events.jsonl")
    started = next(e for e in events if e["kind"] == "cluster_started")
    assert len(started["nodes"]) == 2 and {n["ip"] for n in started["nodes"]} == {"127.0.0.1"}  # ray.nodes()
    faults = read_jsonl(run_dir / "chaos.jsonl")
    phases = {(e["fault"], e["learner"], e["phase"]) for e in faults}
    # The kill on the second node and the lost head-node learners: each detected, restarted on its
    # node (its resource pins it), copied from a peer, and pushing again.
    for fault, learner in (("kill", 1), ("kill_node", 0), ("kill_node", 2)):
        for phase in ("detected", "restarted", "state_copied", "first_push"):
            assert (fault, learner, phase) in phases, (fault, learner, phase, chaos_out, chaos_err)
    killed_node = next(e for e in events if e["kind"] == "node_killed")
    assert killed_node["learners"] == [0, 2] and killed_node["node_id"] == nodes[0]
    rejoined = {e["learner"]: e for e in events if e["kind"] == "learner_rejoined"}
    assert set(rejoined) == {0, 1, 2} and all(e["peer"] is not None for e in rejoined.values())
    # How soon each death was detected (request -> agent -> signal -> the driver's next poll) is the machine's
    # pace, a benchmark's figure (bench/startup.py): 0.4 s on idle cores, 5.6 s beside the suite's other worker.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["restarts"] == {"0": 1, "1": 1, "2": 1}
    final = {row["id"]: row["step"] for row in summary["learners"]}
    assert set(final.values()) == {240}

    # Resume: each learner from the checkpoint it wrote on its node, the syncer from its own.
    resumed_run = _train(cluster, *RUN, PINNED, "run.max_steps=260", f"run.dir={run_dir}")
    try:
        _, stderr = resumed_run.communicate(timeout=600)
    finally:
        kill_tree(resumed_run)
    assert resumed_run.returncode == 0, stderr[-3000:]
    events = read_jsonl(run_dir / "events.jsonl")
    resumed = {e["learner"]: e for e in events if e["kind"] == "run_resumed"}
    assert {i: e["step"] for i, e in resumed.items()} == final
    assert any(e["kind"] == "syncer_restored" for e in events)
    assert not [e for e in events if e["kind"] == "control_ignored"]  # the first run's requests stay its own
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and {row["step"] for row in summary["learners"]} == {260}


def _connections(proc: psutil.Process) -> list:
    with contextlib.suppress(psutil.Error):
        return proc.net_connections(kind="inet")
    return []


def test_learners_on_a_draining_node_leave_with_their_progress_and_the_run_goes_on(
    two_nodes: Cluster, tmp_path: Path
) -> None:
    # The second node is taken back with 60 s of notice, as an autoscaler reclaiming a spot VM does.
    # Its learners (1 and 3, pinned to it) push what they have not pushed and leave; no other node can
    # hold them, so they are retired and the head node's learners finish the run.
    cluster, run_dir = two_nodes, tmp_path / "run"
    train = _train(cluster, *RUN, PINNED, "run.max_steps=75", f"run.dir={run_dir}")
    try:
        status = _wait_until_training(run_dir, train, 4, timeout_s=300)
        second = next(row["node_id"] for row in status["learners"] if row["id"] == 1)
        drain = [sys.executable, "-c", RAY_LOOPBACK, "drain-node", f"--address={cluster.address}",
                 f"--node-id={second}", "--reason=DRAIN_NODE_REASON_PREEMPTION", "--reason-message=spot VM reclaimed",
                 "--deadline-remaining-seconds=60"]  # fmt: skip
        drained = subprocess.run(drain, env=cluster.env, capture_output=True, text=True, timeout=60)
        assert drained.returncode == 0, drained.stderr[-3000:]
        _, stderr = train.communicate(timeout=600)
        assert train.returncode == 0, stderr[-3000:]
    finally:
        kill_tree(train)
    events = read_jsonl(run_dir / "events.jsonl")
    (draining,) = [e for e in events if e["kind"] == "node_draining"]
    assert draining["node_id"] == second and draining["learners"] == [1, 3] and 0 < draining["deadline_in_s"] <= 60
    left = {e["learner"]: e for e in events if e["kind"] == "learner_preempted"}
    assert set(left) == {1, 3}, left
    for e in left.values():  # within the notice, with nothing it trained thrown away
        assert e["reason"] == "node draining" and e["unpushed_steps"] == 0 and 0 < e["leave_s"] < 60, e
    assert {e["learner"] for e in events if e["kind"] == "learner_lost"} == {1, 3}
    summary = json.loads((run_dir / "summary.json").read_text())
    final = {row["id"]: row["step"] for row in summary["learners"]}
    assert summary["status"] == "completed" and final[0] == final[2] == 75
    assert summary["goodput_by_learner"]["1"]["dead"] == 0  # a notice is not a death
