"""The Ray cluster a run's processes live in: an embedded one on loopback, or one to join.

Embedded (no `cluster.address`): a one-node cluster of the driver's own, started with
`address="local"` (a cluster someone started with `ray start`, or RAY_ADDRESS, is never joined by
accident: `cluster.address=auto` asks for that). Ray 2.60 rewrites 127.0.0.1 into the machine's
external address before it starts a node or connects to one (ray-project/ray#59110), and then binds
every port on all interfaces. The one switch Ray offers against it, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0,
also forbids multi-node clusters to every process that inherits it; so the rewrite is switched off
here instead, in this process only and only while `ray.init` runs. The embedded cluster also starts
neither Ray's dashboard (API server) process nor the autoscaler's monitor, which listens on a port of
its own: a one-node cluster with no autoscaling has no use for either. What still listens, all on
127.0.0.1: the GCS, the raylet (node manager and object manager), the runtime-env agent the raylet
asks to prepare workers, and every worker's (and the driver's) gRPC endpoint. Its node agent runs
as in a minimal Ray install unless the recipe names `metrics.port`: then that agent also serves
Prometheus metrics at 127.0.0.1:PORT/metrics (and its own HTTP port), as `ray start
--metrics-export-port` does.

Joining: the address is checked before `ray.init`, so an address nobody listens on, or a cluster
whose token this driver lacks, is refused in seconds with one line (Ray itself retries for 20-40 s).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import ray

from dlc.config.job import ClusterConfig
from dlc.errors import UserError

CONNECT_TIMEOUT_S = 3.0
PROBE_TIMEOUT_S = 8.0  # starting the probe's interpreter and Ray's client takes a second or two of it
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
TOKEN_HELP = (
    "set RAY_AUTH_MODE=token and give this driver the cluster's token, as RAY_AUTH_TOKEN, in a file named by "
    "RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (`ray get-auth-token` on the head node prints it)"
)


def draining_nodes() -> dict[str, float | None]:
    """The nodes Ray is draining (`ray drain-node`, an autoscaler or KubeRay taking a spot node back): node
    id -> the wall time it goes away, None when no deadline was given. Empty when the GCS cannot say.

    Ray has no public call for it; its GCS client's `get_draining_nodes` (what Ray Serve's safe draining
    reads) is used, and a Ray without it gives an empty answer rather than failing the run.
    """
    try:  # Ray's stubs declare no `gcs_client` on its private Worker
        answer = ray._private.worker.global_worker.gcs_client.get_draining_nodes(timeout=2)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a private API: any failure means "none known", never a failed run
        return {}
    return {str(node): (deadline / 1000.0 if deadline else None) for node, deadline in dict(answer).items()}


def start_cluster(
    cfg: ClusterConfig, cpus_needed: float, env: Mapping[str, str] | None = None, metrics_port: int | None = None
) -> dict[str, Any]:
    """Join `cfg.address`, or start an embedded single-node cluster on loopback; returns what the run logs.

    `env`: variables for every process of an embedded cluster, which inherits them from the driver's
    environment (`devices.embedded_env`); they stay in it, where `devices.inherited_env` finds them.
    `metrics_port`: the embedded cluster's Prometheus endpoint (`check_metrics_port` first); None for none.
    """
    _quiet_worker_deaths()
    if cfg.address:
        _join(cfg.address, cpus_needed)
    else:
        os.environ.update(env or {})
        # Logical CPUs, not cores: learners are paced by XLA threads, not by Ray's accounting.
        num_cpus = cfg.num_cpus or max(float(os.cpu_count() or 1), cpus_needed)
        _start_embedded(int(np.ceil(num_cpus)), metrics_port)
    return {
        "address": cfg.address or "embedded",
        "driver_node": ray.get_runtime_context().get_node_id(),
        "nodes": [{k: n[k] for k in ("node_id", "ip", "host", "head")} for n in nodes()],
    }


def stop_cluster() -> None:
    """Leave the cluster, and stop an embedded one; also after a start cut short (a Ctrl-C inside
    `ray.init`), whose processes run though Ray is not initialized. Nothing to do costs ~15 ms."""
    ray.shutdown()


def nodes() -> list[dict[str, Any]]:
    """The cluster's live nodes: id, address, host name, whether it is the head, resources and labels."""
    return [
        {
            "node_id": n["NodeID"],
            "ip": n["NodeManagerAddress"],
            "host": n.get("NodeManagerHostname", ""),
            "head": "node:__internal_head__" in n.get("Resources", {}),
            "resources": dict(n.get("Resources", {})),
            "labels": dict(n.get("Labels") or {}),
        }
        for n in ray.nodes()
        if n.get("Alive")
    ]


