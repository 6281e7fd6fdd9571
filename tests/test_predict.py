"""`prrfl predict`: a saved best model on raw images / NIfTI volumes, preprocessed as in training."""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image

from prrfl.cli import main
from prrfl.config import RunConfig
from prrfl.data.augment import normalize
from prrfl.flare.jobs import job_config
from prrfl.inference import load_saved_model
from prrfl.predict import chance_level, predict
from prrfl.registry import build_method, build_task
from prrfl.site.state import CARD_FIELDS, MODEL_CARD_FORMAT, MODEL_CARD_FORMAT_1, SiteRuntime, save_weights
from prrfl.storage import save_json

DERM_DATA = {"image_size": 32}
# The CSV rounds probabilities to 4 decimals (5e-5 at most). float32 CPU kernels sum in an order that depends on
# the batch shape (oneDNN picks its algorithm by batch size), so one image scored in a batch of 1, 5 or 7 gives
# probabilities that differ in the 6th decimal (up to 2.5e-6 seen on a busy 2-core machine). 1e-4 covers both
# and is still far below any change of a decision.
PROB_ATOL = 1e-4
PROSTATE_DATA = {"image_size": 32, "model_width": 4}
GOOD = {"derm": {"f1": 70.0, "auc": 85.0, "acc": 75.0, "bacc": 70.0}, "prostate": {"dice": 80.0, "iou": 68.0}}  # valid metrics
REPO = Path(__file__).resolve().parents[1]


def site_of(cfg: RunConfig, cohort: str, data_root: str | None) -> SimpleNamespace:
    """What SiteRuntime.model_card reads of a site."""
    task = build_task(cfg)
    return SimpleNamespace(
        cfg=cfg, task=task, run_id="r1", name="site-1", data=SimpleNamespace(cohort=cohort, num_train=10), data_root=data_root
    )


def saved_model(folder: Path, job: str, data: dict, cohort: str, data_root: Path, seed: int = 0) -> Path:
    """best_personal.pt and its card, as a site saves them (save_weights, SiteRuntime.model_card), for a freshly
    built network whose BatchNorm statistics are taken from smooth random images (a new network's are 0 and 1,
    which leaves its outputs nearly constant), so that its outputs differ from input to input."""
    cfg = RunConfig.from_dict({**job_config(job).to_dict(), "data": data})
    task = build_task(cfg)
    torch.manual_seed(seed)
    model = build_method(cfg, task).build_model()
    pre = task.preprocessing()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batch
    noise = torch.rand(16, pre["channels"], 8, 8)
    calibration = torch.nn.functional.interpolate(noise, size=pre["image_size"], mode="bilinear") * 2 - 1
    with torch.no_grad():
        model.train()(calibration)
    path = folder / "best_personal.pt"
    sha256 = save_weights(model.state_dict(), path)
    card = SiteRuntime.model_card(site_of(cfg, cohort, str(data_root)), "personal", 0, GOOD[task.name], GOOD[task.name], sha256)
    save_json(card, path.with_suffix(".json"))
    return path


def reloaded(path: Path) -> torch.nn.Module:
    card = json.loads(path.with_suffix(".json").read_text())
    cfg = RunConfig.from_dict(card["config"])
    model = build_method(cfg, build_task(cfg)).build_model()
    model.load_state_dict(torch.load(path))
    return model.eval()


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ----- dermoscopy -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def derm_raw(tmp_path_factory) -> tuple[Path, Path]:
    """Site A of a synthetic federation: raw JPEGs in the HAM10000 layout, and the same prepared at 32 px."""
    from prrfl.tasks.derm.prepare import prepare_dermoscopy
    from prrfl.tasks.derm.synthetic import generate_synthetic

    root = tmp_path_factory.mktemp("derm")
    generate_synthetic(root / "raw", scale=0.005, seed=0, image_size=(48, 36), sites=("A",))
    prepare_dermoscopy(root / "raw", root / "prepared", size=32, sites=("A",))
    return root / "raw" / "HAM10000_images", root / "prepared" / "A"


@pytest.fixture(scope="module")
def derm_model(tmp_path_factory, derm_raw) -> Path:
    return saved_model(tmp_path_factory.mktemp("derm_model"), "derm_prr", DERM_DATA, "A", derm_raw[1].parent)


def test_derm_probabilities_of_raw_jpegs_are_the_models_softmax_on_the_prepared_images(derm_raw, derm_model, tmp_path):
    images_dir, prepared = derm_raw
    out = tmp_path / "pred.csv"
    result = predict(derm_model, images_dir, out, batch_size=5)  # chunks of 5: several forward passes
    rows = {Path(r["file"]).stem: r for r in read_csv(out)}
    assert result.inputs == len(rows) == len(list(images_dir.glob("*.jpg")))
    model = reloaded(derm_model)
    compared = 0
    for split in ("train", "valid", "test"):
        with np.load(prepared / f"{split}.npz") as z:
            images, ids = torch.from_numpy(z["images"]), list(z["image_ids"])
        with torch.no_grad():
            expected = torch.softmax(model(normalize(images))[0], dim=1).numpy()
        got = np.array([[float(rows[i][f"p_{c}"]) for c in ("nv", "bkl", "mel")] for i in ids])
        np.testing.assert_allclose(got, expected, atol=PROB_ATOL)
        compared += len(ids)
    assert compared >= len(rows) - 2  # the site's images (the raw folder also holds a distractor or two)
    assert np.ptp(got, axis=0).max() > 0.01  # the outputs depend on the image: the comparison is not trivial


