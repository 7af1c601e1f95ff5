"""The driver's side of the syncer: its reports, polled without waiting and written to the run directory.

The driver asks the syncer for its report (its events since the last one, its status, its error)
and takes the answer at a later tick, never waiting on it: a frozen or dead syncer must not stop
the driver. A syncer restarted from its checkpoint and journal reports its predecessor's closed
rounds again, so each (fragment, version) round is logged once: the rounds already in events.jsonl
are remembered across a resume, less those the restored syncer's state does not hold.

What a restored syncer does not hold is lost, and said so before the run goes on. Its journal
keeps closed rounds only: a push accepted into a round still open when the syncer died (or the
run stopped) is gone, and its learner re-sends it, to be accepted again. A push accepted at
fragment p's version v is merged in p's round v + 1, so the restored versions say which logged
acceptances died: each gets a `push_lost` record, and each logged round past them a `round_lost`.
Readers discount them (`dlc.observe.reader.voided`), so each push and round counts once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import ray

from dlc.observe.reader import voided
from dlc.run import events
from dlc.run.files import EVENTS_FILE, read_jsonl
from dlc.run.rundir import RunDir


class Supervisor(Protocol):
    """What the syncer's reports tell the supervisor: the events it acts on, and the syncer's process."""

    syncer_pid: int | None

    def note_syncer_events(self, reported: list[events.Event]) -> None: ...


class Accepted(NamedTuple):
    """A push logged as accepted: merged in its fragment's round `version` + 1."""

    learner: int
    fragment: int
    seq: int
    version: int
    bytes: int

    @classmethod
    def of(cls, event: events.PushAccepted) -> Accepted:
        return cls(event.learner, event.fragment, event.seq, event.version, event.bytes)


