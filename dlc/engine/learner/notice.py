"""A learner's preemption notice: SIGTERM or a draining node, answered by handing its progress over and leaving.

The learner actor takes this as a base. On a notice the training loop stops at its next step
boundary; the learner pushes every fragment moved since its last push, checkpoints with its data
position, reports itself `preempted` (the driver starts its replacement elsewhere) and ends its
process once a poll has told the driver, or by itself when no driver asks.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any


class Preemptible:
    """What a learner does with a preemption notice; the learner actor provides the state it reads."""

    notice: dict[str, Any] | None  # the notice: its reason, when it came, its deadline; then what leaving did
    state: str
    _thread: threading.Thread | None  # the training loop (None before it starts)
    _stop: threading.Event  # stops the loop at its next step boundary
    _ending: threading.Lock  # the loop's end and a notice: one of them decides who leaves
    _reported: threading.Event  # set once a poll has told the driver it left
    _default_sigterm: Any  # the handler SIGTERM had before this learner's

    def _hand_over(self, timeout_s: float) -> int:
        """Push what is not pushed, wait until the syncer holds it, checkpoint; the pushes (the actor's)."""
        raise NotImplementedError

    def _fail(self, error: str) -> None:
        raise NotImplementedError

    def give_notice(self, reason: str, deadline: float | None = None) -> bool:
        """A preemption notice: this process goes away at wall time `deadline` (None: unknown). The loop
        stops at its next step boundary and the learner leaves (`_leave`; one that finished its steps leaves
        at once). False if it has not started training, or already has a notice."""
        with self._ending:
            if self._thread is None or self.notice is not None or self.state in ("failed", "stopped"):
                return False
            self.notice = {"reason": reason, "at": round(time.time(), 3), "deadline": deadline}
            self._stop.set()
            finished = self.state == "finished"
        if finished:  # its loop has ended: nothing else will hand its progress over
            threading.Thread(target=self._leave_finished, name="leaving", daemon=True).start()
        return True

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """SIGTERM is a preemption notice to a training learner; anything else (a spare, a learner still
        starting, a second SIGTERM) ends as Ray ends a worker."""
        if self.give_notice("SIGTERM"):
            return
        if self.notice is None and callable(self._default_sigterm):
            self._default_sigterm(signum, frame)
        elif self.notice is None:
            os._exit(128 + signum)

    def _leave(self) -> None:
        """Preempted: push every fragment moved since its last push, checkpoint (with its data position),
        tell the driver (state `preempted`, which starts a replacement elsewhere), and end the process."""
        notice = self.notice or {}
        self.state = "leaving"
        deadline = notice.get("deadline")
        budget = 120.0 if deadline is None else max(deadline - time.time() - 1.0, 1.0)
        pushed = self._hand_over(timeout_s=budget)
        # What the driver's learner_preempted event reports, read from the snapshot with the state (a new
        # dict: a poll may be reading the old one).
        self.notice = {**notice, "fragments": pushed, "leave_s": round(time.time() - notice.get("at", time.time()), 3)}
        self.state = "preempted"
        threading.Thread(target=self._exit_once_reported, name="leaving", daemon=True).start()

    def _leave_finished(self) -> None:
        try:
            self._leave()
        except Exception:  # reported to the driver, which fails the run with this text
            self._fail(traceback.format_exc())

    def _exit_once_reported(self) -> None:
        """The driver kills a preempted learner once a poll has told it; without a driver (its node is going
        too), the process ends by itself."""
        self._reported.wait(timeout=10.0)
        time.sleep(1.0)  # the poll's answer is on its way
        os._exit(0)
