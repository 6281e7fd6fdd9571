"""FLARE glue that needs no running FLARE: job folders, upload checks, site naming."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import TinyTask
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import ParamsType
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from prrfl.config import RunConfig
from prrfl.flare import task_protocol as P
from prrfl.flare.job_recipe import PRIVACY_FILTERS, export_job
from prrfl.flare.jobs import JOBS, job_config, job_files
from prrfl.messages import Download, Upload
from prrfl.server.checks import upload_problem
from prrfl.server.federation import add_to_sent
from prrfl.tasks.derm.task import DermTask

JOBS_DIR = Path(__file__).resolve().parents[1] / "jobs"


@pytest.mark.parametrize("name", sorted(JOBS))
def test_committed_job_folders_match_the_code(name, tmp_path):
    exported = export_job(name, tmp_path)
    assert job_files(exported) == job_files(JOBS_DIR / name), "run `prrfl jobs export`"


def test_job_folder_shape_and_config(tmp_path):
    job = export_job("derm_prr", tmp_path)
    server = json.loads((job / "app/config/config_fed_server.json").read_text())
    client = json.loads((job / "app/config/config_fed_client.json").read_text())
    workflow = server["workflows"][0]
    assert workflow["path"] == "prrfl.flare.server_workflow.PersonalizedWorkflow"
    assert RunConfig.from_dict(workflow["args"]["config"]) == job_config("derm_prr")
    assert any(c["path"] == "prrfl.flare.tracking.TensorBoardReceiver" for c in server["components"])
    assert any(c["path"].endswith("ConvertToFedEvent") for c in client["components"])
    executor = client["executors"][0]["executor"]
    assert executor["args"]["task_script_path"] == "prrfl_site.py"
    assert sorted(p.name for p in (job / "app/custom").iterdir()) == ["prrfl_site.py"]
    bundled = export_job("derm_prr", tmp_path / "b", bundle=True)
    assert (bundled / "app/custom/prrfl/algorithms/pfa.py").exists()


def test_paper_job_carries_the_paper_schedule():
    cfg = job_config("derm_prr_paper")
    assert (cfg.num_rounds, cfg.local_epochs, cfg.lr, cfg.batch_size, cfg.lr_step_epochs) == (50, 5, 1e-2, 16, 25)
    assert cfg.data["image_size"] == 128 and cfg.data["synthetic_scale"] == 1.0


def test_prostate_jobs_halve_the_learning_rate_as_the_paper_scaled_to_their_epochs():
    paper = job_config("prostate_prr_paper")  # 60 epochs: halved after 25 and 50
    assert (paper.num_rounds * paper.local_epochs, paper.lr) == (60, 1e-3)
    assert [paper.lr_at(e) for e in (0, 24, 25, 49, 50, 59)] == [1e-3, 1e-3, 5e-4, 5e-4, 2.5e-4, 2.5e-4]
    quick = job_config("prostate_prr")  # 20 epochs: halved after 8 and 16 (25 / 60 of them, rounded down)
    assert quick.num_rounds * quick.local_epochs == 20
    assert [quick.lr_at(e) for e in (0, 7, 8, 15, 16, 19)] == [1e-3, 1e-3, 5e-4, 5e-4, 2.5e-4, 2.5e-4]
    assert job_config("prostate_fedavg").lr_step_epochs == 8  # every method of the task on the same schedule


def _upload(**overrides):
    ref = {"w": torch.zeros(2, 3), "n": torch.zeros((), dtype=torch.long)}
    values = dict(
        site="s",
        params={k: v.clone() for k, v in ref.items()},
        num_train=6,
        class_counts=[1, 2, 3],
        meta={"prototypes": [[0.0] * 4] * 3, "prototype_present": [True] * 3},
    )
    values.update(overrides)
    return Upload(**values), ref


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({}, None),
        ({"params": {"w": torch.zeros(2, 3)}}, "missing \\['n'\\]"),
        ({"params": {"w": torch.zeros(2, 3), "n": torch.zeros(()), "x": torch.zeros(1)}}, "unexpected \\['x'\\]"),
        ({"params": {"w": torch.zeros(3, 2), "n": torch.zeros(())}}, "shape \\(3, 2\\)"),
        ({"params": {"w": torch.full((2, 3), math.nan), "n": torch.zeros(())}}, "NaN or Inf"),
        ({"class_counts": [1, -2, 7]}, "non-negative"),
        ({"class_counts": [1, 2]}, "3 non-negative"),
        ({"num_train": 5}, "num_train 5"),
        ({"meta": {"prototypes": [[0.0] * 4] * 2, "prototype_present": [True] * 2}}, "one row per class"),
        ({"meta": {"prototypes": [[math.inf] * 4] * 3, "prototype_present": [True] * 3}}, "prototypes hold NaN"),
        ({"meta": {"prototypes": [[1e300] * 4] * 3, "prototype_present": [True] * 3}}, "norm overflows float32 \\(largest 2e\\+300\\)"),
        ({"meta": {"prototypes": [[1e19] * 4] * 3, "prototype_present": [True] * 3}}, None),  # 2e19: float32 holds it
    ],
)
def test_malformed_uploads_are_rejected_with_a_reason(overrides, reason):
    upload, ref = _upload(**overrides)
    problem = upload_problem(upload, ref, TinyTask({}))
    if reason is None:
        assert problem is None
    else:
        assert problem is not None and re.search(reason, problem), problem


def test_flare_site_names_map_to_cohorts():
    task = DermTask({})
    assert [task.cohort_of(f"site-{i}") for i in range(1, 5)] == ["A", "B", "C", "D"]
    assert task.cohort_of("C") == "C"
    with pytest.raises(ValueError, match="cannot map FLARE site 'site-5'"):
        task.cohort_of("site-5")
    with pytest.raises(ValueError, match="unknown derm data option"):
        DermTask({"img_size": 32})


def _trained_upload(received: dict[str, torch.Tensor]) -> Upload:
    g = torch.Generator().manual_seed(0)
    params = {k: v + 0.02 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v + 5 for k, v in received.items()}
    protos = [[0.5] * 4] * 3
    return Upload("s", params, 6, [1, 2, 3], {"prototypes": protos, "prototype_present": [True] * 3})


def test_a_site_reads_the_round_and_global_counts_as_fields_and_the_methods_values_in_meta():
    download = Download(params={"w": torch.ones(2)}, meta={"pfa_r": 0.4})
    common = {P.CONFIG: RunConfig().to_dict(), P.RUN_ID: "r1", P.NUM_SITES: 3, P.GLOBAL_COUNTS: [5, 6, 7]}
    task = P.download_to_model(download, common, 2, 5)
    assert task.meta == {**common, P.ROUND: 2, "pfa_r": 0.4} and task.current_round == 2 and task.total_rounds == 5
    received = P.model_to_download(task)
    assert received.round == 2 and received.global_class_counts == [5, 6, 7] and received.meta == {"pfa_r": 0.4}
    assert torch.equal(received.params["w"], download.params["w"])


def test_a_site_uploads_the_difference_and_the_server_adds_back_what_it_sent():
    received = {"w": torch.randn(4, 5), "n": torch.tensor(7)}
    upload = _trained_upload(received)
    sent = P.upload_to_model(upload, {}, received)
    assert sent.params_type == ParamsType.DIFF
    assert torch.equal(sent.params["n"], torch.tensor(5))
    back = P.model_to_upload("s", sent)
    assert upload_problem(back, received, TinyTask({})) is None
    rebuilt = add_to_sent(back, received)
    torch.testing.assert_close(rebuilt.params["w"], upload.params["w"])
    assert torch.equal(rebuilt.params["n"], upload.params["n"]) and rebuilt.params["n"].dtype == torch.long
    assert rebuilt.meta == upload.meta and rebuilt.class_counts == upload.class_counts
    with pytest.raises(KeyError, match="not in the download"):
        P.upload_to_model(upload, {}, {"w": received["w"]})


def test_a_channels_last_sites_upload_streams_through_flare():
    """FLARE streams each tensor through safetensors, which refuses a tensor not contiguous in the default order: a
    channels_last model's 4-D weights (prrfl.numerics) once failed the job at the first upload."""
    from nvflare.app_opt.pt.tensor_downloader import TensorDownloadable

    conv = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    received = {k: torch.zeros_like(v, memory_format=torch.contiguous_format) for k, v in conv.state_dict().items()}
    upload = Upload("s", {k: v.detach() for k, v in conv.state_dict().items()}, 6, [1, 2, 3], {})
    assert not upload.params["weight"].is_contiguous()  # what a channels_last site holds
    sent = P.upload_to_model(upload, {}, received)
    streamed = TensorDownloadable(sent.params, max_chunk_size=1 << 20)
    for i in range(streamed.get_item_count()):
        assert streamed.produce_item(i)  # bytes, not "You are trying to save a non contiguous tensor"
    torch.testing.assert_close(sent.params["weight"], conv.weight.detach())


