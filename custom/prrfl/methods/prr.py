"""PRR (TMI 2022): Progressive Fourier Aggregation at the server, Deputy-Enhanced Transfer and the
Conjoint Prototype-Aligned loss at each site.

Each site keeps a personalized model P (never overwritten) and a deputy D (receives the site's own
PFA output). Before every local epoch DET picks Recover / Exchange / Sublimate from the validation
score of D relative to P; the phase decides which model distils from the other (the site's P and D are a
`prrfl.algorithms.det.DeputyPair`, the DET of a FLARE client's PersonalizedPair too). L_sup is CPA: the
conjoint mask G from the global class counts, weighted per class by gamma from the cosine between
the site's prototype (from P) and the sampled global prototype. Only D's non-BN weights, the class
counts and the per-class mean embeddings leave the site.

Ablations (TMI Tables IV-VI) are options, e.g. `prrfl jobs export derm_prr --set method_args.det_enabled=false`:
* pfa_enabled=False: the server averages the deputies' shared (non-BN) weights instead (FedAvg with
  local BN, weighted by `site_weights`); every site gets the same average.
* det_enabled=False: no P/D pair. Each site keeps ONE model ("local") that receives its PFA output,
  trains with L_sup alone, is uploaded and is the evaluated model.
* det_phases: the DET phases allowed, a subset of ("recover", "exchange", "sublimate"). DET picks
  the phase as usual, then a phase that is not allowed becomes the closest allowed one below it
  (or the lowest allowed one): ("recover",) = D always distils from P and P trains alone;
  ("recover", "exchange") = never Sublimate; ("exchange",) = mutual learning every epoch.
* cpa_global=False: the conjoint mask is all ones (plain softmax competition).
* cpa_local=False: gamma = 1 and no prototypes are computed or exchanged.
  With both off, L_sup is the task's own loss (cross entropy).

CPA is the classification term of the task's loss: for classification L_sup = CPA, for
segmentation L_sup = Dice + CPA (1:1, the paper). `cpa_ce_mix` = w makes that term
(1 - w) * CPA + w * CE; the authors' segmentation code uses w = 0.5.

The authors' segmentation script departs from the paper in four site-side choices, each an option
(docs/methods.md lists them with the defaults and why):
* distillation="mse", distill_weight=10: DET distils with 10 x the mean squared difference of the two
  softmax maps instead of the paper's KL at weight 1;
* det_split="train": DET scores P and D on the training split instead of the validation split;
* cpa_ce_mix=0.5: half CPA, half cross entropy in the classification term;
* optimizers="kept": each model's optimiser state (Adam's moments) carries over from round to round;
  the default, "per_round", re-creates the optimisers at every download, as the authors' code does
  (the papers do not say).

report_model: the model a site reports, selects on validation and saves as its best model: "personal"
(P, the paper) or "deputy" (D). Both are evaluated every round either way (the site's results record
the other one's metrics beside it).

det_rescue = r (off by default, as the paper): at a DET check after a round's first epoch, P takes D's
weights (and optimiser state) when phi(P) < r * phi(D). P learns from D only by distillation on the
site's own training split, which carries nothing once P fits that split; at a site of a few volumes P
then stays a local model however far D gets ahead (docs/methods.md, "P at a small site").

personal_prox = mu (0, off, as the paper): P's loss gains (mu / 2) * ||theta_P - theta_down||^2 over the shared
(non-BN) weights, theta_down being the site's download of the round (D's starting point), as Ditto (Li et al.,
ICML 2021) pulls its personal model towards the global one: P then learns from the federation in weight space,
not only through distillation on the site's own images.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from prrfl.algorithms import class_prototypes, cpa, det, pfa
from prrfl.keys import PFA_R, PROTOTYPE_PRESENT, PROTOTYPES
from prrfl.messages import Download, Upload
from prrfl.methods import prototype_exchange as protos
from prrfl.methods.method import Method, global_class_counts, proximal_term
from prrfl.methods.view import SiteView
from prrfl.server import aggregation
from prrfl.server.class_statistics import PrototypeExchange

PHASE_NAMES = det.PHASE_NAMES  # recover, exchange, sublimate


@dataclass(frozen=True)
class PRROptions:
    """PRR's options (method_args of a job; the module docstring says what each ablation does),
    checked together when they are built: a bad value is refused when the job starts, not where it is
    first used (the server's first aggregation, a site's first epoch), which would cost a round."""

    pfa_enabled: bool = True
    r0: float = 0.35
    r1: float = 0.48
    r_schedule: pfa.Schedule = "paper"  # "authors": r1 = 0.475 reached only after the last round
    pfa_components: pfa.Components = "amplitude_phase"  # "amplitude": the MICCAI PRR-FL variant
    conv_layout: pfa.ConvLayout = "paper"  # "authors": (in*kh) x (kw*out)
    classifier_rowwise: bool = True
    site_weights: aggregation.Weighting = "uniform"  # or "samples": weight sites by training-set size
    det_enabled: bool = True
    det_phases: Sequence[det.PhaseName] = PHASE_NAMES
    l1: float = 0.7
    l2: float = 0.9
    det_split: det.MetricSplit = "valid"  # "train": the authors' choice
    cpa_global: bool = True
    cpa_local: bool = True
    beta: float = 0.8
    tau: float = 3.0
    cpa_refine_from_round: int = 0  # authors: 15
    proto_std: class_prototypes.StdKind = "biased"  # "unbiased": the authors' K-1 divisor
    proto_std_floor: float = 0.0  # authors: 1.0
    cpa_ce_mix: float = 0.0  # authors' segmentation code: 0.5
    distillation: det.Distillation = "kl"  # authors' segmentation code: "mse"
    distill_weight: float = 1.0  # authors' segmentation code: 10
    optimizers: Literal["per_round", "kept"] = "per_round"  # re-created at every download (authors' code)
    report_model: Literal["personal", "deputy"] = "personal"  # the paper reports P
    det_rescue: float | None = None  # r: P takes D's weights when phi(P) < r * phi(D) at a DET check after a round's first epoch
    personal_prox: float = 0.0  # mu: (mu / 2) ||P - download||^2 on P's shared weights (Ditto's pull); 0: off

    def __post_init__(self) -> None:
        if self.det_split not in det.DET_METRIC_SPLITS:
            raise ValueError(f"PRR option det_split must be one of {det.DET_METRIC_SPLITS}, got {self.det_split!r}")
        if self.site_weights not in aggregation.WEIGHTINGS:
            raise ValueError(f"PRR option site_weights must be one of {aggregation.WEIGHTINGS}, got {self.site_weights!r}")
        if not 0 < self.l1 <= self.l2 <= 1:
            raise ValueError(f"PRR options need 0 < l1 <= l2 <= 1, got l1={self.l1}, l2={self.l2}")
        if not self.det_phases or set(self.det_phases) - set(PHASE_NAMES):
            raise ValueError(f"PRR option det_phases must be a non-empty subset of {PHASE_NAMES}, got {self.det_phases!r}")
        object.__setattr__(self, "det_phases", tuple(self.det_phases))  # a list from a config: frozen as well
        pfa.pfa_threshold(0, 1, r0=self.r0, r1=self.r1, schedule=self.r_schedule)  # checks r0, r1 and the schedule
        self._check_site_models()
        if not 0 <= self.cpa_ce_mix <= 1:
            raise ValueError(f"PRR option cpa_ce_mix must lie in [0, 1], got {self.cpa_ce_mix}")
        if not (self.tau > 0 and 0 <= self.beta < math.inf and self.proto_std_floor >= 0):
            raise ValueError(
                f"PRR options need tau > 0, finite beta >= 0, proto_std_floor >= 0; got tau={self.tau}, beta={self.beta}, "
                f"proto_std_floor={self.proto_std_floor}"
            )

    def _check_site_models(self) -> None:
        """The options of P and D's training: distillation, the reported model, the rescue and the pull."""
        if self.distillation not in det.DISTILLATIONS:
            raise ValueError(f"PRR option distillation must be one of {det.DISTILLATIONS}, got {self.distillation!r}")
        if not 0 < self.distill_weight < math.inf:
            raise ValueError(f"PRR option distill_weight must be a finite number > 0, got {self.distill_weight}")
        if self.report_model == "deputy" and not self.det_enabled:
            raise ValueError("PRR option report_model='deputy' needs det_enabled: without DET a site keeps one model")
        if self.det_rescue is not None and not 0 < self.det_rescue <= 1:
            raise ValueError(f"PRR option det_rescue must lie in (0, 1] or be null (off), got {self.det_rescue}")
        if not 0 <= self.personal_prox < math.inf:
            raise ValueError(f"PRR option personal_prox must be a finite number >= 0, got {self.personal_prox}")
        if self.personal_prox and not self.det_enabled:
            raise ValueError("PRR option personal_prox needs det_enabled: without DET there is no P to pull")

    @property
    def phases(self) -> tuple[det.Phase, ...]:
        """The allowed DET phases, in order."""
        return tuple(sorted({det.Phase[p.upper()] for p in self.det_phases}))

    @property
    def uses_cpa(self) -> bool:
        """Whether L_sup is CPA (either part on) rather than the task's own loss."""
        return self.cpa_global or self.cpa_local


