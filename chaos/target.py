"""What chaos acts on: the `Target` interface, signals by pid, and a live run reached through its directory.

The controller only knows `Target`. `RunDirTarget` is the one a separate `dlc chaos` process uses: it
reads `status.json` and asks the driver for every fault by appending to `control.jsonl`, which the
driver tails (every 0.2 s). A process id means something only on its own machine, so kills and stalls
too are requests: the driver has the agent on the learner's node send the signal there
(`dlc.engine.supervision.agent`, which uses `ProcessSignals`), and a plan works the same on one machine and many.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from dlc.run.files import CHAOS_FILE, CONTROL_FILE, HEALTHY_STATES, RECIPE_FILE, STATUS_FILE, append_jsonl

# The stall timer runs in its own interpreter and session, so it sends SIGCONT even when the
# process that stalled the victim is killed, or the user presses Ctrl-C in its terminal.
_RESUME_TIMER = """\
import os, signal, sys, time
time.sleep(float(sys.argv[2]))
try:
    os.kill(int(sys.argv[1]), signal.SIGCONT)
except ProcessLookupError:
    pass
"""

# A preemption's deadline, in a process of its own for the same reason: SIGKILL after the notice,
# unless the victim has left by then (or its pid now names a process that is not the one it started
# as: the victim's own start time is compared, so a pid reused meanwhile is never killed).
_KILL_TIMER = """\
import os, signal, sys, time
def started(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None
pid, first = int(sys.argv[1]), started(int(sys.argv[1]))
time.sleep(float(sys.argv[2]))
if first is None or started(pid) == first:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


@dataclass(frozen=True)
class LearnerInfo:
    """One learner as the run reports it; ``state`` is its status.json state (training, slow, dead, ...)."""

    id: int
    pid: int | None
    state: str
    node: str | None = None  # the Ray node id it runs on (kill_node takes every learner on one)

    @property
    def healthy(self) -> bool:
        return self.state in HEALTHY_STATES


class Target(Protocol):
    """A running training job that faults can be injected into."""

    def learners(self) -> list[LearnerInfo]: ...
    def quorum(self) -> int: ...
    def running(self) -> bool: ...  # False once the run finished
    def kill(self, learner: int) -> None: ...
    def stall(self, learner: int, seconds: float) -> None: ...
    def slow(self, learner: int, factor: float, seconds: float | None) -> None: ...  # None: until the run ends
    def join(self, seconds: float | None = None) -> None: ...  # None: stays until the run ends
    def leave(self, learner: int) -> None: ...
    def kill_syncer(self) -> None: ...
    def kill_node(self, learner: int) -> None: ...  # every learner on `learner`'s node
    def degrade_link(self, learner: int, factor: float, seconds: float) -> None: ...  # bandwidth / factor, latency x
    def cut_link(self, learner: int, seconds: float) -> None: ...
    def preempt(self, learner: int, notice_s: float) -> None: ...  # SIGTERM, SIGKILL after notice_s
    def record(self, entry: dict[str, Any]) -> None: ...  # one chaos.jsonl line


class TargetError(Exception):
    """A fault could not be injected: the process is gone, or the run does not say its pid."""


class ProcessSignals:
    """SIGKILL, SIGSTOP with a detached SIGCONT timer, and SIGTERM with a detached SIGKILL timer, sent by pid."""

    def __init__(self, send: Callable[[int, int], None] = os.kill) -> None:
        self._send = send

    def kill(self, pid: int) -> None:
        self._signal(pid, signal.SIGKILL)

    def stall(self, pid: int, seconds: float) -> subprocess.Popen[bytes]:
        """Freeze ``pid`` for ``seconds``; returns the timer process that will send SIGCONT.

        The timer starts first: if this process dies right after the SIGSTOP, the victim still resumes.
        """
        if not seconds > 0:
            raise ValueError(f"a stall needs a positive duration, got {seconds!r}")
        self._signal(pid, 0)  # raises TargetError now rather than leaving a timer for a missing process
        timer = self.resume_after(pid, seconds)
        self._signal(pid, signal.SIGSTOP)
        return timer

    def preempt(self, pid: int, notice_s: float) -> subprocess.Popen[bytes]:
        """A preemption notice: SIGTERM ``pid`` now, SIGKILL it after ``notice_s`` if it still runs; returns
        the timer process that will send the SIGKILL (it starts first, as a stall's does)."""
        if not notice_s > 0:
            raise ValueError(f"a preemption needs a positive notice, got {notice_s!r}")
        self._signal(pid, 0)
        timer = self._timer(_KILL_TIMER, pid, notice_s, "preempt")
        self._signal(pid, signal.SIGTERM)
        return timer

    def resume_after(self, pid: int, seconds: float) -> subprocess.Popen[bytes]:
        """A process in its own session that sleeps ``seconds`` and then sends SIGCONT to ``pid``."""
        return self._timer(_RESUME_TIMER, pid, seconds, "stall")

    def _timer(self, program: str, pid: int, seconds: float, name: str) -> subprocess.Popen[bytes]:
        _check_pid(pid)
        timer = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", program, str(pid), repr(float(seconds))],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        # Reap it when it is done, so no zombie (nor a ResourceWarning) outlives it in a long-lived process.
        threading.Thread(target=timer.wait, name=f"{name}-timer-{pid}", daemon=True).start()
        return timer

    def resume(self, pid: int) -> None:
        self._signal(pid, signal.SIGCONT)

    def _signal(self, pid: int, signum: int) -> None:
        _check_pid(pid)
        try:
            self._send(pid, signum)
        except ProcessLookupError:
            raise TargetError(f"process {pid} is gone") from None
        except PermissionError:
            raise TargetError(f"not allowed to signal process {pid} (another user's process?)") from None


def _check_pid(pid: object) -> None:
    # 0 and negative pids address process groups (-1: every process we may signal): never send those.
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        raise TargetError(f"{pid!r} is not a process id this tool will signal")
    if pid == os.getpid():
        raise TargetError(f"process {pid} is this chaos process itself")


# ---------------------------------------------------------------------------------------------
# A live run, through its directory


class RunDirTarget:
    """A live run reached through its run directory only (what `dlc chaos` uses from outside).

    A status.json older than ``stale_after_s`` means the driver is gone: the run counts as not running.
    """

    def __init__(self, run_dir: Path, stale_after_s: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.run_dir = Path(run_dir)
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._last_status: dict[str, Any] = {}

    def status(self) -> dict[str, Any]:
        """status.json as last written; the previous reading while it is missing or unreadable."""
        for attempt in range(3):
            try:
                status = json.loads((self.run_dir / STATUS_FILE).read_text())
            except (OSError, ValueError):
                time.sleep(0.02 * (attempt + 1))
                continue
            if isinstance(status, dict):
                self._last_status = status
                break
        return self._last_status

    def learners(self) -> list[LearnerInfo]:
        out = []
        for row in self.status().get("learners") or []:
            try:
                pid, node = row.get("pid"), row.get("node_id")
                out.append(
                    LearnerInfo(
                        int(row["id"]),
                        pid if isinstance(pid, int) else None,
                        str(row["state"]),
                        node if isinstance(node, str) else None,
                    )
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        return out

    def quorum(self) -> int:
        """syncer.quorum from status.json, else from the run's recipe.yaml, else every learner (safest)."""
        syncer = self.status().get("syncer") or {}
        if isinstance(syncer, dict) and isinstance(syncer.get("quorum"), int):
            return syncer["quorum"]
        try:
            recipe = yaml.safe_load((self.run_dir / RECIPE_FILE).read_text()) or {}
            return int(recipe["syncer"]["quorum"])
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
            return len(self.learners())

    def running(self) -> bool:
        status = self.status()
        updated = status.get("updated_at")
        fresh = not isinstance(updated, int | float) or self.clock() - updated <= self.stale_after_s
        return status.get("state") == "running" and fresh

    def kill(self, learner: int) -> None:
        # The pid tells the driver which process chaos saw: one that was replaced since is not killed.
        self._request("kill", learner=learner, pid=self._info(learner, "pid").pid)

    def stall(self, learner: int, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"a stall needs a positive duration, got {seconds!r}")
        self._request("stall", learner=learner, duration_s=seconds, pid=self._info(learner, "pid").pid)

    def preempt(self, learner: int, notice_s: float) -> None:
        if not notice_s > 0:
            raise ValueError(f"a preemption needs a positive notice, got {notice_s!r}")
        self._request("preempt", learner=learner, notice_s=notice_s, pid=self._info(learner, "pid").pid)

    def kill_node(self, learner: int) -> None:
        self._request("kill_node", learner=learner, node=self._info(learner, "node").node)

    def slow(self, learner: int, factor: float, seconds: float | None) -> None:
        self._request("slow", learner=learner, factor=factor, duration_s=seconds)

    def join(self, seconds: float | None = None) -> None:
        self._request("join", learner=None, factor=None, duration_s=seconds)

    def leave(self, learner: int) -> None:
        self._request("leave", learner=learner, factor=None, duration_s=None)

    def degrade_link(self, learner: int, factor: float, seconds: float) -> None:
        self._request("degrade_link", learner=learner, factor=factor, duration_s=seconds)

    def cut_link(self, learner: int, seconds: float) -> None:
        self._request("cut_link", learner=learner, duration_s=seconds)

    def kill_syncer(self) -> None:
        syncer = self.status().get("syncer") or {}
        pid = syncer.get("pid") if isinstance(syncer, dict) else None
        if not isinstance(pid, int):
            raise TargetError("status.json does not give the syncer's pid (syncer.pid)")
        self._request("kill_syncer", learner=None, pid=pid)

    def record(self, entry: dict[str, Any]) -> None:
        append_jsonl(self.run_dir / CHAOS_FILE, {"t": round(self.clock(), 3), **entry})

    def _info(self, learner: int, needed: str) -> LearnerInfo:
        """Learner `learner` as status.json gives it, with its `needed` field (pid or node) known."""
        for info in self.learners():
            if info.id == learner:
                if getattr(info, needed) is None:
                    raise TargetError(f"status.json gives no {needed} for learner {learner}")
                return info
        raise TargetError(f"status.json has no learner {learner}")

    def _request(self, op: str, **fields: Any) -> None:
        append_jsonl(self.run_dir / CONTROL_FILE, {"t": round(self.clock(), 3), "op": op, **fields})
