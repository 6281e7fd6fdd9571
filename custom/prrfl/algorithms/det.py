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
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import Literal

import torch
import torch.nn.functional as F

from prrfl.algorithms.pfa import batchnorm_keys

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


PHASE_NAMES: tuple[str, ...] = tuple(p.name.lower() for p in Phase)  # recover, exchange, sublimate


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


def allowed_phase(phase: Phase, allowed: Sequence[Phase]) -> Phase:
    """`phase` if allowed, else the closest allowed phase below it, else the lowest allowed one."""
    if phase in allowed:
        return phase
    below = [p for p in allowed if p < phase]
    return max(below) if below else min(allowed)


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


class DeputyPair:
    """A personalized model P and its deputy D, and DET's phase between them: the site side of PRR for any
    training loop (prrfl.methods.prr.PRR runs its sites' DET through it; prrfl.flare.components.PersonalizedPair
    puts it around FLARE's Client API).

    l1 <= l2: the phase thresholds on deputy_score / personal_score (`next_phase`; higher scores are
    better). local_keys: state-dict keys that never leave the site and are never overwritten by a
    download (default: the deputy's BatchNorm parameters and buffers, FedBN style). phases: the phases
    allowed (default all three); DET picks the phase as usual, then a phase that is not allowed becomes
    the closest allowed one below it, or the lowest allowed one (`allowed_phase`).
    """

    def __init__(
        self,
        personal: torch.nn.Module,
        deputy: torch.nn.Module,
        l1: float = 0.7,
        l2: float = 0.9,
        local_keys: Iterable[str] | None = None,
        phases: Iterable[Phase | int] = tuple(Phase),
    ):
        if not 0 < l1 <= l2 <= 1:
            raise ValueError(f"need 0 < l1 <= l2 <= 1, got l1={l1}, l2={l2}")
        if personal is deputy:
            raise ValueError("the personalized model and its deputy must be two different modules")
        self.personal, self.deputy = personal, deputy
        self.l1, self.l2 = l1, l2
        self.local_keys = set(batchnorm_keys(deputy) if local_keys is None else local_keys)
        self.phases: tuple[Phase, ...] = tuple(sorted({Phase(p) for p in phases}))
        if not self.phases:
            raise ValueError("DET needs at least one allowed phase")
        self.downloads = 0  # models received so far; the first one initialises both P and D
        self.current_phase: Phase | None = None
        self.just_downloaded = False

    def shared_keys(self) -> list[str]:
        return [k for k in self.deputy.state_dict() if k not in self.local_keys]

    def receive_state(self, params: dict[str, torch.Tensor], first: bool | None = None) -> bool:
        """Take the server's weights. The first ones initialise both P and D (all keys must match); later
        ones go to the deputy only, without its local keys (strict=False: weights of the shared keys only are
        fine). DET restarts in Recover. first: whether these are the first weights (default: none were received
        through this pair yet). Returns `first`."""
        if first is None:
            first = self.downloads == 0
        if first:
            self.personal.load_state_dict(params)
            self.deputy.load_state_dict(params)
        else:
            self.deputy.load_state_dict({k: v for k, v in params.items() if k not in self.local_keys}, strict=False)
        self.downloads += 1
        self.current_phase = None
        self.just_downloaded = True
        return first

    def phase(self, personal_score: float, deputy_score: float, just_downloaded: bool | None = None) -> Phase:
        """The DET phase of the coming epoch from P's and D's scores (higher is better), `next_phase` capped to
        the allowed `phases`. just_downloaded: whether D was replaced since the last epoch (default: no epoch ran
        since the last download)."""
        if just_downloaded is None:
            just_downloaded = self.just_downloaded
        phase = next_phase(self.current_phase, deputy_score, personal_score, l1=self.l1, l2=self.l2, just_downloaded=just_downloaded)
        self.current_phase = allowed_phase(phase, self.phases)
        self.just_downloaded = False
        return self.current_phase

    def distillation(
        self, z_personal: torch.Tensor, z_deputy: torch.Tensor, form: Distillation = "kl", weight: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(extra loss of P, extra loss of D) in the current phase: `weight` times the distillation
        (`distillation`, KL by default) with the teacher detached, for the model that learns from the other;
        0 for the other."""
        if self.current_phase is None:
            raise RuntimeError("no DET phase yet: call phase() before the epoch's batches")
        p_learns, d_learns = distillation_targets(self.current_phase)
        zero = z_personal.new_zeros(())
        return (
            weight * distillation(z_personal, z_deputy, form) if p_learns else zero,
            weight * distillation(z_deputy, z_personal, form) if d_learns else zero,
        )

    def shared_state(self) -> dict[str, torch.Tensor]:
        """The deputy's shared weights, detached copies on the CPU: what the site sends."""
        state = self.deputy.state_dict()
        return {k: state[k].detach().cpu().clone() for k in self.shared_keys()}

    def state_dict(self) -> dict:
        return {
            "personal": self.personal.state_dict(),
            "deputy": self.deputy.state_dict(),
            "phase": None if self.current_phase is None else int(self.current_phase),
            "downloads": self.downloads,
            "just_downloaded": self.just_downloaded,
        }

    def load_state_dict(self, state: dict) -> None:
        self.personal.load_state_dict(state["personal"])
        self.deputy.load_state_dict(state["deputy"])
        self.current_phase = None if state["phase"] is None else Phase(state["phase"])
        self.downloads = int(state["downloads"])
        self.just_downloaded = bool(state["just_downloaded"])
