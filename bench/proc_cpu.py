"""CPU time of a run's processes, read from /proc while it runs (Linux; elsewhere nothing is read).

On a machine whose cores are saturated, throughput and CPU per step are one measure; what CPU
per step adds is where it goes. Every process started under a `dlc train` (Ray's included) is
summed by role: the learners' XLA threads (their step's compute), the learners' other threads
(the step loop, the protocol's threads, Ray's), the syncer, and everything else (the driver,
Ray's own processes). XLA's CPU per step doubles as a gauge of the machine's speed: the same work
takes more of it in a run during which the machine was slower. A sample costs the bench's own
process about 8 ms of CPU on the 2-core machine (a tiny run's processes): under 1% of a core at one
a second, the same in every arm, and counted in none.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

PROC = Path("/proc")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
PARTS = ("learners_xla", "learners_other", "syncer", "other")


def _stat(path: Path) -> tuple[str, list[str]]:
    """(comm, the fields after it) of a /proc stat file."""
    text = path.read_text()
    return text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1].split()


def _descendants(root: int) -> dict[int, list[str]]:
    """Every process under `root` (itself included), with the fields of its stat file."""
    stats: dict[int, list[str]] = {}
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat(entry / "stat")[1]
            except (OSError, ValueError, IndexError):  # it ended meanwhile
                continue
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            out[pid] = stats[pid]
        todo.extend(children.get(pid, []))
    return out


def _role(pid: int) -> str:
    cmdline = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")[0]
    if cmdline.startswith(b"ray::LearnerWorker"):
        return "learner"
    return "syncer" if cmdline.startswith(b"ray::SyncerWorker") else "other"


def _cpu_s(fields: list[str]) -> float:
    """User plus system CPU seconds from the fields of a stat file."""
    return (int(fields[11]) + int(fields[12])) * TICK_S


def sample(root: int) -> Counter[str]:
    """CPU seconds so far of every process under `root`, by part (`PARTS`)."""
    cpu: Counter[str] = Counter()
    for pid, fields in _descendants(root).items():
        try:
            role = _role(pid)
            if role != "learner":
                cpu[role] += _cpu_s(fields)
                continue
            for task in (PROC / str(pid) / "task").iterdir():
                comm, task_fields = _stat(task / "stat")
                cpu["learners_xla" if comm.startswith("tf_") else "learners_other"] += _cpu_s(task_fields)
        except (OSError, ValueError, IndexError):  # the process or thread ended meanwhile
            continue
    return cpu


class Sampler:
    """Samples `sample(root)` every `every_s` seconds on a thread of its own until `stop`."""

    def __init__(self, root: int, every_s: float = 1.0) -> None:
        self.root, self.every_s = root, every_s
        self.samples: list[tuple[float, Counter[str]]] = []  # (time.time(), CPU seconds by part)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if PROC.is_dir():
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append((time.time(), sample(self.root)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def between(self, lo: float, hi: float) -> tuple[float, float, Counter[str]] | None:
        """(t0, t1, CPU seconds by part) between the first sample at or after `lo` and the last at
        or before `hi`; None without two such samples."""
        inside = [s for s in self.samples if lo <= s[0] <= hi]
        if len(inside) < 2:
            return None
        (t0, a), (t1, b) = inside[0], inside[-1]
        return t0, t1, Counter({part: b[part] - a[part] for part in PARTS})
