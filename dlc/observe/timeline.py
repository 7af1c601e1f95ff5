"""How a run went over time, from its records: goodput over a sliding window, each learner's states.

A learner's states (training, stalled, dead, restarting, rejoining, ...) are intervals of time.

The driver logs the goodput ledger's running totals (productive and allocated seconds) every
status interval, so goodput over any window is a ratio of two differences: a fault shows as a dip
that recovers, where the cumulative figure would barely move. The states come from events.jsonl
(the engine's records and the chaos injections it copies there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# events.jsonl kinds -> the state a learner is in from then on (None: no longer part of the run).
STATE_AFTER = {
    "learner_started": "starting",
    "learner_joining": "restarting",  # a joiner starts a process, then copies a peer like a restart
    "learner_training": "training",
    "learner_died": "restarting",  # the engine saw the process gone and starts a new one at once
    "learner_lost": "dead",  # no live node can hold it: not restarted
    "learner_preempted": "preempted",  # left on a notice, its progress pushed: a new process starts
    "learner_restarted": "rejoining",  # a process is up: copying state, then its first step
    "learner_stalled": "stalled",
    "learner_thawed": "training",
    "learner_finished": None,
    "learner_left": None,
    "learner_stopped": None,
}
# A hot spare's events -> its state from then on: started, then compiled and idle ("spare") until
# it takes a slot (its work goes on in that learner's row) or dies.
SPARE_STATE_AFTER = {"spare_started": "starting", "spare_ready": "spare", "spare_taken": None, "spare_died": None}
# Faults chaos injected (events.jsonl "chaos" records) -> the state they put their learner in at
# once, before the engine notices (a death is seen within a second, a stall after the heartbeat timeout).
INJECTED = {"kill": "dead", "stall": "stalled", "preempt": "leaving"}
STATES = ("starting", "training", "slow", "stalled", "dead", "leaving", "preempted", "restarting", "rejoining", "spare")
SYNCER = -1  # the row of the syncer, shown only while it restarts after a death


@dataclass(frozen=True)
class Interval:
    learner: int | str  # a learner's index, SYNCER, or a hot spare's name ("s0")
    start: float  # unix seconds
    end: float
    state: str


def learner_intervals(events: list[dict[str, Any]], end: float) -> list[Interval]:
    """Each learner's states from events.jsonl, as consecutive intervals up to `end`; a hot spare's
    (named by its name) from its start until it takes a slot.

    A slow-down (`learner_slowed`, with its `duration_s`) shows as `slow` over the training it
    stretched; a learner is `training` again once it ends. So does a stall chaos injected for a
    `duration_s` too short for the engine to see (under the heartbeat timeout: no
    `learner_stalled`, so no `learner_thawed` either).
    """
    current: dict[int | str, tuple[float, str]] = {}
    slowed: dict[int, float] = {}  # learner -> when its slow-down ends
    unseen_stalls: dict[int, float] = {}  # learner -> when a stall the engine has not seen ends
    out: list[Interval] = []

    def switch(learner: int | str, t: float, state: str | None) -> None:
        if learner in current:
            start, was = current.pop(learner)
            if t > start:
                out.append(Interval(learner, start, t, was))
        if state is not None:
            current[learner] = (t, state)

    def lapse(timers: dict[int, float], by: float, state: str) -> None:
        """Timed states (`slowed`, `unseen_stalls`) that ended by `by`: their learner goes on training,
        or slow inside a slow-down that outlasts it."""
        for who, until in list(timers.items()):
            if until <= by:
                del timers[who]
                if current.get(who, (0.0, ""))[1] == state:
                    switch(who, until, "slow" if slowed.get(who, 0.0) > until else "training")

    for e in sorted((e for e in events if isinstance(e.get("t"), int | float)), key=lambda e: e["t"]):
        kind, learner, t = e.get("kind"), e.get("learner"), float(e["t"])
        if kind in ("syncer_died", "syncer_restarted"):
            switch(SYNCER, t, "restarting" if kind == "syncer_died" else None)
            continue
        if kind in SPARE_STATE_AFTER and isinstance(e.get("spare"), str):
            switch(e["spare"], t, SPARE_STATE_AFTER[kind])
            continue
        if kind in ("node_killed", "node_draining"):  # every learner on one node at once
            for victim in e.get("learners") or []:
                if victim in current:  # a learner the log has seen start
                    switch(victim, t, "dead" if kind == "node_killed" else "leaving")
            continue
        if not isinstance(learner, int):
            continue
        lapse(unseen_stalls, t, "stalled")
        if kind == "chaos":
            if e.get("phase") == "injected" and e.get("fault") in INJECTED and learner in current:
                switch(learner, t, INJECTED[e["fault"]])
                if e["fault"] == "stall" and isinstance(e.get("duration_s"), int | float):
                    unseen_stalls[learner] = t + float(e["duration_s"])
            continue
        if kind == "learner_stalled":  # seen: its thaw ends it
            unseen_stalls.pop(learner, None)
        lapse(slowed, t, "slow")
        if kind == "learner_slowed":
            duration = e.get("duration_s")
            slowed[learner] = t + float(duration) if isinstance(duration, int | float) else float("inf")
            if current.get(learner, (0.0, ""))[1] == "training":
                switch(learner, t, "slow")
        elif kind in STATE_AFTER:
            state = STATE_AFTER[kind]
            if state == "training" and learner in slowed:
                state = "slow"
            switch(learner, t, state)
    lapse(unseen_stalls, end, "stalled")
    lapse(slowed, end, "slow")
    for learner in list(current):
        switch(learner, end, None)
    return _joined(sorted(out, key=lambda i: (isinstance(i.learner, str), i.learner, i.start)))


def row_order(row: int | str) -> tuple[int, int, str]:
    """Learners by index, then hot spares in the order they started (s2 before s10), then the syncer."""
    if row == SYNCER:
        return (2, 0, "")
    if isinstance(row, str):
        number = row[1:]
        return (1, int(number) if number.isdigit() else -1, row)
    return (0, row, "")


def row_name(row: int | str) -> str:
    """How a row of `learner_intervals` is labelled."""
    if row == SYNCER:
        return "syncer"
    return f"spare {row}" if isinstance(row, str) else f"learner {row}"


def _joined(intervals: list[Interval]) -> list[Interval]:
    """Consecutive intervals of one learner in one state as one: a stall chaos injected and then
    seen by the engine, a learner dead from its node's loss and then not restarted."""
    out: list[Interval] = []
    for i in intervals:
        last = out[-1] if out else None
        if last is not None and (last.learner, last.state, last.end) == (i.learner, i.state, i.start):
            out[-1] = Interval(i.learner, last.start, i.end, i.state)
        else:
            out.append(i)
    return out


