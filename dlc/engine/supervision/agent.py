"""Per-node agents: chaos's hands on every node.

A process id means something only on its own machine, so the driver never signals a learner
itself: it asks the agent pinned to the learner's node (a Ray actor with no CPUs, one per node the
run uses) to send the signal there. That works the same on one machine and on many. A stall's
SIGCONT comes from a timer process the agent starts on that node in a session of its own, so the
learner resumes even if the agent, the driver or `dlc chaos` dies first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from chaos.faults import lacking
from chaos.target import ProcessSignals, TargetError
from dlc.engine.supervision.chaos_log import ChaosLog
from dlc.run import events
from dlc.run.rundir import RunDir


class NodeAgentWorker:
    """Lives in the agent actor of one node: sends signals to processes of that node.

    Each call answers `(t, errors)`: this node's wall time just before the first signal went out (a
    stall's SIGCONT comes no earlier than `t` plus its duration), and what could not be done."""

    def __init__(self) -> None:
        self.signals = ProcessSignals()

    def kill(self, pids: list[int]) -> tuple[float, list[str]]:
        """SIGKILL each pid (all at once for a lost node)."""
        t = time.time()
        return t, [error for pid in pids for error in _sent(self.signals.kill, pid)]

    def stall(self, pid: int, seconds: float) -> tuple[float, list[str]]:
        """SIGSTOP `pid` and start the timer on this node that sends SIGCONT after `seconds`."""
        t = time.time()
        return t, _sent(self.signals.stall, pid, seconds)

    def preempt(self, pid: int, notice_s: float) -> tuple[float, list[str]]:
        """SIGTERM `pid` (a preemption notice) and start the timer on this node that SIGKILLs it after `notice_s`."""
        t = time.time()
        return t, _sent(self.signals.preempt, pid, notice_s)

    def pid(self) -> int:
        return os.getpid()


def _sent(send: Callable[..., object], pid: int, *args: float) -> list[str]:
    """Send one signal: [] if it went out, else why not (the process is gone, or not one to signal)."""
    try:
        send(pid, *args)
    except TargetError as exc:
        return [str(exc)]
    return []


# Ray's stubs type `remote` with task options only: its actor options (max_concurrency) are missing.
NodeAgent = ray.remote(num_cpus=0, max_concurrency=4)(NodeAgentWorker)  # type: ignore[call-overload]


class Agents:
    """The driver's agents, one per node, started when a node first needs one."""

    def __init__(self) -> None:
        self._by_node: dict[str, Any] = {}

    def on(self, node_id: str) -> Any:
        """The agent of `node_id` (started now if the run has none there yet)."""
        agent = self._by_node.get(node_id)
        if agent is None:
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            agent = NodeAgent.options(scheduling_strategy=strategy).remote()
            self._by_node[node_id] = agent
        return agent

    def unready(self, timeout_s: float) -> list[str]:
        """Waits up to `timeout_s` for every agent's process to answer; returns the nodes whose agent did not.

        An agent's process can take 20 s and more to start on cores busy compiling: a signal sent to
        it meanwhile lands that much after chaos asked for it."""
        nodes = list(self._by_node)
        pings = [self._by_node[node].pid.remote() for node in nodes]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout_s)
        return [node for node, ping in zip(nodes, pings, strict=True) if ping not in ready]

    def forget(self, node_id: str) -> None:
        """The node's agent died (its node with it): the next request starts a new one, if the node is back."""
        self._by_node.pop(node_id, None)

    def stop(self) -> None:
        for agent in self._by_node.values():
            ray.kill(agent)
        self._by_node.clear()


class Signals:
    """The driver's side: carries out chaos's kill, stall, preempt, kill_node and kill_syncer requests through the
    agents.

    Nothing here waits on an agent: each tick looks at the answers that came back, and a signal that
    could not be sent is recorded (a `control_ignored` event and a `not_carried_out` outcome).
    """

    def __init__(self, rundir: RunDir, chaos: ChaosLog, agents: Agents) -> None:
        self.rundir = rundir
        self.chaos = chaos
        self.agents = agents
        self._calls: list[tuple[Any, dict[str, Any], str]] = []  # (answer ref, request, node id)
        self._sent = False  # a kill went out since `take_sent` last asked

    def carry_out(
        self, request: dict[str, Any], live: dict[int, dict[str, Any]], syncer_pid: int | None, syncer_node: str | None
    ) -> None:
        """`live`: each live learner's last view (pid, node_id, node); the request names one, or the syncer."""
        op, i = request.get("op"), request.get("learner")
        if op == "kill_syncer":
            if syncer_pid is None or syncer_node is None or request.get("pid") not in (None, syncer_pid):
                self._ignore(request, f"the syncer is not the process chaos saw (pid {syncer_pid} now)")
                return
            self._calls.append((self.agents.on(syncer_node).kill.remote([syncer_pid]), request, syncer_node))
            self._sent = True
            return
        view = live.get(i) if isinstance(i, int) else None
        if view is None:
            self._ignore(request, f"learner {i} is not live")
            return
        pid, node = view.get("pid"), view.get("node_id")
        if pid is None or request.get("pid") not in (None, pid):
            self._ignore(request, f"learner {i} is not the process chaos saw (pid {pid} now)")
            return
        if node is None:
            self._ignore(request, f"learner {i} has not reported its node yet")
            return
        # A request without a setting its fault needs is ignored, never given a default of the engine's own.
        if (needs := lacking(request)) is not None:
            self._ignore(request, f"a {op} request without its {needs}")
            return
        agent = self.agents.on(node)
        if op == "kill":
            ref = agent.kill.remote([pid])
        elif op == "stall":
            ref = agent.stall.remote(pid, float(request["duration_s"]))
        elif op == "preempt":
            ref = agent.preempt.remote(pid, float(request["notice_s"]))
        else:  # kill_node: every live learner on that node, at once
            victims = sorted(j for j, v in live.items() if v.get("node_id") == node and v.get("pid"))
            self.chaos.note_victims("kill_node", victims, float(request.get("t") or time.time()))
            pids = [live[j]["pid"] for j in victims]
            ref = agent.kill.remote(pids)
            self.rundir.event(events.NodeKilled(node_id=node, node=view.get("node"), learners=victims, pids=pids))
        self._calls.append((ref, request, node))
        self._sent = self._sent or op not in ("stall", "preempt")

    def take_sent(self) -> bool:
        """Whether a kill went out since the last call: its death shows within milliseconds, so the
        driver looks again soon instead of a whole tick later."""
        sent, self._sent = self._sent, False
        return sent

    def check(self) -> None:
        """Record what the agents answered: when each signal went out (`signalled`, on the agent's clock,
        seconds after chaos asked), or why it could not."""
        pending = []
        for ref, request, node in self._calls:
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                pending.append((ref, request, node))
                continue
            try:
                t, errors = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the agent died: its node is gone, or going
                self.agents.forget(node)
                t, errors = None, [f"the agent on node {node[:8]} failed: {str(exc).splitlines()[0]}"]
            if errors:
                self._ignore(request, "; ".join(errors))
            else:
                self.chaos.outcome(str(request.get("op")), request.get("learner"), "signalled", at=t)
        self._calls = pending

    def _ignore(self, request: dict[str, Any], reason: str) -> None:
        self.rundir.event(events.ControlIgnored(request=request, reason=reason))
        self.chaos.outcome(str(request.get("op")), request.get("learner"), "not_carried_out", detail=reason)
