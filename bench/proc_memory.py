"""Peak memory of a running `dlc train`'s processes, by role, sampled from /proc on a thread (Linux).

Roles: the driver (the command's own process), each learner (pids from the run's learner_started
events), the evaluator, the syncer, and every process under the driver together (their PSS summed,
shared pages counted once). For a learner, also the resident pages of a prepared dataset's shards
(/proc/PID/smaps), which the page cache may reclaim: RSS overstates what a learner holds when it
memory-maps its data, and anonymous memory (RSS less shared pages) does not.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import psutil

SAMPLE_EVERY_S = 0.5


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """events.jsonl's complete lines (a line being written is left out)."""
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def smaps_rss(pid: int, prefix: str) -> int:
    """Resident bytes of `pid`'s mappings of files under `prefix` (/proc/PID/smaps)."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            if not line[:1].isupper():  # a mapping's header line: "start-end perms offset dev inode path"
                inside = prefix in line
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


class MemorySampler:
    """Peak memory of a `dlc train`'s processes, sampled every `every_s` on a thread of its own.

    Roles: `driver` (the command's own process), `learner I` (pids from the run's learner_started
    events), `evaluator`, `syncer`, and `all` (the PSS of every process under the driver, Ray's
    included, summed: shared pages counted once). Each role's peak RSS, USS and PSS, and for a
    learner the resident pages of the dataset's files (`dataset`).
    """

    def __init__(self, driver: int, run_dir: Path, dataset: Path | None, every_s: float = SAMPLE_EVERY_S) -> None:
        self.driver, self.run_dir, self.every_s = driver, run_dir, every_s
        self.dataset = str(dataset.resolve()) + "/" if dataset is not None else None
        self.learners: dict[int, int] = {}  # learner index -> pid
        self.peaks: dict[str, dict[str, int]] = {}
        self.series: list[tuple[float, dict[str, int]]] = []  # (time, RSS by role)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _role(self, proc: psutil.Process) -> str:
        if proc.pid == self.driver:
            return "driver"
        for index, pid in self.learners.items():
            if proc.pid == pid:
                return f"learner {index}"
        cmdline = " ".join(proc.cmdline()[:1])
        if cmdline.startswith("ray::EvaluatorWorker"):
            return "evaluator"
        return "syncer" if cmdline.startswith("ray::SyncerWorker") else "other"

    def _sample(self) -> None:
        for event in read_events(self.run_dir):  # a restarted learner's newest pid wins
            if event.get("kind") == "learner_started" and isinstance(event.get("pid"), int):
                self.learners[event["learner"]] = event["pid"]
        try:
            root = psutil.Process(self.driver)
            procs = {p.pid: p for p in [root, *root.children(recursive=True)]}
        except psutil.Error:
            return
        for pid in set(self.learners.values()) - set(procs):  # a learner outside the driver's tree
            try:
                procs[pid] = psutil.Process(pid)
            except psutil.Error:
                continue
        now: dict[str, int] = {}
        total_pss = 0
        for proc in procs.values():
            try:
                role = self._role(proc)
                mem = proc.memory_full_info()
                # anon: RSS less the pages that map files or shared memory (a dataset's shards, libraries)
                seen = {"rss": mem.rss, "uss": mem.uss, "pss": mem.pss, "anon": mem.rss - mem.shared}
                if role.startswith("learner") and self.dataset is not None:
                    seen["dataset"] = smaps_rss(proc.pid, self.dataset)
            except (psutil.Error, OSError):  # it ended meanwhile
                continue
            total_pss += mem.pss
            if role == "other":
                continue
            now[role] = mem.rss
            peak = self.peaks.setdefault(role, {})
            for key, value in seen.items():
                peak[key] = max(peak.get(key, 0), value)
        everything = self.peaks.setdefault("all", {"pss": 0})
        everything["pss"] = max(everything["pss"], total_pss)
        self.series.append((time.time(), now))

    def learner_peak(self, key: str) -> int | None:
        values = [p[key] for role, p in self.peaks.items() if role.startswith("learner") and key in p]
        return max(values) if values else None

    def peak(self, role: str, key: str) -> int | None:
        return self.peaks.get(role, {}).get(key)
