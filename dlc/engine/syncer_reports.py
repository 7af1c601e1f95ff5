"""The driver's side of the syncer: its reports, polled without waiting and written to the run directory.

The driver asks the syncer for its report (its events since the last one, its status, its error)
and takes the answer at a later tick, never waiting on it: a frozen or dead syncer must not stop
the driver. A syncer restarted from its checkpoint and journal reports its predecessor's closed
rounds again, so each (fragment, version) round is logged once: the rounds already in events.jsonl
are remembered across a resume, less those the restored syncer's state does not hold.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import ray

from dlc.run.files import EVENTS_FILE, read_jsonl
from dlc.run.rundir import RunDir

if TYPE_CHECKING:
    from dlc.engine.supervisor import Supervisor


class SyncerReports:
    """What the driver has heard from the syncer: its `status`, the pushes it `rejected` per learner, its `failure`."""

    def __init__(self, rundir: RunDir, resume: bool) -> None:
        self.rundir = rundir
        self.status: dict[str, Any] = {}  # the syncer's last status, for the live view and status.json
        self.rejected: dict[int, int] = {}  # learner -> pushes the syncer rejected
        self.failure: str | None = None  # the syncer's error: it fails the run
        self._asked: Any = None  # the poll asked for and not taken yet
        self._rounds_logged: set[tuple[Any, Any]] = set()  # (fragment, version) in events.jsonl
        if resume:
            logged, _ = read_jsonl(rundir.path / EVENTS_FILE)
            self._rounds_logged = {
                (e.get("fragment"), e.get("version")) for e in logged if e.get("kind") == "round_closed"
            }

    def restored(self, versions: list[int]) -> None:
        """The resumed syncer restored its fragments at `versions`: rounds after them are made again."""
        self._rounds_logged = rounds_kept(self._rounds_logged, versions)

    def poll(self, syncer: Any, supervisor: Supervisor) -> bool:
        """Take the syncer's report if it has answered, else ask for one; False when the syncer died."""
        if self._asked is None:
            self._asked = syncer.poll.remote()
        ready, _ = ray.wait([self._asked], timeout=0)
        if ready:
            ref, self._asked = self._asked, None
            try:
                self._absorb(ray.get(ref), supervisor)
            except ray.exceptions.RayActorError:
                return False
        return True

    def finish(self, syncer: Any, supervisor: Supervisor) -> bool:
        """Have the syncer merge what it holds and save, taking its last reports; False (and `failure`
        says why) when it died meanwhile."""
        if self._asked is not None:  # it drained events already: absorb them, or they are lost
            ref, self._asked = self._asked, None
            with contextlib.suppress(ray.exceptions.RayError):
                self._absorb(ray.get(ref, timeout=30), supervisor)
        try:
            self._absorb(ray.get(syncer.finish.remote(), timeout=300), supervisor)
        except ray.exceptions.RayError as exc:
            self.failure = (
                f"the syncer died while the run was ending ({str(exc).splitlines()[0][:120]}): the learners' "
                "last pushes may not be merged; the run's checkpoints are kept, resume it to go on"
            )
            return False
        return True

    def _absorb(self, result: dict[str, Any], supervisor: Supervisor) -> None:
        # A restarted syncer reports the rounds of its predecessor's journal again: log each once.
        events = [e for e in result["events"] if e["kind"] != "round_closed" or self._new_round(e)]
        for event in events:
            self.rundir.event(**event)
            if event["kind"] == "push_rejected":
                self.rejected[event["learner"]] = self.rejected.get(event["learner"], 0) + 1
        supervisor.note_syncer_events(events)
        self.status = result["status"]
        supervisor.syncer_pid = self.status.get("pid")
        if result["error"]:
            self.failure = f"syncer failed:\n{result['error']}"

    def _new_round(self, event: dict[str, Any]) -> bool:
        key = (event["fragment"], event["version"])
        if key in self._rounds_logged:
            return False
        self._rounds_logged.add(key)
        return True


def rounds_kept(logged: set[tuple[Any, Any]], versions: list[int]) -> set[tuple[int, int]]:
    """Of the (fragment, version) rounds in events.jsonl, those the restored syncer's state holds.

    Rounds after its versions were lost with what it restored from (a journal moved aside): those
    versions are made again, and their new rounds must be logged, not taken for repeats.
    """
    return {
        (p, v)
        for p, v in logged
        if isinstance(p, int) and isinstance(v, int) and 0 <= p < len(versions) and v <= versions[p]
    }
