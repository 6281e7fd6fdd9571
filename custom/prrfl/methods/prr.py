"""PRR (TMI 2022): Progressive Fourier Aggregation at the server, Deputy-Enhanced Transfer and the
Conjoint Prototype-Aligned loss at each site.

Each site keeps a personalized model P (never overwritten) and a deputy D (receives the site's own
PFA output). Before every local epoch DET picks Recover / Exchange / Sublimate from the validation
score of D relative to P; the phase decides which model distils from the other. L_sup is CPA: the
conjoint mask G from the global class counts, weighted per class by gamma from the cosine between
the site's prototype (from P) and the sampled global prototype. Only D's non-BN weights, the class
counts and the per-class mean embeddings leave the site.
"""

from __future__ import annotations

from typing import Any

import torch

from prrfl.algorithms import cpa, det, pfa, prototypes
from prrfl.methods.base import Download, Method, Upload
from prrfl.site.state import SiteRuntime


class PRR(Method):
    name = "prr"
    roles = ("personal", "deputy")
    eval_role = "personal"
    upload_role = "deputy"

    def __init__(
        self,
        cfg,
        task,
        *,
        pfa_enabled: bool = True,
        r0: float = 0.35,
        r1: float = 0.48,
        r_schedule: str = "paper",  # "authors": r1 = 0.475 reached only after the last round
        pfa_components: str = "amplitude_phase",  # "amplitude": the MICCAI PRR-FL variant
        conv_layout: str = "paper",  # "authors": (in*kh) x (kw*out)
        classifier_rowwise: bool = True,
        site_weights: str = "uniform",  # or "samples": weight sites by training-set size
        det_enabled: bool = True,
        l1: float = 0.7,
        l2: float = 0.9,
        det_split: str = "valid",  # "train": the authors' choice
        cpa_global: bool = True,
        cpa_local: bool = True,
        beta: float = 0.8,
        tau: float = 3.0,
        cpa_refine_from_round: int = 0,  # authors: 15
        proto_std: str = "biased",  # "unbiased": the authors' K-1 divisor
        proto_std_floor: float = 0.0,  # authors: 1.0
    ):
        super().__init__(cfg, task)
        if det_split not in det.DET_METRIC_SPLITS:
            raise ValueError(f"PRR option det_split must be one of {det.DET_METRIC_SPLITS}, got {det_split!r}")
        if site_weights not in ("uniform", "samples"):
            raise ValueError(f"PRR option site_weights must be 'uniform' or 'samples', got {site_weights!r}")
        if not 0 < l1 <= l2 <= 1:
            raise ValueError(f"PRR options need 0 < l1 <= l2 <= 1, got l1={l1}, l2={l2}")
        self.opt = dict(locals())
        for key in ("self", "cfg", "task", "__class__"):
            self.opt.pop(key, None)

    # ----- shared ------------------------------------------------------------------------
    def shared_keys(self, model: torch.nn.Module) -> list[str]:
        local = pfa.batchnorm_keys(model)  # BN stays at the site (FedBN style)
        return [k for k in model.state_dict() if k not in local]

    # ----- server --------------------------------------------------------------------------
    def aggregate(self, uploads: list[Upload], round_idx: int, server: dict[str, Any]) -> dict[str, Download]:
        o = self.opt
        states = [u.params for u in uploads]
        if o["pfa_enabled"]:
            r = pfa.pfa_threshold(round_idx, self.cfg.num_rounds, r0=o["r0"], r1=o["r1"], schedule=o["r_schedule"])
            weights = [float(u.num_train) for u in uploads] if o["site_weights"] == "samples" else None
            mixed = pfa.pfa_aggregate(
                states,
                r,
                weights=weights,
                components=o["pfa_components"],
                conv_layout=o["conv_layout"],
                classifier_key=self.task.classifier_key,
                classifier_rowwise=o["classifier_rowwise"],
                bn_keys=set(),  # BN keys never travel (shared_keys)
            )
        else:
            r, mixed = 0.0, states  # PFA off: each deputy keeps its own weights
        generator = torch.Generator()
        if "proto_rng" in server:  # continue the persisted stream: a resumed server samples the same prototypes
            generator.set_state(server["proto_rng"])
        else:
            generator.manual_seed(self.cfg.seed + 7919)
        site_protos = torch.stack([torch.as_tensor(u.meta["prototypes"], dtype=torch.float64) for u in uploads])
        present = torch.stack([torch.as_tensor(u.meta["prototype_present"], dtype=torch.bool) for u in uploads])
        global_protos, global_present = prototypes.sample_global_prototypes(
            site_protos, site_present=present, generator=generator, std=o["proto_std"], std_floor=o["proto_std_floor"]
        )
        server["proto_rng"] = generator.get_state()
        meta = {
            "pfa_r": r,
            "global_prototypes": global_protos.tolist(),
            "global_prototype_present": global_present.tolist(),
        }
        return {u.site: Download(params=p, meta=dict(meta)) for u, p in zip(uploads, mixed)}

    # ----- site ----------------------------------------------------------------------------
    def on_download(self, site: SiteRuntime, download: Download, first: bool) -> None:
        if first:  # P and D start from the same initial model
            for role in self.roles:
                site.models[role].load_state_dict(download.params)
        else:
            site.models["deputy"].load_state_dict(download.params, strict=False)
        mem = site.memory
        mem["phase"] = None  # every download restarts DET in Recover
        counts = download.meta["global_class_counts"]
        c = self.task.num_classes
        mask = cpa.conjoint_mask(torch.tensor(counts, dtype=torch.float64), beta=self.opt["beta"])
        mem["mask"] = mask if self.opt["cpa_global"] else torch.ones(c, c, dtype=torch.float64)
        if "global_prototypes" in download.meta:
            mem["global_prototypes"] = torch.tensor(download.meta["global_prototypes"], dtype=torch.float64)
            mem["global_present"] = torch.tensor(download.meta["global_prototype_present"], dtype=torch.bool)
        mem["round"] = download.meta["round"]
        if "pfa_r" in download.meta:
            site.log_scalar("pfa/r", download.meta["pfa_r"], download.meta["round"] * self.cfg.local_epochs)

    def before_epoch(self, site: SiteRuntime, epoch: int) -> None:
        mem, o = site.memory, self.opt
        step = mem["round"] * self.cfg.local_epochs + epoch
        if o["det_enabled"]:
            metric = site.task.primary_metric
            personal = site.evaluate("personal", o["det_split"])[metric]
            deputy = site.evaluate("deputy", o["det_split"])[metric]
            mem["phase"] = det.next_phase(mem["phase"], deputy, personal, l1=o["l1"], l2=o["l2"], just_downloaded=epoch == 0)
            site.log_scalar("det/phase", int(mem["phase"]), step)
            site.log_scalar("det/personal_score", personal, step)
            site.log_scalar("det/deputy_score", deputy, step)
        mem["gamma"] = self._gamma(site)
        for c, name in enumerate(site.task.class_names):
            site.log_scalar(f"cpa/gamma_{name}", float(mem["gamma"][c]), step)
        mem["accumulator"] = prototypes.PrototypeAccumulator(site.task.num_classes, self._embed_dim(site))

    def _gamma(self, site: SiteRuntime) -> torch.Tensor:
        mem, c = site.memory, site.task.num_classes
        refine = self.opt["cpa_local"] and mem["round"] >= self.opt["cpa_refine_from_round"]
        if not refine or "global_prototypes" not in mem or "prototypes" not in mem:
            return torch.ones(c, dtype=torch.float64)
        present = mem["prototype_present"] & mem["global_present"]
        return cpa.prototype_gamma(mem["prototypes"], mem["global_prototypes"], tau=self.opt["tau"], present=present)

    @staticmethod
    def _embed_dim(site: SiteRuntime) -> int:
        return site.models["personal"].fc2.in_features

    def losses(self, site, labels, outputs):
        mem = site.memory
        mask = mem["mask"].to(labels.device, torch.float32)
        gamma = mem["gamma"].to(labels.device, torch.float32)
        (z_p, _), (z_d, _) = outputs["personal"], outputs["deputy"]
        loss_p = cpa.cpa_loss(z_p, labels, mask, gamma=gamma)
        loss_d = cpa.cpa_loss(z_d, labels, mask, gamma=gamma)
        phase = mem["phase"] if self.opt["det_enabled"] else None
        if phase is not None:
            p_learns, d_learns = det.distillation_targets(phase)
            if p_learns:
                loss_p = loss_p + det.kl_distillation(z_p, z_d)
            if d_learns:
                loss_d = loss_d + det.kl_distillation(z_d, z_p)
        return {"personal": loss_p, "deputy": loss_d}

    def after_batch(self, site, labels, outputs):
        # prototypes come from P's embeddings of the batch it is training on (authors' choice)
        site.memory["accumulator"].update(outputs["personal"][1].detach(), labels)

    def after_epoch(self, site: SiteRuntime, epoch: int) -> None:
        protos, counts = site.memory.pop("accumulator").compute()
        site.memory["prototypes"] = protos.double().cpu()
        site.memory["prototype_present"] = (counts > 0).cpu()

    def upload_meta(self, site: SiteRuntime) -> dict[str, Any]:
        return {
            "prototypes": site.memory["prototypes"].tolist(),
            "prototype_present": site.memory["prototype_present"].tolist(),
        }