def test_derm_csv_one_row_per_image_in_sorted_order_probabilities_sum_to_one_argmax_named(derm_raw, derm_model, tmp_path, capsys):
    images_dir, _ = derm_raw
    out = tmp_path / "sub" / "pred.csv"
    assert main(["predict", "--model", str(derm_model), "--input", str(images_dir), "--out", str(out), "--batch-size", "7"]) == 0
    assert f"class probabilities of {len(list(images_dir.iterdir()))} input(s) written to {out}" in capsys.readouterr().out
    with open(out, newline="") as f:
        header = next(csv.reader(f))
    assert header == ["file", "predicted", "predicted_name", "p_nv", "p_bkl", "p_mel", "flag", "model", "model_warning"]
    rows = read_csv(out)
    assert [r["file"] for r in rows] == sorted(p.name for p in images_dir.iterdir())
    assert all(re.fullmatch(r"[01]\.\d{4}", r[f"p_{c}"]) for r in rows for c in ("nv", "bkl", "mel"))  # 4 decimals
    probs = np.array([[float(r[f"p_{c}"]) for c in ("nv", "bkl", "mel")] for r in rows])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1.5e-4)  # 3 roundings of at most 5e-5
    assert [r["predicted"] for r in rows] == [("nv", "bkl", "mel")[i] for i in probs.argmax(axis=1)]
    long_names = {"nv": "melanocytic nevus", "bkl": "benign keratosis-like lesion", "mel": "melanoma"}
    assert [r["predicted_name"] for r in rows] == [long_names[r["predicted"]] for r in rows]
    assert {r["flag"] for r in rows} == {""}  # the site's own kind of image: nothing implausible
    sha256 = hashlib.sha256(derm_model.read_bytes()).hexdigest()
    assert {r["model"] for r in rows} == {f"derm/prr best_personal.pt of site-1_A, run r1, round 0, sha256 {sha256[:12]}"}
    assert {r["model_warning"] for r in rows} == {""}  # a model above chance, its card checked
    assert probs.std(axis=0).max() > 0.01  # the outputs depend on the image

    single = tmp_path / "one.csv"  # a single image file as input
    predict(derm_model, images_dir / rows[3]["file"], single)
    [row] = read_csv(single)
    assert (row["file"], row["predicted"]) == (rows[3]["file"], rows[3]["predicted"])
    np.testing.assert_allclose([float(row[f"p_{c}"]) for c in ("nv", "bkl", "mel")], probs[3], atol=PROB_ATOL)  # batch of 1


# ----- prostate MRI ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prostate_raw(tmp_path_factory) -> tuple[Path, Path]:
    """RUNMC of a synthetic federation: raw NIfTI cases (48 x 48 slices, LPS on disk) with their masks,
    and the same prepared at 32 px."""
    from prrfl.tasks.prostate.prepare import prepare_prostate
    from prrfl.tasks.prostate.synthetic import generate_synthetic_prostate

    root = tmp_path_factory.mktemp("prostate")
    generate_synthetic_prostate(root / "raw", scale=0.1, seed=3, max_matrix=48, sites=["RUNMC", "BMC"])
    prepare_prostate(root / "raw", root / "prepared", size=32, sites=["RUNMC", "BMC"])
    return root / "raw" / "RUNMC", root / "prepared"


@pytest.fixture(scope="module")
def prostate_model(tmp_path_factory, prostate_raw) -> Path:
    return saved_model(tmp_path_factory.mktemp("prostate_model"), "prostate_prr", PROSTATE_DATA, "RUNMC", prostate_raw[1], seed=1)


def test_prostate_masks_are_on_the_inputs_grid_from_the_slices_training_prepared(prostate_raw, prostate_model, tmp_path, monkeypatch):
    from prrfl.tasks.prostate.prepare import prepare_image, restore_labels
    from prrfl.tasks.prostate.reader import from_canonical, load_image
    from prrfl.tasks.prostate.store import load_split

    raw, prepared = prostate_raw
    out = tmp_path / "masks"
    monkeypatch.setattr("prrfl.predict.PROGRESS_SECONDS", 0.0)  # a progress line after every volume but the last
    progress: list[str] = []
    result = predict(prostate_model, raw, out, batch_size=8, progress=progress.append)  # the cases' _Segmentation files are skipped
    cases = sorted(p.name[: -len(".nii.gz")] for p in raw.glob("Case??.nii.gz"))
    assert [line.split(",")[0] for line in progress] == [f"predict: {i}/{len(cases)} volumes" for i in range(1, len(cases))]
    assert result.inputs == len(cases) and sorted(p.name for p in out.iterdir()) == sorted(
        [f"{c}_mask.nii.gz" for c in cases] + ["summary.csv"]
    )
    model = reloaded(prostate_model)
    summary = {r["file"]: r for r in read_csv(out / "summary.csv")}
    for split in ("train", "valid", "test"):
        s = load_split(prepared, "RUNMC", split)
        for case, rows in s.volume_rows().items():
            source = nib.load(raw / f"{case}.nii.gz")
            written = nib.load(out / f"{case}_mask.nii.gz")
            mask = np.asanyarray(written.dataobj)
            assert mask.dtype == np.uint8 and mask.shape == source.shape and set(np.unique(mask)) <= {0, 1}
            np.testing.assert_array_equal(written.affine, source.affine)
            volume = load_image(raw / f"{case}.nii.gz")
            slices = s.images[rows].numpy()
            np.testing.assert_array_equal(prepare_image(volume.image, 32), slices)  # byte for byte the training slices
            with torch.no_grad():
                labels = model(normalize(torch.from_numpy(slices)))[0].argmax(dim=1).numpy().astype(np.uint8)
            np.testing.assert_array_equal(mask, from_canonical(restore_labels(labels, volume.image.shape), volume.ornt))
            assert int(summary[f"{case}.nii.gz"]["voxels_prostate"]) == int(mask.sum())
            sha256 = hashlib.sha256(prostate_model.read_bytes()).hexdigest()[:12]
            assert written.header["descrip"].tobytes().rstrip(b"\0") == f"prrfl predicted mask, model sha256 {sha256}".encode()
    assert {(r["model"], r["model_warning"]) for r in summary.values()} == {
        (f"prostate/prr best_personal.pt of site-1_RUNMC, run r1, round 0, sha256 {sha256}", "")
    }


