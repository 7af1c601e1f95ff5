"""An adversarial sweep of bad input: every recipe section, every command's options, unusable run
directories, damaged checkpoints and journals.

The promise (README, "Training"): bad input prints `error: ...` naming what is wrong and the fix,
exits with code 2 without a traceback, and changes nothing in the run directory. Every case runs
in-process and must be refused before `dlc train` starts the engine: `no_cluster` turns reaching
the cluster into a failure. The resume cases damage a copy of one finished run directory (made
once, without Ray) and compare every file before and after the refused command.

Each table row is one case, so adding a case is one line. Cases that need a Ray cluster's
resources (an unreachable address, too few CPUs, GPUs) belong beside the engine's start-up tests.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dlc.config.load import dump_recipe, load_recipe, replaced_overrides
from dlc.errors import UserError
from dlc.run.files import CHECKPOINT_DIR, syncer_journal_path
from tests.helpers import REPO, TINY, assert_user_error, invoke, marked_storage, run_cli, run_started, snapshot

GIB = 2**30


class ReachedCluster(Exception):
    """The command got as far as starting the engine: the refusal came too late."""


@pytest.fixture(autouse=True)
def no_cluster(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    import dlc.engine.cluster

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ReachedCluster

    if "real_cluster" not in request.keywords:  # the cases about the cluster itself start one
        monkeypatch.setattr(dlc.engine.cluster, "start_cluster", refuse)
    monkeypatch.chdir(REPO)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 kB of text: enough for two learners, quick to read in every case."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_bytes((REPO / "README.md").read_bytes() * 10)
    return path


def train_overrides(corpus: Path, run_dir: Path | str) -> list[str]:
    return [
        f"run.dir={run_dir}",
        "data.source=text",
        f"data.paths=[{corpus}]",
        "learners.count=2",
        "run.max_steps=6",
        "run.compile_cache=false",
    ]


# -- a finished run directory, made once without Ray ---------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    """A run directory as `dlc train` leaves it: recipe, logs, summary, a syncer checkpoint with
    journaled rounds after it (written by the real syncer worker), and a checkpoint per learner."""
    from dlc.algo.decoupled.messages import Push
    from dlc.core.codec import get_codec
    from dlc.engine.syncer.actor import SyncerWorker
    from dlc.run.checkpoint import Checkpointer
    from tests.fakes import Direct

    run = tmp_path_factory.mktemp("finished") / "run"
    recipe = load_recipe(TINY, train_overrides(corpus, run))
    run.mkdir()
    (run / "recipe.yaml").write_text(dump_recipe(recipe))
    (run / "events.jsonl").write_text('{"t": 1.0, "kind": "run_started"}\n{"t": 2.0, "kind": "run_finished"}\n')
    (run / "metrics.jsonl").write_text('{"t": 1.5, "kind": "train", "learner": 0, "step": 6, "loss": 4.0}\n')
    (run / "status.json").write_text('{"state": "completed", "step": 6}')
    (run / "summary.json").write_text('{"status": "completed", "steps": 6, "wall_s": 10.0}')
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"\x00" * 16)

    worker = SyncerWorker(recipe.model_dump(mode="json"), str(run), marked_storage(run))
    for i in range(2):
        worker.register(i, SimpleNamespace(deliver=Direct(lambda message: None)))

    def round_of(fragment: int, seq: int, base: int) -> None:
        delta = np.full(worker.syncer.plan.size(fragment), 1e-3, np.float32)
        worker.syncer.open_round(fragment)
        worker.push(Push(0, fragment, base, 4, 400, seq, get_codec("int4").encode(delta), sent_at=0.0))

    round_of(0, seq=0, base=0)
    worker.save()  # the syncer's checkpoint ...
    round_of(1, seq=1, base=0)
    round_of(2, seq=2, base=0)  # ... and two rounds journaled after it
    worker.close()
    for i in range(2):
        learner = Checkpointer(learner_checkpoint_dir(run, i), keep=2)
        for step in (3, 6):
            learner.save(step, {"params": np.zeros(4, np.float32)}, {"step": step})
        learner.close()
    return run


def journal_records(run: Path) -> list[bytes]:
    """The journal's records, each as the bytes the syncer wrote."""
    data, out, start = syncer_journal_path(run).read_bytes(), [], 0
    import io

    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        pickle.load(stream)
        out.append(data[start : stream.tell()])
        start = stream.tell()
    return out


def rewrite_record(run: Path, **changes: Any) -> None:
    """Replace the journal's first round (after the snapshot a checkpoint starts it with) by a copy
    carrying `changes`."""
    records = journal_records(run)
    k = next(i for i, raw in enumerate(records) if "fragment" in pickle.loads(raw))
    records[k] = pickle.dumps({**pickle.loads(records[k]), **changes}, protocol=pickle.HIGHEST_PROTOCOL)
    syncer_journal_path(run).write_bytes(b"".join(records))


