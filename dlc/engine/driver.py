"""`dlc train`: start the syncer and learners on Ray, watch them, write the run directory.

The driver never trains. It polls every actor without waiting on any one of them (a frozen
process never answers), writes what they report to the run directory, asks for evaluations of
the global model, and decides when the run ends.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from dlc.config.schema import Recipe
from dlc.core.data import Split, load_corpus, split_corpus
from dlc.observe.console import ProgressView
from dlc.run.rundir import SUMMARY_FILE, RunDir

EXIT_INTERRUPTED = 130
TICK_S = 0.2


class StopRequest:
    """Turns the first Ctrl-C into a request to stop cleanly; a second one interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopRequest:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


@dataclass
class Outcome:
    """What `run` returns to the CLI."""

    status: str  # completed | interrupted | failed
    summary: dict[str, Any]
    run_dir: str
    exit_code: int = 0


class Budget:
    """The recipe's stop condition and how far along it the run is (0..1)."""

    def __init__(self, recipe: Recipe) -> None:
        self.max_steps = recipe.run.max_steps
        self.max_tokens = recipe.run.max_tokens
        self.max_wall_s = recipe.run.max_wall_s

    def progress(self, step: float, tokens: int, wall_s: float) -> float:
        limits = ((step, self.max_steps), (tokens, self.max_tokens), (wall_s, self.max_wall_s))
        return min(1.0, max(value / limit for value, limit in limits if limit))

    def driver_limit_reached(self, tokens: int, wall_s: float) -> bool:
        return bool((self.max_tokens and tokens >= self.max_tokens) or (self.max_wall_s and wall_s >= self.max_wall_s))

    def eta_s(self, step: float, tokens: int, wall_s: float, tokens_per_s: float, steps_per_s: float) -> float | None:
        etas = []
        if self.max_tokens and tokens_per_s > 0:
            etas.append((self.max_tokens - tokens) / tokens_per_s)
        if self.max_steps and steps_per_s > 0:
            etas.append((self.max_steps - step) / steps_per_s)
        if self.max_wall_s:
            etas.append(self.max_wall_s - wall_s)
        return max(0.0, min(etas)) if etas else None


def run(recipe: Recipe, fresh: bool = False, view: ProgressView | None = None, chaos_plan: Any = None) -> Outcome:
    """Train the recipe until its stop condition, Ctrl-C, or an error; inject `chaos_plan` alongside."""
    view = view or ProgressView(log_every_steps=recipe.run.log_every_steps)
    corpus = load_corpus(recipe.data)
    min_bytes = max(recipe.learners.batch_size_of(i) for i in range(recipe.learners.count))
    streams = recipe.learners.count + recipe.learners.join_streams
    split = split_corpus(corpus, recipe.data, streams, recipe.run.seed, min_bytes * (recipe.learners.seq_len + 1) * 2)
    rundir, resume = RunDir.prepare(recipe, fresh)
    rundir.event(
        "run_started",
        run_dir=str(rundir.path),
        corpus_bytes=len(corpus),
        eval_bytes=len(split.eval_bytes),
        learners=recipe.learners.count,
        algorithm=recipe.algorithm,
        resumed=resume,
    )
    try:
        return Driver(recipe, rundir, resume, split, view, chaos_plan).run()
    finally:
        rundir.close()


