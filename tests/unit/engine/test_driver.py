"""What Ctrl-C does to `dlc train`, in-process: interrupt a start, request a stop, interrupt, hold.

The whole flow on the real CLI, with Ctrl-C pressed again and again, is in tests/e2e/test_interrupt_resume.py."""

import contextlib
import gc
import json
import os
import signal
import time
from collections.abc import Iterator

import pytest

from dlc.engine.interrupts import Interrupts, exit_code_of


@pytest.fixture(autouse=True)
def _python_sigint_handler() -> Iterator[None]:
    """Each test starts from Python's own handler, whatever the session inherited: a pytest started
    in the background by a shell without job control (`pytest > log &` in a script) starts with
    SIGINT ignored, and "the handler found is put back" would then put back SIG_IGN."""
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, found)


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler runs in this (the main) thread, between two bytecodes


def test_while_training_the_first_ctrl_c_requests_a_stop_the_second_interrupts_then_all_are_held(capsys):
    before = signal.getsignal(signal.SIGINT)
    with Interrupts() as interrupts:
        interrupts.training()
        ctrl_c()
        assert interrupts.requested
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()
        ctrl_c()  # the clean-up after the interrupt: nothing raised, the user is told
        ctrl_c()
    assert signal.getsignal(signal.SIGINT) is before
    assert capsys.readouterr().err.count("still stopping") == 2


def test_while_starting_every_ctrl_c_interrupts_until_the_clean_up_holds_them(capsys):
    with Interrupts() as interrupts:
        for _ in range(2):
            with pytest.raises(KeyboardInterrupt):
                ctrl_c()
        interrupts.hold()
        ctrl_c()
        assert not interrupts.requested
    assert "still stopping" in capsys.readouterr().err


def test_a_run_that_winds_down_by_itself_holds_ctrl_c_and_puts_the_handler_back(capsys):
    with Interrupts() as interrupts:
        interrupts.training()
        interrupts.hold()
        ctrl_c()
        assert not interrupts.requested
    assert "still stopping" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()


def test_a_process_that_ends_with_the_run_ignores_ctrl_c_and_sigterm_once_it_is_over():
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Interrupts(final=True):
            pass
        assert all(signal.getsignal(signum) is signal.SIG_IGN for signum in before)
        ctrl_c()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_sigterm_stops_a_run_as_ctrl_c_does_and_gives_its_own_exit_code():
    """A scheduler's notice (Kubernetes, Slurm, a spot VM) is SIGTERM: a clean stop, exit 143."""
    before = signal.getsignal(signal.SIGTERM)
    with Interrupts() as interrupts:
        interrupts.training()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert interrupts.requested and interrupts.exit_code == 143
        with pytest.raises(KeyboardInterrupt) as raised:
            ctrl_c()  # a second signal interrupts at once; the first one's code stays
        assert exit_code_of(raised.value) == 143
    assert signal.getsignal(signal.SIGTERM) is before
    with Interrupts() as interrupts, pytest.raises(KeyboardInterrupt) as raised:
        os.kill(os.getpid(), signal.SIGTERM)  # while starting: interrupts at once
        time.sleep(0.05)
    assert exit_code_of(raised.value) == 143
    assert exit_code_of(KeyboardInterrupt()) == 130  # Python's own Ctrl-C, before dlc handles it


def test_an_interrupt_lost_in_a_garbage_collection_callback_while_starting_is_delivered_again(capsys):
    """JAX collects garbage with a callback, where Python prints an exception and drops it."""
    fired, armed = [], []

    def callback(phase: str, info: dict) -> None:
        # Armed inside the block only: a collection Python starts by itself before it (more likely
        # after tests that left garbage) would send the signal to pytest's own handler.
        if phase == "start" and armed and not fired:
            fired.append(phase)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, inside the callback

    gc.callbacks.append(callback)
    try:
        with Interrupts(), pytest.raises(KeyboardInterrupt):
            armed.append(True)
            gc.collect()
            time.sleep(0.05)
    finally:
        gc.callbacks.remove(callback)
    assert fired and "Traceback" not in capsys.readouterr().err


def test_a_ctrl_c_of_the_start_that_something_swallowed_stops_the_run_cleanly_once_it_trains():
    """A library that clears a pending exception loses the interrupt without a trace: the run that
    starts anyway must not train on as if Ctrl-C had never been pressed."""
    with Interrupts() as interrupts:
        with contextlib.suppress(KeyboardInterrupt):  # swallowed on its way out of the start
            ctrl_c()
        assert not interrupts.requested
        interrupts.training()
        assert interrupts.requested and interrupts.exit_code == 130
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()  # the next one is a second Ctrl-C: it interrupts at once


def test_an_interrupt_dropped_while_starting_is_not_sent_again_once_the_run_trains():
    """The re-sent signal of a dropped interrupt would be a second Ctrl-C to a run that trains."""
    with Interrupts() as interrupts:
        interrupts.signum = signal.SIGINT  # the dropped one
        interrupts.training()
        interrupts._deliver_again()
        time.sleep(0.05)
        assert interrupts.requested  # the stop asked for, and no interrupt raised


@pytest.mark.parametrize(
    ("files", "wall_s", "initial"),
    [
        # A lost driver writes no summary: the status it wrote last holds the run's time and first loss.
        ({"status.json": {"state": "running", "elapsed_s": 31.5, "eval_loss_initial": 5.43}}, 31.5, 5.43),
        # A clean end writes both; the status is the newer (a run resumed after it, then lost).
        (
            {
                "summary.json": {"status": "completed", "wall_s": 20.0, "eval_loss_initial": 5.43},
                "status.json": {"state": "running", "elapsed_s": 44.0, "eval_loss_initial": 5.43},
            },
            44.0,
            5.43,
        ),
        ({"summary.json": {"status": "interrupted", "wall_s": 20.0, "eval_loss_initial": 5.4}}, 20.0, 5.4),
    ],
    ids=["hard-stop", "resumed-then-lost", "summary-only"],
)
def test_a_resumed_run_counts_the_earlier_runs_time_and_keeps_its_first_loss(files, wall_s, initial, tmp_path):
    from dlc.config.schema import Recipe
    from dlc.engine.driver import Driver
    from dlc.observe.console import ProgressView
    from dlc.run.rundir import RunDir

    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    driver = Driver(Recipe(), RunDir(tmp_path, ""), resume=True, data=None, view=ProgressView(log_every_steps=50))
    assert driver.prior_wall_s == wall_s and driver.evals.initial == initial