def test_an_identity_size_volume_gets_the_models_argmax_on_its_prepared_slices_in_its_own_orientation(
    prostate_raw, prostate_model, tmp_path
):
    """A 32 x 32 x Z volume stored L-P-S (no padding, no resizing at 32 px): the mask, seen in RAS+ by
    nibabel, is the model's argmax on the slices preparation makes of the case."""
    from prrfl.tasks.prostate.prepare import prepare_case
    from prrfl.tasks.prostate.reader import CaseFiles, from_display, load_case

    raw, _ = prostate_raw
    source = nib.load(raw / "Case00.nii.gz")
    assert nib.aff2axcodes(source.affine) == ("L", "P", "S")
    image = np.asanyarray(source.dataobj)[8:40, 10:42, :]  # 32 x 32 in-plane
    affine = source.affine.copy()
    affine[:3, 3] = nib.affines.apply_affine(source.affine, (8, 10, 0))
    folder = tmp_path / "in"
    folder.mkdir()
    nib.save(nib.Nifti1Image(image, affine), folder / "Case00.nii.gz")
    truth = np.asanyarray(nib.load(raw / "Case00_Segmentation.nii.gz").dataobj)[8:40, 10:42, :]
    nib.save(nib.Nifti1Image(truth, affine), tmp_path / "Case00_segmentation.nii.gz")

    predict(prostate_model, folder, tmp_path / "out")
    written = nib.load(tmp_path / "out" / "Case00_mask.nii.gz")
    assert written.shape == image.shape and np.array_equal(written.affine, nib.load(folder / "Case00.nii.gz").affine)
    case = load_case(CaseFiles("RUNMC", "Case00", folder / "Case00.nii.gz", tmp_path / "Case00_segmentation.nii.gz"))
    slices, _ = prepare_case(case, 32)
    with torch.no_grad():
        labels = reloaded(prostate_model)(normalize(torch.from_numpy(slices)))[0].argmax(dim=1).numpy()
    assert 0 < labels.sum() < labels.size  # both classes present: the comparison is not trivial
    np.testing.assert_array_equal(np.asanyarray(nib.as_closest_canonical(written).dataobj), from_display(labels))


def test_restore_labels_undoes_padding_and_resizing_of_a_non_square_volume():
    from prrfl.tasks.prostate.prepare import resize_slices, restore_labels, square_pad
    from prrfl.tasks.prostate.reader import to_display

    rng = np.random.default_rng(0)
    volume = (rng.random((12, 16, 3)) > 0.5).astype(np.uint8)  # RAS+ [X, Y, Z]: display slices 16 x 12, padded to 16
    prepared = resize_slices(square_pad(to_display(volume)), 32, nearest=True).astype(np.uint8)  # 2x: exact
    np.testing.assert_array_equal(restore_labels(prepared, volume.shape), volume)
    assert restore_labels(np.ones((3, 32, 32), np.uint8), (12, 16, 3)).all()  # the padding is cut off


# ----- errors -----------------------------------------------------------------------------------------
def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("prrfl: error: ") and "\n" not in err, err
    return err


def test_missing_model_or_card_is_one_line_naming_the_file(derm_raw, derm_model, tmp_path, capsys):
    images_dir, _ = derm_raw
    missing = tmp_path / "best_personal.pt"
    assert main(["predict", "--model", str(missing), "--input", str(images_dir), "--out", str(tmp_path / "p.csv")]) == 2
    assert f"{missing}: no such model file" in error_line(capsys)
    missing.write_bytes(derm_model.read_bytes())
    assert main(["predict", "--model", str(missing), "--input", str(images_dir), "--out", str(tmp_path / "p.csv")]) == 2
    assert f"{missing.with_suffix('.json')}: the model card of best_personal.pt is missing" in error_line(capsys)
    missing.with_suffix(".json").write_text("{not json")
    assert main(["predict", "--model", str(missing), "--input", str(images_dir), "--out", str(tmp_path / "p.csv")]) == 2
    assert f"{missing.with_suffix('.json')}: not a readable model card" in error_line(capsys)
    missing.with_suffix(".json").write_text(derm_model.with_suffix(".json").read_text())
    missing.write_bytes(derm_model.read_bytes()[:1000])  # truncated
    assert main(["predict", "--model", str(missing), "--input", str(images_dir), "--out", str(tmp_path / "p.csv")]) == 2
    assert f"cannot read checkpoint {missing}" in error_line(capsys)
    assert not (tmp_path / "p.csv").exists()


