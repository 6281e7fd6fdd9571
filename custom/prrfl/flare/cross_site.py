"""Cross-site evaluation on a deployment: FLARE's CrossSiteEval, run after the training workflow.

Every site sends its best personalized model (`submit_model`: best_<role>.pt with its model card, see
prrfl.flare.site_app), the server sends each model to every site, and each site scores it on its own
test split (`validate`). No model of the server takes part (server_models=[], no persistor): a
personalized method has no global model, and the sites' best models stay at the sites except for this.

What FLARE's CrossSiteEval does not know about a prrfl run, this subclass adds:
* it asks only the sites that completed the run's last round (the workflow's results.json in the run
  folder), so that a site lost during training does not hold the job for the task timeouts;
* a site that has no best model answers with an error: it is reported and its empty answer is not sent
  round for validation; a model of another run (its card's run_id) is refused the same way;
* FLARE's matrix (`cross_site_val/cross_val_results.json`, keyed data site -> model site) is also written
  in prrfl's crosseval.json layout (prrfl.crosseval.cross_site_eval_result) beside the run's results.json,
  for `prrfl results` and `prrfl report`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.workflows.cross_site_eval import CrossSiteEval

from prrfl.crosseval import CROSSEVAL_FILE, cross_site_eval_result, summary_line
from prrfl.flare import task_protocol as P
from prrfl.storage import load_json, save_json

COMPONENT_ID = "cross_site_eval"  # its id in every prrfl job (prrfl.flare.job_recipe)
CARD = "model_card"  # meta key of a submitted model: its card (prrfl.site.state.SiteRuntime.model_card)
RESULTS = "results.json"  # the workflow's, in the server's run folder


def sites_to_evaluate(results: dict[str, Any]) -> list[str]:
    """The sites of a finished run that completed its last round (their last upload was used)."""
    return sorted(s for s, r in results["sites"].items() if r["participation"]["rounds"] - 1 in r["participation"]["aggregated"])


class CrossSiteEvaluation(CrossSiteEval):
    def __init__(self, submit_model_timeout: int = 600, validation_timeout: int = 3600):
        """submit_model_timeout: seconds a site has to send its best model; validation_timeout: seconds
        a site has to score one model (it scores every site's model in turn, so this bounds all of them)."""
        super().__init__(
            server_models=[],
            persistor_id="",
            ignore_result_error=True,  # a site that fails is reported, the others go on
            submit_model_timeout=submit_model_timeout,
            validation_timeout=validation_timeout,
        )
        # attributes named like the arguments: FLARE's job export reads them back into the config
        self.submit_model_timeout = submit_model_timeout
        self.validation_timeout = validation_timeout
        self.results: dict[str, Any] | None = None
        self.models: dict[str, dict[str, Any]] = {}  # site -> what its card says of the model it sent
        self.errors: dict[str, str] = {}  # "<site>" (its model) or "<model site> on <data site>" -> why not

    def initialize(self, fl_ctx: FLContext) -> None:
        run_dir = Path(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id()))
        if (run_dir / RESULTS).is_file():
            self.results = load_json(run_dir / RESULTS)
            self._participating_clients = sites_to_evaluate(self.results)
        else:
            self._participating_clients = []
        super().initialize(fl_ctx)

    def run(self) -> None:
        if self.results is None:
            self.warning("no cross-site evaluation: the training workflow wrote no results.json (it did not finish)")
            return
        left_out = sorted(set(self.results["sites"]) - set(self._participating_clients))
        if left_out:
            self.warning(f"cross-site evaluation without {left_out}: they did not complete the run's last round")
        if self._participating_clients:
            super().run()

    def _receive_local_model_cb(self, model: FLModel) -> None:
        """A submitted model: sent round for validation only when it is this run's best model of the site."""
        site, meta = model.meta["client_name"], model.meta
        card = meta.get(CARD) or {}
        if P.ERROR in meta:
            self.errors[site] = meta[P.ERROR]
        elif card.get("run_id") != self.results["run_id"]:
            self.errors[site] = f"its best model is of run {card.get('run_id')}, not of this run {self.results['run_id']}"
        else:
            self.models[site] = {k: card.get(k) for k in ("cohort", "round", "role", "weights_sha256")}
            super()._receive_local_model_cb(model)
            return
        self.warning(f"cross-site evaluation: no model of {site}: {self.errors[site]}")

    def track_results(self, model_owner: str, data_client: str, val_results: FLModel) -> None:
        error = (val_results.meta or {}).get(P.ERROR) or (None if val_results.metrics else "an answer without metrics")
        if error:
            self.errors[f"{model_owner} on {data_client}"] = error
            self.warning(f"cross-site evaluation: {data_client} could not score the model of {model_owner}: {error}")
            return
        super().track_results(model_owner, data_client, val_results)

    def save_results(self) -> None:
        super().save_results()
        result = cross_site_eval_result(self.results, self._json_val_results, self.models, self.errors)
        path = save_json(result, Path(self.get_run_dir()) / CROSSEVAL_FILE)
        self.info(f"cross-site evaluation: {summary_line(result)}; matrix in {path}")
