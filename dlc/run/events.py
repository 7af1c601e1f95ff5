"""Every kind of event a run writes to events.jsonl, declared once: its fields and what it means.

The catalog in the manual (docs/reference/events.md) is generated from these declarations, and the
run directory checks each event it writes against them when DLC_CHECK_EVENTS is set (the test suite
sets it), so an event kind or a field that the code writes and this module does not declare fails
a test instead of going undocumented. Every event also has `t` (Unix seconds) and `kind`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Declared:
    """One kind of event: the fields it may carry (beside `t` and `kind`) and what it means."""

    kind: str
    fields: tuple[str, ...]
    meaning: str
    any_fields: bool = False  # its fields are another record's (`chaos` copies a chaos.jsonl line)


def _e(kind: str, fields: str, meaning: str, any_fields: bool = False) -> Declared:
    return Declared(kind, tuple(fields.split()), meaning, any_fields)


GROUPS: tuple[tuple[str, tuple[Declared, ...]], ...] = (
    (
        "The run",
        (
            _e(
                "run_started",
                "run_dir storage algorithm learners data tokenizer train_tokens eval_tokens "
                "eval_bytes_per_token resumed",
                "The run began: its directory and storage, the data, its tokenizer, "
                "its training and held-out tokens and the held-out bytes per token.",
            ),
            _e(
                "cluster_started",
                "address driver_node nodes",
                "The Ray cluster is up: its address (`embedded`, or the one joined), the driver's node, every node "
                "(id, address, host, head).",
            ),
            _e(
                "compile_cache",
                "dir torn_entries_removed",
                "The compilation cache's directory, and how many torn entries of a killed writer were removed.",
            ),
            _e(
                "run_resumed",
                "learner step data_position incarnation checkpoint",
                "A learner goes on from its checkpoint: its step, data position and incarnation.",
            ),
            _e(
                "syncer_restored",
                "versions checkpoint_rounds journal_rounds rounds_closed",
                "The syncer restored from its checkpoint and journal: each fragment's version, the rounds each held.",
            ),
            _e("checkpoint_saved", "learner step", "A learner's checkpoint is written."),
            _e("final_push", "learner fragments", "A learner pushed the progress it had not pushed, at its end."),
            _e("profile_written", "learner steps dir", "A profiler trace of the steps given, in `dir`."),
            _e("run_finished", "status tokens", "The run ended: how, and the tokens trained."),
        ),
    ),
    (
        "Learners starting and stopping",
        (
            _e(
                "learner_started",
                "learner pid platform device_kind device node node_id allocator",
                "A learner's process is up: its pid, platform, device kind and device, node address and id, allocator.",
            ),
            _e(
                "learner_training",
                "learner device incarnation spare process_s compile_wait_s compile_s compiled_from copy_s",
                "Its first step is done, start-up over: `compile_wait_s` waiting for another learner compiling the "
                "same functions, `compile_s` with that wait, `compiled_from` `cache` or `xla`.",
            ),
            _e("learner_finished", "learner step", "A learner trained all its steps."),
            _e("learner_stopped", "learner step reason", "A learner's loop stopped (the run's end, or a stop)."),
            _e("spare_started", "spare", "A hot spare's process started."),
            _e(
                "spare_ready",
                "spare after_s device process_s compile_s compile_wait_s compiled_from",
                "A hot spare compiled and waits, holding no data.",
            ),
            _e("spare_taken", "spare learner ready", "A hot spare took a dead learner's slot."),
            _e(
                "spare_died",
                "spare learner error",
                "A spare's process died while it waited, or as it took a slot: another takes its place.",
            ),
        ),
    ),
    (
        "Faults and recovery",
        (
            _e(
                "learner_died",
                "learner step data_position pid",
                "A learner's process died (step and data position as last reported).",
            ),
            _e("learner_restarted", "learner after_s pid spare", "A new process (or a hot spare) took the slot."),
            _e(
                "learner_rejoined",
                "learner peer step data_position copy_s",
                "It copied a healthy peer's state and rejoined.",
            ),
            _e(
                "learner_recovered",
                "learner after_s fault",
                "Its first accepted push after a fault; `fault`: what ended its process (`kill`, `kill_node` or "
                "`preempt`).",
            ),
            _e(
                "learner_preempted",
                "learner reason fragments leave_s unpushed_steps step data_position pid",
                "It left on a notice (`reason` SIGTERM or node draining), with the `fragments` it pushed, "
                "`leave_s` from the notice.",
            ),
            _e("node_draining", "node node_id learners deadline_in_s", "A node is being drained, and its learners."),
            _e("learner_stalled", "learner silent_s", "A learner stopped answering (its heartbeats stopped)."),
            _e("learner_thawed", "learner silent_s", "A stalled learner answers again."),
            _e("learner_slowed", "learner factor duration_s", "Chaos slowed a learner's steps."),
            _e("link_degraded", "learner factor duration_s", "Chaos degraded a learner's link."),
            _e("link_cut", "learner factor duration_s", "Chaos cut a learner's link."),
            _e("learner_joining", "learner duration_s", "A temporary learner joins."),
            _e("learner_left", "learner", "A learner retired for good."),
            _e("learner_lost", "learner reason", "Dead, and no live node can hold it: not restarted."),
            _e("restart_retried", "learner error", "A new process died with its node before it was ready."),
            _e("state_copy_retried", "learner peer error", "The peer being copied died: it copies again."),
            _e("node_killed", "node node_id learners pids", "Every learner on a node killed at once."),
            _e("syncer_died", "", "The syncer's process died."),
            _e(
                "syncer_restarted",
                "after_s resent_pushes versions checkpoint_rounds journal_rounds rounds_closed",
                "The syncer is back from its checkpoint and journal; the learners re-sent what it lost.",
            ),
        ),
    ),
    (
        "Chaos",
        (
            _e("chaos", "", "A copy of each chaos.jsonl line (its fields are that line's).", any_fields=True),
            _e("chaos_started", "plan", "A chaos plan started in the run (`dlc train --chaos`)."),
            _e("chaos_finished", "fired refused stopped_because", "The chaos plan ended."),
            _e("control_ignored", "request reason", "A request the driver could not carry out, and why."),
        ),
    ),
    (
        "The protocol",
        (
            _e(
                "push_sent",
                "learner fragment seq base_version version bytes step steps",
                "A learner sent a fragment's outer gradient (also the pushes made at the end of the run).",
            ),
            _e(
                "push_accepted",
                "learner fragment seq base_version version bytes steps part share superseded",
                "The syncer took a push; `version` is the fragment's then: it is merged in the round that makes "
                "version + 1.",
            ),
            _e(
                "push_rejected",
                "learner fragment seq base_version version steps reason detail",
                "The syncer refused a push, with `reason` and `detail`.",
            ),
            _e(
                "round_closed",
                "fragment version contributors weights staleness grace_s waited_s tokens seqs merged replayed",
                "A fragment's round merged: each contributor's newest `seqs`, and `merged`, every (learner, seq) "
                "folded in, superseded pushes included; `replayed` marks a round a restarted syncer reported for "
                "its predecessor.",
            ),
            _e(
                "push_lost",
                "learner fragment seq version bytes reason",
                "An acceptance the restored syncer does not hold (`reason`: `syncer_died`, `run_stopped` or "
                "`round_lost`): the push is accepted again.",
            ),
            _e("round_lost", "fragment version reason", "A logged round the restored syncer does not hold."),
        ),
    ),
    (
        "Blocking baselines (`algorithm=dp` and `diloco`)",
        (
            _e("members_admitted", "learners version", "Learners admitted to the group."),
            _e("learner_admitted", "learner version", "A learner admitted to the group."),
            _e("member_lost", "learners reason", "Members lost, and why."),
            _e("reconfigure", "why pause_s members", "The group changed: why, the pause, its members."),
            _e("reconfigure_folded", "why", "A change during a pause, folded into it."),
        ),
    ),
)

EVENTS: dict[str, Declared] = {event.kind: event for _, events in GROUPS for event in events}
CHECK_VARIABLE = "DLC_CHECK_EVENTS"


def undeclared(record: dict[str, Any]) -> str | None:
    """What in an event record its declaration does not allow, or None."""
    kind = record.get("kind")
    declared = EVENTS.get(kind) if isinstance(kind, str) else None
    if declared is None:
        return f"event kind {kind!r} is not declared in dlc/run/events.py"
    extra = sorted(set(record) - {"t", "kind", *declared.fields})
    if extra and not declared.any_fields:
        return f"event {kind}: fields {extra} are not declared in dlc/run/events.py"
    return None


def checking() -> bool:
    """Whether each event written is checked against its declaration (DLC_CHECK_EVENTS set, as in the tests)."""
    return bool(os.environ.get(CHECK_VARIABLE))


def catalog_markdown() -> str:
    """The events catalog of the manual: a table per group, from the declarations."""
    lines: list[str] = []
    for title, events in GROUPS:
        lines += [f"## {title}", "", "| kind | fields | what it means |", "|---|---|---|"]
        for e in events:
            fields = "any of its chaos.jsonl line's" if e.any_fields else ", ".join(f"`{f}`" for f in e.fields)
            lines.append(f"| `{e.kind}` | {fields or '-'} | {' '.join(e.meaning.split())} |")
        lines.append("")
    return "\n".join(lines)
