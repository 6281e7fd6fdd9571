"""Fed-ISIC2019 (FCA's task): FLamby's layout read, checked and prepared; the synthetic counts; the balanced softmax
that FCA trains every framework with, as an option of every method; missing classes end to end."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from doc_layouts import DocLayout
from PIL import Image

from prrfl.config import ConfigError, RunConfig
from prrfl.registry import build_method, build_task, validate_config
from prrfl.tasks.isic2019.layout import CENTRES, CLASS_NAMES, COUNTS, CSV_COLUMNS, SPLIT_CSV
from prrfl.tasks.isic2019.prepare import prepare_isic2019, valid_assignment
from prrfl.tasks.isic2019.records import read_flamby
from prrfl.tasks.isic2019.store import load_split
from prrfl.tasks.isic2019.synthetic import plan, scaled_counts

# A tiny FLamby tree: BCN (centre 0) with MEL and NV, MSK (centre 4) with NV and BKL only (MSK lacks BCC, AK, DF,
# VASC, SCC in FLamby's split file too). (image, class, centre, fold)
ROWS = [
    *[(f"ISIC_00000{i:02d}", "MEL", 0, "train") for i in range(4)],
    *[(f"ISIC_00001{i:02d}", "NV", 0, "train") for i in range(5)],
    ("ISIC_0000200", "MEL", 0, "test"),
    ("ISIC_0000201", "NV", 0, "test"),
    *[(f"ISIC_00003{i:02d}_downsampled", "NV", 4, "train") for i in range(3)],
    *[(f"ISIC_00004{i:02d}_downsampled", "BKL", 4, "train") for i in range(2)],
    ("ISIC_0000500_downsampled", "BKL", 4, "test"),
]


def csv_row(image: str, label: str, centre: int, fold: str) -> dict[str, str]:
    hot = {c: "1.0" if c == label else "0.0" for c in (*CLASS_NAMES, "UNK")}
    target = CLASS_NAMES.index(label) if label in CLASS_NAMES else 8
    return {"image": image, **hot, "target": str(target), "center": str(centre), "fold": fold, "fold2": f"{fold}_{centre}"}


# FLamby's layout as docs/isic2019.md writes it: the trees are built from its block (folder, file names, columns).
DOC = DocLayout.read("isic2019.md", "isic2019")
DOC_CSV = DOC.csv("fold2")
DOC_IMAGE = DOC.one(lambda e: e.name == "<image>.jpg", "the preprocessed images")


def documented_row(image: str, label: str, centre: int, fold: str) -> dict[str, str]:
    """csv_row under the documented columns, in the documented order."""
    row = csv_row(image, label, centre, fold)
    unknown = [c for c in DOC_CSV.columns if c not in row]
    assert not unknown, f"{DOC.doc} documents column(s) {unknown} of {DOC_CSV.name}, which this test gives no value"
    return {c: row[c] for c in DOC_CSV.columns}


def write_tree(root, rows=ROWS, edit=None, sizes=None) -> None:
    """FLamby's layout as its scripts leave it and docs/isic2019.md writes it: the preprocessed JPEGs (shorter side
    224) and the split CSV."""
    roots = {DOC.roots[0].parts[0]: root}
    table = [documented_row(*r) for r in rows]
    if edit:
        edit(table)
    DOC_CSV.path(roots).parent.mkdir(parents=True, exist_ok=True)
    with DOC_CSV.path(roots).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    rng = np.random.default_rng(0)
    for i, (image, *_rest) in enumerate(rows):
        size = (sizes or {}).get(image, (224 + 75 * (i % 2), 224))  # HAM-like 299x224 and BCN-like 224x224
        pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
        path = DOC_IMAGE.path(roots, image=image)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, quality=90)


def test_flambys_layout_is_read_and_prepared_with_a_stratified_validation_split_from_its_train_fold(tmp_path):
    write_tree(tmp_path / "raw")
    records = read_flamby(tmp_path / "raw")
    assert [(r.centre, r.fold) for r in records[:1]] == [("BCN", "train")] and len(records) == len(ROWS)
    m = prepare_isic2019(tmp_path / "raw", tmp_path / "out", size=16, centres=["BCN", "MSK"])
    counts = {c: {s: v["counts"] for s, v in info["splits"].items()} for c, info in m.data["sites"].items()}
    # BCN: MEL 4 -> 1 valid (round(0.1 x 4) = 0, at least 1), NV 5 -> 1 valid; the test fold stays whole
    assert (counts["BCN"]["train"]["MEL"], counts["BCN"]["valid"]["MEL"], counts["BCN"]["test"]["MEL"]) == (3, 1, 1)
    assert (counts["BCN"]["train"]["NV"], counts["BCN"]["valid"]["NV"], counts["BCN"]["test"]["NV"]) == (4, 1, 1)
    # MSK: BKL has 2 training images: both train, none to validation (a class needs 3 to give one)
    assert (counts["MSK"]["train"]["NV"], counts["MSK"]["valid"]["NV"]) == (2, 1)
    assert (counts["MSK"]["train"]["BKL"], counts["MSK"]["valid"]["BKL"], counts["MSK"]["test"]["BKL"]) == (2, 0, 1)
    assert counts["MSK"]["train"]["MEL"] == 0 and "centre MSK: no training image of MEL, BCC, AK, DF, VASC, SCC" in m.data["warnings"]
    split = load_split(tmp_path / "out", "MSK", "test")
    assert split.image_ids == ["ISIC_0000500_downsampled"] and split.labels.tolist() == [4] and tuple(split.images.shape) == (1, 3, 16, 16)


def test_the_validation_split_takes_a_tenth_of_each_class_at_least_one_from_three_images():
    labels = [0] * 30 + [1] * 3 + [2] * 2 + [5] * 11
    chosen = valid_assignment(labels, 0.1, seed=0)
    taken = {c: int(chosen[np.array(labels) == c].sum()) for c in (0, 1, 2, 5)}
    assert taken == {0: 3, 1: 1, 2: 0, 5: 1}
    assert (valid_assignment(labels, 0.1, seed=0) == chosen).all() and (valid_assignment(labels, 0.1, seed=1) != chosen).any()


def bad(rows_edit=None, **kw):
    return {"edit": rows_edit, **kw}


def _set(field, value, row=0):
    def edit(table):
        table[row][field] = value

    return edit


@pytest.mark.parametrize(
    "case, message",
    [
        (
            bad(lambda t: t[0].update(MEL="0.0", UNK="1.0", target="8")),
            r"line 2: image 'ISIC_0000000' is labelled UNK",
        ),
        (bad(_set("target", "1")), r"line 2: field 'target' is '1', expected 0 \(MEL, as its one-hot columns say\)"),
        (bad(_set("NV", "1.0")), r"line 2: the one-hot columns MEL/NV/BCC/AK/BKL/DF/VASC/SCC/UNK must hold exactly one 1"),
        (bad(_set("MEL", "yes")), r"line 2: field 'MEL' is 'yes', expected 0.0 or 1.0"),
        (bad(lambda t: t[0].update(center="6", fold2="train_6")), r"line 2: field 'center' is '6', expected a centre index 0-5"),
        (bad(lambda t: t[0].update(fold="val", fold2="val_0")), r"line 2: field 'fold' is 'val', expected one of \['train', 'test'\]"),
        (bad(_set("fold2", "test_0")), r"line 2: field 'fold2' is 'test_0', expected 'train_0' \(fold_center\)"),
        (bad(_set("image", "ISIC_0000001")), r"line 3: image 'ISIC_0000001' is listed twice \(first on line 2\)"),
        (bad(lambda t: [r.pop("fold2") for r in t]), r"missing column\(s\) \['fold2'\]"),
        (bad(_set("image", "ISIC_9999999")), r"ISIC_9999999.jpg: listed in .* \(and 0 more missing\) but not on disk"),
        (
            bad(sizes={"ISIC_0000003": (200, 150)}),
            r"ISIC_0000003.jpg: 200x150 px, but FLamby's resize script leaves every Fed-ISIC2019 image",
        ),
    ],
)
def test_a_bad_flamby_tree_is_refused_naming_the_file_line_and_field(tmp_path, case, message):
    write_tree(tmp_path / "raw", edit=case["edit"], sizes=case.get("sizes"))
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        prepare_isic2019(tmp_path / "raw", tmp_path / "out", size=16, centres=["BCN", "MSK"])
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_missing_split_file_or_images_folder_says_where_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="no FLamby split file; copy FLamby's .*train_test_split"):
        read_flamby(tmp_path)
    (tmp_path / SPLIT_CSV).write_text(",".join(CSV_COLUMNS) + "\n")
    with pytest.raises(FileNotFoundError, match="no images folder; run FLamby's download and resize scripts"):
        read_flamby(tmp_path)


def test_the_synthetic_counts_are_flambys_scaled_with_its_missing_classes_kept_missing():
    full = scaled_counts(1.0)
    assert full == COUNTS and sum(sum(n) for c in full.values() for n in c.values()) == 23247
    quick = scaled_counts(0.08)
    for centre in CENTRES:
        for fold, floor in (("train", 3), ("test", 1)):
            for n_full, n in zip(COUNTS[centre][fold], quick[centre][fold]):
                assert n == max(min(n_full, floor), round(0.08 * n_full))
    bcc = CLASS_NAMES.index("BCC")
    assert quick["MSK"]["train"][bcc] == 0 and quick["HAM_vidir_molemax"]["train"][bcc] == 2 and quick["HAM_vienna_dias"]["train"][bcc] == 3
    rows = plan(0.08, seed=0)
    assert rows == plan(0.08, seed=0) and [r["seed"] for r in rows] != [r["seed"] for r in plan(0.08, seed=1)]
    assert [r["image"] for r in rows] == sorted(r["image"] for r in rows)  # ids in CSV order ...
    assert len({r["centre"] for r in rows[:20]}) > 1  # ... which is not centre by centre


# ----- balanced softmax: FCA's loss, an option of every classification method ---------------------------------------
def hand_bsm() -> float:
    """Balanced softmax by hand for logits [[1,0,0],[0,2,0]], targets [0,1], the site's class counts [6,3,1]:
    prior (.6,.3,.1); -log of the target's share of prior_c * e^{z_c}, averaged."""
    e = math.e
    first = 0.6 * e / (0.6 * e + 0.3 + 0.1)
    second = 0.3 * e**2 / (0.6 + 0.3 * e**2 + 0.1)
    return -(math.log(first) + math.log(second)) / 2