def windowed_goodput(samples: list[tuple[float, float, float]], window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Goodput over the last `window_s` at each sample: (times, fractions).

    `samples` are (t, productive_s, allocated_s) running totals in time order; at each sample the
    window reaches back to the latest sample at least `window_s` older (or the first one). A
    resumed run's driver starts its totals again: each run is a segment of its own, and a NaN
    between segments leaves the gap between the runs blank in a plot.
    """
    times: list[float] = []
    values: list[float] = []
    segments: list[list[tuple[float, float, float]]] = []
    for sample in samples:
        if not segments or sample[2] < segments[-1][-1][2]:
            segments.append([])
        segments[-1].append(sample)
    for segment in segments:
        if len(segment) < 2:
            continue
        if times:
            times.append(segment[0][0])
            values.append(float("nan"))
        t, productive, allocated = (np.array(column, dtype=float) for column in zip(*segment, strict=True))
        for i in range(1, len(t)):
            j = int(np.searchsorted(t, t[i] - window_s, side="right")) - 1
            j = min(max(j, 0), i - 1)
            spent = allocated[i] - allocated[j]
            if spent > 0:
                times.append(t[i])
                values.append(min(max((productive[i] - productive[j]) / spent, 0.0), 1.0))
    return np.array(times), np.array(values)


def window_for(duration_s: float) -> float:
    """A window long enough to hold several ledger samples, short enough that one fault shows."""
    return max(10.0, duration_s / 30.0)
