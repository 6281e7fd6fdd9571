"""One name for a site in every output (prrfl.naming): the FLARE client name the console shows and the cohort, as
`site-1_RUNMC`, in the results table, the TensorBoard and MLflow runs, the cross-site matrix and the reports."""

from __future__ import annotations

import re

from nvflare.apis.fl_constant import EventScope, FLContextKey, ReservedKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_opt.tracking.mlflow.mlflow_receiver import MLflowReceiver

from prrfl.naming import cohort_labels, site_label

COHORTS = {"site-1": "RUNMC", "site-2": "BMC"}  # a prostate run in the simulator
LABELS = ["site-1_RUNMC", "site-2_BMC"]


def test_a_label_is_the_client_name_and_the_cohort_as_one_safe_token():
    assert site_label("site-2", "B") == "site-2_B"
    assert site_label("site-1", "ViDIR Modern/1") == "site-1_ViDIR-Modern-1"  # a folder name, a CSV header, a shell word
    assert site_label("RUNMC", "RUNMC") == "RUNMC"  # a deployment naming its clients by their cohorts: named once
    assert site_label("site-3", None) == "site-3" and site_label("site-3", "") == "site-3"  # cohort not known (yet)
    # over several runs: the cohort's label where every run gave it to one client; the cohort alone where they differ
    assert cohort_labels([("site-1", "A"), ("site-1", "A"), ("site-2", "B"), ("B", "B")]) == {"A": "site-1_A", "B": "B"}


def results_rows(table: str) -> list[str]:
    return [line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:] if not line.startswith("| **mean**")]


def tensorboard_run(site: str) -> str:
    """The run (event folder) the server's TensorBoard receiver writes a site's scalars to."""
    from prrfl.flare.tracking import TensorBoardReceiver, publish_cohorts

    ctx = FLContext()
    publish_cohorts(ctx, COHORTS, "run1")
    ctx.set_prop(FLContextKey.EVENT_SCOPE, EventScope.FEDERATION, private=True, sticky=False)
    event = Shareable()
    event.set_peer_props({ReservedKey.IDENTITY_NAME: site})
    return TensorBoardReceiver()._get_record_origin(ctx, event)


def mlflow_run(site: str, monkeypatch) -> str:
    """The name the MLflow receiver gives a site's run once the workflow has published the cohorts."""
    from prrfl.flare.mlflow_tracking import MLflowRunReceiver
    from prrfl.flare.tracking import publish_cohorts

    names = []

    class Client:
        def update_run(self, run_id, name):
            names.append(name)

        def set_tag(self, run_id, key, value):
            pass

    monkeypatch.setattr(MLflowReceiver, "save", lambda self, fl_ctx, shareable, record_origin: None)
    receiver = MLflowRunReceiver(kw_args={"experiment_name": "prostate_prr"})
    receiver.mlflow_clients, receiver.run_ids = {site: Client()}, {site: "r1"}
    ctx = FLContext()
    publish_cohorts(ctx, COHORTS)
    receiver.save(ctx, Shareable(), site)
    (name,) = names
    return name


def test_one_run_names_each_site_alike_in_its_results_table_tracking_runs_and_cross_site_matrix(monkeypatch):
    from prrfl.report.protocol import run_matrix
    from prrfl.summary import results_table

    best = {"round": 1, "test": {"slice_dice": 80.0, "slice_iou": 70.0, "dice": 82.0, "iou": 71.0}}
    summaries = {site: {"best": best, "cohort": cohort} for site, cohort in COHORTS.items()}
    table = results_table(summaries, ("slice_dice", "dice"))
    crosseval = {
        "task": "prostate",
        "method": "prr",
        "reported_model": "personal",
        "cohorts": COHORTS,
        "cross_site": {m: {t: {"dice": 80.0} for t in COHORTS} for m in COHORTS},
    }
    matrix = run_matrix(crosseval).splitlines()
    assert results_rows(table) == LABELS  # `prrfl results` and the table the server logs at the end of the run
    assert [tensorboard_run(site) for site in COHORTS] == LABELS  # <run dir>/tb_events/site-1_RUNMC/
    assert [mlflow_run(site, monkeypatch) for site in COHORTS] == LABELS  # the MLflow run's name
    assert matrix[0] == "| prr: Dice on → | site-1_RUNMC | site-2_BMC |"  # `prrfl results`, `prrfl crosseval`, the report
    assert [re.sub(r"'s personal \|.*", "", row).removeprefix("| ") for row in matrix[2:]] == LABELS