def node_info() -> dict[str, str]:
    """The node this process runs on (inside an actor): Ray's node id, its address, the host name.

    Outside Ray (a worker class driven in-process by a test) it is this machine, with no node id.
    """
    if not ray.is_initialized():
        return {"node_id": "", "ip": "127.0.0.1", "host": socket.gethostname()}
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "host": socket.gethostname(),
    }


# How the raylet's report of a worker process that died begins (then it guesses at causes, the
# kernel's OOM killer first).
WORKER_DIED = "A worker died or was killed"


def _quiet_worker_deaths() -> None:
    """Keep the raylet's reports of dead workers off the driver's console; every other error prints.

    Ray's driver prints each error the raylet publishes for its job (`listen_error_messages`); a
    dead worker's is a paragraph that suggests the OOM killer, printed over the live view after every
    kill, chaos's included. The supervisor sees each death itself, reports it and restarts the
    learner. The printer is looked up at each call, so replacing it reaches that thread.
    """
    from ray._private import worker

    printer = worker.print_to_stdstream
    if getattr(printer, "keeps_deaths_quiet", False):
        return

    def print_but_deaths(data: dict[str, Any], ignore_prefix: bool) -> None:
        if not any(WORKER_DIED in str(line) for line in data.get("lines", ())):
            printer(data, ignore_prefix=ignore_prefix)

    print_but_deaths.keeps_deaths_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = print_but_deaths


# -- the embedded cluster ------------------------------------------------------------------------


