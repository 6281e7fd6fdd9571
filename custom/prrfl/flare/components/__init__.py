"""Personalized federated learning as FLARE components, usable from any FLARE job.

* `PerClientController`: a ModelController whose clients each get a model of their own.
"""

from prrfl.flare.components.controller import Answers, PerClientController

__all__ = ["Answers", "PerClientController"]