class Driver:
    def __init__(
        self, recipe: Recipe, rundir: RunDir, resume: bool, split: Split, view: ProgressView, chaos_plan: Any = None
    ) -> None:
        self.recipe = recipe
        self.chaos_plan = chaos_plan
        self.rundir = rundir
        self.resume = resume
        self.split = split
        self.view = view
        self.budget = Budget(recipe)
        self.started = time.time()
        self.started_monotonic = time.monotonic()
        from dlc.observe.tensorboard import TensorBoardWriter

        self.tb = TensorBoardWriter(rundir.path)
        self.prior_wall_s = 0.0
        self.eval_initial: float | None = None
        self.eval_loss: float | None = None
        self.eval_bpb: float | None = None
        self._rejected_by_learner: dict[int, int] = {}
        self.syncer_view: dict[str, Any] = {}
        self.failure: str | None = None
        self._syncer_poll: Any = None
        self._eval_ref: Any = None
        self._eval_step = 0.0
        self._next_eval = recipe.eval.every_steps
        self._rates: list[tuple[float, int, float]] = []
        from dlc.algo.registry import get_algorithm

        self.has_global_model = get_algorithm(recipe.algorithm).global_model
        if resume:
            previous = _read_json(rundir.path / SUMMARY_FILE)
            self.prior_wall_s = float(previous.get("wall_s", 0.0))
            self.eval_initial = previous.get("eval_loss_initial")

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> Outcome:
        from dlc.engine import actors as engine

        learners = self.recipe.learners
        # Learners, the syncer, and room for the learners chaos may add (each joiner reserves as
        # much as a learner): otherwise a joiner waits for CPUs and takes a restarting syncer's.
        cpus = (
            sum(_learner_cpus(self.recipe, i) for i in range(learners.count))
            + learners.join_streams * learners.num_cpus
            + self.recipe.syncer.num_cpus
        )
        cluster = engine.start_cluster(self.recipe.cluster, cpus)
        self.rundir.event("cluster_started", **cluster)
        try:
            self._launch(engine)
        except BaseException as exc:
            # Nothing has trained yet: leave the run directory's summary and status as they were.
            engine.stop_cluster()
            raise _user_error_inside(exc) from None
        status, exit_code = "failed", 1
        self.rundir.write_status(self._snapshot("running"))  # chaos acts on a run it sees running
        chaos = self._start_chaos()
        try:
            with StopRequest() as stop, self.view:
                self._watch(stop)
                if chaos is not None:
                    chaos[1].set()
                    report = chaos[0].report
                    self.rundir.event(
                        "chaos_finished",
                        fired={k.name.lower(): v for k, v in report.fired.items()},
                        refused={k.name.lower(): v for k, v in report.refused.items()},
                        stopped_because=report.stopped_because,
                    )
                status, exit_code = ("interrupted", EXIT_INTERRUPTED) if stop.requested else ("completed", 0)
                if self.failure:
                    status, exit_code = "failed", 1
                self.view.message(f"{status}: stopping learners, merging what they have not pushed")
                self._finish()
        except KeyboardInterrupt:
            status, exit_code = "interrupted", EXIT_INTERRUPTED
        finally:
            summary = self._summary(status)
            self.rundir.write_status(self._snapshot(status))
            self.rundir.write_summary(summary)
            self.rundir.event("run_finished", status=status, tokens=summary["tokens_total"])
            self.tb.close()
            engine.stop_cluster()
        if self.failure:
            self.view.message(self.failure)
        return Outcome(status, summary, str(self.rundir.path), exit_code)

    def _start_chaos(self) -> tuple[Any, Any] | None:
        """Run the chaos plan in a thread, acting on this run through its run directory."""
        if self.chaos_plan is None:
            return None
        import threading

        from chaos import Controller, RunDirTarget

        stop = threading.Event()
        controller = Controller(
            self.chaos_plan,
            RunDirTarget(self.rundir.path),
            stop=stop,
            on_record=lambda e: self.view.message(
                f"chaos: {e.get('phase')} {e.get('fault')} {e.get('target', '')} {e.get('detail', '')}".rstrip()
            ),
        )
        thread = threading.Thread(target=controller.run, name="chaos", daemon=True)
        thread.start()
        self.rundir.event("chaos_started", plan=self.chaos_plan.summary())
        return controller, stop

    def _launch(self, engine: Any) -> None:
        import ray

        recipe, rundir = self.recipe, self.rundir
        recipe_json = recipe.model_dump(mode="json")
        run_dir = str(rundir.path)
        self.syncer = engine.SyncerActor.options(num_cpus=recipe.syncer.num_cpus).remote(recipe_json, run_dir)
        restored = ray.get(self.syncer.restore.remote()) if self.resume else None
        if restored:
            rundir.event("syncer_restored", **restored)
        self.evaluator = engine.EvaluatorActor.options(num_cpus=0).remote(recipe_json, ray.put(self.split.eval_bytes))
        from dlc.engine.supervisor import Supervisor

        def make_learner(i: int, stream: Any, incarnation: int = 0) -> Any:
            options: dict[str, Any] = {"num_cpus": _learner_cpus(recipe, i)}
            gpus = next(
                (o.num_gpus for o in recipe.learners.overrides if o.index == i and o.num_gpus is not None),
                recipe.learners.num_gpus,
            )
            if gpus:
                options["num_gpus"] = gpus
            return engine.LearnerActor.options(**options).remote(
                recipe_json, i, stream, run_dir, self.syncer, incarnation
            )

        streams = {i: ray.put(stream) for i, stream in enumerate(self.split.streams)}
        spares = [streams[i] for i in range(recipe.learners.count, len(streams))]
        self.supervisor = Supervisor(recipe, rundir, engine, self.syncer, make_learner, spares)
        self.learners = {i: make_learner(i, streams[i]) for i in range(recipe.learners.count)}
        if self.resume:
            for i, where in enumerate(ray.get([h.restore.remote() for h in self.learners.values()])):
                rundir.event("run_resumed", learner=i, **where)
                self.view.message(
                    f"learner {i} resumed at step {where['step']} (data position {where['data_position']})"
                )
        ray.get([self.syncer.register.remote(i, h) for i, h in self.learners.items()])
        if self.eval_initial is None and self.has_global_model:
            self.eval_initial, _ = ray.get(self.evaluator.evaluate.remote(self.syncer.global_params.remote()))
            self._metric(kind="eval", step=0, tokens=0, eval_loss=self.eval_initial, eval_bpb=_bpb(self.eval_initial))
        fragments, versions = ray.get(self.syncer.global_fragments.remote()) if self.resume else (None, None)
        ray.get(self.syncer.start.remote())
        pids = ray.get([h.start.remote(fragments, versions) for h in self.learners.values()])
        for i, pid in enumerate(pids):
            rundir.event("learner_started", learner=i, pid=pid)
            self.supervisor.add(i, self.learners[i], streams[i], pid, since=self.started_monotonic)

    def _watch(self, stop: StopRequest) -> None:
        last_status = 0.0
        while not stop.requested and not self.failure:
            time.sleep(TICK_S)
            self._poll_all()
            if self.supervisor.failure:
                self.failure = self.supervisor.failure
            self._maybe_evaluate()
            tokens = self._tokens()
            if time.time() - last_status >= self.recipe.run.status_interval_s:
                last_status = time.time()
                snap = self._snapshot("running")
                self.rundir.write_status(snap)
                self.view.update(snap)
                if snap["goodput"] is not None:  # goodput over time, for dlc report
                    self._metric(kind="goodput", step=snap["step"], tokens=snap["tokens"], goodput=snap["goodput"])
            states = [self.supervisor.state_of(i) for i in self.supervisor.slots]
            done = all(state in ("finished", "failed", "left") for state in states)
            # Learners stop themselves at run.max_steps (and report it); the driver enforces the rest.
            if done or self.budget.driver_limit_reached(tokens, self.wall_s()):
                return

    def _finish(self) -> None:
        import ray

        self.supervisor.file_time()
        for i, final in self.supervisor.stop_all(timeout_s=120, absorb=self._absorb_learner):
            if final is None:
                self.rundir.event("learner_stopped", learner=i, reason="unresponsive_at_end")
                continue
            self._absorb_learner(i, final)
            self.supervisor.slots[i].view = final["snapshot"]
            self.rundir.event("learner_stopped", learner=i, step=final["snapshot"]["step"], reason="run_end")
        if self._syncer_poll is not None:  # it drained events already: absorb them, or they are lost
            ref, self._syncer_poll = self._syncer_poll, None
            with contextlib.suppress(ray.exceptions.RayError):
                self._absorb_syncer(ray.get(ref, timeout=30))
        self._absorb_syncer(ray.get(self.syncer.finish.remote(), timeout=300))
        if self._eval_ref is not None:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(self._eval_ref)
        if not self.has_global_model:
            return
        params = self.syncer.global_params.remote()
        self.eval_loss, self.eval_bpb = ray.get(self.evaluator.evaluate.remote(params), timeout=300)
        self._metric(
            kind="eval",
            step=round(self._mean_step(), 1),
            tokens=self._tokens(),
            eval_loss=self.eval_loss,
            eval_bpb=self.eval_bpb,
            final=True,
        )

    # -- polling -----------------------------------------------------------------------------

    def _poll_all(self) -> None:
        import ray

        self.supervisor.tick(self._absorb_learner)
        if self._syncer_poll is None:
            self._syncer_poll = self.syncer.poll.remote()
        ready, _ = ray.wait([self._syncer_poll], timeout=0)
        if ready:
            ref, self._syncer_poll = self._syncer_poll, None
            try:
                self._absorb_syncer(ray.get(ref))
            except ray.exceptions.RayActorError:
                self._restart_syncer()

    def _restart_syncer(self) -> None:
        """Start a new syncer from the checkpoint and journal; learners re-send what it never merged."""
        import ray

        from dlc.engine import actors as engine

        died = time.time()
        chaos = self.supervisor.chaos
        self.rundir.event("syncer_died")
        chaos.outcome("kill_syncer", None, "detected", after_s=chaos.since("kill_syncer", None))
        recipe_json = self.recipe.model_dump(mode="json")
        syncer = engine.SyncerActor.options(num_cpus=self.recipe.syncer.num_cpus).remote(
            recipe_json, str(self.rundir.path)
        )
        restored = ray.get(syncer.restore.remote(), timeout=300) or {}
        live = self.supervisor.live()
        ray.get([syncer.register.remote(i, h) for i, h in live.items()], timeout=60)
        ray.get(syncer.start.remote(), timeout=60)
        self.syncer = self.supervisor.syncer = syncer
        refs = [h.set_syncer.remote(syncer) for h in live.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=30)  # a frozen learner re-sends when it thaws
        resent = sum(ray.get(r) for r in ready)
        after = round(time.time() - died, 3)
        self.supervisor.forgive_silence()  # the driver was busy here, not the learners silent
        self.rundir.event("syncer_restarted", after_s=after, resent_pushes=resent, **restored)
        chaos.outcome(
            "kill_syncer",
            None,
            "restarted",
            after_s=chaos.since("kill_syncer", None),
            resent_pushes=resent,
            versions=restored.get("versions"),
        )
        self.view.message(f"syncer restarted in {after:.1f} s; learners re-sent {resent} unacknowledged pushes")

    def _absorb_learner(self, index: int, result: dict[str, Any]) -> None:
        for event in result["events"]:
            self.rundir.event(**event)
        for metric in result["metrics"]:
            self._metric(**metric)

    def _absorb_syncer(self, result: dict[str, Any]) -> None:
        for event in result["events"]:
            self.rundir.event(**event)
            if event["kind"] == "push_rejected":
                self._rejected_by_learner[event["learner"]] = self._rejected_by_learner.get(event["learner"], 0) + 1
        self.supervisor.note_syncer_events(result["events"])
        self.syncer_view = result["status"]
        if result["error"]:
            self.failure = f"syncer failed:\n{result['error']}"

    def _maybe_evaluate(self) -> None:
        import ray

        if not self.has_global_model:
            return
        if self._eval_ref is not None:
            ready, _ = ray.wait([self._eval_ref], timeout=0)
            if not ready:
                return
            ref, self._eval_ref = self._eval_ref, None
            try:
                self.eval_loss, self.eval_bpb = ray.get(ref)
            except ray.exceptions.RayError:  # the syncer died while serving the parameters
                return
            self._metric(
                kind="eval",
                step=round(self._eval_step, 1),
                tokens=self._eval_tokens,
                eval_loss=self.eval_loss,
                eval_bpb=self.eval_bpb,
            )
        step = self._mean_step()
        if step >= self._next_eval:
            self._next_eval = (int(step) // self.recipe.eval.every_steps + 1) * self.recipe.eval.every_steps
            self._eval_step, self._eval_tokens = step, self._tokens()
            self._eval_ref = self.evaluator.evaluate.remote(self.syncer.global_params.remote())

    # -- views -------------------------------------------------------------------------------

    def wall_s(self) -> float:
        return self.prior_wall_s + time.time() - self.started

    def _goodput_summary(self) -> dict[str, Any]:
        if not hasattr(self, "supervisor"):
            return {"goodput": None, "badput": {}}
        ledger = self.supervisor.ledger.summary()
        return {
            "goodput": ledger["goodput"],
            "badput": ledger["badput_s"],
            "goodput_by_learner": ledger["learners"],
            "restarts": dict(self.supervisor.restarts),
        }

    def _metric(self, **fields: Any) -> None:
        """One metrics.jsonl line, mirrored to TensorBoard."""
        self.rundir.metric(**fields)
        self.tb.metric(fields)

    def _rows(self) -> list[dict[str, Any]]:
        return self.supervisor.rows() if hasattr(self, "supervisor") else []

    def _mean_step(self) -> float:
        steps = [v.get("step", 0) for v in self._rows() if v["state"] != "left"]
        return sum(steps) / len(steps) if steps else 0.0

    def _tokens(self) -> int:
        # Tokens trained in this run: a restarted learner copies its peer's counter, so sum the
        # learners' own counters only while they were alive (the ledger of tokens is the syncer's).
        return sum(v.get("tokens", 0) for v in self._rows())

    def _snapshot(self, run_state: str) -> dict[str, Any]:
        step, tokens, wall = self._mean_step(), self._tokens(), self.wall_s()
        rows = self._rows()
        ledger = self._goodput_summary()
        tokens_per_s = sum(v.get("tokens_per_s", 0.0) for v in rows if v["state"] in ("training", "slow"))
        now = time.monotonic()
        self._rates = [r for r in self._rates if now - r[0] < 10.0] + [(now, tokens, step)]
        t0, _, s0 = self._rates[0]
        steps_per_s = (step - s0) / (now - t0) if now > t0 else 0.0
        ages = self.syncer_view.get("last_push_age_s", {})
        learners = [
            {**v, "last_push_age_s": ages.get(str(v["id"])), "rejected": self._rejected_by_learner.get(v["id"], 0)}
            for v in rows
        ]

        losses = [v["loss"] for v in learners if v.get("loss") is not None]
        return {
            "run": self.recipe.run.name,
            "run_dir": str(self.rundir.path),
            "algorithm": self.recipe.algorithm,
            "state": run_state,
            "updated_at": round(time.time(), 3),
            "elapsed_s": round(wall, 3),
            "progress": round(self.budget.progress(step, tokens, wall), 4),
            "eta_s": _round(self.budget.eta_s(step, tokens, wall, tokens_per_s, steps_per_s)),
            "step": round(step, 1),
            "tokens": tokens,
            "tokens_per_s": round(tokens_per_s, 1),
            "train_loss": sum(losses) / len(losses) if losses else None,
            "eval_loss": self.eval_loss,
            "eval_bpb": self.eval_bpb,
            "eval_loss_initial": self.eval_initial,
            "learners": learners,
            "syncer": self.syncer_view,
            "goodput": ledger["goodput"],
            "badput": ledger["badput"],
        }

    def _summary(self, status: str) -> dict[str, Any]:
        sync = self.syncer_view
        wall = self.wall_s()
        tokens = self._tokens()
        return {
            "status": status,
            "run": self.recipe.run.name,
            "run_dir": str(self.rundir.path),
            "algorithm": self.recipe.algorithm,
            "wall_s": round(wall, 3),
            "steps": round(self._mean_step(), 1),
            "tokens_total": tokens,
            "tokens_per_s": round(tokens / (time.time() - self.started), 1),
            "eval_loss_initial": self.eval_initial,
            "eval_loss_final": self.eval_loss,
            "eval_bpb_final": self.eval_bpb,
            "learners": [
                {k: v.get(k) for k in _LEARNER_SUMMARY_KEYS}
                | {"contributed": sync.get("contributed", {}).get(str(v["id"]), 0)}
                for v in self._rows()
            ],
            **self._goodput_summary(),
            "rounds": sync.get("rounds_closed", 0),
            "versions": sync.get("versions", []),
            "mean_contributors": sync.get("mean_contributors", 0.0),
            "bytes_up": sync.get("bytes_up", 0),
            "bytes_down": sync.get("bytes_down", 0),
            "pushes_accepted": sync.get("pushes_accepted", 0),
            "pushes_rejected": sync.get("rejections", {}),
            "error": self.failure,
        }


_LEARNER_SUMMARY_KEYS = (
    "id",
    "state",
    "restarts",
    "goodput",
    "step",
    "tokens",
    "data_position",
    "pushes",
    "adopted",
    "bytes_sent",
    "steady_tokens_per_s",
)


def _user_error_inside(exc: BaseException) -> BaseException:
    """A UserError raised inside an actor reaches the driver wrapped by Ray: unwrap it."""
    from dlc.errors import UserError

    cause = getattr(exc, "cause", None)
    return UserError(str(cause)) if isinstance(cause, UserError) else exc


def _learner_cpus(recipe: Recipe, index: int) -> float:
    for o in recipe.learners.overrides:
        if o.index == index and o.num_cpus is not None:
            return o.num_cpus
    return recipe.learners.num_cpus


def _bpb(loss: float) -> float:
    import math

    return loss / math.log(2)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _read_json(path: Any) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
