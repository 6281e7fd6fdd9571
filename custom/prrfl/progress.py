"""Durations and time left, as the progress lines write them (`prrfl predict`, a job's rounds)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """Seconds under 2 minutes, minutes under 2 hours, else hours."""
    if seconds < 119.5:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7170 else f"{seconds / 3600:.1f} h"


def time_left(elapsed: float, done: int, total: int) -> str:
    """'about <duration> left' at the pace so far (`done` of `total` units in `elapsed` seconds); '' before any is done."""
    if done <= 0 or total <= done:
        return ""
    return f"about {duration(elapsed / done * (total - done))} left"