def test_flare_percentile_privacy_filter_applies_to_the_upload():
    """The filter a job gets with `prrfl jobs export --privacy percentile`, on the exact result a site sends."""
    received = {"w": torch.randn(20, 30), "n": torch.tensor(7)}
    upload = _trained_upload(received)
    shareable = FLModelUtils.to_shareable(P.upload_to_model(upload, {}, received))
    filtered = FLModelUtils.from_shareable(PRIVACY_FILTERS["percentile"]().process(shareable, FLContext()))
    back = P.model_to_upload("s", filtered)
    assert upload_problem(back, received, TinyTask({})) is None  # still a well-formed upload
    diff = back.params["w"]
    assert diff.abs().max() <= 0.01 + 1e-7  # clipped to gamma
    assert 0.08 <= float((diff == 0).float().mean()) <= 0.12  # the smallest 10 % withheld
    assert back.meta == upload.meta and back.class_counts == upload.class_counts
    rebuilt = add_to_sent(back, received)
    assert torch.equal(rebuilt.params["w"][diff == 0], received["w"][diff == 0])


def test_a_privacy_filter_is_added_to_the_train_results(tmp_path):
    job = export_job("derm_prr", tmp_path, privacy="percentile")
    client = json.loads((job / "app/config/config_fed_client.json").read_text())
    (entry,) = client["task_result_filters"]
    assert entry["tasks"] == ["train"] and entry["filters"][0]["path"].endswith("PercentilePrivacy")
    with pytest.raises(ValueError, match="unknown privacy filter"):
        export_job("derm_prr", tmp_path, privacy="blur")


