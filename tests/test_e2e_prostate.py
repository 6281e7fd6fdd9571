"""prostate_prr end to end in the FLARE simulator: 2 sites, 2 rounds, tiny synthetic NIfTI volumes
written in the raw layout and prepared like real data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import SimulatorRun, session_cache
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from prrfl.config import RunConfig
from prrfl.flare.job_recipe import export_job
from prrfl.flare.jobs import job_config
from prrfl.registry import build_task

pytestmark = pytest.mark.e2e

TINY_PROSTATE = {"image_size": 32, "model_width": 4, "synthetic_scale": 0.1, "synthetic_matrix_scale": 0.15}


def tiny_prostate_config(job: str) -> RunConfig:
    return RunConfig.from_dict({**job_config(job).to_dict(), "num_rounds": 2, "local_epochs": 1, "data": TINY_PROSTATE})


@pytest.fixture(scope="module")
def prostate_runs(tmp_path_factory):
    """The prostate PRR and HarmoFL jobs in FLARE's simulator, started together (conftest's SimulatorRun): job ->
    its SimulatorRun."""
    runs = {}
    for job in ("prostate_prr", "prostate_harmofl"):
        root = tmp_path_factory.mktemp(job)
        exported = export_job(job, root / "jobs", cfg=tiny_prostate_config(job))
        runs[job] = SimulatorRun(exported, root / "ws", 2, session_cache(tmp_path_factory))
    yield runs
    for run in runs.values():
        run.stop()


@pytest.fixture(scope="module")
def finished_run(prostate_runs):
    return prostate_runs["prostate_prr"].finished()


def test_every_site_reports_volume_dice_and_iou(finished_run):
    ws, proc = finished_run
    server = json.loads((ws / "server/simulate_job/results.json").read_text())
    assert sorted(server["sites"]) == ["site-1", "site-2"]
    for site, cohort in (("site-1", "RUNMC"), ("site-2", "BMC")):
        results = json.loads((ws / site / "prrfl/prostate_prr/results.json").read_text())
        assert results["task"] == "prostate" and results["cohort"] == cohort and results["rounds_completed"] == 2
        assert set(results["best"]["test"]) == {"dice", "iou", "slice_dice", "slice_iou"}
        assert 0 <= results["best"]["test"]["iou"] <= results["best"]["test"]["dice"] <= 100  # IoU <= Dice
        counts = results["class_counts"]  # voxels per class: 32 x 32 per training slice
        assert sum(counts) == results["num_train"] * 32 * 32 and 0 < counts[1] < counts[0]
        assert results["ood"] is None  # the prostate task has no out-of-distribution cohort
    assert "test Dice" in proc.stdout + proc.stderr  # the job prints the per-site table with the task's metrics


def test_each_site_gets_its_own_pfa_download(finished_run):
    ws, _ = finished_run
    state = torch.load(ws.with_name("ws.state") / "server/prostate_prr/server_state.pt", weights_only=False)
    one, two = state["downloads"]["site-1"].params, state["downloads"]["site-2"].params
    assert set(one) == set(two) and not any(k.endswith(("running_mean", "running_var")) for k in one)  # BN stays
    assert "aspp.0.weight" in one and any(not torch.equal(one[k], two[k]) for k in one)
    assert len(state["downloads"]["site-1"].meta["global_prototypes"]) == 2  # background, prostate


def test_tensorboard_events_for_every_site(finished_run):
    ws, _ = finished_run
    for site in ("site-1", "site-2"):
        files = list((ws / "server/simulate_job/tb_events").glob(f"{site}_*/events.out.tfevents.*"))
        assert files, f"no TensorBoard events for {site}"
        acc = EventAccumulator(str(files[0].parent))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        for expected in ("loss/personal", "det/recover", "valid/dice", "test/iou", "cpa/gamma_prostate"):
            assert any(t.endswith(expected) for t in tags), (expected, sorted(tags))


def test_report_builds_table_iii_and_the_overlay_figure(finished_run, tmp_path):
    from prrfl.report import build_report

    ws, _ = finished_run
    for site in ("site-1", "site-2"):
        with np.load(ws / site / "prrfl/prostate_prr/examples.npz") as z:
            assert z["image"].shape == z["truth"].shape == z["prediction"].shape and z["image"].shape[1:] == (32, 32)
            assert set(np.unique(z["truth"])) <= {0, 1} and z["truth"][0].any()  # the largest prostate section
    report = build_report([ws], tmp_path / "report")
    text = report.read_text()
    assert "## Table III: per-site test Dice/slice, IoU/slice, Dice and IoU" in text and "Table X" not in text
    header = "| method | seeds | site-1_RUNMC Dice/slice | site-1_RUNMC IoU/slice | site-1_RUNMC Dice | site-1_RUNMC IoU | site-2_BMC Dice/slice |"
    assert header in text
    assert "![overlays](overlays.jpg)" in text and (tmp_path / "report/overlays.jpg").stat().st_size > 0


def test_predict_writes_the_trained_models_masks_on_each_raw_volumes_grid(finished_run, tmp_path):
    """site-1's trained model on the raw RUNMC volumes its federation was prepared from: one mask per
    volume with the volume's affine and shape, equal to the model's labels on the prepared test slices
    taken back to the volume's grid; the summary counts its voxels."""
    import csv

    import nibabel as nib

    from prrfl.data.augment import normalize
    from prrfl.inference import load_saved_model
    from prrfl.predict import predict
    from prrfl.tasks.prostate.prepare import restore_labels
    from prrfl.tasks.prostate.reader import from_canonical, load_image
    from prrfl.tasks.prostate.store import load_split

    ws, _ = finished_run
    best = ws.with_name("ws.state") / "site-1/prostate_prr/best_personal.pt"
    federation = build_task(tiny_prostate_config("prostate_prr")).prepared_root(None).parent  # the run's (session cache)
    raw = federation / "raw/RUNMC"
    result = predict(best, raw, tmp_path / "masks")
    volumes = sorted(p for p in raw.glob("*.nii.gz") if "_segmentation" not in p.name.lower())
    assert result.inputs == len(volumes) > 0
    with open(tmp_path / "masks/summary.csv", newline="") as f:
        summary = {r["file"]: r for r in csv.DictReader(f)}
    test = load_split(federation / "prepared", "RUNMC", "test")
    model = load_saved_model(best).model
    compared = 0
    for path in volumes:
        stem = path.name[: -len(".nii.gz")]
        source, written = nib.load(path), nib.load(tmp_path / f"masks/{stem}_mask.nii.gz")
        mask = np.asanyarray(written.dataobj)
        assert mask.shape == source.shape and np.array_equal(written.affine, source.affine) and mask.dtype == np.uint8
        assert int(summary[path.name]["voxels_prostate"]) == int(mask.sum())
        if stem in test.cases:
            images, _ = test.volume(stem)
            with torch.no_grad():
                labels = model(normalize(images))[0].argmax(dim=1).numpy().astype(np.uint8)
            volume = load_image(path)
            np.testing.assert_array_equal(mask, from_canonical(restore_labels(labels, volume.image.shape), volume.ornt))
            compared += 1
    assert compared == len(test.cases) > 0


def test_harmofl_runs_on_prostate_and_its_global_model_scores_the_pooled_volumes(prostate_runs):
    from prrfl.crosseval import write_crosseval

    ws, _ = prostate_runs["prostate_harmofl"].finished()
    server = json.loads((ws / "server/simulate_job/results.json").read_text())
    amplitude = torch.load(server["global_model"]["file"])["norm.amplitude"]
    assert amplitude.shape == (1, 32, 32) and amplitude.abs().sum() > 0  # one MRI channel at the slices' size
    [path] = write_crosseval(ws)
    result = json.loads(path.read_text())
    assert result["metrics"] == ["dice"] and result["generalization"]["model"] == "global"
    assert 0 <= result["generalization"]["values"]["dice"] <= 100
    for site in ("site-1", "site-2"):
        reported = json.loads((ws / site / "prrfl/prostate_harmofl/results.json").read_text())["best"]["test"]
        assert result["specialization"]["per_site"][site] == {"dice": reported["dice"]}