def check_metrics_port(port: int) -> None:
    """UserError, with the fix, when the embedded cluster could not export metrics at 127.0.0.1:`port`."""
    from ray._private import utils

    missing = utils.get_dashboard_dependency_error() if hasattr(utils, "get_dashboard_dependency_error") else None
    if missing is not None:
        raise UserError(
            f"metrics.port={port} needs Ray's metrics agent, which this Ray lacks ({str(missing).splitlines()[0]}): "
            "pip install 'dlc[metrics]' (Ray's default extra), or leave metrics.port out"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise UserError(
                f"metrics.port={port}: 127.0.0.1:{port} cannot be listened on ({exc.strerror}): choose a free port"
            ) from None


def _start_embedded(num_cpus: int, metrics_port: int | None = None) -> None:
    common: dict[str, Any] = {"log_to_driver": False, "logging_level": "ERROR", "include_dashboard": False}
    if metrics_port is not None:
        common["_metrics_export_port"] = metrics_port
    exporter = _minimal_agent() if metrics_port is None else contextlib.nullcontext()
    with _without_env("RAY_ADDRESS"), _loopback_kept(), _no_dashboard_nor_monitor(), exporter:
        ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", **common)


@contextlib.contextmanager
def _loopback_kept() -> Iterator[None]:
    """While it lasts, Ray keeps 127.0.0.1 as given instead of replacing it with the external address."""
    from ray._private import services

    rewrite = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda host: host
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = rewrite


@contextlib.contextmanager
def _no_dashboard_nor_monitor() -> Iterator[None]:
    """While it lasts, a head node Ray starts in this process starts no API server and no autoscaler monitor."""
    from ray._private.node import Node

    saved = Node.start_api_server, Node.start_monitor
    Node.start_api_server = lambda self, **_: None  # type: ignore[method-assign]
    Node.start_monitor = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Node.start_api_server, Node.start_monitor = saved  # type: ignore[method-assign]


@contextlib.contextmanager
def _minimal_agent() -> Iterator[None]:
    """While it lasts, the node Ray starts runs its agent as a minimal Ray install would: no metrics
    exporter, no HTTP server, whatever packages are installed. Used unless the run asks for metrics."""
    from ray._private import utils

    saved = getattr(utils, "get_dashboard_dependency_error", None)
    if saved is None:  # a Ray that decides otherwise: its agent is what it is
        yield
        return
    # What Ray's check returns when the dashboard's packages are missing: an ImportError.
    utils.get_dashboard_dependency_error = lambda: ImportError("dlc: no metrics.port")
    try:
        yield
    finally:
        utils.get_dashboard_dependency_error = saved


@contextlib.contextmanager
def _without_env(name: str) -> Iterator[None]:
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


# -- joining a cluster ---------------------------------------------------------------------------


def _join(address: str, cpus_needed: float) -> None:
    where = f"cluster.address={address}"
    client = address.startswith("ray://")
    if not client:
        address = _bootstrap_address(address)
        _check_reachable(address, where)
        _check_token(address, where)
    elif (parsed := _host_port(address.removeprefix("ray://"))) is not None:
        _check_reachable(f"{parsed[0]}:{parsed[1]}", where)
    common: dict[str, Any] = {"log_to_driver": False, "logging_level": "ERROR"}
    try:
        with _loopback_kept():
            ray.init(address=address, **common)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UserError(f"cannot join the Ray cluster at {where}: {_first_line(exc)}") from None
    available = ray.cluster_resources().get("CPU", 0.0)
    if available < cpus_needed:
        ray.shutdown()
        raise UserError(
            f"the Ray cluster at {address} has {available:g} CPUs, the recipe reserves {cpus_needed:g}: "
            "lower learners.num_cpus, learners.spares, learners.join_streams or syncer.num_cpus, or add nodes"
        )


def _bootstrap_address(address: str) -> str:
    """HOST:PORT of the head's GCS: as given, or what `auto` finds (RAY_ADDRESS, the last `ray start` here)."""
    if address != "auto":
        return address
    from ray._private import services

    try:
        with _loopback_kept():
            found = services.canonicalize_bootstrap_address("auto")
    except ConnectionError:
        found = None
    if not found:
        raise UserError(
            "cluster.address=auto found no Ray cluster on this machine (no RAY_ADDRESS, no `ray start` here): "
            "start one with `ray start --head`, or give cluster.address=HOST:PORT"
        )
    return found


def _host_port(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _check_reachable(address: str, where: str) -> None:
    """Something listens at HOST:PORT; UserError (in seconds, not Ray's 40) otherwise."""
    parsed = _host_port(address)
    if parsed is None:
        raise UserError(f"{where} is not HOST:PORT (e.g. 10.0.0.5:6379), auto, or ray://HOST:PORT")
    host, port = parsed
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or type(exc).__name__
        raise UserError(
            f"cannot reach the Ray cluster at {where} ({reason} within {CONNECT_TIMEOUT_S:g} s): start its head "
            "with `ray start --head --port=PORT`, or fix the address"
        ) from None


def _check_token(address: str, where: str) -> None:
    """One call to the cluster's GCS with this driver's token settings; UserError if it is refused.

    In a process of its own: Ray's client retries for 40 s when what answers is no GCS, and logs
    every refused attempt; the user gets one line from us instead, in seconds.
    """
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _GCS_PROBE, address, str(CONNECT_TIMEOUT_S)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"something listens at {where}, but no Ray GCS answers there within {PROBE_TIMEOUT_S:g} s: give the "
            "address `ray start --head` printed (the head's --port, 6379 by default)"
        ) from None
    if probe.returncode == _AUTH_REFUSED:
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            raise UserError(f"the Ray cluster at {where} requires token authentication: {TOKEN_HELP}")
        raise UserError(f"the Ray cluster at {where} refused this driver's token: {TOKEN_HELP}")
    # Anything else (a GCS still starting): ray.init retries and says what it finds.


_AUTH_REFUSED = 3
_GCS_PROBE = f"""
import sys
from ray._raylet import GcsClient
from ray.exceptions import AuthenticationError
try:
    GcsClient(address=sys.argv[1]).internal_kv_get(b"dlc-probe", None, timeout=float(sys.argv[2]))
except AuthenticationError:
    sys.exit({_AUTH_REFUSED})
"""


def _first_line(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    text = str(cause).strip().splitlines()
    return text[0] if text else type(cause).__name__