# ----- the update-norm rule ---------------------------------------------------------------------------------
def test_update_norm_is_the_l2_norm_over_floating_entries():
    from prrfl.server.checks import update_norm

    diff = {"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]]), "bn.num_batches_tracked": torch.tensor(100)}
    assert update_norm(diff) == pytest.approx(5.0)


def test_an_update_far_above_the_rounds_median_is_an_outlier_with_its_reason():
    from prrfl.server.checks import norm_outliers

    norms = {"site-1": 1.0, "site-2": 2.0, "site-3": 1.5, "site-4": 50.0}
    # lower median of [1, 1.5, 2, 50] is 1.5; 50 > 10 x 1.5, 2 is not
    assert list(norm_outliers(norms, 10.0)) == ["site-4"]
    assert norm_outliers(norms, 10.0)["site-4"] == ("its update norm 50 is 33.3 x the round's median 1.5 (limit: update_norm_ratio=10)")
    two_huge = {"a": 1.0, "b": 1.2, "c": 1e6, "d": 2e6}  # the lower median is still an honest site's
    assert sorted(norm_outliers(two_huge, 10.0)) == ["c", "d"]
    assert norm_outliers(norms, None) == {}  # off
    assert norm_outliers({"a": 0.0, "b": 0.0, "c": 3.0}, 10.0) == {}  # no weights travel (median 0)


def test_with_two_sites_the_larger_update_is_refused_when_it_is_ratio_times_the_other():
    from prrfl.server.checks import norm_outliers

    # the lower median of two is the smaller: 1e4 x 0.12 is 1e4 x the honest site's norm
    assert norm_outliers({"site-1": 0.12, "site-2": 1200.0}, 10.0) == {
        "site-2": "its update norm 1.2e+03 is 1e+04 x the round's median 0.12 (limit: update_norm_ratio=10)"
    }
    assert norm_outliers({"site-1": 0.12, "site-2": 1.19}, 10.0) == {}  # 9.9 x: within the ratio
    # which of two is wrong cannot be known: the larger is refused, as it would dominate the average
    assert list(norm_outliers({"site-1": 0.12, "site-2": 0.0012}, 10.0)) == ["site-1"]


def test_a_site_is_also_measured_against_its_own_accepted_norms():
    from prrfl.server.checks import NORM_HISTORY, norm_outliers

    history = {"site-1": [9.0, 1.0, 2.0, 3.0, 4.0, 5.0]}  # the last NORM_HISTORY = 5: median_low of 1..5 is 3
    assert NORM_HISTORY == 5
    # alone in its round (no round rule), 31 > 10 x 3; 29 is not
    assert norm_outliers({"site-1": 31.0}, 10.0, history) == {
        "site-1": "its update norm 31 is 10.3 x the median 3 of its own last 5 accepted update(s) (limit: update_norm_ratio=10)"
    }
    assert norm_outliers({"site-1": 29.0}, 10.0, history) == {}
    # two sites that both turn 20 x larger: the round's rule sees nothing, each site's own history does
    both = norm_outliers({"a": 20.0, "b": 24.0}, 10.0, {"a": [1.0], "b": [1.2, 1.0]})
    assert sorted(both) == ["a", "b"] and "x the median 1 of its own last 1" in both["a"]
    assert norm_outliers({"a": 20.0}, None, {"a": [1.0]}) == {}  # ratio off: both relative rules off


def test_an_absolute_bound_refuses_any_upload_above_it_even_alone():
    from prrfl.server.checks import norm_outliers

    assert norm_outliers({"site-1": 2.5e3}, None, max_norm=1e3) == {"site-1": "its update norm 2.5e+03 exceeds update_norm_max=1000"}
    assert norm_outliers({"site-1": 999.0}, None, max_norm=1e3) == {}
    # the absolute reason wins where both apply (one reason per site)
    assert norm_outliers({"a": 1.0, "b": 2e3}, 10.0, max_norm=1e3) == {"b": "its update norm 2e+03 exceeds update_norm_max=1000"}


def test_update_norm_ratio_must_exceed_one_or_be_null():
    from prrfl.config import ConfigError, RunConfig

    assert RunConfig().update_norm_ratio == 10.0 and RunConfig(update_norm_ratio=None).update_norm_ratio is None
    with pytest.raises(ConfigError, match="config field 'update_norm_ratio' must be > 1 or null"):
        RunConfig(update_norm_ratio=0.5)


def test_tracking_run_names_carry_the_cohort_and_backends_are_checked():
    from prrfl.flare.tracking import TensorBoardReceiver, receiver, run_name

    assert run_name("site-2", {"site-2": "B"}) == "site-2_B"
    assert run_name("site-1", {"site-1": "ViDIR Modern/1"}) == "site-1_ViDIR-Modern-1"  # a safe folder name
    assert run_name("site-3", {"site-1": "A"}) == "site-3"  # cohort not reported (yet): the client name
    assert isinstance(receiver("tensorboard"), TensorBoardReceiver)
    with pytest.raises(ValueError, match="unknown tracking backend 'wandb'"):
        receiver("wandb")
    with pytest.raises(ValueError, match="tracking_uri is for tracking='mlflow'"):
        receiver("tensorboard", "sqlite:///x.db")
    assert receiver("mlflow", "sqlite:///x.db", experiment="derm_prr").kw_args == {"experiment_name": "derm_prr"}


def test_the_federation_tracks_a_global_models_scores_where_the_sites_log_them(monkeypatch):
    """A FedAvg site's reported model after round 2 is the global model of round 1, scored at round 2's download:
    the federation logs the sites' mean as valid_global/... at round 1's last epoch, as the sites do; a
    personalized method's after-round scores stay valid/... at the round's last epoch."""
    from prrfl.flare import server_workflow

    sent: list[tuple[int, dict[str, float]]] = []
    monkeypatch.setattr(server_workflow, "send_scalars", lambda component, ctx, scalars, step: sent.append((step, dict(scalars))))
    flow = server_workflow.PersonalizedWorkflow.__new__(server_workflow.PersonalizedWorkflow)
    flow.cfg, flow.fl_ctx = RunConfig(local_epochs=5, num_rounds=4), None

    def summary(kind: str, epochs_done: int, f1: float) -> dict:
        return {"last": {"kind": kind, "epochs_done": epochs_done, "valid": {"f1": f1}, "test": {"f1": f1 + 1}}}

    flow._track_round(2, {"A": summary("download", 10, 50.0), "B": summary("download", 10, 60.0)}, {"pfa/r": 0.4}, "f1")
    assert sent == [(10, {"pfa/r": 0.4}), (9, {"valid_global/f1": 55.0, "test_global/f1": 56.0}), (14, {"federation/sites_aggregated": 2})]
    sent.clear()
    flow._track_round(2, {"A": summary("round", 15, 50.0), "B": summary("round", 15, 70.0)}, {}, "f1")
    assert sent == [(10, {}), (14, {"federation/sites_aggregated": 2, "valid/f1": 60.0, "test/f1": 61.0})]


def test_the_federation_shows_a_download_reporting_sites_own_model_and_the_last_aggregates_scores():
    """FedBN, SiloBN, FedAvg: beside the reported global model (valid_global/...), the mean of the sites' models after
    the round's local epochs (`trained`, valid/...); the last aggregate, scored after the last round, lands at the last
    epoch (step num_rounds x E - 1) as valid_global/... (hand-computed means)."""
    from prrfl.flare.server_workflow import site_means

    def site(f1_global: float, f1_own: float) -> dict:
        return {
            "last": {"kind": "download", "epochs_done": 10, "valid": {"f1": f1_global}, "test": {"f1": f1_global + 1}},
            "trained": {"round": 2, "epochs_done": 15, "valid": {"f1": f1_own}, "test": {"f1": f1_own + 2}},
        }

    assert site_means({"A": site(50.0, 70.0), "B": site(60.0, 80.0)}, 14) == {
        9: {"valid_global/f1": 55.0, "test_global/f1": 56.0},
        14: {"valid/f1": 75.0, "test/f1": 77.0},
    }
    last = {"kind": "download", "epochs_done": 20, "valid": {"f1": 40.0}, "test": {"f1": 30.0, "auc": 70.0}}
    assert site_means({"A": {"last": last}, "B": {"last": {**last, "test": {"f1": 50.0, "auc": 80.0}}}}, 19) == {
        19: {"valid_global/f1": 40.0, "test_global/f1": 40.0, "test_global/auc": 75.0}
    }
    assert site_means({"A": {"last": None}}, 4) == {}


def test_time_left_is_the_pace_so_far_times_the_units_to_go():
    from prrfl.progress import duration, time_left

    assert time_left(60.0, 2, 5) == "about 90 s left"  # 30 s a round, 3 to go
    assert time_left(600.0, 1, 5) == "about 40 min left"
    assert time_left(10.0, 0, 5) == "" and time_left(10.0, 5, 5) == ""  # nothing measured yet / nothing left
    assert [duration(s) for s in (59.4, 119.4, 119.6, 7169, 7171)] == ["59 s", "119 s", "2 min", "119 min", "2.0 h"]
