"""How a run went over time, from its records: goodput over a sliding window, each learner's states.

A learner's states (training, stalled, dead, restarting, rejoining, ...) are intervals of time.

The driver logs the goodput ledger's running totals (productive and allocated seconds) every
status interval, so goodput over any window is a ratio of two differences: a fault shows as a dip
that recovers, where the cumulative figure would barely move. The states come from events.jsonl
(the engine's records and the chaos injections it copies there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlc.run import events

# Events of a learner -> the state it is in from then on (None: no longer part of the run).
STATE_AFTER: dict[type[events.Event], str | None] = {
    events.LearnerStarted: "starting",
    events.LearnerJoining: "restarting",  # a joiner starts a process, then copies a peer like a restart
    events.LearnerTraining: "training",
    events.LearnerDied: "restarting",  # the engine saw the process gone and starts a new one at once
    events.LearnerLost: "dead",  # no live node can hold it: not restarted
    events.LearnerPreempted: "preempted",  # left on a notice, its progress pushed: a new process starts
    events.LearnerRestarted: "rejoining",  # a process is up: copying state, then its first step
    events.LearnerStalled: "stalled",
    events.LearnerThawed: "training",
    events.LearnerFinished: None,
    events.LearnerLeft: None,
    events.LearnerStopped: None,
}
# A hot spare's events -> its state from then on: started, then compiled and idle ("spare") until
# it takes a slot (its work goes on in that learner's row) or dies.
SPARE_STATE_AFTER: dict[type[events.Event], str | None] = {
    events.SpareStarted: "starting",
    events.SpareReady: "spare",
    events.SpareTaken: None,
    events.SpareDied: None,
}
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


def learner_intervals(logged: list[events.Event], end: float) -> list[Interval]:
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

    for e in sorted((e for e in logged if e.t is not None), key=lambda e: e.t or 0.0):
        t = e.t or 0.0
        if isinstance(e, events.SyncerDied | events.SyncerRestarted):
            switch(SYNCER, t, "restarting" if isinstance(e, events.SyncerDied) else None)
            continue
        if type(e) in SPARE_STATE_AFTER and isinstance(spare := getattr(e, "spare", None), str):
            switch(spare, t, SPARE_STATE_AFTER[type(e)])
            continue
        if isinstance(e, events.NodeKilled | events.NodeDraining):  # every learner on one node at once
            for victim in e.learners:
                if victim in current:  # a learner the log has seen start
                    switch(victim, t, "dead" if isinstance(e, events.NodeKilled) else "leaving")
            continue
        learner = getattr(e, "learner", None)
        if not isinstance(learner, int):
            continue
        lapse(unseen_stalls, t, "stalled")
        if isinstance(e, events.Chaos):
            if e.phase == "injected" and e.fault in INJECTED and learner in current:
                switch(learner, t, INJECTED[e.fault])
                if e.fault == "stall" and e.duration_s is not None:
                    unseen_stalls[learner] = t + e.duration_s
            continue
        if isinstance(e, events.LearnerStalled):  # seen: its thaw ends it
            unseen_stalls.pop(learner, None)
        lapse(slowed, t, "slow")
        if isinstance(e, events.LearnerSlowed):
            slowed[learner] = t + e.duration_s if e.duration_s is not None else float("inf")
            if current.get(learner, (0.0, ""))[1] == "training":
                switch(learner, t, "slow")
        elif type(e) in STATE_AFTER:
            state = STATE_AFTER[type(e)]
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