@pytest.mark.parametrize("method", ["fedavg", "fedbn", "prr", "fedfocal"])
def test_balanced_softmax_replaces_every_methods_classification_term_when_the_run_asks(tiny_task, method):
    logits, targets = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]), torch.tensor([0, 1])
    site = SimpleNamespace(class_counts=[6, 3, 1], memory={})
    cfg = RunConfig.from_dict({"task": "tiny", "method": method, "class_loss": "balanced_softmax"})
    loss = build_method(cfg, tiny_task).supervised_loss(site, logits, targets)
    assert float(loss) == pytest.approx(hand_bsm(), rel=1e-6)
    ce = RunConfig.from_dict({"task": "tiny", "method": "fedavg"})
    assert float(build_method(ce, tiny_task).supervised_loss(site, logits, targets)) == pytest.approx(
        -(math.log(math.e / (math.e + 2)) + math.log(math.e**2 / (math.e**2 + 2))) / 2, rel=1e-6
    )


def test_balanced_softmax_is_refused_on_a_segmentation_task():
    with pytest.raises(ConfigError, match="config field 'class_loss': balanced_softmax needs a classification task; task 'prostate'"):
        validate_config({"task": "prostate", "method": "fedavg", "class_loss": "balanced_softmax"})


def test_the_isic2019_task_leads_with_fcas_metrics_and_takes_its_data_options():
    task = build_task(RunConfig.from_dict({"task": "isic2019", "method": "fedavg"}))
    assert task.site_names == CENTRES and task.class_names == CLASS_NAMES and task.primary_metric == "bacc"
    assert task.cohort_of("site-5") == "MSK" and task.build_model()(torch.zeros(2, 3, 64, 64))[0].shape == (2, 8)
    with pytest.raises(ConfigError, match="isic2019 data option 'valid_fraction'"):
        build_task(RunConfig.from_dict({"task": "isic2019", "data": {"valid_fraction": 1.5}}))


