"""The first round of a resumed job gets prepare's deadline: its sites start afresh inside it."""

from __future__ import annotations

from types import SimpleNamespace

from prrfl.flare.liveness import Deadline
from prrfl.flare.server_workflow import PersonalizedWorkflow


def workflow(resumed_at):
    wf = PersonalizedWorkflow.__new__(PersonalizedWorkflow)
    wf.deadline = Deadline()  # auto: 3 x the slowest round, at least 60 s; prepare 7200 s
    wf.state = SimpleNamespace(observed_seconds=lambda: [12.0], round_estimates={"a": 2.0})
    wf._resumed_at = resumed_at
    return wf


def test_a_resumed_jobs_first_round_gets_the_prepare_deadline_and_later_rounds_the_usual_one():
    wf = workflow(resumed_at=1)
    assert wf.round_deadline(1) == 7200.0
    assert wf.deadline_note(1, 7200.0) == "; deadline 7200 s (the first round of a resumed job: the sites start afresh, as at prepare)"
    assert wf.round_deadline(2) == 60.0  # max(60, 3 x 12)
    assert wf.deadline_note(2, 60.0).startswith("; deadline 60 s (3 x the slowest round so far")


def test_a_new_run_keeps_the_usual_deadline_from_its_first_round():
    wf = workflow(resumed_at=None)
    assert wf.round_deadline(0) == 60.0 and wf.round_deadline(1) == 60.0
