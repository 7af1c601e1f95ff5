"""`dlc train`: start the syncer and learners on Ray, watch them, write the run directory.

The driver never trains. It polls every actor without waiting on any one of them (a frozen
process never answers), writes what they report to the run directory, asks for evaluations of
the global model, and decides when the run ends. What it hears from the syncer is kept by
`syncer_reports`; the learners are watched, restarted and accounted for by the `supervisor`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dlc.config.budget import Budget
from dlc.config.schema import Recipe
from dlc.data.plan import DataPlan
from dlc.engine.interrupts import Interrupts, exit_code_of
from dlc.engine.metrics import RayMetricsTracker
from dlc.engine.supervision.control import start_chaos
from dlc.engine.syncer.evaluations import Evaluations
from dlc.engine.syncer.reports import SyncerReports
from dlc.observe.console import ProgressView
from dlc.observe.snapshot import RunView, Snapshots
from dlc.run import events
from dlc.run.files import GONE_STATES, STATUS_FILE, SUMMARY_FILE, read_json
from dlc.run.rundir import RunDir

TICK_S = 0.2
AGENT_WAIT_S = 60.0  # at most, for the node agents before training starts
AFTER_KILL_S = 0.03  # the next tick, after chaos's agent sent a SIGKILL (Ray sees the death in ~15 ms)


@dataclass
class Outcome:
    """What `run` returns to the CLI."""

    status: str  # completed | interrupted | failed
    summary: dict[str, Any]
    run_dir: str  # the run directory on this machine
    exit_code: int = 0
    resume_dir: str = ""  # what run.dir must be to resume: the run directory, or the URL of its storage


class Driver:
    def __init__(
        self,
        recipe: Recipe,
        rundir: RunDir,
        resume: bool,
        data: DataPlan,
        view: ProgressView,
        chaos_plan: Any = None,
        cluster_info: dict[str, Any] | None = None,
    ) -> None:
        """`cluster_info`: what `cluster.start_cluster` returned (the cluster is started before the run
        directory is written, so a refused start changes nothing there)."""
        self.recipe = recipe
        self.cluster_info = cluster_info or {}
        self.chaos_plan = chaos_plan
        self.rundir = rundir
        self.resume = resume
        self.data = data
        self.view = view
        self.budget = Budget(recipe)
        self.started = time.time()
        self.snapshots = Snapshots(recipe, str(rundir.path), self.budget, self.started)
        self.started_monotonic = time.monotonic()
        self.trackers: Any = None  # TensorBoard, W&B, MLflow: opened once the run has started
        self.prior_wall_s = 0.0
        self.failure: str | None = None
        self.syncer_reports = SyncerReports(rundir, resume)
        from dlc.algo import get_algorithm

        self.has_global_model = get_algorithm(recipe.algorithm).global_model
        initial = None  # the run's first eval loss, kept across resumes
        if resume:
            # The last status the earlier run wrote: also after a hard stop (a lost driver), which
            # writes no summary; the summary of an earlier, clean end is older than it.
            status = read_json(rundir.path / STATUS_FILE) or {}
            summary = read_json(rundir.path / SUMMARY_FILE) or {}
            self.prior_wall_s = float(status.get("elapsed_s", summary.get("wall_s")) or 0.0)
            initial = status.get("eval_loss_initial", summary.get("eval_loss_initial"))
        self.evals = Evaluations(recipe.eval.every_steps, self._metric, initial=initial)

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self, interrupts: Interrupts) -> Outcome:
        """Start, train and end the run; `interrupts` says what Ctrl-C does meanwhile (entered by the caller)."""
        from dlc.engine import cluster, devices

        if not self.cluster_info:  # a caller that did not start it (tests): start it here
            recipe = self.recipe
            self.cluster_info = cluster.start_cluster(
                recipe.cluster, recipe.cpus_reserved(), devices.embedded_env(recipe)
            )
            interrupts.claim()
        self.rundir.event(events.ClusterStarted(**self.cluster_info))
        try:
            self._launch()
            # Every actor has started and restored: only now does the run directory change, so a
            # refused resume (an unreadable checkpoint, another run's syncer) leaves it as it was.
            self.rundir.begin()
            from dlc.observe.trackers import Trackers

            # Every event, metric and status the run directory writes reaches the trackers, from the start on.
            extra = [RayMetricsTracker(self.rundir.path.name)] if self.recipe.metrics.on else []
            self.trackers = Trackers.open(self.recipe, self.rundir.path, self.view.message, extra)
            self.rundir.observe(self.trackers)
        except BaseException as exc:
            # Nothing has trained yet: leave the run directory as it was.
            interrupts.hold()
            self._release()
            self.rundir.abandon()
            cluster.stop_cluster()
            raise _user_error_inside(exc) from None
        status, exit_code = "failed", 1
        self.rundir.write_status(self._snapshot("running"))  # chaos acts on a run it sees running
        chaos = None
        if self.chaos_plan is not None:
            chaos = start_chaos(self.chaos_plan, self.rundir, self.view.message)
        interrupts.training()
        try:
            with self.view:
                self._watch(interrupts)
                if chaos is not None:
                    chaos[1].set()
                    report = chaos[0].report
                    self.rundir.event(
                        events.ChaosFinished(
                            fired={k.name.lower(): v for k, v in report.fired.items()},
                            refused={k.name.lower(): v for k, v in report.refused.items()},
                            stopped_because=report.stopped_because,
                        )
                    )
                ending, code = ("interrupted", interrupts.exit_code) if interrupts.requested else ("completed", 0)
                if self.failure:
                    ending, code = "failed", 1
                self.view.message(f"{ending}: stopping learners, merging what they have not pushed")
                self._finish()
                # Only once everything is merged and saved (the syncer may die while the run ends).
                status, exit_code = ("failed", 1) if self.failure else (ending, code)
        except KeyboardInterrupt as exc:
            status, exit_code = "interrupted", exit_code_of(exc)
        except Exception as exc:  # a UserError from inside an actor (a damaged journal at a restart): one line
            self.failure = self.failure or str(_user_error_inside(exc)).splitlines()[0]
            raise _user_error_inside(exc) from None
        finally:
            interrupts.hold()  # what follows must finish: a Ctrl-C cutting it short leaves Ray's processes behind
            summary = self._summary(status)
            self.rundir.write_status(self._snapshot(status))
            self.rundir.write_summary(summary)
            self.rundir.event(events.RunFinished(status=status, tokens=summary["tokens_total"]))
            self.rundir.observe(None)
            self.trackers.close()
            self._release()
            cluster.stop_cluster()
        if self.failure:
            self.view.message(self.failure)
        storage = self.rundir.storage
        resume_dir = storage.location if storage.is_url else str(self.rundir.path)
        return Outcome(status, summary, str(self.rundir.path), exit_code, resume_dir)

    def _launch(self) -> None:
        import ray

        from dlc.engine.processes import Processes, storage_usable
        from dlc.engine.supervision.supervisor import Supervisor

        recipe, rundir = self.recipe, self.rundir
        driver_node = self.cluster_info.get("driver_node") or ray.get_runtime_context().get_node_id()
        # Each process's device and environment (devices), and the node it runs on (placement).
        self.processes = processes = Processes(recipe, rundir, driver_node)
        # The driver node's agent first: its process starts before the learners' compilation takes the cores.
        processes.agents.on(driver_node)
        self.syncer = processes.syncer()
        syncer_storage = self.syncer.storage_check.remote()  # waited for with the learners' (they start meanwhile)
        restored = None
        if self.resume:
            storage_usable([ray.get(syncer_storage)])
            restored = ray.get(self.syncer.restore.remote())
        if restored:
            rundir.event(events.SyncerRestored(**restored))
        self.evaluator = processes.evaluator(self.data.eval)

        # New processes push to the syncer of the moment: it may have been restarted since the launch.
        def make_learner(i: int, stream: Any, incarnation: int = 0) -> Any:
            return processes.learner(i, stream, self.syncer, incarnation)

        def make_spare(requested_at: float) -> Any:
            return processes.spare(requested_at, self.syncer)

        streams = {i: ray.put(stream) for i, stream in enumerate(self.data.streams)}
        joiners = [streams[i] for i in range(recipe.learners.count, len(streams))]
        self.supervisor = Supervisor(
            recipe,
            rundir,
            self.syncer,
            make_learner,
            joiners,
            make_spare,
            agents=processes.agents,
            syncer_node=driver_node,
            feasible=processes.placement.feasible,
            say=self.view.message,
        )
        self.learners = {i: make_learner(i, streams[i]) for i in range(recipe.learners.count)}
        # A backend that failed to start (no CUDA plugin, GPU memory taken) ends the run here, in one line.
        *device_infos, _ = ray.get(
            [h.device_info.remote() for h in self.learners.values()] + [self.evaluator.device_info.remote()]
        )
        placed = ray.get([h.where.remote() for h in self.learners.values()])
        storage_usable([ray.get(syncer_storage), *(p["storage_error"] for p in placed)])
        for node in {driver_node, *(p["node_id"] for p in placed)}:
            processes.agents.on(node)
        resumed: dict[int, dict[str, Any]] = {}
        if self.resume:
            next_seqs = ray.get(self.syncer.next_seqs.remote())
            restores = [h.restore.remote(next_seqs.get(i, 0)) for i, h in self.learners.items()]
            for i, where in enumerate(ray.get(restores)):
                self.supervisor.restarts[i] = where["incarnation"]  # restarts before the stop count too
                resumed[i] = {"step": where["step"], "data_position": where["data_position"]}
                rundir.event(events.RunResumed(learner=i, **where))
                self.view.message(
                    f"learner {i} resumed at step {where['step']} (data position {where['data_position']})"
                    if where["checkpoint"]
                    else f"learner {i} has no checkpoint in the run directory: it starts from the global model, "
                    "at the start of its data"
                )
        ray.get([self.syncer.register.remote(i, h) for i, h in self.learners.items()])
        if self.has_global_model:
            self.evals.first(self.evaluator, self.syncer.global_params.remote())
        fragments, versions = ray.get(self.syncer.global_fragments.remote()) if self.resume else (None, None)
        if versions is not None:
            self.syncer_reports.restored(versions)
        # Every node's agent answers before anything trains, so chaos's first signal is not held up by
        # a process still starting. One that does not answer in time delays chaos only, not the run.
        for node in processes.agents.unready(AGENT_WAIT_S):
            self.view.message(f"the chaos agent on node {node[:8]} has not started yet: signals to it wait for it")
        ray.get(self.syncer.start.remote())
        pids = ray.get([h.start.remote(fragments, versions) for h in self.learners.values()])
        for i, pid in enumerate(pids):
            rundir.event(
                events.LearnerStarted(
                    learner=i, pid=pid, node=placed[i]["ip"], node_id=placed[i]["node_id"], **device_infos[i]
                )
            )
            self.supervisor.add(i, self.learners[i], streams[i], pid, since=self.started_monotonic)
            # Where a learner that dies before its first report goes on from: its checkpoint's place.
            self.supervisor.slots[i].view.update(resumed.get(i, {}))
        self.supervisor.spares.keep()  # after the learners, which come first for CPUs and compile time

    def _release(self) -> None:
        """Give back the placement group and the node agents (before the cluster goes, if it is ours)."""
        import ray

        if ray.is_initialized() and getattr(self, "processes", None) is not None:
            self.processes.release()

    def _watch(self, interrupts: Interrupts) -> None:
        last_status = 0.0
        while not interrupts.requested and not self.failure:
            time.sleep(AFTER_KILL_S if self.supervisor.signals.take_sent() else TICK_S)
            self._poll_all()
            if self.supervisor.failure:
                self.failure = self.supervisor.failure
            if self.has_global_model:
                self.evals.poll(self._mean_step(), self._tokens(), lambda: self.syncer.global_params.remote())
            tokens = self._tokens()
            if time.time() - last_status >= self.recipe.run.status_interval_s:
                last_status = time.time()
                snap = self._snapshot("running")
                self.rundir.write_status(snap)
                self.view.update(snap)
                if snap["goodput"] is not None:  # goodput over time, for dlc report
                    # The ledger's running totals too: goodput over any window is a difference of them.
                    ledger = self.supervisor.ledger.summary()
                    self._metric(
                        kind="goodput",
                        step=snap["step"],
                        tokens=snap["tokens"],
                        goodput=snap["goodput"],
                        productive_s=ledger["productive_s"],
                        allocated_s=ledger["allocated_s"],
                    )
            states = [self.supervisor.state_of(i) for i in self.supervisor.slots]
            done = all(state in GONE_STATES for state in states)
            # Learners stop themselves at run.max_steps (and report it); the driver enforces the rest.
            if done or self.budget.driver_limit_reached(tokens, self.wall_s()):
                return

    def _finish(self) -> None:
        self.supervisor.file_time()
        for i, final in self.supervisor.stop_all(timeout_s=120, absorb=self._absorb_learner):
            if final is None:
                self.rundir.event(events.LearnerStopped(learner=i, reason="unresponsive_at_end"))
                continue
            self._absorb_learner(i, final)
            self.supervisor.slots[i].view = final["snapshot"]
            self.rundir.event(events.LearnerStopped(learner=i, step=final["snapshot"]["step"], reason="run_end"))
        finished = self.syncer_reports.finish(self.syncer, self.supervisor)
        self.failure = self.syncer_reports.failure or self.failure
        if self.has_global_model:
            self.evals.settle_initial()
        if finished and self.has_global_model:
            self.evals.final(self.syncer.global_params.remote(), self._mean_step(), self._tokens())

    # -- polling -----------------------------------------------------------------------------

    def _poll_all(self) -> None:
        self.supervisor.tick(self._absorb_learner)
        if not self.syncer_reports.poll(self.syncer, self.supervisor):
            # Start a new syncer from the checkpoint and journal; learners re-send what it never merged.
            self.syncer, said = self.supervisor.restart_syncer(self.processes.syncer, self.syncer_reports)
            self.supervisor.catch_up(self._absorb_learner)
            self.view.message(said)
        self.failure = self.syncer_reports.failure or self.failure

    def _absorb_learner(self, index: int, result: dict[str, Any]) -> None:
        for event in result["events"]:
            self.rundir.event(event)
            if isinstance(event, events.ProfileWritten):
                first, last = event.steps
                self.view.message(f"learner {index}: profile of steps {first}-{last} in {event.dir}")
        for metric in result["metrics"]:
            self._metric(**metric)

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
            "spare_s": ledger["spare_s"],
            "goodput_with_spares": ledger["goodput_with_spares"],
            "restarts": dict(self.supervisor.restarts),
        }

    def _metric(self, **fields: Any) -> None:
        """One metrics.jsonl line (the run directory passes it on to the trackers)."""
        self.rundir.metric(**fields)

    def _view(self) -> RunView:
        return RunView(
            wall_s=self.wall_s(),
            step=self._mean_step(),
            tokens=self._tokens(),
            learners=self._rows(),
            goodput=self._goodput_summary(),
            syncer=self.syncer_reports.status,
            rejected=self.syncer_reports.rejected,
            eval_initial=self.evals.initial,
            eval_loss=self.evals.loss,
            eval_bpb=self.evals.bpb,
            spares=self.supervisor.spares.rows() if hasattr(self, "supervisor") else [],
        )

    def _snapshot(self, run_state: str) -> dict[str, Any]:
        return self.snapshots.status(run_state, self._view())

    def _summary(self, status: str) -> dict[str, Any]:
        return self.snapshots.summary(status, self._view(), self.failure)

    def _rows(self) -> list[dict[str, Any]]:
        return self.supervisor.rows() if hasattr(self, "supervisor") else []

    def _mean_step(self) -> float:
        steps = [v.get("step", 0) for v in self._rows() if v["state"] != "left"]
        return sum(steps) / len(steps) if steps else 0.0

    def _tokens(self) -> int:
        # Tokens trained in this run: a restarted learner copies its peer's counter, so sum the
        # learners' own counters only while they were alive (the ledger of tokens is the syncer's).
        return sum(v.get("tokens", 0) for v in self._rows())


def _user_error_inside(exc: BaseException) -> BaseException:
    """A UserError raised inside an actor reaches the driver wrapped by Ray: unwrap it."""
    from dlc.errors import UserError

    cause = getattr(exc, "cause", None)
    return UserError(str(cause)) if isinstance(cause, UserError) else exc