class PRR(Method):
    name = "prr"
    roles = ("personal", "deputy")
    eval_role = "personal"
    upload_role = "deputy"
    options_class = PRROptions

    def __init__(self, cfg, task, **options: Any):
        """options: the fields of `PRROptions` (Method.option_parameters reads them from there)."""
        super().__init__(cfg, task)
        self.opt = PRROptions(**options)
        self._pairs: dict[str, det.DeputyPair] = {}  # site -> its P and D as DET's pair (`_pair`)
        if not self.opt.det_enabled:  # one model: receives the PFA output, trains with L_sup, is evaluated
            self.roles, self.eval_role, self.upload_role = ("local",), "local", "local"
        else:
            self.eval_role = self.opt.report_model

    # ----- shared ------------------------------------------------------------------------
    def shared_keys(self, model: torch.nn.Module) -> list[str]:
        local = pfa.batchnorm_keys(model)  # BN stays at the site (FedBN style)
        return [k for k in model.state_dict() if k not in local]

    # ----- server --------------------------------------------------------------------------
    def aggregate(self, uploads: list[Upload], round_idx: int, server: dict[str, Any]) -> dict[str, Download]:
        """The server's aggregators on the uploads (prrfl.server.aggregation, the FLARE components' math): PFA (or,
        without it, the weighted average of the shared weights), then CPA's global prototypes from the prototype
        exchange."""
        o = self.opt
        states = {u.site: u.params for u in uploads}
        samples = {u.site: u.num_train for u in uploads}
        if o.pfa_enabled:
            aggregator = aggregation.Fourier(
                r0=o.r0,
                r1=o.r1,
                schedule=o.r_schedule,
                components=o.pfa_components,
                conv_layout=o.conv_layout,
                classifier_key=self.classifier_keys or None,
                classifier_rowwise=o.classifier_rowwise,
                weighting=o.site_weights,
                bn_keys=(),  # BN keys never travel (shared_keys)
            )
        else:  # the ablation without PFA: a plain average of the shared weights
            aggregator = aggregation.FedAvg(weighting=o.site_weights)
        mixed = aggregator.aggregate_states(states, samples, round_idx, self.cfg.num_rounds)
        meta = aggregator.output_meta(round_idx, self.cfg.num_rounds)
        exchanged = self._global_prototypes(uploads, server) if o.cpa_local else {}
        return {site: Download(params=dict(params), meta={**meta, **exchanged.get(site, {})}) for site, params in mixed.items()}

    def server_scalars(self, downloads: dict[str, Download]) -> dict[str, float]:
        """PFA's r of the round (the same for every site)."""
        r = next((d.meta[PFA_R] for d in downloads.values() if PFA_R in d.meta), None)
        return {} if r is None else {"pfa/r": r}

    def _global_prototypes(self, uploads: list[Upload], server: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """site -> the round's global prototypes (one draw shared by every site), from the exchange whose
        generator is seeded seed + 7919 and continued in the server's memory, so a resumed server samples
        the same prototypes."""
        exchange = PrototypeExchange(std=self.opt.proto_std, std_floor=self.opt.proto_std_floor, seed=self.cfg.seed + 7919)
        if "proto_rng" in server:
            exchange.load_state_dict({"generator": server["proto_rng"]})
        # the prototypes only: the federation's class counts are those the sites reported at prepare, never an upload's
        exchanged = exchange.exchange({u.site: {k: u.meta[k] for k in (PROTOTYPES, PROTOTYPE_PRESENT) if k in u.meta} for u in uploads})
        server["proto_rng"] = exchange.state_dict()["generator"]
        return exchanged

    # ----- site ----------------------------------------------------------------------------
    def _pair(self, site: SiteView) -> det.DeputyPair:
        """The site's P and D as DET's pair (`prrfl.algorithms.det.DeputyPair`, the DET of a FLARE client's
        PersonalizedPair too), built once per site, in the phase the site's memory holds: the memory is what the
        loop checkpoints and a restore replaces, so the phase is read from it at every use (and written back by
        the hooks that change it)."""
        personal, deputy = site.models["personal"], site.models["deputy"]
        pair = self._pairs.get(site.name)
        if pair is None or pair.personal is not personal or pair.deputy is not deputy:
            o = self.opt
            local = pfa.batchnorm_keys(deputy)  # BN stays at the site (`shared_keys`)
            pair = self._pairs[site.name] = det.DeputyPair(personal, deputy, l1=o.l1, l2=o.l2, local_keys=local, phases=o.phases)
        pair.current_phase = site.memory.get("phase")
        return pair

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        mem = site.memory
        if self.opt.det_enabled:  # the first download starts P and D from the same model, later ones reach D only
            pair = self._pair(site)
            pair.receive_state(download.params, first=first)
            mem["phase"] = pair.current_phase  # None: every download restarts DET in Recover
        else:
            site.models["local"].load_state_dict(download.params, strict=first)
        if self.opt.optimizers == "per_round":  # as new optimisers: no moments, no step count
            for optimizer in site.optimizers.values():
                optimizer.state.clear()
        if self.opt.personal_prox:  # where P is pulled to this round: the download's shared weights
            personal = site.models["personal"]
            shared, device = self.shared_keys(personal), next(personal.parameters()).device
            mem["prox_anchor"] = {k: v.detach().to(device, copy=True) for k, v in download.params.items() if k in shared}
        mem["round"] = download.round
        if self.opt.uses_cpa:
            c = self.task.num_classes
            counts = torch.tensor(global_class_counts(download, self.name), dtype=torch.float64)
            mask = cpa.conjoint_mask(counts, beta=self.opt.beta)
            mem["mask"] = mask if self.opt.cpa_global else torch.ones(c, c, dtype=torch.float64)
        protos.receive(site, download.meta)

    def before_epoch(self, site: SiteView, epoch: int) -> None:
        mem, o = site.memory, self.opt
        step = mem["round"] * self.cfg.local_epochs + epoch
        if o.det_enabled:
            metric = site.task.primary_metric
            personal = site.evaluate("personal", o.det_split)[metric]
            deputy = site.evaluate("deputy", o.det_split)[metric]
            rescue = o.det_rescue is not None and epoch > 0 and personal < o.det_rescue * deputy
            if rescue:  # P becomes D, optimiser state included: both are equal from here
                site.models["personal"].load_state_dict(site.models["deputy"].state_dict())
                site.optimizers["personal"].load_state_dict(site.optimizers["deputy"].state_dict())
                personal = deputy
            if o.det_rescue is not None:
                site.log_scalar("det/rescue", float(rescue), step)
            mem["phase"] = self._pair(site).phase(personal, deputy, just_downloaded=epoch == 0)
            for phase_name in PHASE_NAMES:  # 1 for the phase of this epoch, by name
                site.log_scalar(f"det/{phase_name}", float(mem["phase"].name.lower() == phase_name), step)
            site.log_scalar("det/personal_score", personal, step)
            site.log_scalar("det/deputy_score", deputy, step)
        if self.opt.uses_cpa:
            mem["gamma"] = self._gamma(site)
            for c, name in enumerate(site.task.class_names):
                site.log_scalar(f"cpa/gamma_{name}", float(mem["gamma"][c]), step)

    def _gamma(self, site: SiteView) -> torch.Tensor:
        mem, c = site.memory, site.task.num_classes
        refine = self.opt.cpa_local and mem["round"] >= self.opt.cpa_refine_from_round
        if not refine or "global_prototypes" not in mem or "prototypes" not in mem:
            return torch.ones(c, dtype=torch.float64)
        present = mem["prototype_present"] & mem["global_present"]
        return cpa.prototype_gamma(mem["prototypes"], mem["global_prototypes"], tau=self.opt.tau, present=present)

    def class_term(self, site: SiteView, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """CPA; the task's own term when both CPA parts are off."""
        if not self.opt.uses_cpa:
            return None
        mask = site.memory["mask"].to(targets.device, torch.float32, non_blocking=True)
        gamma = site.memory["gamma"].to(targets.device, torch.float32, non_blocking=True)
        term = cpa.cpa_loss(logits, targets, mask, gamma=gamma)
        mix = self.opt.cpa_ce_mix
        if mix:
            term = (1 - mix) * term + mix * F.cross_entropy(logits, targets)
        return term

    def losses(self, site, targets, outputs):
        losses = {role: self.supervised_loss(site, z, targets) for role, (z, _) in outputs.items()}
        if self.opt.det_enabled and site.memory["phase"] is not None:
            (z_p, _), (z_d, _) = outputs["personal"], outputs["deputy"]
            extra_p, extra_d = self._pair(site).distillation(z_p, z_d, self.opt.distillation, self.opt.distill_weight)
            losses["personal"] = losses["personal"] + extra_p
            losses["deputy"] = losses["deputy"] + extra_d
        if self.opt.personal_prox:  # Ditto's pull of P towards the round's download
            pull = proximal_term(site.models["personal"], site.memory["prox_anchor"], self.opt.personal_prox)
            losses["personal"] = losses["personal"] + pull
        return losses

    def after_batch(self, site, targets, outputs):
        # prototypes come from P's embeddings of the batch it is training on (authors' choice)
        if self.opt.cpa_local:
            protos.track(site, outputs[self.roles[0]][1], targets)

    def after_epoch(self, site: SiteView, epoch: int) -> None:
        if self.opt.cpa_local:
            protos.finish_epoch(site)

    def upload_meta(self, site: SiteView) -> dict[str, Any]:
        return protos.upload_meta(site) if self.opt.cpa_local else {}
