"""The syncer actor: the algorithm's syncer behind a lock, a ticking thread, checkpoints, a journal.

Pushes are handled in the order each learner sent them: on the reader thread of its connection
(`syncer.channel: direct`, `dlc.net.channel`) or in one ordered concurrency group (`ray`); rounds
close from a ticking thread. Every closed round is journaled, so a restarted syncer
resumes from its last checkpoint plus the journal: the state at the moment of death.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import ray

from dlc.config.schema import Recipe
from dlc.core.allocator import freeze_heap
from dlc.engine.cluster import node_info
from dlc.engine.syncer.journal import Journal, damaged
from dlc.errors import UserError
from dlc.net.channel import Beat, Hub
from dlc.run import events
from dlc.run.checkpoint import Checkpointer
from dlc.run.files import syncer_journal_path
from dlc.run.storage import RunStorage, describe

# A tick this far past its time: the syncer's process did not run (it ticks when due, every 5 ms to
# a few seconds, or at once when a push arrives).
STALL_S = 1.0


class SyncerWorker:
    """Lives in the syncer actor: the algorithm's syncer behind a lock, a ticking thread, checkpoints."""

    def __init__(self, recipe_json: dict[str, Any], run_dir: str, storage: dict[str, str]) -> None:
        """`run_dir`: the run directory on the driver's node, where it runs (its journal goes there);
        `storage`: where checkpoints go and the token of this start (see `dlc.run.storage`)."""
        from dlc.algo import get_algorithm
        from dlc.core.compile_cache import enable_run_cache
        from dlc.core.model import build_model, flatten_params
        from dlc.net.transport import Transport

        freeze_heap(collect=False)  # what the imports made; the rest once started (`start`)
        self.recipe = Recipe.model_validate(recipe_json)
        self.storage = RunStorage(storage["location"])
        node = node_info()
        self.hub: Hub | None = None
        self.storage_error = self.storage.check(storage["token"], describe(node))
        if self.storage_error:  # the driver asks `storage_check` first and ends the run with this line
            return
        enable_run_cache(self.recipe.run)  # the model's construction is compiled: a load after the first process
        _, params = build_model(self.recipe.model, self.recipe.run.seed)
        self.shapes = flatten_params(params)
        self.learners: dict[int, Any] = {}
        learners = self.recipe.learners
        self.transport = Transport(lambda i: learners.resolved(i).link, seed=self.recipe.run.seed + 1)  # downlinks
        self.algorithm = get_algorithm(self.recipe.algorithm)
        self.syncer = self.algorithm.syncer(self.recipe, self.shapes, self._deliver, time.monotonic)
        self.checkpointer = Checkpointer(self.storage.syncer_dir(), self.recipe.checkpoint.keep)
        self.journal = Journal(syncer_journal_path(Path(run_dir)))
        self.syncer.journal = self._journal_round
        # Events of the rounds journaled since the last checkpoint: the next checkpoint keeps them,
        # so a restarted syncer can re-send any its predecessor closed but never reported.
        self._round_events: list[dict[str, Any]] = []  # their records, as the journal holds them
        self._resend: list[events.Event] = []  # those a restarted syncer reports again, first
        self.lock = threading.Lock()
        self._stop = threading.Event()
        # The ticking thread sleeps until the syncer's next deadline (`next_tick_in`), and is woken
        # early when a push brings one nearer (a round reaching quorum starts its grace window).
        self._wake = threading.Event()
        self._tick_at = time.monotonic()  # when it wakes next; guarded by the lock
        self._last_save = time.monotonic()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._tick_loop, name="syncer-tick", daemon=True)
        # Messages to learners leave once the syncer is done with what caused them, each learner's
        # in one write (`Hub.batch`): a merged fragment with the requests of the round it opens.
        self.batch: Any = contextlib.nullcontext
        if self.recipe.syncer.channel == "direct":  # learners connect to it: on this node's address
            self.hub = Hub(node["ip"], self._on_message)
            self.batch = self.hub.batch

    def storage_check(self) -> str | None:
        """Why the syncer cannot use the run's storage, or None."""
        return self.storage_error

    def channel(self) -> dict[str, Any] | None:
        """Where learners connect for the direct channel, and the key they prove (None: channel=ray)."""
        return None if self.hub is None else {"address": self.hub.address, "authkey": self.hub.authkey}

    def _deliver(self, learner: int, message: Any) -> int:
        if self.hub is not None:  # every member has a port from register or rejoin to leave
            port = self.hub.port(learner)
            return self.transport.send(port, message, link=learner) if port is not None else 0
        handle = self.learners.get(learner)
        return self.transport.send(handle.deliver, message, link=learner) if handle is not None else 0

    def _on_message(self, message: Any) -> None:
        """A message on the direct channel, from the reader thread of its learner's connection."""
        # Ray's stubs make a @ray.method a remote method only; in the actor's own process it is the plain one.
        if isinstance(message, Beat):
            try:
                self.heartbeat(message.learner, message.step)  # type: ignore[operator]
            except Exception:  # nobody waits for a heartbeat: the driver fails the run with it
                self.error = self.error or traceback.format_exc()
        else:
            self.push(message)  # type: ignore[operator]

    def impair_link(self, index: int, factor: float | None, seconds: float) -> None:
        """Degrade learner `index`'s downlink by `factor` (None: cut it) for `seconds`."""
        self.transport.impair(index, factor, seconds)

    def _journal_round(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event is not None:
            self._round_events.append(event)
        self.journal.write(record)

    def restore(self) -> dict[str, Any] | None:
        """The last checkpoint, then every journaled round after it: the state at the moment of death."""
        restored = None
        if self.checkpointer.latest_step() is not None:
            tree, meta = self.checkpointer.restore(self.syncer.state()[0])
            if meta.get("plan") != self.syncer.fingerprint():
                raise UserError("the syncer checkpoint was written with other fragments: pass --fresh to start over")
            self.syncer.load(tree, meta)
            restored = {"checkpoint_rounds": meta["rounds_closed"]}
            resend = list(meta.get("round_events", []))
        else:
            resend = []
        replayed = 0
        sizes = [f.size for f in self.syncer.global_fragments()]
        for record in self.journal.records(sizes):
            try:
                replayed += self.syncer.replay(record)
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
                detail = f"{_record_name(record)} cannot be replayed: {type(exc).__name__}"
                raise UserError(damaged(self.journal.path, detail)) from None
            if "event" in record:
                self._round_events.append(record["event"])
        # The dead syncer's last rounds may never have reached the driver: report them again (the
        # driver logs each round once), from the last checkpoint's rounds and the journal's.
        self._resend = [
            dataclasses.replace(e, replayed=True)
            for e in events.parse_all(resend + self._round_events)
            if isinstance(e, events.RoundClosed)
        ]
        if restored is None and replayed == 0:
            return None
        return {
            **(restored or {}),
            "journal_rounds": replayed,
            "versions": self.syncer.versions(),
            "rounds_closed": self.syncer.counters.rounds_closed,
        }

    def start(self) -> None:
        # Restored and about to tick: what exists now lives as long as the syncer, and a full
        # collection that walked it would hold every round up for a tenth of a second.
        freeze_heap()
        self._thread.start()

    def register(self, index: int, handle: Any, holds_initial: bool = True) -> None:
        """A learner takes part; `holds_initial`: its fragments still at version 0 are the initial
        parameters (False after a syncer restart: it may have copied a peer since)."""
        with self.lock, self.batch():
            self.learners[index] = handle
            if self.hub is not None:
                self.hub.open(index)
            self.syncer.join(index, holds_initial)

    def rejoin(self, index: int, handle: Any) -> None:
        """A restarted learner: a new incarnation of `index` whose seqs start again."""
        with self.lock, self.batch():
            self.learners[index] = handle
            if self.hub is not None:
                self.hub.open(index)  # what was queued for the dead process is dropped
            self.syncer.rejoin(index)

    def leave(self, index: int) -> None:
        with self.lock:
            self.learners.pop(index, None)
            if self.hub is not None:
                self.hub.drop(index)
            self.syncer.leave(index)

    def retire(self, index: int) -> None:
        """Learner `index` trained all its steps and this syncer holds its every push (its barrier
        returned): it stays connected, out of the rounds (`DecoupledSyncer.retire`)."""
        with self.lock:
            self.syncer.retire(index)

    # One thread: pushes from a learner stay in order. No return value (see LearnerWorker.deliver).
    @ray.method(concurrency_group="pushes", num_returns=0)
    def push(self, push: Any) -> None:
        try:
            with self.lock, self.batch():
                self.syncer.push(push)
                self._tick()
                if time.monotonic() + self.syncer.next_tick_in() < self._tick_at:
                    self._wake.set()
        except Exception:  # nobody waits for this call: the driver fails the run with it
            self.error = self.error or traceback.format_exc()

    @ray.method(concurrency_group="pushes")
    def barrier(self) -> None:
        """Returns after every push sent before it by the same caller has been handled."""

    @ray.method(num_returns=0)
    def heartbeat(self, index: int, step: int | None = None) -> None:
        with self.lock:
            self.syncer.heartbeat(index, step)

    def _tick(self) -> None:
        """Tick the syncer (under the lock). A tick due more than STALL_S ago means this process did
        not run meanwhile (starved of CPU, paused): the learners' heartbeats waited unread, and the
        first message handled after it must not find every other learner silent."""
        late = time.monotonic() - self._tick_at
        if late > STALL_S:
            self.syncer.excuse(late)
            self._tick_at = time.monotonic()
        self.syncer.tick()

    def _tick_loop(self) -> None:
        try:
            wait = 0.0
            while True:
                self._wake.wait(wait)
                self._wake.clear()
                if self._stop.is_set():
                    return
                with self.lock, self.batch():
                    self._tick()
                    # At least a millisecond: a deadline a tick could not act on never spins the thread.
                    wait = max(self.syncer.next_tick_in(), 0.001)
                    self._tick_at = time.monotonic() + wait
                if time.monotonic() - self._last_save >= self.recipe.syncer.checkpoint_interval_s:
                    self.save(wait=False)
        except Exception:
            self.error = traceback.format_exc()

    def save(self, wait: bool = True) -> None:
        """Checkpoint the syncer's state (`wait=False`: the files are written while it merges on). The
        journal before it is dropped once the checkpoint is complete."""
        self.checkpointer.wait()  # the previous checkpoint complete, and its journal dropped, first
        with self.lock:
            tree, meta = self.syncer.state()
            meta = {**meta, "round_events": self._round_events}
            self._round_events = []
            tree = _copied(tree)
            step = self.syncer.counters.rounds_closed
            # Rounds after this state go to a fresh journal; the old one stays until the
            # checkpoint is complete, so a death mid-save still replays from the previous one.
            self.journal.rotate(self.syncer.journal_snapshot())
        self.checkpointer.save(step, tree, meta, wait=wait, then=self.journal.drop_previous)
        self._last_save = time.monotonic()

    def next_seqs(self) -> dict[int, int]:
        """Per learner, the lowest seq above every one seen (restored with the syncer's state)."""
        with self.lock:
            return self.syncer.next_seqs()

    def global_fragments(self) -> tuple[list[np.ndarray], list[int]]:
        with self.lock:
            return self.syncer.global_fragments(), self.syncer.versions()

    def global_params(self) -> dict[str, np.ndarray]:
        with self.lock:
            return self.syncer.global_params(self.shapes)

    def poll(self) -> dict[str, Any]:
        with self.lock:
            status = {**self.syncer.status(), "pid": os.getpid(), "channel": self.recipe.syncer.channel}
            if self.hub is not None:
                status["channel_messages_in"] = self.hub.received
            reported, self._resend = self._resend + self.syncer.drain_events(), []
            return {"status": status, "events": reported, "error": self.error}

    def close(self) -> None:
        """Release the journal, checkpoint files and channel (the actor's process does this by ending)."""
        if self.hub is not None:
            self.hub.close()
        self.journal.close()
        self.checkpointer.close()

    def finish(self) -> dict[str, Any]:
        """End of run: close every round holding a push, stop ticking, checkpoint."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        with self.lock, self.batch():
            self.syncer.flush()
        self.save()
        return self.poll()


# Ray's stubs type `remote` with task options only: its actor options (max_concurrency, concurrency_groups) are missing.
SyncerActor = ray.remote(max_concurrency=8, concurrency_groups={"pushes": 1})(SyncerWorker)  # type: ignore[call-overload]


def _record_name(record: dict[str, Any]) -> str:
    if "fragment" in record:
        return f"a round of fragment {record['fragment']}"
    return "a refused push" if "refused" in record else "its merge history"


def _copied(tree: Any) -> Any:
    """A copy of a nested dict of arrays, taken under the lock: the write goes on after it is released."""
    if isinstance(tree, dict):
        return {key: _copied(value) for key, value in tree.items()}
    return np.array(tree)
