"""How long the server waits for the sites of a round: the per-round deadline.

A site that dies or hangs must never stall the federation. FLARE notices a dead site by itself only in a
deployment, and late (its job process gone: about a minute; the whole machine gone: after the server's
`heart_beat_timeout`, 600 s in provisioned kits); in the simulator it never does. The workflow therefore
gives every round a deadline, derived from the work the sites have shown they need:

* "auto" (default): every round gets `max(floor, factor x the slowest round any site took so far)`, so a
  round that took 20 s gets 60 s and one that took 10 min gets 30 min. Before any round is measured, the
  first round gets `max(floor, estimate_factor x the sum of the sites' own estimates of a round)`, made at
  `prepare` by timing one training step (prrfl.site.trainer.estimate_round_seconds): the sum is what the
  round would take if the sites ran one after another (a simulator with fewer threads than sites), and
  the factor covers what one timed step cannot see. The `prepare` task itself, which may generate the
  synthetic data, gets `first` seconds. The measured times and
  estimates are part of the workflow's saved state, so a resumed run keeps them.
* a number of seconds: that deadline for every task; 0: no deadline (wait for ever; not recommended).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class Deadline:
    timeout: float | str = AUTO
    first: float = 7200.0  # prepare (may generate the synthetic data); round 0 when no site sent an estimate
    floor: float = 60.0
    factor: float = 3.0
    estimate_factor: float = 5.0  # round 0: the estimate is rough (one step timed, evaluation guessed)

    def __post_init__(self) -> None:
        if self.timeout != AUTO and (isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or self.timeout < 0):
            raise ValueError(f"workflow argument 'task_timeout' must be \"auto\" or seconds >= 0, got {self.timeout!r}")
        for name in ("first", "floor", "factor", "estimate_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
                raise ValueError(f"workflow argument for the deadline's '{name}' must be a positive number, got {value!r}")

    def seconds(self, observed: list[float], estimates: list[float] = ()) -> float | None:
        """The deadline of the next task given the durations (s) of the train tasks seen so far and the
        sites' estimates of a round; None: no deadline."""
        if self.timeout != AUTO:
            return float(self.timeout) or None
        if observed:
            return max(self.floor, self.factor * max(observed))
        if estimates:
            return max(self.floor, self.estimate_factor * sum(estimates))
        return float(self.first)

    def explain(self, observed: list[float], estimates: list[float] = ()) -> str:
        seconds = self.seconds(observed, estimates)
        if seconds is None:
            return "no deadline (task_timeout=0)"
        if self.timeout != AUTO:
            return f"{seconds:.0f} s (task_timeout)"
        if observed:
            return f"{seconds:.0f} s ({self.factor:g} x the slowest round so far, {max(observed):.0f} s; at least {self.floor:g} s)"
        if estimates:
            return f"{seconds:.0f} s ({self.estimate_factor:g} x the sum of the sites' estimates of a round, {sum(estimates):.1f} s; at least {self.floor:g} s)"
        return f"{seconds:.0f} s (nothing measured or estimated yet)"