# ----- missing classes: a site that never sees a class ---------------------------------------------------------------
def tiny_task_without_c():
    """The tiny task where site B holds no image of class c in any split (as MSK lacks BCC ... SCC)."""
    from conftest import TinyTask

    from prrfl.tasks.contract import Split

    def drop_c(split: Split) -> Split:
        keep = split.targets != 2
        return Split(images=split.images[keep], targets=split.targets[keep])

    class WithoutC(TinyTask):
        def load_site(self, cohort, device, data_root=None):
            data = super().load_site(cohort, device, data_root)
            return data if cohort != "B" else self.site_data(cohort, drop_c(data.train), drop_c(data.valid), drop_c(data.test))

    return WithoutC({})


@pytest.mark.parametrize("method, overrides", [("prr", {}), ("fedproto", {}), ("fca", {}), ("fedavg", {"class_loss": "balanced_softmax"})])
def test_a_site_without_a_class_trains_reports_it_zero_and_the_prototypes_and_priors_leave_it_out(tmp_path, method, overrides):
    from conftest import make_runtime

    from prrfl.keys import GLOBAL_PROTOTYPE_PRESENT, GLOBAL_PROTOTYPES, PROTOTYPE_PRESENT
    from prrfl.messages import Download
    from prrfl.site.trainer import run_round

    task = tiny_task_without_c()
    sites = [
        make_runtime(task, tmp_path, site=s, method=method, local_epochs=1, eval_test_every_epoch=False, **overrides) for s in ("A", "B")
    ]
    assert sites[1].data.class_counts == [10, 10, 0]  # reported with its zero
    counts = [20, 20, 10]
    torch.manual_seed(0)
    method_obj = sites[0].method
    downloads = {s.name: Download(params=method_obj.build_model().state_dict(), round=0, global_class_counts=counts) for s in sites}
    server: dict = {}
    for round_idx in range(2):
        uploads = [run_round(s, downloads[s.name], round_idx) for s in sites]
        if method in ("prr", "fedproto"):  # B's prototype of c is not there, and says so
            assert uploads[1].meta[PROTOTYPE_PRESENT] == [True, True, False] and uploads[0].meta[PROTOTYPE_PRESENT] == [True, True, True]
        out = method_obj.aggregate(uploads, round_idx, server)
        if method in ("prr", "fedproto"):  # the global prototype of c is A's alone, not dragged towards B's zero row
            meta = out["B"].meta
            assert meta[GLOBAL_PROTOTYPE_PRESENT] == [True, True, True]
            assert meta[GLOBAL_PROTOTYPES][2] == pytest.approx(uploads[0].meta["prototypes"][2], abs=1e-6)
        downloads = {k: Download(params=d.params, meta=d.meta, round=round_idx + 1, global_class_counts=counts) for k, d in out.items()}
    for s in sites:
        losses = [v for tag, v, _ in s.scalars if tag.startswith("loss/")]
        assert losses and all(math.isfinite(v) for v in losses)
    best_b = sites[1].best["test"]
    assert math.isnan(best_b["recall_c"]) and not math.isnan(best_b["recall_a"])  # the per-class table shows it absent
    assert math.isfinite(best_b["bacc"]) and math.isfinite(best_b["auc"])  # bACC and AUC over the classes B holds


def test_a_prepared_flamby_tree_is_a_site_of_the_task_with_its_missing_classes_counted_zero(tmp_path):
    write_tree(tmp_path / "raw")
    prepare_isic2019(tmp_path / "raw", tmp_path / "out", size=16, centres=["BCN", "MSK"])
    task = build_task(RunConfig.from_dict({"task": "isic2019", "data": {"image_size": 16}}))
    msk = task.load_site(task.cohort_of("site-5"), torch.device("cpu"), str(tmp_path / "out"))
    assert msk.cohort == "MSK" and msk.class_counts == [0, 2, 0, 0, 2, 0, 0, 0] and len(msk.test) == 1
    assert task.stats_problem(msk.num_train, msk.class_counts) is None  # the server accepts the zeros
    with pytest.raises(ValueError, match=r"out/MSK/train.npz holds 16 px images but the job asks for image_size=32"):
        build_task(RunConfig.from_dict({"task": "isic2019", "data": {"image_size": 32}})).load_site(
            "MSK", torch.device("cpu"), str(tmp_path / "out")
        )
