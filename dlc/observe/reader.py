"""`dlc status`, reading: a run directory into one snapshot dict (rendered by `dlc.observe.dashboard`).

Nothing here talks to Ray, so the view works from another terminal, on a finished run, or on a
machine that only mounts the directory. Files are read defensively: a half-written JSON line, a
missing file or a corrupt status.json degrades the view, never crashes it.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dlc.observe.console import fmt_duration
from dlc.run import events
from dlc.run.files import (
    CHAOS_FILE,
    EVENTS_FILE,
    METRICS_FILE,
    RECIPE_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    JsonlTail,
    read_json,
    summary_superseded,
)

# A running run whose status.json is older than this has lost its driver (it rewrites ~1/s).
STALE_AFTER_S = 15.0
FEED_LINES = 6  # chaos entries kept for the feed
LIFECYCLE = (
    events.LearnerDied,
    events.LearnerRestarted,
    events.LearnerRejoined,
    events.LearnerRecovered,
    events.LearnerLeft,
)


# -- reading a run directory ----------------------------------------------------------------------


def read_recipe(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load((path / RECIPE_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return raw if isinstance(raw, dict) else {}


def dp_equivalent_bytes(params: int | None, learner_steps: int) -> int | None:
    """Bytes data-parallel would move each way: one fp32 gradient per learner per step."""
    return None if params is None else 4 * params * learner_steps


def mean_adopt_lag(learners: list[dict[str, Any]]) -> float | None:
    """The learners' mean merge lag: inner steps from a push to adopting the merge that holds it
    (tau when every merge arrives in time); None when no learner has measured one."""
    lags = [lag for row in learners if (lag := _num(row.get("adopt_lag_steps"))) is not None]
    return sum(lags) / len(lags) if lags else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def lifecycle_entry(event: events.Event) -> dict[str, Any] | None:
    """A learner's death or recovery in events.jsonl as a feed entry like chaos.jsonl's, or None.

    These stand in for chaos.jsonl when a run has none: a process killed from outside chaos.
    """
    if not isinstance(event, LIFECYCLE):
        return None
    extras = {k: v for k, v in event.fields().items() if k != "learner" and _num(v) is not None}
    learner, phase = event.learner, event.kind.removeprefix("learner_")
    return {
        "t": event.t,
        **extras,
        "fault": "unplanned",
        "target": f"learner {learner}",
        "learner": learner,
        "phase": phase,
    }


def voided(logged: list[events.Event]) -> set[int]:
    """Indices of the `push_accepted` and `round_closed` records that a later `push_lost` or `round_lost` takes back.

    A syncer that dies, or a run that stops, loses what its restored state does not hold. The
    engine logs one `push_lost` for each acceptance lost, before the push can be accepted again,
    and one `round_lost` for each logged round lost. Each cancels the latest earlier record of the
    same push (learner, seq) or round (fragment, version). What is left counts each push and round once.
    """
    latest: dict[tuple[str, int, int], int] = {}
    out: set[int] = set()
    for i, event in enumerate(logged):
        if isinstance(event, events.PushAccepted | events.PushLost):
            key = ("push", event.learner, event.seq)
        elif isinstance(event, events.RoundClosed | events.RoundLost):
            key = ("round", event.fragment, event.version)
        else:
            continue
        if isinstance(event, events.PushAccepted | events.RoundClosed):
            latest[key] = i
        elif (taken := latest.pop(key, None)) is not None:
            out.add(taken)
    return out


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    number = _num(value)
    return int(number) if number is not None else 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


class RunReader:
    """Reads a run directory into one snapshot dict; keeps file offsets between calls."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self._reset()

    def _reset(self) -> None:
        self.events = JsonlTail(self.path / EVENTS_FILE)
        self.metrics = JsonlTail(self.path / METRICS_FILE)
        self.chaos = JsonlTail(self.path / CHAOS_FILE)
        self.embedded = False
        self.rejected: Counter[int] = Counter()
        self.staleness: dict[int, int] = {}
        self.eval_points: list[tuple[float, float]] = []
        self.train_by_step: dict[int, tuple[float, dict[int, float]]] = {}  # step -> (latest t, learner -> loss)
        self.feed: deque[dict[str, Any]] = deque(maxlen=FEED_LINES)
        self.lifecycle: deque[dict[str, Any]] = deque(maxlen=FEED_LINES)
        self.restarts: Counter[int] = Counter()
        self.devices: dict[int, str] = {}  # learner -> device label, from its start-up events
        self.status: dict[str, Any] = {}
        self.status_bad = False
        self.traffic: deque[tuple[float, int, int]] = deque(maxlen=40)

    def _absorb(self) -> None:
        tails = (self.events, self.metrics, self.chaos)
        batches = [tail.read() for tail in tails]
        if any(batch is None for batch in batches):
            self._reset()
            batches = [tail.read() or [] for tail in (self.events, self.metrics, self.chaos)]
        logged, metrics, chaos = (batch or [] for batch in batches)
        for e in events.parse_all(logged):
            if isinstance(e, events.LearnerStarted | events.LearnerTraining) and e.device is not None:
                self.devices[e.learner] = e.device
            if isinstance(e, events.ClusterStarted):
                self.embedded = e.address == "embedded"
            elif isinstance(e, events.PushRejected):
                self.rejected[e.learner] += 1
            elif (entry := lifecycle_entry(e)) is not None:
                self.lifecycle.append(entry)
            elif isinstance(e, events.RoundClosed):
                self.staleness.update(zip(e.contributors, e.staleness or [], strict=False))
        for m in metrics:
            t, loss = _num(m.get("t")), _num(m.get("loss"))
            if m.get("kind") == "eval" and t is not None and _num(m.get("eval_loss")) is not None:
                self.eval_points.append((t, float(m["eval_loss"])))
            elif m.get("kind") == "train" and t is not None and loss is not None and isinstance(m.get("learner"), int):
                # Learners log the same steps: the mean over the learners that logged a step.
                seen_t, losses = self.train_by_step.get(_int(m.get("step")), (t, {}))
                losses[m["learner"]] = loss
                self.train_by_step[_int(m.get("step"))] = (max(seen_t, t), losses)
        for c in chaos:
            self.feed.append(c)
            if c.get("phase") == "restarted" and isinstance(c.get("learner"), int):
                self.restarts[c["learner"]] += 1

    def snapshot(self) -> dict[str, Any]:
        """Everything `dlc status` shows, as plain JSON-able data."""
        self._absorb()
        now = self.clock()
        status_file = read_json(self.path / STATUS_FILE)
        self.status_bad = status_file is None and (self.path / STATUS_FILE).exists()
        if status_file is not None:
            self.status = status_file
        st, summary = self.status, read_json(self.path / SUMMARY_FILE)
        recipe = read_recipe(self.path)
        updated = _num(st.get("updated_at"))
        if summary is not None and st and summary_superseded(self.path):
            summary = None
        state = str((summary or {}).get("status") or st.get("state") or ("starting" if not st else "unknown"))
        age = None if updated is None else max(0.0, now - updated)
        live = state == "running" and age is not None and age < STALE_AFTER_S
        sync = _dict(st.get("syncer"))
        learners = self._learners(st, summary, sync, live)
        steps = sum(row["step"] for row in learners)
        params = _int(st.get("params")) or _int((summary or {}).get("params")) or None  # recorded by the driver
        dp = dp_equivalent_bytes(params, steps)
        up, down = _int(sync.get("bytes_up")), _int(sync.get("bytes_down"))
        up_rate, down_rate = self._rates(updated, up, down, _num(st.get("elapsed_s")), live)
        warnings = []
        if self.status_bad:
            warnings.append("status.json could not be read" + ("; showing the last good copy" if st else ""))
        for tail in (self.events, self.metrics, self.chaos):
            if tail.skipped:
                warnings.append(f"{tail.path.name}: skipped {tail.skipped} unreadable line(s)")
            if tail.partial and not live:
                warnings.append(f"{tail.path.name}: last line is incomplete (ignored)")
        if state == "running" and not live and age is not None:
            warnings.append(f"status.json not updated for {fmt_duration(age)}: is the driver still running?")
        goodput = _num(_dict(summary).get("goodput"))  # the final figure once the run has ended
        return {
            "run_dir": str(self.path),
            "run": st.get("run") or _dict(recipe.get("run")).get("name") or self.path.name,
            "algorithm": st.get("algorithm") or recipe.get("algorithm"),
            "state": state,
            "live": live,
            "updated_at": updated,
            "status_age_s": None if age is None else round(age, 1),
            "error": (summary or {}).get("error"),
            "elapsed_s": _num(st.get("elapsed_s")) if st else _num((summary or {}).get("wall_s")),
            "progress": _num(st.get("progress")),
            "eta_s": _num(st.get("eta_s")) if live else None,
            "step": _num(st.get("step")),
            "tokens": _int(st.get("tokens")),
            "tokens_per_s": _num(st.get("tokens_per_s")) if live else None,
            "train_loss": _num(st.get("train_loss")),
            "eval_loss": _num(st.get("eval_loss")),
            "eval_bpb": _num(st.get("eval_bpb")),
            "eval_loss_initial": _num(st.get("eval_loss_initial")),
            "goodput": goodput if goodput is not None else _num(st.get("goodput")),
            "badput": _badput(_dict(summary)) or _badput(st),
            "learners": learners,
            "devices": device_summary([row["device"] for row in learners]),
            "spares": self._spares(st, live),
            "syncer": {
                "rounds_closed": _int(sync.get("rounds_closed")),
                "quorum": sync.get("quorum"),
                "healthy": sync.get("healthy"),
                "grace_window_s": _num(sync.get("grace_window_s")),
                "mean_contributors": _num(sync.get("mean_contributors")),
                "rejections": {str(k): _int(v) for k, v in _dict(sync.get("rejections")).items()},
                "bytes_up": up,
                "bytes_down": down,
                "bytes_up_per_s": up_rate,
                "bytes_down_per_s": down_rate,
            },
            "dp_equivalent": {"params": params, "learner_steps": steps, "bytes_each_way": dp},
            "loss_history": {"eval": self.eval_points[-400:], "train": self._train_history(updated, st)},
            "faults": list(self.feed or self.lifecycle),
            "warnings": warnings,
        }

    def _train_history(self, updated: float | None, st: dict[str, Any]) -> list[tuple[float, float]]:
        """metrics.jsonl's mean train loss, plus status.json's newer one (metrics are sparse)."""
        points = sorted((t, statistics.fmean(losses.values())) for t, losses in self.train_by_step.values())[-400:]
        loss = _num(st.get("train_loss"))
        if updated is not None and loss is not None and (not points or updated > points[-1][0]):
            points = [*points, (updated, loss)]
        return points

    def _learners(
        self, st: dict[str, Any], summary: dict[str, Any] | None, sync: dict[str, Any], live: bool
    ) -> list[dict[str, Any]]:
        rows = [r for r in st.get("learners") or [] if isinstance(r, dict) and isinstance(r.get("id"), int)]
        healthy = sync.get("healthy")
        rates = [v for r in rows if r.get("state") == "training" and (v := _num(r.get("tokens_per_s")))]
        median_rate = statistics.median(rates) if len(rates) > 1 else None
        error = str((summary or {}).get("error") or "")
        nodes = _node_labels(rows)
        out = []
        for r in rows:
            i, state, pid = r["id"], str(r.get("state") or "starting"), r.get("pid")
            rate = _num(r.get("tokens_per_s"))
            if f"learner {i} died" in error:
                state = "dead"
            elif live and state == "training":
                if self.embedded and isinstance(pid, int) and not _pid_alive(pid):
                    state = "dead"
                elif isinstance(healthy, list) and i not in healthy:
                    state = "stalled"  # no heartbeat within the syncer's timeout
                elif median_rate and rate is not None and rate < 0.5 * median_rate:
                    state = "slow"
            out.append(
                {
                    "id": i,
                    "state": state,
                    "step": _int(r.get("step")),
                    "tokens": _int(r.get("tokens")),
                    "tokens_per_s": rate,
                    "loss": _num(r.get("loss")),
                    "last_push_age_s": _num(r.get("last_push_age_s")),
                    "adopt_lag_steps": _num(r.get("adopt_lag_steps")),
                    "staleness": r.get("staleness", self.staleness.get(i)),
                    "restarts": _int(r.get("restarts", self.restarts.get(i, 0))),
                    "rejected": _int(r.get("rejected", self.rejected.get(i, 0))),
                    "goodput": _num(r.get("goodput")),
                    "pid": pid,
                    "phase": r.get("phase") if isinstance(r.get("phase"), str) else None,
                    "phase_s": _num(r.get("phase_s")),
                    "device": r.get("device") if isinstance(r.get("device"), str) else self.devices.get(i),
                    "node": nodes.get(r.get("node_id")),
                }
            )
        return out

    @staticmethod
    def _spares(st: dict[str, Any], live: bool) -> list[dict[str, Any]]:
        """Hot spares while the run is live (a finished run holds none)."""
        rows = st.get("spares") if live else None
        return [
            {
                "id": str(r.get("id")),
                "state": "spare",
                "phase": r.get("phase") if isinstance(r.get("phase"), str) else None,
                "phase_s": _num(r.get("phase_s")),
                "device": r.get("device") if isinstance(r.get("device"), str) else None,
            }
            for r in rows or []
            if isinstance(r, dict)
        ]

    def _rates(
        self, updated: float | None, up: int, down: int, elapsed: float | None, live: bool
    ) -> tuple[float | None, float | None]:
        """Bytes/s over the last ~10 s of snapshots while live, else the whole run's average."""
        if updated is not None and (not self.traffic or self.traffic[-1][0] != updated):
            self.traffic.append((updated, up, down))
        while len(self.traffic) > 2 and self.traffic[-1][0] - self.traffic[1][0] >= 10.0:
            self.traffic.popleft()
        if live and len(self.traffic) > 1:
            (t0, up0, down0), (t1, up1, down1) = self.traffic[0], self.traffic[-1]
            return (up1 - up0) / (t1 - t0), (down1 - down0) / (t1 - t0)
        if elapsed:
            return up / elapsed, down / elapsed
        return None, None


def device_summary(devices: list[str | None]) -> str | None:
    """Learners per device, most first: '4 x gpu: NVIDIA H100 80GB HBM3', '1 x gpu: ..., 3 x cpu'."""
    counts = Counter(d for d in devices if d)
    return ", ".join(f"{n} x {d}" for d, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or None


def _node_labels(rows: list[dict[str, Any]]) -> dict[Any, str]:
    """A short name per node id the learners report: its address, with the start of the id where two nodes
    share an address (several nodes on one host)."""
    ips: dict[str, str] = {}
    for r in rows:
        node_id, ip = r.get("node_id"), r.get("node")
        if isinstance(node_id, str) and node_id and isinstance(ip, str):
            ips[node_id] = ip
    shared = {ip for ip in ips.values() if list(ips.values()).count(ip) > 1}
    return {node_id: f"{ip}/{node_id[:6]}" if ip in shared else ip for node_id, ip in ips.items()}


def _badput(source: dict[str, Any]) -> dict[str, float]:
    """Seconds lost per bucket, under either name the driver may use."""
    raw = source.get("badput") or source.get("badput_s") or {}
    return {str(k): float(v) for k, v in raw.items() if _num(v)} if isinstance(raw, dict) else {}