def test_inputs_of_the_other_task_and_empty_folders_are_refused_by_name(
    derm_raw, derm_model, prostate_raw, prostate_model, tmp_path, capsys
):
    images_dir, _ = derm_raw
    raw, _ = prostate_raw
    out = tmp_path / "out"
    assert main(["predict", "--model", str(prostate_model), "--input", str(images_dir), "--out", str(out)]) == 2
    assert f"input folder {images_dir} holds JPEG/PNG images, but {prostate_model} (a prostate model) takes NIfTI volumes" in error_line(
        capsys
    )
    assert main(["predict", "--model", str(derm_model), "--input", str(raw), "--out", str(out)]) == 2
    assert f"input folder {raw} holds NIfTI volumes, but {derm_model} (a derm model) takes JPEG/PNG images" in error_line(capsys)
    assert main(["predict", "--model", str(derm_model), "--input", str(raw / "Case00.nii.gz"), "--out", str(out)]) == 2
    assert f"{raw / 'Case00.nii.gz'} is one of the NIfTI volumes, but {derm_model}" in error_line(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no image here")
    assert main(["predict", "--model", str(derm_model), "--input", str(empty), "--out", str(out)]) == 2
    assert f"input folder {empty} holds no JPEG/PNG images (.jpg, .jpeg, .png)" in error_line(capsys)
    assert main(["predict", "--model", str(derm_model), "--input", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert f"{tmp_path / 'nowhere'}: no such input file or folder" in error_line(capsys)
    assert not out.exists()


def copied(files, folder: Path) -> Path:
    folder.mkdir()
    for p in files:
        (folder / p.name).write_bytes(p.read_bytes())
    return folder


def skipped_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped: ")]


def test_an_unreadable_image_or_volume_is_skipped_by_name_the_others_written_exit_status_3(
    derm_raw, derm_model, prostate_raw, prostate_model, tmp_path, capsys, caplog
):
    images_dir, _ = derm_raw
    folder = copied(sorted(images_dir.iterdir())[:4], tmp_path / "images")
    (folder / "c_broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")  # among the good ones
    out = tmp_path / "pred.csv"
    assert main(["predict", "--model", str(derm_model), "--input", str(folder), "--out", str(out), "--batch-size", "2"]) == 3
    [line] = skipped_lines(caplog)
    assert line.startswith(f"skipped: cannot read image {folder / 'c_broken.jpg'}: ") and "\n" not in line
    assert [r["file"] for r in read_csv(out)] == sorted(p.name for p in folder.iterdir() if p.name != "c_broken.jpg")
    assert f"of 4 input(s) written to {out}; 1 unreadable input(s) skipped" in capsys.readouterr().out

    raw, _ = prostate_raw
    volumes = copied([raw / "Case00.nii.gz"], tmp_path / "volumes")
    (volumes / "Case01.nii.gz").write_bytes((raw / "Case01.nii.gz").read_bytes()[:400])  # truncated
    masks = tmp_path / "masks"
    caplog.clear()
    assert main(["predict", "--model", str(prostate_model), "--input", str(volumes), "--out", str(masks)]) == 3
    [line] = skipped_lines(caplog)
    assert str(volumes / "Case01.nii.gz") in line
    assert sorted(p.name for p in masks.iterdir()) == ["Case00_mask.nii.gz", "summary.csv"]
    assert [r["file"] for r in read_csv(masks / "summary.csv")] == ["Case00.nii.gz"]


def test_a_batch_of_unreadable_inputs_only_is_refused_and_leaves_nothing_at_out(
    derm_model, prostate_raw, prostate_model, tmp_path, capsys, caplog
):
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("a.jpg", "b.png"):
        (folder / name).write_bytes(b"not an image")
    out = tmp_path / "pred.csv"
    assert main(["predict", "--model", str(derm_model), "--input", str(folder), "--out", str(out)]) == 2
    assert "none of the 2 input(s) could be read (each named above): nothing written" in error_line(capsys)
    assert len(skipped_lines(caplog)) == 2
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]

    raw, _ = prostate_raw
    volumes = tmp_path / "volumes"
    volumes.mkdir()
    (volumes / "Case01.nii.gz").write_bytes((raw / "Case01.nii.gz").read_bytes()[:400])
    masks = tmp_path / "masks"
    assert main(["predict", "--model", str(prostate_model), "--input", str(volumes), "--out", str(masks)]) == 2
    assert "none of the 1 input(s) could be read" in error_line(capsys)
    assert not masks.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_predict_prints_progress_with_the_count_and_time_left_on_stderr_unless_quiet(derm_raw, derm_model, tmp_path, capsys, monkeypatch):
    images_dir, _ = derm_raw
    total = len(list(images_dir.iterdir()))
    monkeypatch.setattr("prrfl.predict.PROGRESS_SECONDS", 0.0)  # a line after every chunk but the last
    command = ["predict", "--model", str(derm_model), "--input", str(images_dir), "--out", str(tmp_path / "p.csv"), "--batch-size", "5"]
    assert main(command) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("predict: ")]
    counts = [re.fullmatch(rf"predict: (\d+)/{total} images, \d+ s, about \d+ s left", line) for line in lines]
    assert all(counts) and [int(m[1]) for m in counts] == list(range(5, total, 5)), lines
    assert main([*command, "--quiet"]) == 0
    assert "predict: " not in capsys.readouterr().err


def test_progress_lines_come_every_few_seconds_with_the_time_left_at_the_pace_so_far():
    from prrfl.predict import Progress

    lines: list[str] = []
    now = [100.0]
    progress = Progress(5000, "images", lines.append, clock=lambda: now[0])
    for done, at in [(64, 101.0), (1200, 125.0), (1264, 126.0), (2000, 140.0), (4000, 820.0), (5000, 900.0)]:
        now[0] = at
        progress.update(done)
    assert lines == [
        "predict: 1200/5000 images, 25 s, about 79 s left",  # 25 s for 1200: 79 s for the other 3800
        "predict: 2000/5000 images, 40 s, about 60 s left",  # 1 s after a line: none at 1264; none once all are done
        "predict: 4000/5000 images, 12 min, about 3 min left",
    ]
    now[0] = 100.0
    slow = Progress(100000, "images", lines.append, clock=lambda: now[0])
    now[0] = 7300.0
    slow.update(10000)
    assert lines[-1] == "predict: 10000/100000 images, 2.0 h, about 18.0 h left"
    silent = Progress(10, "images", None, clock=lambda: now[0])
    now[0] = 9999.0
    silent.update(5)  # no report: nothing to call


def test_implausible_images_are_predicted_and_flagged_with_their_reason(derm_raw, derm_model, tmp_path, caplog):
    images_dir, _ = derm_raw
    normal = sorted(images_dir.glob("*.jpg"))[0]
    folder = copied([normal], tmp_path / "images")
    Image.new("RGB", (10, 10), (128, 128, 128)).save(folder / "grey.jpg")
    Image.new("RGB", (200, 20), (0, 0, 0)).save(folder / "strip.png")  # 20 px high: not too small at 32 px, but black
    out = tmp_path / "pred.csv"
    assert predict(derm_model, folder, out).flagged == 2
    flags = {r["file"]: r["flag"] for r in read_csv(out)}
    assert flags == {
        normal.name: "",
        "grey.jpg": "smaller than 1/2 of the training size (10x10 px vs 32 px); near-constant image (std 0.0 of 255)",
        "strip.png": "near-constant image (std 0.0 of 255)",
    }
    assert f"2 of 3 inputs flagged: see the flag column of {out}" in caplog.messages


def test_implausible_volumes_are_predicted_and_flagged_in_the_summary(prostate_raw, prostate_model, tmp_path):
    raw, _ = prostate_raw
    folder = copied([raw / "Case00.nii.gz"], tmp_path / "volumes")
    flat = 1000 + np.random.default_rng(0).normal(0, 2, (12, 14, 6))  # std 0.2 % of the mean, 12 x 14 in-plane
    nib.save(nib.Nifti1Image(flat.astype(np.float32), np.diag([1.0, 1.0, 3.0, 1.0])), folder / "flat.nii.gz")
    result = predict(prostate_model, folder, tmp_path / "masks")
    flags = {r["file"]: r["flag"] for r in read_csv(tmp_path / "masks" / "summary.csv")}
    assert result.flagged == 1 and flags == {
        "Case00.nii.gz": "",
        "flat.nii.gz": "smaller than 1/2 of the training size (12x14 px vs 32 px); near-constant volume (std 0.2% of its mean intensity)",
    }


# ----- the model card ----------------------------------------------------------------------------------
def test_the_card_holds_the_weights_sha256_code_version_data_fingerprint_and_synthetic_flag(derm_raw, derm_model, tmp_path):
    card = json.loads(derm_model.with_suffix(".json").read_text())
    manifest = derm_raw[1].parent / "manifest.json"
    assert card["weights_sha256"] == hashlib.sha256(derm_model.read_bytes()).hexdigest()
    assert card["prrfl_version"] == importlib.metadata.version("prrfl")
    assert card["data_fingerprint"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert card["synthetic_data"] is True  # prepared from the generator's raw layout: its manifest says so
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if (REPO / ".git").exists() and head.returncode == 0:
        assert card["code_commit"] in (head.stdout.strip(), head.stdout.strip() + "-dirty")
    else:
        assert card["code_commit"] is None

    real = tmp_path / "real"  # the same preparation, as if of real images
    real.mkdir()
    data = json.loads(manifest.read_text())
    data["config"]["synthetic"] = None
    (real / "manifest.json").write_text(json.dumps(data))
    cfg = RunConfig.from_dict(card["config"])
    real_card = SiteRuntime.model_card(site_of(cfg, "A", str(real)), "personal", 0, {}, {}, "0" * 64)
    assert real_card["synthetic_data"] is False
    assert real_card["data_fingerprint"] == hashlib.sha256((real / "manifest.json").read_bytes()).hexdigest()


def test_the_embedded_federation_is_synthetic_whatever_its_manifest(derm_raw, monkeypatch, tmp_path):
    from prrfl.tasks.derm.task import DermTask

    monkeypatch.setattr(DermTask, "prepared_root", lambda self, data_root, workers=1: tmp_path)  # no data root: the cache
    (tmp_path / "manifest.json").write_text('{"config": {"synthetic": null}}')
    cfg = RunConfig.from_dict({**job_config("derm_prr").to_dict(), "data": DERM_DATA})
    card = SiteRuntime.model_card(site_of(cfg, "A", None), "personal", 0, {}, {}, "0" * 64)
    assert card["synthetic_data"] is True and card["data_fingerprint"] == hashlib.sha256(b'{"config": {"synthetic": null}}').hexdigest()


def beside(folder: Path, weights: Path, card: Path | dict) -> Path:
    """best_personal.pt in `folder` with the bytes of `weights` and, beside it, `card` (a file or its content)."""
    folder.mkdir(exist_ok=True)
    model = folder / "best_personal.pt"
    model.write_bytes(weights.read_bytes())
    model.with_suffix(".json").write_text(card.read_text() if isinstance(card, Path) else json.dumps(card))
    return model


def sealed(card: dict) -> dict:
    """`card` with its content_sha256 made anew: as a site writes a card with these fields."""
    from prrfl.site.state import card_digests

    body = {k: v for k, v in card.items() if k != "content_sha256"}
    return {**body, "content_sha256": card_digests(body)}


def test_weights_of_another_model_under_a_card_are_refused_by_predict_and_evaluate(derm_raw, derm_model, tmp_path, capsys):
    images_dir, prepared = derm_raw
    other = saved_model(tmp_path / "site-3", "derm_prr", DERM_DATA, "A", prepared.parent, seed=3)  # same network, other weights
    model = beside(tmp_path / "mixed", other, derm_model.with_suffix(".json"))
    out = tmp_path / "p.csv"
    assert main(["predict", "--model", str(model), "--input", str(images_dir), "--out", str(out)]) == 2
    line = error_line(capsys)
    assert f"{model} (sha256 " in line and f"is not the model its card {model.with_suffix('.json')} was written for" in line
    assert "put the .pt and .json saved together side by side" in line and not out.exists()
    assert main(["evaluate", "--model", str(model), "--data-root", str(prepared.parent)]) == 2
    assert f"is not the model its card {model.with_suffix('.json')} was written for" in error_line(capsys)


def test_a_card_without_weights_sha256_is_read_with_a_warning(derm_raw, derm_model, tmp_path, caplog):
    images_dir, _ = derm_raw
    card = json.loads(derm_model.with_suffix(".json").read_text())
    del card["weights_sha256"], card["content_sha256"]  # a card of format 1 written by an older prrfl has neither
    card["format"] = MODEL_CARD_FORMAT_1
    model = beside(tmp_path / "old", derm_model, card)
    image = sorted(images_dir.glob("*.jpg"))[0]  # a card that cannot be verified is read only when accepted
    assert predict(model, image, tmp_path / "p.csv", accept_unverified_card=True).inputs == 1
    assert (
        f"{model.with_suffix('.json')} has no weights_sha256 (written by an older prrfl): cannot check that best_personal.pt is its model"
        in (caplog.messages)
    )


def test_predict_warns_when_the_cards_validation_metrics_are_at_chance_level(derm_raw, derm_model, tmp_path, caplog):
    images_dir, _ = derm_raw
    image = sorted(images_dir.glob("*.jpg"))[0]
    predict(derm_model, image, tmp_path / "good.csv")
    assert not [m for m in caplog.messages if "chance level" in m]  # GOOD: AUC 85, bACC 70
    card = json.loads(derm_model.with_suffix(".json").read_text())
    card["metrics"]["valid"] = {"f1": 32.5, "auc": 52.0, "acc": 97.0, "bacc": 33.3}  # every image called nv
    model = beside(tmp_path / "chance", derm_model, sealed(card))
    caplog.clear()
    predict(model, image, tmp_path / "chance.csv")
    [warning] = [m for m in caplog.messages if "chance level" in m]
    assert warning == (
        f"{model.with_suffix('.json')}: the model is at chance level on its validation split (AUC 52.0 <= 55; balanced "
        "accuracy 33.3 <= 38.3, one class for every input scores 33.3): its predictions say little"
    )
    assert [r["model_warning"] for r in read_csv(tmp_path / "chance.csv")] == [warning]  # in the output too
    assert [r["model_warning"] for r in read_csv(tmp_path / "good.csv")] == [""]


def test_a_chance_level_segmentation_model_says_so_in_its_summary(prostate_raw, prostate_model, tmp_path):
    raw, _ = prostate_raw
    card = json.loads(prostate_model.with_suffix(".json").read_text())
    card["metrics"]["valid"] = {"dice": 8.0, "iou": 4.2}
    model = beside(tmp_path / "chance", prostate_model, sealed(card))
    predict(model, raw / "Case00.nii.gz", tmp_path / "masks")
    [row] = read_csv(tmp_path / "masks" / "summary.csv")
    assert row["model_warning"] == (
        f"{model.with_suffix('.json')}: the model is at chance level on its validation split (Dice 8.0 < 20): its predictions say little"
    )


def test_the_chance_rule_per_task_kind():
    derm = {"class_names": ["nv", "bkl", "mel"]}
    assert chance_level({**derm, "metrics": {"valid": GOOD["derm"]}}) is None
    assert chance_level({**derm, "metrics": {"valid": {"auc": 80.0, "bacc": 38.0}}}).startswith("balanced accuracy 38.0")
    assert chance_level({**derm, "metrics": {"valid": {"auc": 80.0, "bacc": 38.4}}}) is None  # 100/3 + 5 = 38.33
    assert chance_level({**derm, "metrics": {"valid": {"auc": 55.0, "bacc": 60.0}}}) == "AUC 55.0 <= 55"
    assert chance_level({**derm, "metrics": {"valid": {"auc": float("nan"), "bacc": 60.0}}}) is None  # not judged
    assert chance_level({"class_names": ["background", "prostate"], "metrics": {"valid": {"dice": 8.0}}}) == "Dice 8.0 < 20"
    assert chance_level({"class_names": ["background", "prostate"], "metrics": {"valid": GOOD["prostate"]}}) is None
    assert chance_level({}) is None


def test_a_card_whose_preprocessing_disagrees_with_its_config_is_refused(derm_raw, derm_model, tmp_path, capsys):
    images_dir, _ = derm_raw
    model = tmp_path / "best_personal.pt"
    model.write_bytes(derm_model.read_bytes())
    card = json.loads(derm_model.with_suffix(".json").read_text())
    card["preprocessing"]["image_size"] = 48
    del card["content_sha256"]  # a card of format 1 of an older prrfl: its fields are checked against each other instead
    card["format"] = MODEL_CARD_FORMAT_1
    model.with_suffix(".json").write_text(json.dumps(card))
    out = tmp_path / "p.csv"
    assert main(["predict", "--model", str(model), "--input", str(images_dir), "--out", str(out), "--accept-unverified-card"]) == 2
    assert f"{model.with_suffix('.json')}: its preprocessing says image_size 48 but its config builds image_size 32" in error_line(capsys)
    assert not out.exists()


def test_every_field_of_a_model_card_is_bound_by_its_content_sha256(derm_model):
    card = json.loads(derm_model.with_suffix(".json").read_text())
    assert card["format"] == MODEL_CARD_FORMAT and sorted(card) == sorted([*CARD_FIELDS, "content_sha256"])
    assert sorted(card["content_sha256"]) == sorted(CARD_FIELDS)


# how a hand might edit a card so that predict says something else, or warns of nothing; other fields: any value
EDITS = {
    "format": lambda card: card.update(format=MODEL_CARD_FORMAT_1),  # the earlier format binds fewer fields
    "class_names": lambda card: card["class_names"].reverse(),  # every nv read as mel
    "class_long_names": lambda card: card["class_long_names"].reverse(),
    "task": lambda card: card.update(task="isic2019"),
    "metrics": lambda card: card["metrics"]["valid"].update(auc=90.0, bacc=80.0),  # hides a chance-level model
    "preprocessing": lambda card: card["preprocessing"].update(image_size=64),
    "config": lambda card: card["config"]["data"].update(image_size=64),
    "round": lambda card: card.update(round=7),
    "weights_sha256": lambda card: card.update(weights_sha256="0" * 64),
}


@pytest.mark.parametrize("edited", CARD_FIELDS)
def test_a_model_card_edited_by_hand_is_refused_naming_the_field(derm_raw, derm_model, tmp_path, capsys, edited):
    """Every field is bound: reversed class names would relabel every prediction, raised validation metrics
    would hide that the model is at chance level, another run or round would name another model."""
    images_dir, _ = derm_raw
    card = json.loads(derm_model.with_suffix(".json").read_text())
    EDITS.get(edited, lambda card: card.update({edited: "edited by hand"}))(card)
    model = beside(tmp_path / "edited", derm_model, card)
    out = tmp_path / "p.csv"
    assert main(["predict", "--model", str(model), "--input", str(images_dir), "--out", str(out)]) == 2
    line = error_line(capsys)
    assert f"{model.with_suffix('.json')}: {edited} changed since the card was written" in line and "edited by hand is refused" in line
    assert not out.exists()


def test_an_untouched_model_card_is_accepted_without_a_warning(derm_raw, derm_model, tmp_path, caplog):
    images_dir, _ = derm_raw
    unedited = beside(tmp_path / "as_saved", derm_model, derm_model.with_suffix(".json"))
    assert predict(unedited, sorted(images_dir.glob("*.jpg"))[0], tmp_path / "ok.csv").inputs == 1
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_current_card_without_its_content_sha256_is_refused_naming_the_card_and_the_key(derm_raw, derm_model, tmp_path, capsys):
    """The edit of a card that deletes its checksum too (class names reversed) is refused, not read as an older card."""
    images_dir, _ = derm_raw
    card = json.loads(derm_model.with_suffix(".json").read_text())
    del card["content_sha256"]
    card["class_names"].reverse()
    model = beside(tmp_path / "stripped", derm_model, card)
    out = tmp_path / "p.csv"
    assert main(["predict", "--model", str(model), "--input", str(images_dir), "--out", str(out)]) == 2
    assert f"{model.with_suffix('.json')}: no content_sha256, which every {MODEL_CARD_FORMAT} model card holds" in error_line(capsys)
    assert not out.exists()


def test_a_field_added_to_a_card_or_removed_with_its_digest_is_refused(derm_raw, derm_model, tmp_path):
    card = json.loads(derm_model.with_suffix(".json").read_text())
    with pytest.raises(ValueError, match=r"best_personal.json: approved_by changed since the card was written"):
        predict(beside(tmp_path / "added", derm_model, {**card, "approved_by": "someone"}), derm_raw[0], tmp_path / "p.csv")
    del card["metrics"], card["content_sha256"]["metrics"]  # no validation metrics: no chance level judged
    with pytest.raises(ValueError, match=r"best_personal.json: metrics changed since the card was written"):
        predict(beside(tmp_path / "removed", derm_model, card), derm_raw[0], tmp_path / "p.csv")


def format_1_card(card: dict) -> dict:
    """`card` as prrfl wrote it before format 2: no class_long_names, content_sha256 binding 12 fields only."""
    from prrfl.site.state import FORMAT_1_BOUND, card_digests

    old = {k: v for k, v in card.items() if k not in ("class_long_names", "content_sha256")}
    old["format"] = MODEL_CARD_FORMAT_1
    return {**old, "content_sha256": card_digests(old, FORMAT_1_BOUND)}


def test_an_earlier_format_card_is_read_saying_what_its_checksum_does_not_bind(derm_raw, derm_model, tmp_path, capsys, caplog):
    images_dir, _ = derm_raw
    image = sorted(images_dir.glob("*.jpg"))[0]
    card = format_1_card(json.loads(derm_model.with_suffix(".json").read_text()))
    model = beside(tmp_path / "format1", derm_model, card)
    with pytest.raises(ValueError, match="a model card that cannot be verified is refused"):  # unless accepted
        predict(model, image, tmp_path / "p.csv")
    assert predict(model, image, tmp_path / "p.csv", accept_unverified_card=True).inputs == 1
    [warning] = [m for m in caplog.messages if "does not bind" in m]
    assert warning.startswith(f"{model.with_suffix('.json')} is a {MODEL_CARD_FORMAT_1} card (an older prrfl): its content_sha256")
    assert {"format", "metrics"} <= set(warning.split("does not bind ")[1].split(", so")[0].split(", "))
    [row] = read_csv(tmp_path / "p.csv")
    assert row["model_warning"] == warning  # said in the output too
    assert row["predicted_name"] in ("melanocytic nevus", "benign keratosis-like lesion", "melanoma")  # the task's: the card has none
    card["class_names"].reverse()  # what it binds is checked, accepted unverified or not
    model = beside(tmp_path / "format1", derm_model, card)
    accepted = ["--accept-unverified-card"]
    assert main(["predict", "--model", str(model), "--input", str(image), "--out", str(tmp_path / "q.csv"), *accepted]) == 2
    assert f"{model.with_suffix('.json')}: class_names changed since the card was written" in error_line(capsys)
    card["class_names"].reverse()
    del card["content_sha256"]  # written before the checksum existed: read, with a warning that it is unchecked
    caplog.clear()
    assert predict(beside(tmp_path / "format1", derm_model, card), image, tmp_path / "r.csv", accept_unverified_card=True).inputs == 1
    assert f"{model.with_suffix('.json')} has no content_sha256 (a {MODEL_CARD_FORMAT_1} card of an older prrfl): cannot check" in (
        caplog.text
    )
    assert read_csv(tmp_path / "r.csv")[0]["model_warning"].startswith(f"{model.with_suffix('.json')} has no content_sha256")


def downgraded(card: dict) -> dict:
    """The audit's edit of a current card: its format set back to the earlier one, its content_sha256 deleted (as a
    card written before the checksum existed) and its class names reversed (every nv would be read as mel)."""
    old = {k: v for k, v in card.items() if k != "content_sha256"}
    return {**old, "format": MODEL_CARD_FORMAT_1, "class_names": card["class_names"][::-1]}


ACCEPT_HINT = "pass --accept-unverified-card to prrfl predict / prrfl evaluate (accept_unverified_card=True in Python)"


def test_a_current_card_downgraded_to_the_earlier_format_without_its_checksum_is_refused_naming_it(derm_raw, derm_model, tmp_path, capsys):
    images_dir, prepared = derm_raw
    model = beside(tmp_path / "downgraded", derm_model, downgraded(json.loads(derm_model.with_suffix(".json").read_text())))
    unchecked = f"{model.with_suffix('.json')} has no content_sha256 (a {MODEL_CARD_FORMAT_1} card of an older prrfl): cannot check"
    out = tmp_path / "p.csv"
    assert main(["predict", "--model", str(model), "--input", str(images_dir), "--out", str(out)]) == 2
    line = error_line(capsys)
    assert line.startswith(f"prrfl: error: {unchecked}") and "a model card that cannot be verified is refused" in line
    assert line.endswith(ACCEPT_HINT) and not out.exists()  # the file, what is wrong, and how to read it anyway
    assert main(["evaluate", "--model", str(model), "--data-root", str(prepared.parent)]) == 2
    assert error_line(capsys).startswith(f"prrfl: error: {unchecked}")
    for load in (lambda: predict(model, images_dir, out), lambda: load_saved_model(model)):  # the Python API: refused too
        with pytest.raises(ValueError, match=re.escape(unchecked)):
            load()
    assert not out.exists()


def test_an_unverified_card_is_read_when_accepted_with_its_warning_in_the_output_and_on_stderr(derm_raw, derm_model, tmp_path, capsys):
    images_dir, prepared = derm_raw
    image = sorted(images_dir.glob("*.jpg"))[0]
    model = beside(tmp_path / "downgraded", derm_model, downgraded(json.loads(derm_model.with_suffix(".json").read_text())))
    warning = f"{model.with_suffix('.json')} has no content_sha256 (a {MODEL_CARD_FORMAT_1} card of an older prrfl): cannot check that it is unedited"
    out = tmp_path / "p.csv"
    command = [sys.executable, "-m", "prrfl.cli", "predict", "--model", str(model), "--input", str(image), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "custom"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([*command, "--accept-unverified-card", "--quiet"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert warning in proc.stderr.splitlines()[0] and "refused" not in proc.stderr  # said on stderr
    [row] = read_csv(out)
    assert row["model_warning"] == warning  # and in the output: the user chose to read it as it is
    assert [c for c in row if c.startswith("p_")] == ["p_mel", "p_bkl", "p_nv"]  # its (edited) class names, unchecked
    assert load_saved_model(model, accept_unverified_card=True).warnings == (warning,)
    assert predict(model, image, tmp_path / "q.csv", accept_unverified_card=True).inputs == 1
    assert read_csv(tmp_path / "q.csv")[0]["model_warning"] == warning
    with pytest.raises(ValueError, match="a model card that cannot be verified is refused"):
        load_saved_model(model)  # refused by default
    assert main(["evaluate", "--model", str(model), "--data-root", str(prepared.parent), "--accept-unverified-card"]) == 0
    assert "on A test" in capsys.readouterr().out


@pytest.mark.parametrize("written", ["prrfl-model-card/3", "prrfl-model-card/0", None])
def test_a_card_of_an_unknown_format_is_refused_even_when_unverified_cards_are_accepted(derm_raw, derm_model, tmp_path, capsys, written):
    images_dir, _ = derm_raw
    card = json.loads(derm_model.with_suffix(".json").read_text())
    card["format"] = written
    model = beside(tmp_path / "unknown", derm_model, card)
    out = tmp_path / "p.csv"
    for accept in ([], ["--accept-unverified-card"]):
        assert main(["predict", "--model", str(model), "--input", str(images_dir), "--out", str(out), *accept]) == 2
        assert (
            f"{model.with_suffix('.json')}: not a model card this prrfl reads (its format is {written!r}): cards are of format "
            f"{MODEL_CARD_FORMAT} (or the earlier {MODEL_CARD_FORMAT_1}, read only with --accept-unverified-card)"
        ) in error_line(capsys)
    with pytest.raises(ValueError, match="not a model card this prrfl reads"):
        load_saved_model(model, accept_unverified_card=True)
    assert not out.exists()


def test_the_output_must_be_of_the_tasks_kind_and_a_folder_of_other_files_is_kept(
    derm_raw, derm_model, prostate_raw, prostate_model, tmp_path, capsys
):
    images_dir, _ = derm_raw
    raw, _ = prostate_raw
    assert main(["predict", "--model", str(derm_model), "--input", str(images_dir), "--out", str(tmp_path)]) == 2
    assert f"{tmp_path} is a folder, but a derm model writes one CSV file" in error_line(capsys)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "report.docx").write_text("keep me")
    assert main(["predict", "--model", str(prostate_model), "--input", str(raw / "Case00.nii.gz"), "--out", str(busy)]) == 2
    assert f"output folder {busy} holds other files (report.docx)" in error_line(capsys)
    assert sorted(p.name for p in busy.iterdir()) == ["report.docx"]
    out = tmp_path / "masks"  # a previous output is replaced whole
    predict(prostate_model, raw, out)
    predict(prostate_model, raw / "Case01.nii.gz", out)
    assert sorted(p.name for p in out.iterdir()) == ["Case01_mask.nii.gz", "summary.csv"]