class SyncerReports:
    """What the driver has heard from the syncer: its `status`, the pushes it `rejected` per learner, its `failure`."""

    def __init__(self, rundir: RunDir, resume: bool) -> None:
        self.rundir = rundir
        self.status: dict[str, Any] = {}  # the syncer's last status, for the live view and status.json
        self.rejected: dict[int, int] = {}  # learner -> pushes the syncer rejected
        self.failure: str | None = None  # the syncer's error: it fails the run
        self._asked: Any = None  # the poll asked for and not taken yet
        self._rounds_logged: set[tuple[int, int]] = set()  # (fragment, version) in events.jsonl
        # Logged acceptances no logged round merged yet, by fragment: what a syncer's death can lose.
        self._waiting: dict[int, dict[tuple[int, int], Accepted]] = {}
        # On a resume, every acceptance events.jsonl holds (less those lost already), until `restored`
        # says which the resumed syncer holds: it may have restored an older state than the log's.
        self._logged: list[Accepted] = []
        if resume:
            logged = events.parse_all(read_jsonl(rundir.path / EVENTS_FILE)[0])
            void = voided(logged)
            kept = [e for i, e in enumerate(logged) if i not in void]
            self._rounds_logged = {(e.fragment, e.version) for e in kept if isinstance(e, events.RoundClosed)}
            self._logged = [Accepted.of(e) for e in kept if isinstance(e, events.PushAccepted)]

    def restored(self, versions: Sequence[int] | None, reason: str = "run_stopped") -> None:
        """A syncer was restored with its fragments at `versions` (None: nothing restored), after the run
        stopped (a resume) or the syncer died (`reason="syncer_died"`). What it does not hold is lost:
        logged rounds after `versions` (made again, and logged again), and the acceptances they or an
        open round held (their pushes may be accepted again). Each gets a record, before the new
        syncer reports anything."""
        versions = list(versions or [])
        kept = rounds_kept(self._rounds_logged, versions)
        lost_rounds = self._rounds_logged - kept
        for fragment, version in sorted(lost_rounds):
            self.rundir.event(events.RoundLost(fragment=fragment, version=version, reason=reason))
        self._rounds_logged = kept
        logged = [*self._logged, *(push for waiting in self._waiting.values() for push in waiting.values())]
        for push in lost_pushes(logged, versions):
            why = "round_lost" if (push.fragment, push.version + 1) in lost_rounds else reason
            self.rundir.event(events.PushLost(**push._asdict(), reason=why))
        self._logged, self._waiting = [], {}  # the rest are in rounds it holds

    def poll(self, syncer: Any, supervisor: Supervisor) -> bool:
        """Take the syncer's report if it has answered, else ask for one; False when the syncer died."""
        if self._asked is None:
            self._asked = syncer.poll.remote()
        ready, _ = ray.wait([self._asked], timeout=0)
        if ready:
            ref, self._asked = self._asked, None
            try:
                self.absorb(ray.get(ref), supervisor)
            except ray.exceptions.RayActorError:
                return False
        return True

    def finish(self, syncer: Any, supervisor: Supervisor) -> bool:
        """Have the syncer merge what it holds and save, taking its last reports; False (and `failure`
        says why) when it died meanwhile."""
        if self._asked is not None:  # it drained events already: absorb them, or they are lost
            ref, self._asked = self._asked, None
            with contextlib.suppress(ray.exceptions.RayError):
                self.absorb(ray.get(ref, timeout=30), supervisor)
        try:
            self.absorb(ray.get(syncer.finish.remote(), timeout=300), supervisor)
        except ray.exceptions.RayError as exc:
            self.failure = (
                f"the syncer died while the run was ending ({str(exc).splitlines()[0][:120]}): the learners' "
                "last pushes may not be merged; the run's checkpoints are kept, resume it to go on"
            )
            return False
        return True

    def absorb(self, result: dict[str, Any], supervisor: Supervisor) -> None:
        """Log a report the syncer gave (`poll` and `finish` take them): its events, status and error."""
        # A restarted syncer reports the rounds of its predecessor's journal again: log each once.
        reported = [e for e in result["events"] if not isinstance(e, events.RoundClosed) or self._new_round(e)]
        for event in reported:
            self.rundir.event(event)
            if isinstance(event, events.PushRejected):
                self.rejected[event.learner] = self.rejected.get(event.learner, 0) + 1
            elif isinstance(event, events.PushAccepted):
                push = Accepted.of(event)
                self._waiting.setdefault(push.fragment, {})[(push.learner, push.seq)] = push
            elif isinstance(event, events.RoundClosed) and event.fragment in self._waiting:
                # Every push accepted before the round closed is in it, superseded ones too.
                waiting = self._waiting[event.fragment]
                for key in [key for key, push in waiting.items() if push.version < event.version]:
                    del waiting[key]
        supervisor.note_syncer_events(reported)
        self.status = result["status"]
        supervisor.syncer_pid = self.status.get("pid")
        if result["error"]:
            self.failure = f"syncer failed:\n{result['error']}"

    def _new_round(self, event: events.RoundClosed) -> bool:
        key = (event.fragment, event.version)
        if key in self._rounds_logged:
            return False
        self._rounds_logged.add(key)
        return True


def rounds_kept(logged: set[tuple[int, int]], versions: list[int]) -> set[tuple[int, int]]:
    """Of the (fragment, version) rounds in events.jsonl, those the restored syncer's state holds.

    Rounds after its versions were lost with what it restored from (a journal moved aside): those
    versions are made again, and their new rounds must be logged, not taken for repeats.
    """
    return {(p, v) for p, v in logged if 0 <= p < len(versions) and v <= versions[p]}


def lost_pushes(accepted: Iterable[Accepted], versions: Sequence[int]) -> list[Accepted]:
    """Of the accepted pushes, those a syncer restored at `versions` does not hold, oldest first.

    A push accepted at fragment p's version v waits in p's open round, which closes as version
    v + 1: a syncer at versions[p] >= v + 1 holds it merged; any other lost it. A fragment past
    `versions` (nothing restored) holds none.
    """
    held = dict(enumerate(versions))
    return [a for a in accepted if a.version >= held.get(a.fragment, 0)]
