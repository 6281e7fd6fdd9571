"""Deputy-Enhanced Transfer (DET), the site side of PRR (TMI 2022, Sec. III-B).

A site keeps a personalized model P and a deputy D that receives the server's aggregate. Before
every local epoch DET compares the deputy's score phi(D) with phi(P) and picks a phase:
Recover (D lags far behind, or was just overwritten by the download): D distils from P;
Exchange (D is catching up): mutual distillation; Sublimate (D is close to P): P distils from D,
D trains alone. This keeps P from retrogressing on the aggregate while still absorbing it.

phi is computed on the validation split by default (both papers); the authors' code uses the
training split. The training loop makes that choice among `DET_METRIC_SPLITS`.

The distillation term is KL(p_teacher || p_student) in the papers (`kl_distillation`); the authors'
segmentation script uses the mean squared difference of the two softmax maps instead, weighted by 10
(`mse_distillation`). `distillation` picks one of `DISTILLATIONS` by name.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Literal

import torch
import torch.nn.functional as F

MetricSplit = Literal["valid", "train"]
PhaseName = Literal["recover", "exchange", "sublimate"]  # the names of `Phase`, in lower case, for configs
Distillation = Literal["kl", "mse"]
DET_METRIC_SPLITS: tuple[str, ...] = ("valid", "train")  # paper's choice first (the default)
DISTILLATIONS: tuple[str, ...] = ("kl", "mse")  # paper's choice first (the default)


class Phase(IntEnum):
    """DET phases, numbered as the authors' stages (their stage 0, "just reset", is `None` here)."""

    RECOVER = 1
    EXCHANGE = 2
    SUBLIMATE = 3


_TARGETS: dict[Phase, tuple[bool, bool]] = {
    Phase.RECOVER: (False, True),
    Phase.EXCHANGE: (True, True),
    Phase.SUBLIMATE: (True, False),
}


def next_phase(
    phase: Phase | int | None,
    deputy_score: float,
    personal_score: float,
    l1: float = 0.7,
    l2: float = 0.9,
    just_downloaded: bool = False,
) -> Phase:
    """The phase for the coming epoch (docs/authors_code.md §2.1), rules in order:

    1. D < l1*P, or the deputy was just downloaded, or no phase yet   -> RECOVER
    2. coming from RECOVER, or (EXCHANGE/SUBLIMATE and D < l2*P)       -> EXCHANGE
    3. otherwise                                                        -> SUBLIMATE
    So RECOVER never jumps straight to SUBLIMATE, and any phase can fall back.
    """
    if not 0 < l1 <= l2 <= 1:
        raise ValueError(f"need 0 < l1 <= l2 <= 1, got l1={l1}, l2={l2}")
    if not (math.isfinite(deputy_score) and math.isfinite(personal_score)):
        raise ValueError(f"DET scores must be finite, got deputy={deputy_score}, personal={personal_score}")
    phase = None if phase is None else Phase(phase)
    if phase is None or just_downloaded or deputy_score < l1 * personal_score:
        return Phase.RECOVER
    if phase == Phase.RECOVER or deputy_score < l2 * personal_score:
        return Phase.EXCHANGE
    return Phase.SUBLIMATE


def distillation_targets(phase: Phase | int) -> tuple[bool, bool]:
    """(personal learns from deputy, deputy learns from personal) in `phase`."""
    return _TARGETS[Phase(phase)]


def kl_distillation(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(p_teacher || p_student) averaged over samples, the teacher detached.

    Logits [B, C] (or [B, C, *spatial], averaged over samples and positions). At temperature T
    both softmaxes use z / T and the result is scaled by T^2 (Hinton et al.), so gradients keep
    their size; T = 1 is the authors' plain batch-mean KL.
    """
    if student_logits.shape != teacher_logits.shape or student_logits.ndim < 2:
        raise ValueError(
            f"need student and teacher logits of the same [B, C, ...] shape, got "
            f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    num_classes = student_logits.shape[1]
    student = student_logits.movedim(1, -1).reshape(-1, num_classes) / temperature
    teacher = teacher_logits.detach().movedim(1, -1).reshape(-1, num_classes) / temperature
    kl = F.kl_div(F.log_softmax(student, dim=1), F.log_softmax(teacher, dim=1), reduction="batchmean", log_target=True)
    return kl * temperature**2


def mse_distillation(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """mean over samples, classes and positions of (softmax(student) - softmax(teacher))^2, the teacher
    detached: the distillation of the authors' segmentation script (which multiplies it by 10)."""
    if student_logits.shape != teacher_logits.shape or student_logits.ndim < 2:
        raise ValueError(
            f"need student and teacher logits of the same [B, C, ...] shape, got "
            f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        )
    return F.mse_loss(student_logits.softmax(dim=1), teacher_logits.detach().softmax(dim=1))


def distillation(student_logits: torch.Tensor, teacher_logits: torch.Tensor, form: Distillation = "kl") -> torch.Tensor:
    """The distillation term of one of `DISTILLATIONS`: "kl" (`kl_distillation`) or "mse" (`mse_distillation`)."""
    if form == "kl":
        return kl_distillation(student_logits, teacher_logits)
    if form == "mse":
        return mse_distillation(student_logits, teacher_logits)
    raise ValueError(f"distillation must be one of {DISTILLATIONS}, got {form!r}")