def replace_with_file(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.write_text("not what was here\n")


def replace_with_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


def learner_checkpoint_dir(run: Path, index: int) -> Path:
    return run / CHECKPOINT_DIR / f"learner-{index}"


def journal(run: Path) -> Path:
    return syncer_journal_path(run)


# -- dlc train: every recipe section ---------------------------------------------------------------

# (case, overrides, fragments of the one error line)
RECIPE_CASES = [
    ("run-seed-negative", ["run.seed=-1"], ["run.seed=-1", "greater than or equal to 0"]),
    ("run-local-dir-blank", ["run.local_dir= "], ["run.local_dir is empty", "leave the key out"]),
    # Bytes that are not UTF-8 on the command line reach Python as lone surrogates (PEP 383).
    ("override-not-utf8", ["run.name=a\udcffb"], ["not valid UTF-8", "\\xff"]),
    ("run-seed-beyond-32-bits", ["run.seed=4294967296"], ["run.seed=4294967296", "less than or equal to 4294967295"]),
    ("run-max-steps-bool", ["run.max_steps=true"], ["run.max_steps=true", "not a number"]),
    ("run-status-interval-inf", ["run.status_interval_s=.inf"], ["run.status_interval_s=inf", "finite number"]),
    ("model-heads-bool", ["model.num_heads=true"], ["model.num_heads=true", "not a number"]),
    ("model-init-std-inf", ["model.init_std=.inf"], ["model.init_std=inf", "finite number"]),
    ("model-width-beyond-memory", ["model.width=65536"], ["of memory", "available", "lower model.width"]),
    ("model-context-beyond-memory", ["model.context_len=2000000000"], ["of memory", "model.context_len"]),
    ("data-block-shorter-than-sequence", ["data.block_bytes=64"], ["data.block_bytes=64", "learners.seq_len=64"]),
    ("data-corpus-bytes-bool", ["data.max_corpus_bytes=true"], ["data.max_corpus_bytes=true", "not a number"]),
    ("data-prepared-without-path", ["data.source=prepared"], ["data.source=prepared needs data.path"]),
    ("data-prepared-missing", ["data.source=prepared", "data.path=/none/ds"], ["/none/ds", "dlc prepare"]),
    ("data-path-for-bytes", ["data.path=/tmp/ds"], ["data.path is read only with data.source=prepared"]),
    ("data-path-a-url", ["data.source=prepared", "data.path=gs://bucket/ds"], ["gs://bucket/ds", "is a URL", "mounts"]),
    ("model-vocab-below-bytes", ["model.vocab_size=100"], ["model.vocab_size=100", "256 tokens"]),
    ("learners-count-bool", ["learners.count=true"], ["learners.count=true", "not a number"]),
    ("learners-batch-beyond-memory", ["learners.batch_size=100000"], ["of memory", "batch 100000"]),
    (
        "learners-override-twice",
        ["learners.overrides=[{index: 0, batch_size: 2}, {index: 0, step_time_s: 1}]"],
        ["learners.overrides names learner 0 twice"],
    ),
    ("learners-override-index-bool", ["learners.overrides=[{index: true}]"], ["learners.overrides.0.index=true"]),
    ("learners-latency-nan", ["learners.latency_ms=.nan"], ["learners.latency_ms=nan", "finite number"]),
    ("inner-lr-inf", ["inner.lr=.inf"], ["inner.lr=inf", "finite number"]),
    ("inner-warmup-bool", ["inner.warmup_steps=false"], ["inner.warmup_steps=false", "not a number"]),
    ("syncer-fragments-beyond-tensors", ["syncer.fragments=5000"], ["syncer.fragments=5000", "lower syncer.fragments"]),
    ("syncer-fragments-absurd", ["syncer.fragments=100000000"], ["syncer.fragments=100000000"]),
    ("syncer-codec-block-beyond-memory", ["syncer.codec_block_values=4000000000"], ["syncer.codec_block_values"]),
    ("syncer-quorum-bool", ["syncer.quorum=true"], ["syncer.quorum=true", "not a number"]),
    ("blocking-reconfigure-bool", ["blocking.reconfigure_s=true"], ["blocking.reconfigure_s=true"]),
    ("cluster-cpus-bool", ["cluster.num_cpus=true"], ["cluster.num_cpus=true", "not a number"]),
    ("checkpoint-keep-bool", ["checkpoint.keep=true"], ["checkpoint.keep=true", "not a number"]),
    ("eval-windows-beyond-memory", ["eval.batches=100000", "eval.batch_size=100000"], ["of memory", "eval.batches"]),
    ("track-unknown", ["track=[tensorboard,neptune]"], ["track.1='neptune'", "'tensorboard', 'wandb' or 'mlflow'"]),
    ("track-twice", ["track=[mlflow,mlflow]"], ["track lists mlflow more than once"]),
    ("override-twice", ["run.seed=1", "run.seed=2"], ["run.seed is set twice", "'run.seed=1', then 'run.seed=2'"]),
    ("override-whole-and-part", ["eval.batches=2", "eval={batches: 3}"], ["eval is set both whole and in part"]),
    (
        "address-option-and-override",
        ["--address=127.0.0.1:1", "cluster.address=127.0.0.1:2"],
        ["--address and a cluster.address override both name the cluster"],
    ),
    ("metrics-port-low", ["metrics.port=80"], ["metrics.port=80", "greater than or equal to 1024"]),
    ("metrics-embedded-without-port", ["metrics.enabled=true"], ["metrics.enabled=true", "set metrics.port"]),
    (
        "metrics-port-joining-a-cluster",
        ["metrics.port=9100", "cluster.address=127.0.0.1:1"],
        ["metrics.port=9100", "exports at its own port", "set metrics.enabled=true"],
    ),
    (
        "track-mlflow-server-unreachable",  # a closed loopback port: refused at once
        ["track=[mlflow]", "tracking.mlflow_uri=http://127.0.0.1:9"],
        ["tracking.mlflow_uri='http://127.0.0.1:9' is unreachable", "remove mlflow from track"],
    ),
]


@pytest.mark.parametrize(("overrides", "fragments"), [c[1:] for c in RECIPE_CASES], ids=[c[0] for c in RECIPE_CASES])
def test_train_refuses_a_bad_recipe_before_anything_is_written(overrides, fragments, corpus, tmp_path):
    run = tmp_path / "run"
    assert_user_error(
        invoke("train", str(TINY), *replaced_overrides(train_overrides(corpus, run), *overrides)), *fragments
    )
    assert not run.exists()


def test_train_refuses_an_empty_run_directory_and_writes_nothing(corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the default runs/ would be made
    overrides = [o for o in train_overrides(corpus, "x") if not o.startswith("run.dir=")]
    assert_user_error(invoke("train", str(TINY), "run.dir=", *overrides), "run.dir is empty", "leave the key out")
    assert list(tmp_path.iterdir()) == []


def recipe_text(text: str) -> Callable[[Path], Path]:
    def write(tmp: Path) -> Path:
        (tmp / "recipe.yaml").write_text(text)
        return tmp / "recipe.yaml"

    return write


# (case, the recipe argument given a scratch directory, fragments)
RECIPE_PATH_CASES: list[tuple[str, Callable[[Path], Path], list[str]]] = [
    ("recipe-is-a-folder", lambda tmp: tmp, ["is a directory", "give a recipe file inside it"]),
    ("recipe-empty", recipe_text(""), ["recipe.yaml", "is empty", "recipes/tiny.yaml"]),
    ("recipe-only-comments", recipe_text("# learners: 4\n\n"), ["recipe.yaml", "is empty"]),
    ("recipe-a-bare-zero", recipe_text("0\n"), ["recipe.yaml", "bare int", "not a mapping of sections"]),
    ("recipe-a-bare-string", recipe_text("tiny\n"), ["recipe.yaml", "bare str", "'tiny'"]),
    ("recipe-a-list", recipe_text("- run\n"), ["recipe.yaml", "bare list"]),
]


@pytest.mark.parametrize(
    ("make", "fragments"), [c[1:] for c in RECIPE_PATH_CASES], ids=[c[0] for c in RECIPE_PATH_CASES]
)
def test_train_names_what_is_wrong_with_the_recipe_path(make, fragments, tmp_path):
    assert_user_error(invoke("train", str(make(tmp_path))), *fragments)


# -- dlc train: run directories that cannot be made ------------------------------------------------------

# (case, run.dir given a scratch directory holding a regular file `f`, fragments)
UNUSABLE_DIR_CASES: list[tuple[str, Callable[[Path], str], list[str]]] = [
    ("under-a-regular-file", lambda tmp: f"{tmp / 'f'}/run", ["cannot be written", "Not a directory"]),
    ("in-sysfs", lambda tmp: "/sys/dlc-bad-input-run", ["cannot be written", "choose a writable run.dir"]),
    ("in-procfs", lambda tmp: "/proc/self/dlc-bad-input-run", ["cannot be written"]),
    ("an-unwritable-directory", lambda tmp: "/proc/self", ["cannot be written"]),
    ("a-name-too-long", lambda tmp: str(tmp / ("x" * 300)), ["cannot be used", "too long"]),
    ("a-nul-byte", lambda tmp: f"{tmp}/a\0b", ["NUL byte"]),
    ("a-regular-file", lambda tmp: str(tmp / "f"), ["exists and is not a directory"]),
]


@pytest.mark.parametrize(
    ("make", "fragments"), [c[1:] for c in UNUSABLE_DIR_CASES], ids=[c[0] for c in UNUSABLE_DIR_CASES]
)
def test_train_refuses_a_run_directory_it_cannot_write(make, fragments, corpus, tmp_path):
    (tmp_path / "f").write_text("a file\n")
    before = snapshot(tmp_path)
    assert_user_error(invoke("train", str(TINY), *train_overrides(corpus, make(tmp_path))), *fragments)
    assert snapshot(tmp_path) == before


# -- dlc train: resuming a damaged run directory ----------------------------------------------------------

# (case, damage done to a copy of the finished run, extra overrides, fragments)
DAMAGED_RUN_CASES: list[tuple[str, Callable[[Path], Any], list[str], list[str]]] = [
    ("another-model", lambda run: None, ["model.width=32"], ["holds a checkpoint of a different run", "--fresh"]),
    # before the journal is read: its fragment numbers would otherwise be called damage
    ("other-fragments", lambda run: None, ["syncer.fragments=8"], ["changed: syncer.fragments from 16 to 8"]),
    ("recipe-yaml-a-list", lambda run: (run / "recipe.yaml").write_text("- 1\n"), [], ["recipe.yaml is not a recipe"]),
    ("recipe-yaml-section-a-number", lambda run: (run / "recipe.yaml").write_text("model: 5\n"), [], ["--fresh"]),
    ("recipe-yaml-a-directory", lambda run: replace_with_dir(run / "recipe.yaml"), [], ["recipe.yaml is a directory"]),
    ("events-a-directory", lambda run: replace_with_dir(run / "events.jsonl"), [], ["events.jsonl is a directory"]),
    ("metrics-a-directory", lambda run: replace_with_dir(run / "metrics.jsonl"), [], ["metrics.jsonl is a directory"]),
    ("summary-a-directory", lambda run: replace_with_dir(run / "summary.json"), [], ["summary.json is a directory"]),
    ("tensorboard-a-file", lambda run: replace_with_file(run / "tensorboard"), [], ["tensorboard is a file"]),
    ("wandb-a-file", lambda run: (run / "wandb").write_text("a file\n"), [], ["wandb is a file"]),
    ("mlflow-a-file", lambda run: (run / "mlflow").write_text("a file\n"), [], ["mlflow is a file"]),
    ("trackers-json-a-directory", lambda run: (run / "trackers.json").mkdir(), [], ["trackers.json is a directory"]),
    ("checkpoints-a-file", lambda run: replace_with_file(run / "checkpoints"), [], ["checkpoints is a file"]),
    (
        "learner-checkpoint-folder-a-file",
        lambda run: replace_with_file(learner_checkpoint_dir(run, 1)),
        [],
        ["checkpoint folder", "learner-1 is not a directory", "--fresh"],
    ),
    (
        "learner-latest-checkpoint-a-file",
        lambda run: replace_with_file(learner_checkpoint_dir(run, 0) / "6"),
        [],
        ["learner-0/6 is not a directory", "older step"],
    ),
    (
        "syncer-checkpoint-folder-a-file",
        lambda run: replace_with_file(run / "checkpoints" / "syncer"),
        [],
        ["syncer is not a directory"],
    ),
    (
        "journal-garbage",
        lambda run: journal(run).write_bytes(b"these bytes were never a pickle"),
        [],
        ["syncer journal", "is damaged", "record 1", "move it aside", "--fresh"],
    ),
    (
        "journal-of-another-type",
        lambda run: journal(run).write_bytes(pickle.dumps([1, 2, 3], protocol=pickle.HIGHEST_PROTOCOL)),
        [],
        ["is a list, not a round"],
    ),
    (
        "journal-damaged-in-the-middle",
        lambda run: journal(run).write_bytes(journal_records(run)[0] + b"\x00garbage" + journal_records(run)[1]),
        [],
        ["record 2", "is unreadable"],
    ),
    (
        "journal-record-of-another-fragment-count",
        lambda run: rewrite_record(run, fragment=99),
        [],
        ["fragment 99", "this run has 16 fragments"],
    ),
    (
        "journal-record-of-another-size",
        lambda run: rewrite_record(run, theta=np.zeros(3, np.float32)),
        [],
        ["holds 3 values of fragment 1"],
    ),
    (
        "journal-record-of-an-older-dlc",  # a momentum where the outer step's state now is
        lambda run: rewrite_record(run, outer=None, momentum=np.zeros(3, np.float32)),
        [],
        ["syncer journal", "is damaged", "written by an older dlc", "--fresh"],
    ),
    (
        "journal-refusal-of-no-push",
        lambda run: journal(run).write_bytes(
            journal(run).read_bytes()
            + pickle.dumps({"refused": "seq 3", "reason": "stale"}, protocol=pickle.HIGHEST_PROTOCOL)
        ),
        [],
        ["record 4", "names a refused push 'seq 3'"],
    ),
    (
        "journal-a-directory",
        lambda run: replace_with_dir(journal(run)),
        [],
        ["syncer-journal.pkl is a directory", "--fresh"],
    ),
    (
        "journal-prev-garbage",
        lambda run: journal(run).with_suffix(".prev").write_bytes(b"\x00\x01 not a pickle"),
        [],
        ["syncer-journal.prev is damaged"],
    ),
]


@pytest.fixture
def run_copy(finished_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished_run, tmp_path / "run", symlinks=True))


@pytest.mark.parametrize(
    ("damage", "extra", "fragments"), [c[1:] for c in DAMAGED_RUN_CASES], ids=[c[0] for c in DAMAGED_RUN_CASES]
)
def test_resume_refuses_a_damaged_run_directory_and_leaves_it_as_it_was(damage, extra, fragments, run_copy, corpus):
    damage(run_copy)
    before = snapshot(run_copy)
    assert_user_error(invoke("train", str(TINY), *train_overrides(corpus, run_copy), *extra), *fragments)
    assert snapshot(run_copy) == before


# Controls: what is not damage reaches the engine, and still nothing is written before it starts.
HEALTHY_RUN_CASES: list[tuple[str, Callable[[Path], Any]]] = [
    ("undamaged", lambda run: None),
    # A syncer killed mid-write leaves its last record cut short: the rounds before it stand.
    ("journal-last-record-cut-short", lambda run: journal(run).write_bytes(journal(run).read_bytes()[:-1000])),
    ("no-journal", lambda run: journal(run).unlink()),
]


@pytest.mark.parametrize("damage", [c[1] for c in HEALTHY_RUN_CASES], ids=[c[0] for c in HEALTHY_RUN_CASES])
def test_a_healthy_run_directory_passes_every_check(damage, run_copy, corpus):
    damage(run_copy)
    before = snapshot(run_copy)
    result = invoke("train", str(TINY), *train_overrides(corpus, run_copy))
    assert isinstance(result.exception, ReachedCluster), result.stderr
    assert snapshot(run_copy) == before  # the run had not started: nothing was written yet


def write_completed_summary(run: Path, steps: float = 6.0) -> dict[str, Any]:
    """Write the summary `dlc train` leaves at a completed end of the fixture's run (2 learners, 6 steps)."""
    summary = {
        "status": "completed",
        "steps": steps,
        "tokens_total": 2 * 6 * 16 * 64,
        "wall_s": 31.5,
        "eval_loss_initial": 5.43,
        "eval_loss_final": 3.21,
        "eval_bpb_final": 4.63,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return summary


def test_resuming_a_completed_run_trains_nothing_and_says_how_to_train_further(run_copy, corpus):
    """Every learner would restore, find its budget spent and stop: the engine is not started at all."""
    write_completed_summary(run_copy)
    before = snapshot(run_copy)
    result = invoke("train", str(TINY), *train_overrides(corpus, run_copy))
    assert result.exit_code == 0, result.stderr
    assert "nothing to train" in result.stderr and "run.max_steps" in result.stderr and "--fresh" in result.stderr
    assert "completed: 12,288 tokens in 31.5 s; eval loss 5.430 -> 3.210" in result.stderr
    assert snapshot(run_copy) == before


@pytest.mark.parametrize(
    ("extra", "steps", "later_status"),
    [
        pytest.param(["run.max_steps=8"], 6.0, False, id="a-larger-budget"),
        pytest.param([], 5.5, False, id="a-learner-short-of-it"),
        pytest.param([], 6.0, True, id="a-later-resume-stopped-hard"),
    ],
)
def test_a_completed_run_with_budget_left_resumes(extra, steps, later_status, run_copy, corpus):
    write_completed_summary(run_copy, steps)
    if later_status:  # status.json written after the summary: a resume since, which ended without one
        later = (run_copy / "summary.json").stat().st_mtime + 5
        os.utime(run_copy / "status.json", (later, later))
    result = invoke("train", str(TINY), *replaced_overrides(train_overrides(corpus, run_copy), *extra))
    assert isinstance(result.exception, ReachedCluster), result.stderr


# Resources the cluster does not have: each refused within seconds (Ray would wait forever for them),
# naming the resource and the fix, before the run directory changes. (case, overrides, fragments)
CLUSTER_CASES: list[Any] = [
    pytest.param(
        ["cluster.address=127.0.0.1:1"], ["cannot reach the Ray cluster", "127.0.0.1:1"], id="address-nobody-answers"
    ),
    pytest.param(["cluster.num_cpus=3"], ["cluster.num_cpus=3", "reserves 5 CPUs"], id="cpus-fewer-than-reserved"),
    pytest.param(
        ["learners.num_gpus=1"],
        ["reserves 2 GPUs (2 learners x 1) but the Ray cluster has 0", "learners.num_gpus=0"],
        marks=pytest.mark.slow,  # an embedded cluster starts (seconds)
        id="gpus-where-none-exist",
    ),
    pytest.param(
        ["learners.overrides=[{index: 1, resources: {node_b: 1}}]"],
        ["learner 1 asks for CPU 1, node_b 1, which no node of the cluster has"],
        marks=pytest.mark.slow,
        id="a-learner-no-node-can-hold",
    ),
]


@pytest.mark.real_cluster
@pytest.mark.parametrize(("overrides", "fragments"), CLUSTER_CASES)
def test_resources_the_cluster_lacks_are_refused_in_seconds(overrides, fragments, run_copy, corpus, request):
    before = snapshot(run_copy)
    args = ("train", str(TINY), *train_overrides(corpus, run_copy), *overrides)
    started = time.monotonic()
    # A cluster that starts forks Ray's processes: in a fresh interpreter, not this one (JAX runs here).
    result = run_cli(*args, timeout=120) if "slow" in request.keywords else invoke(*args)
    assert_user_error(result, *fragments)
    assert time.monotonic() - started < 60  # not a wait for resources that never come
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("extra", [[], ["--fresh"]], ids=["resume", "fresh"])
def test_a_run_directory_in_use_by_another_train_is_refused_and_left_as_it_is(extra, run_copy, corpus):
    """Two runs writing one directory would interleave their logs and checkpoints."""
    import os

    from dlc.run.rundir import Claim

    before = snapshot(run_copy)
    with Claim() as other:  # as another `dlc train` holds it: a second claim conflicts in one process too
        other.take(run_copy)
        result = invoke("train", str(TINY), *train_overrides(corpus, run_copy), *extra)
    assert_user_error(result, "is in use by another dlc train", f"(pid {os.getpid()})", "choose another run.dir")
    assert snapshot(run_copy) == before


def test_a_claim_is_free_again_once_released(tmp_path):
    from dlc.run.rundir import Claim

    first, second = Claim(), Claim()
    first.take(tmp_path)
    first.take(tmp_path)  # held already: nothing to do
    with pytest.raises(UserError, match="in use by another dlc train"):
        second.take(tmp_path)
    first.release()
    second.take(tmp_path)
    second.release()


def test_only_a_directory_without_an_earlier_run_is_written_before_the_run_starts(run_copy, corpus, tmp_path):
    from dlc.run.rundir import RunDir

    new, resume = RunDir.prepare(load_recipe(TINY, train_overrides(corpus, tmp_path / "new")), fresh=False)
    new.event(run_started(tmp_path / "new"))
    assert not resume and (tmp_path / "new" / "recipe.yaml").is_file()  # dlc status sees it starting
    assert "run_started" in (tmp_path / "new" / "events.jsonl").read_text()
    new.close()

    before = snapshot(run_copy)
    old, resume = RunDir.prepare(load_recipe(TINY, train_overrides(corpus, run_copy)), fresh=False)
    old.event(run_started(run_copy))
    # Held until the engine has started; only the storage's marker is new (learners check they see it),
    # and a refused start puts it back.
    changed = {k for k in snapshot(run_copy).keys() | before.keys() if snapshot(run_copy).get(k) != before.get(k)}
    assert resume and changed == {"storage.json"}
    old.abandon()
    assert snapshot(run_copy) == before
    old.begin()
    assert (run_copy / "events.jsonl").read_text().splitlines()[-1].startswith('{"t"')
    assert '"kind": "run_started"' in (run_copy / "events.jsonl").read_text().splitlines()[-1]
    old.close()


def test_fresh_clears_everything_an_earlier_run_wrote(run_copy, corpus):
    from dlc.run.rundir import RunDir

    earlier = ("tensorboard/events.out.tfevents.1", "wandb/debug.log", "mlflow/mlflow.db", "trackers.json")
    for name in (*earlier, "chaos.jsonl", "control.jsonl", "keep-me.txt"):
        (run_copy / name).parent.mkdir(parents=True, exist_ok=True)
        (run_copy / name).write_text("an earlier run's\n")
    rundir, resume = RunDir.prepare(load_recipe(TINY, train_overrides(corpus, run_copy)), fresh=True)
    rundir.close()
    # Only what the new run wrote (its recipe, empty logs) and what is not a run's are left.
    assert not resume and sorted(p.name for p in run_copy.iterdir()) == [
        "events.jsonl",
        "keep-me.txt",
        "metrics.jsonl",
        "recipe.yaml",
        "storage.json",  # the new start's marker
    ]
    assert (run_copy / "events.jsonl").read_text() == ""


def test_a_resume_refused_while_the_engine_starts_writes_nothing(run_copy, corpus, monkeypatch):
    """A learner that cannot read its checkpoint refuses the resume from inside its actor, after the
    cluster has started: the events, the TensorBoard file and the recipe must not change either."""
    import dlc.engine.cluster
    from dlc.engine.driver import Driver

    def unreadable(self: Driver) -> None:
        raise UserError("checkpoint learner-0/6 is unreadable (ValueError: garbage): pass --fresh to start over")

    node = {"node_id": "n0", "ip": "127.0.0.1", "host": "h", "head": True, "resources": {"CPU": 64.0}, "labels": {}}
    started = {"address": "embedded", "nodes": [node], "driver_node": "n0"}
    monkeypatch.setattr(dlc.engine.cluster, "start_cluster", lambda cfg, cpus, env, metrics_port: started)
    monkeypatch.setattr(dlc.engine.cluster, "nodes", lambda: [node])
    monkeypatch.setattr(dlc.engine.cluster, "stop_cluster", lambda: None)
    monkeypatch.setattr(Driver, "_launch", unreadable)
    before = snapshot(run_copy)
    assert_user_error(invoke("train", str(TINY), *train_overrides(corpus, run_copy)), "is unreadable", "--fresh")
    assert snapshot(run_copy) == before


# -- the syncer's journal, read by a restarted syncer -------------------------------------------------------


def test_a_journal_cut_anywhere_in_its_last_record_keeps_every_record_before_it(finished_run, tmp_path):
    from dlc.engine.syncer.journal import read_records

    whole = journal_records(finished_run)
    path = tmp_path / "journal.pkl"
    last_start = len(b"".join(whole[:-1]))
    data = b"".join(whole)
    for cut in (last_start + 1, last_start + 2, last_start + 40, len(data) - 1):
        path.write_bytes(data[:cut])
        assert len(read_records(path)) == len(whole) - 1
    path.write_bytes(data)
    assert len(read_records(path)) == len(whole)


def test_a_syncer_restarted_after_a_death_mid_write_appends_after_whole_records(finished_run, tmp_path):
    """The cut-short record is dropped from the file, not only skipped: a second restart must not
    find it in the middle, with the rounds closed since behind it."""
    from dlc.engine.syncer.journal import Journal, read_records

    whole = journal_records(finished_run)
    path = tmp_path / "syncer-journal.pkl"
    path.write_bytes(b"".join(whole)[:-1000])  # the syncer died writing its second round
    restarted = Journal(path)
    # The snapshot the checkpoint started the journal with (no fragment), then the first round.
    assert [r.get("fragment") for r in restarted.records()] == [None, 1]
    assert path.stat().st_size == len(b"".join(whole)) - 1000  # reading changes nothing
    restarted.write(pickle.loads(whole[2]))  # the restarted syncer closes that round again
    restarted.close()
    assert [r.get("fragment") for r in read_records(path)] == [None, 1, 2]


def test_the_restarted_syncer_refuses_a_record_that_does_not_fit(finished_run, tmp_path):
    """The syncer's own check, for a journal damaged after the driver looked."""
    from dlc.engine.syncer.actor import SyncerWorker

    run = Path(shutil.copytree(finished_run, tmp_path / "run"))
    rewrite_record(run, fragment=99)
    recipe = load_recipe(run / "recipe.yaml")
    worker = SyncerWorker(recipe.model_dump(mode="json"), str(run), marked_storage(run))
    try:
        with pytest.raises(UserError, match="this run has 16 fragments"):
            worker.restore()
    finally:
        worker.close()


# -- the other commands' options ------------------------------------------------------------------------------

# (case, arguments given a scratch directory holding a regular file `f` and a directory `d`, fragments)
COMMAND_CASES: list[tuple[str, Callable[[Path], list[str]], list[str]]] = [
    ("simulate-seed-negative", lambda tmp: ["simulate", "--seed", "-1"], ["--seed=-1"]),
    ("simulate-chips-infinite", lambda tmp: ["simulate", "--chips", "1e400"], ["--chips='1e400'", "too large"]),
    ("simulate-sweep-chips-infinite", lambda tmp: ["simulate", "--sweep", "chips=1e400"], ["too large"]),
    ("simulate-horizon-infinite", lambda tmp: ["simulate", "--horizon-days", "inf"], ["--horizon-days=inf", "finite"]),
    ("simulate-horizon-beyond-memory", lambda tmp: ["simulate", "--horizon-days", "1e9"], ["of memory", "--horizon"]),
    ("simulate-pause-beyond-memory", lambda tmp: ["simulate", "--pause-on-failure-s", "1e20"], ["of memory"]),
    ("simulate-restart-infinite", lambda tmp: ["simulate", "--dp-restart-s", "inf"], ["--dp-restart-s=inf"]),
    (
        "simulate-chips-beyond-memory",
        lambda tmp: ["simulate", "--chips", "1e12", "-M", "1000", "--horizon-days", "0.001"],
        ["of memory", "--chips"],
    ),
    ("bandwidth-params-infinite", lambda tmp: ["bandwidth", "--params", "1e400"], ["--params='1e400'", "too large"]),
    ("bandwidth-params-absurd", lambda tmp: ["bandwidth", "--params", "1e20"], ["--params=1e20", "more than 100T"]),
    (
        "bandwidth-recipe-absurd",
        lambda tmp: ["bandwidth", "--recipe", str(recipe_file(tmp, "model: {width: 10000000, num_layers: 10}"))],
        ["parameters, more than 100T", "model.width (10000000)"],
    ),
    (  # counted from one block and two, in seconds, not traced block by block for hours
        "bandwidth-recipe-absurdly-deep",
        lambda tmp: ["bandwidth", "--recipe", str(recipe_file(tmp, "model: {num_layers: 10000000000}"))],
        ["parameters, more than 100T", "model.num_layers (10000000000)"],
    ),
    ("bandwidth-step-time-infinite", lambda tmp: ["bandwidth", "--step-time-s", "inf"], ["--step-time-s=inf"]),
    ("bandwidth-fragments-beyond-memory", lambda tmp: ["bandwidth", "--fragments", "1000000000"], ["of memory"]),
    ("bandwidth-buckets-beyond-memory", lambda tmp: ["bandwidth", "--buckets", "10000000000"], ["--buckets="]),
    (
        "bandwidth-utilisation-unreachable",
        lambda tmp: ["bandwidth", "--utilisation", "0.999999999999999"],
        ["no link under", "lower --utilisation"],
    ),
    ("bandwidth-tau-vanishing", lambda tmp: ["bandwidth", "--tau", "1e-300"], ["no finite bandwidth", "--tau"]),
    ("bandwidth-recipe-a-folder", lambda tmp: ["bandwidth", "--recipe", str(tmp / "d")], ["is a directory"]),
    (
        "bandwidth-recipe-fragments-beyond-tensors",
        lambda tmp: ["bandwidth", "--recipe", str(recipe_file(tmp, "syncer: {fragments: 5000}"))],
        ["syncer.fragments=5000"],
    ),
    ("report-out-under-a-file", lambda tmp: ["report", "RUN", "--out", str(tmp / "f" / "x")], ["--out", "cannot"]),
    ("report-out-in-procfs", lambda tmp: ["report", "RUN", "--out", "/proc/self/dlc-report"], ["--out", "cannot"]),
    ("chaos-kill-rate-infinite", lambda tmp: ["chaos", "RUN", "--kill-rate", "inf"], ["--kill-rate=inf", "finite"]),
    ("chaos-plan-a-folder", lambda tmp: ["chaos", "--plan", str(tmp / "d")], ["--plan", "is a directory"]),
    ("train-chaos-a-folder", lambda tmp: ["train", str(TINY), "--chaos", str(tmp / "d")], ["is a directory"]),
]


def recipe_file(tmp: Path, text: str) -> Path:
    path = tmp / "recipe.yaml"
    path.write_text(text + "\n")
    return path


@pytest.mark.parametrize(("make", "fragments"), [c[1:] for c in COMMAND_CASES], ids=[c[0] for c in COMMAND_CASES])
def test_every_command_refuses_bad_options_in_one_line(make, fragments, tmp_path, finished_run, monkeypatch):
    (tmp_path / "f").write_text("a file\n")
    (tmp_path / "d").mkdir()
    args = [str(finished_run) if a == "RUN" else a for a in make(tmp_path)]  # report reads the finished run
    result = invoke(*args)
    assert_user_error(result, *fragments)
    assert result.stderr.count("\n") == 1  # one line


def test_bandwidth_of_a_recipe_too_large_to_build_allocates_nothing(tmp_path):
    """200B parameters: the shapes come from the recipe, so the command answers at once."""
    recipe = recipe_file(tmp_path, "model: {width: 65536, num_layers: 4, num_heads: 64}")
    result = invoke("bandwidth", "--recipe", str(recipe), "--json")
    assert result.exit_code == 0, result.stderr
    import json

    traffic = json.loads(result.stdout)
    # 4 blocks of 12 d^2 + 9 d (attention 4 d^2, MLP 8 d^2 + 5 d, two norms 4 d), embeddings of
    # 256 bytes and 128 positions, a final norm of 2 d, with d = 65536
    d = 65536
    assert traffic["params"] == 4 * (12 * d * d + 9 * d) + (256 + 128) * d + 2 * d
    assert traffic["params"] > 2e11


def test_the_memory_check_counts_by_hand(corpus):
    """The footprint of tiny: what the refusal message quotes."""
    from dlc.core.abstract import activation_bytes, param_count
    from dlc.plan.memory import PROCESS_BYTES, PUSH_BUFFERS, check_fits, footprint

    recipe = load_recipe(TINY, train_overrides(corpus, "unused"))
    n = 219_520  # README: tiny's parameters
    assert param_count(recipe.model) == n
    need = footprint(recipe)
    # Weights and AdamW's two moments, float32; two step counters; one lr factor for each of 44 tensors.
    assert need.learner_state == 3 * 4 * n + 2 * 4 + 4 * 44
    assert need.learner_activations == 16 * activation_bytes(recipe.model, 64)  # batch 16 of 64 tokens
    # the forward pass keeps more than the parameters for every token: the residual stream and the
    # attention's scores of every block, and the logits
    assert need.learner_activations > 16 * 64 * 4 * (4 * 64 + 256)
    assert need.learner_fragments == 4 * (recipe.syncer.fragments + PUSH_BUFFERS) * need.padded_fragment
    assert need.learner_processes == 2 and need.total > 2 * PROCESS_BYTES
    assert check_fits(recipe, available=need.total) == need
    with pytest.raises(UserError, match=r"needs about .* of memory and this machine has 1\.0 GiB available"):
        check_fits(recipe, available=GIB)
