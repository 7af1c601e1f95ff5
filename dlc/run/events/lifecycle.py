"""The run's events, and its learners' and hot spares' starting and stopping."""

from __future__ import annotations

from typing import Any

from dlc.run.events.base import RUN, STARTING, Event, declared


@declared(RUN, "run_started")
class RunStarted(Event):
    """The run began: its directory and storage, the data, its tokenizer, its training and held-out tokens and the
    held-out bytes per token (the data's fields null in a run of a dlc before they were recorded)."""

    run_dir: str
    storage: str
    algorithm: str
    learners: int
    resumed: bool
    data: str | None = None
    tokenizer: str | None = None
    train_tokens: int | None = None
    eval_tokens: int | None = None
    eval_bytes_per_token: float | None = None


@declared(RUN, "cluster_started")
class ClusterStarted(Event):
    """The Ray cluster is up: its address (`embedded`, or the one joined), the driver's node, every node (id,
    address, host, head)."""

    address: str
    driver_node: str
    nodes: list[dict[str, Any]]


@declared(RUN, "compile_cache")
class CompileCache(Event):
    """The compilation cache's directory, and how many torn entries of a killed writer were removed."""

    dir: str
    torn_entries_removed: int


@declared(RUN, "run_resumed")
class RunResumed(Event):
    """A learner goes on from its checkpoint: its step, data position and incarnation."""

    learner: int
    step: int
    data_position: int
    incarnation: int
    checkpoint: bool


@declared(RUN, "syncer_restored")
class SyncerRestored(Event):
    """The syncer restored from its checkpoint and journal: each fragment's version, the rounds each held."""

    versions: list[int]
    checkpoint_rounds: int | None = None  # None: no checkpoint, the journal alone
    journal_rounds: int
    rounds_closed: int


@declared(RUN, "checkpoint_saved")
class CheckpointSaved(Event):
    """A learner's checkpoint is written."""

    learner: int
    step: int


@declared(RUN, "final_push")
class FinalPush(Event):
    """A learner pushed the progress it had not pushed: as it reached `run.max_steps`, or when the run stopped it."""

    learner: int
    fragments: int


@declared(RUN, "profile_written")
class ProfileWritten(Event):
    """A profiler trace of the steps given (first and last), in `dir`."""

    learner: int
    steps: list[int]
    dir: str


@declared(RUN, "run_finished")
class RunFinished(Event):
    """The run ended: how, and the tokens trained."""

    status: str
    tokens: int


@declared(STARTING, "learner_started")
class LearnerStarted(Event):
    """A learner's process is up: its pid, platform, device kind and device, node address and id, allocator (all but
    the pid null in a run of a dlc before they were recorded)."""

    learner: int
    pid: int
    platform: str | None = None
    device_kind: str | None = None
    device: str | None = None
    node: str | None = None
    node_id: str | None = None
    allocator: str | None = None


@declared(STARTING, "learner_training")
class LearnerTraining(Event):
    """Its first step is done, start-up over: `compile_wait_s` waiting for another learner compiling the same
    functions, `compile_s` with that wait, `compiled_from` `cache`, `xla` or `both`; `copy_s` copying a peer's
    state; `spare` when a hot spare took the slot."""

    learner: int
    device: str
    incarnation: int
    spare: bool = False
    process_s: float | None = None
    compile_wait_s: float | None = None
    compile_s: float | None = None
    compiled_from: str | None = None
    copy_s: float | None = None


@declared(STARTING, "learner_finished")
class LearnerFinished(Event):
    """A learner trained all its steps."""

    learner: int
    step: int | None


@declared(STARTING, "learner_stopped")
class LearnerStopped(Event):
    """A learner's loop stopped (the run's end, or a stop); no `step` when it did not answer."""

    learner: int
    step: int | None = None
    reason: str


@declared(STARTING, "spare_started")
class SpareStarted(Event):
    """A hot spare's process started."""

    spare: str


@declared(STARTING, "spare_ready")
class SpareReady(Event):
    """A hot spare compiled and waits, holding no data."""

    spare: str
    after_s: float
    device: str | None
    process_s: float | None = None
    compile_s: float | None = None
    compile_wait_s: float | None = None
    compiled_from: str | None = None


@declared(STARTING, "spare_taken")
class SpareTaken(Event):
    """A hot spare took a dead learner's slot."""

    spare: str
    learner: int
    ready: bool


@declared(STARTING, "spare_died")
class SpareDied(Event):
    """A spare's process died while it waited (`spare`), or as it took `learner`'s slot: another takes its place."""

    spare: str | None = None
    learner: int | None = None
    error: str | None = None
