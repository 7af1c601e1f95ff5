"""The step profiler: which of a learner's steps it traces, with JAX's real profiler."""

import jax
import jax.numpy as jnp

from dlc.core.profiler import StepProfiler


def run(profiler: StepProfiler, start: int, stop: int) -> list[int]:
    """Step a jitted function from step `start` to `stop` as the learner's loop does; the steps traced."""
    f = jax.jit(lambda x: (x @ x).sum())
    x = jnp.ones((8, 8))
    traced = []
    for step in range(start, stop):
        profiler.tick(step)
        if profiler.active:
            traced.append(step + 1)  # the step this iteration finishes
        f(x).block_until_ready()
    profiler.tick(stop)
    profiler.close()
    return traced


def test_traces_the_steps_named_and_writes_tensorboards_and_perfettos_files(tmp_path):
    profiler = StepProfiler(tmp_path / "learner-0", 3, 5)
    assert run(profiler, 0, 10) == [3, 4, 5] and profiler.done and not profiler.active
    (trace,) = (tmp_path / "learner-0" / "plugins" / "profile").glob("*/perfetto_trace.json.gz")
    assert trace.stat().st_size > 0 and list(trace.parent.glob("*.xplane.pb"))


def test_a_learner_resumed_inside_the_range_traces_the_rest_and_one_past_it_nothing(tmp_path):
    assert run(StepProfiler(tmp_path / "a", 3, 6), 4, 10) == [5, 6]
    past = StepProfiler(tmp_path / "b", 3, 6)
    assert run(past, 7, 10) == [] and not (tmp_path / "b").exists()


def test_a_run_that_ends_inside_the_range_stops_the_trace(tmp_path):
    profiler = StepProfiler(tmp_path / "a", 2, 100)
    assert run(profiler, 0, 5) == [2, 3, 4, 5] and profiler.done
    assert list((tmp_path / "a" / "plugins" / "profile").glob("*/*.xplane.pb"))
