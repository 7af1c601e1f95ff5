"""The job around the training: its name, directory and stop, its cluster, checkpoints, evaluation and trackers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dlc.config.section import Section

# The trackers a recipe may list in `track`, each the module dlc.observe.trackers.<name>.
TRACKERS = ("tensorboard", "wandb", "mlflow")
TrackerName = Literal[TRACKERS]  # type: ignore[valid-type]  # the names are TRACKERS

# Seeds feed NumPy's and JAX's generators, which take unsigned 32-bit values.
MAX_SEED = 2**32 - 1


class RunConfig(Section):
    name: str = Field("run", description="Run name; the default run directory is runs/<name>-<timestamp>.")
    dir: str | None = Field(
        None,
        description="Run directory. Default: runs/<name>-<UTC timestamp>. Point it at an existing run "
        "directory to resume from its checkpoint. On several machines: a path every node mounts at the same "
        "place, or a URL etils can write (gs://, s3://, file://) that holds the checkpoints.",
    )
    local_dir: str | None = Field(
        None,
        description="With a URL run.dir only: the directory on the driver's machine for status, events, metrics "
        "and the summary (what dlc status and dlc report read). Default: runs/<last part of the URL>.",
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Seed for parameter initialisation and the data split (0 to 2^32 - 1)."
    )
    max_steps: int | None = Field(None, ge=1, description="Stop after this many inner steps per learner.")
    max_tokens: int | None = Field(
        None, ge=1, description="Stop after this many training tokens (bytes), all learners together."
    )
    max_wall_s: float | None = Field(None, gt=0, description="Stop after this many seconds of wall time.")
    log_every_steps: int = Field(50, ge=1, description="Steps between train-loss lines in metrics.jsonl and the log.")
    status_interval_s: float = Field(1.0, gt=0, description="Seconds between rewrites of status.json.")
    compile_cache: bool = Field(
        True,
        description="Keep compiled functions in compile_cache_dir, so a restarted, joining or later learner "
        "loads its step instead of compiling it (false: compile in every process).",
    )
    compile_cache_dir: str = Field(
        "~/.cache/dlc/xla",
        description="JAX's persistent compilation cache, shared by every process of a run and by later runs; "
        "safe for several processes at once.",
    )

    @field_validator("dir", "local_dir")
    @classmethod
    def _not_blank(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(f"run.{info.field_name} is empty: name a directory, or leave the key out for its default")
        return value

    @model_validator(mode="after")
    def _needs_a_stop(self) -> RunConfig:
        if self.max_steps is None and self.max_tokens is None and self.max_wall_s is None:
            raise ValueError("no stop condition: set run.max_steps, run.max_tokens or run.max_wall_s")
        if self.local_dir is not None and not (self.dir and "://" in self.dir):
            raise ValueError(
                f"run.local_dir={self.local_dir!r} is only for a URL run.dir (gs://...): with a path, the run "
                "directory is run.dir itself; remove run.local_dir"
            )
        return self


class ClusterConfig(Section):
    address: str | None = Field(
        None,
        description="Ray cluster to join: HOST:PORT of its head (ray start --head), auto, or ray://HOST:10001. "
        "Default: start an embedded one-node cluster on 127.0.0.1 with no dashboard.",
    )
    num_cpus: float | None = Field(
        None,
        ge=1,
        description="CPUs the embedded cluster advertises; at least what the recipe reserves. Default: the "
        "machine's logical CPUs, or what the recipe reserves if that is more.",
    )


class MetricsConfig(Section):
    """dlc's series through Ray's metrics API, to the Prometheus endpoint a Ray cluster already exports."""

    port: int | None = Field(
        None,
        ge=1024,
        le=65535,
        description="Port of the embedded cluster's Prometheus endpoint, http://127.0.0.1:PORT/metrics: dlc's "
        "series (dlc_*) beside Ray's own. Needs Ray's metrics agent: pip install 'dlc[metrics]'. Default: no "
        "endpoint, no series.",
    )
    enabled: bool = Field(
        False,
        description="With cluster.address: send dlc's series to the joined cluster's own endpoint (the port its "
        "nodes were started with, ray start --metrics-export-port). The embedded cluster needs metrics.port "
        "instead.",
    )

    @property
    def on(self) -> bool:
        return self.enabled or self.port is not None


class CheckpointConfig(Section):
    every_steps: int = Field(500, ge=1, description="Steps between checkpoints (one is always written at exit).")
    keep: int = Field(2, ge=1, description="How many recent checkpoints to keep.")


class ProfileConfig(Section):
    learners: list[int] = Field(
        [], description="Learners whose steps are traced with JAX's profiler (e.g. [0]); [] (the default): none."
    )
    steps: list[int] = Field(
        [10, 20],
        description="[first, last]: trace each listed learner from the start of its step `first` to the end of "
        "step `last`, into RUN/profile/learner-<i>/ (TensorBoard's profile plugin, and Perfetto: "
        "perfetto_trace.json.gz).",
    )

    @field_validator("steps")
    @classmethod
    def _a_range(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or not 0 <= value[0] <= value[1]:
            raise ValueError(f"profile.steps={value} is not [first, last] with 0 <= first <= last: e.g. [100, 110]")
        return value


class EvalConfig(Section):
    every_steps: int = Field(200, ge=1, description="Steps between evaluations on the held-out split.")
    batches: int = Field(8, ge=1, description="Batches per evaluation (fixed windows of the held-out split).")
    batch_size: int = Field(16, ge=1, description="Sequences per eval batch.")
    num_gpus: float = Field(
        0.0,
        ge=0,
        le=1,
        description="GPU share reserved for the evaluator (0: it evaluates on CPU). With GPU learners, a small "
        "share (e.g. 0.04 beside 4 learners x 0.24) makes evaluations of large models quick.",
    )


class TrackingConfig(Section):
    project: str = Field(
        "dlc", min_length=1, description="The W&B project and the MLflow experiment the run is logged under."
    )
    entity: str | None = Field(None, description="W&B entity (user or team). Default: your W&B default entity.")
    wandb_mode: Literal["online", "offline"] | None = Field(
        None,
        description="W&B online (needs wandb login) or offline (files under RUN/wandb, uploaded later with "
        "wandb sync). Default: $WANDB_MODE, else online.",
    )
    mlflow_uri: str | None = Field(
        None,
        description="MLflow tracking URI: http(s)://HOST:PORT of a tracking server, sqlite:///PATH, or file:PATH. "
        "Default: $MLFLOW_TRACKING_URI, else an SQLite database in RUN/mlflow.",
    )
