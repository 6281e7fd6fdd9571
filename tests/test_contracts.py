"""The task and method contracts on a tiny classification task and a tiny segmentation task:
batching, streaming evaluation, statistics, masked prototypes, Dice + CPA, joint augmentation."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import make_runtime

from prrfl.algorithms import cpa
from prrfl.config import RunConfig
from prrfl.data.augment import SliceAugment, normalize
from prrfl.messages import Download
from prrfl.methods.prr import PRR
from prrfl.server.checks import upload_problem
from prrfl.site.trainer import run_round
from prrfl.tasks.contract import Split
from prrfl.tasks.segmentation import VolumeOverlap, masked_class_embeddings


# ----- batching -----------------------------------------------------------------------------------
def test_train_batches_cover_the_split_once_and_never_end_with_a_single_sample(tiny_task):
    split = Split(images=torch.zeros(17, 3, 8, 8, dtype=torch.uint8), targets=torch.arange(17))
    batches = list(tiny_task.train_batches(split, 8, torch.Generator().manual_seed(0)))
    assert [len(t) for _, t in batches] == [8, 9]  # 8 + 8 + 1: the last one joins the batch before
    assert sorted(torch.cat([t for _, t in batches]).tolist()) == list(range(17))


def test_eval_batches_keep_the_split_order_and_say_where_each_chunk_is(tiny_seg_task):
    split = tiny_seg_task.load_site("A", torch.device("cpu")).test
    chunks = list(tiny_seg_task.eval_batches(split, batch_size=4))
    assert [c[2] for c in chunks] == [slice(0, 4), slice(4, 8), slice(8, 9)]
    assert torch.equal(torch.cat([c[1] for c in chunks]), split.targets)


# ----- streaming evaluation -------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["tiny_task", "tiny_seg_task"])
def test_evaluation_in_chunks_equals_evaluation_in_one_go(fixture, request):
    task = request.getfixturevalue(fixture)
    torch.manual_seed(0)
    model = task.build_model()
    split = task.load_site("A", torch.device("cpu")).test
    whole = task.evaluate(model, split, batch_size=len(split))
    assert task.evaluate(model, split, batch_size=2) == pytest.approx(whole, abs=1e-9, nan_ok=True)
    assert set(whole) == set(task.recorded_metrics) and model.training  # the model's mode is restored
    assert task.recorded_metrics[:4] == task.metric_names  # classification adds each class's recall after them


def test_volume_overlap_is_computed_per_volume_across_chunks():
    # volume 0 (slices 0, 1): predicted {a, b}, true {b, c} -> Dice 2*1/(2+2) = 0.5, IoU 1/3; volume 1 perfect
    true = torch.zeros(4, 2, 2, dtype=torch.long)
    pred = torch.zeros(4, 2, 2, dtype=torch.long)
    pred[0, 0, 0] = pred[0, 0, 1] = 1
    true[0, 0, 1] = true[1, 1, 1] = 1
    pred[2, 1, 0] = true[2, 1, 0] = pred[3, 0, 0] = true[3, 0, 0] = 1
    logits = torch.stack([1 - pred, pred], dim=1).float()  # argmax = pred
    metric = VolumeOverlap(2, groups=torch.tensor([0, 0, 1, 1]))
    metric.update(logits[:3], true[:3], slice(0, 3))  # a chunk ends inside volume 1
    metric.update(logits[3:], true[3:], slice(3, 4))
    out = metric.compute()
    assert out["dice"] == pytest.approx(100 * (0.5 + 1) / 2)
    assert out["iou"] == pytest.approx(100 * (1 / 3 + 1) / 2)
    # per slice: slice 0 predicted {a, b}, true {b}: Dice 2/3, IoU 1/2; slice 1 missed: 0; slices 2, 3 perfect
    assert out["slice_dice"] == pytest.approx(100 * (2 / 3 + 0 + 1 + 1) / 4)
    assert out["slice_iou"] == pytest.approx(100 * (1 / 2 + 0 + 1 + 1) / 4)


def test_a_slice_without_prostate_scores_100_when_none_is_predicted_and_0_otherwise():
    true = torch.zeros(2, 2, 2, dtype=torch.long)  # one volume of two empty slices
    pred = torch.zeros(2, 2, 2, dtype=torch.long)
    pred[1, 0, 0] = 1  # a false positive on the second
    metric = VolumeOverlap(2, groups=torch.tensor([0, 0]))
    metric.update(torch.stack([1 - pred, pred], dim=1).float(), true, slice(0, 2))
    out = metric.compute()
    assert (out["slice_dice"], out["slice_iou"]) == (pytest.approx(50.0), pytest.approx(50.0))
    assert (out["dice"], out["iou"]) == (0.0, 0.0)  # the volume: prostate predicted where there is none


def test_volume_overlap_refuses_scattered_slices():
    metric = VolumeOverlap(2, groups=torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="volume 0 are not contiguous"):
        metric.update(torch.zeros(3, 2, 2, 2), torch.zeros(3, 2, 2, dtype=torch.long), slice(0, 3))


# ----- statistics -----------------------------------------------------------------------------------
def test_site_statistics_are_the_tasks(tiny_task, tiny_seg_task):
    assert tiny_task.load_site("A", torch.device("cpu")).class_counts == [10, 10, 10]  # images per class
    data = tiny_seg_task.load_site("A", torch.device("cpu"))
    counts = data.class_counts  # voxels per class
    assert sum(counts) == data.num_train * 16 * 16 and counts[1] == int(data.train.targets.sum())
    assert tiny_seg_task.stats_problem(data.num_train, counts) is None
    assert "expected num_train 18 x 256" in tiny_seg_task.stats_problem(18, [counts[0], counts[1] + 1])
    assert "2 non-negative integers" in tiny_seg_task.stats_problem(18, [4608])


# ----- prototypes ---------------------------------------------------------------------------------------
def test_masked_class_embeddings_by_hand():
    features = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[10.0, 20.0], [30.0, 40.0]]])[None]  # [1, D=2, 2, 2]
    features = torch.cat([features, features])  # image 2: the same features, no foreground
    masks = torch.tensor([[[1, 1], [0, 0]], [[0, 0], [0, 0]]])
    vectors, classes = masked_class_embeddings(features, masks, 2, "area")
    # image 1: background = pixels 3, 4; foreground = pixels 1, 2; image 2: background = all
    assert classes.tolist() == [0, 1, 0]
    assert vectors.tolist() == [[3.5, 35.0], [1.5, 15.0], [2.5, 25.0]]
    vectors, classes = masked_class_embeddings(features, masks, 2, "sum")  # the authors': / (h w), every class
    assert classes.tolist() == [0, 1, 0, 1]
    assert vectors.tolist() == [[1.75, 17.5], [0.75, 7.5], [2.5, 25.0], [0.0, 0.0]]


def test_masks_are_resized_to_the_feature_map_by_nearest_neighbour():
    features = torch.arange(4.0).reshape(1, 1, 2, 2)
    masks = torch.zeros(1, 4, 4, dtype=torch.long)
    masks[0, 2, 2] = 1  # the pixel nearest-resizing keeps for feature cell (1, 1)
    masks[0, 0, 1] = 1  # dropped by the resize
    vectors, classes = masked_class_embeddings(features, masks, 2, "area")
    assert classes.tolist() == [0, 1] and vectors.flatten().tolist() == [1.0, 3.0]


def test_prr_prototypes_on_segmentation_are_masked_feature_averages(tiny_seg_task, tmp_path):
    site = make_runtime(tiny_seg_task, tmp_path, local_epochs=1)
    torch.manual_seed(0)
    counts = tiny_seg_task.load_site("A", torch.device("cpu")).class_counts
    upload = run_round(site, Download(params=tiny_seg_task.build_model().state_dict(), round=0, global_class_counts=counts), 0)
    protos = torch.tensor(upload.meta["prototypes"])
    assert protos.shape == (2, 6) and upload.meta["prototype_present"] == [True, True]
    assert upload.class_counts == counts and upload.num_train == 18
    reference = {k: v for k, v in site.method.reference_model.state_dict().items() if k in upload.params}
    assert upload_problem(upload, reference, tiny_seg_task) is None


# ----- losses ------------------------------------------------------------------------------------------
def _two_pixels():
    # one image of 2 pixels: logits (bg, fg) = (0, 1) and (2, 0); targets fg, bg
    logits = torch.tensor([[0.0, 2.0], [1.0, 0.0]]).reshape(1, 2, 1, 2)
    return logits, torch.tensor([[[1, 0]]])


def _hand_dice_loss() -> float:
    p = [math.e / (1 + math.e), 1 / (math.e**2 + 1)]  # softmax foreground probabilities
    q = [1.0, 0.0]
    inter = sum(a * b for a, b in zip(p, q))
    return 1 - (2 * inter + 1) / (sum(p) + sum(q) + 1)  # MONAI / the authors' smooth = 1


def test_segmentation_loss_is_dice_plus_cross_entropy_by_hand(tiny_seg_task):
    logits, targets = _two_pixels()
    ce = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(-2))) / 2
    assert float(tiny_seg_task.loss(logits, targets)) == pytest.approx(_hand_dice_loss() + ce, rel=1e-6)


def test_dice_plus_cpa_by_hand(tiny_seg_task):
    logits, targets = _two_pixels()
    g = cpa.conjoint_mask([100, 10], beta=0.8)  # G[bg, fg] = 0.1 ** 0.8, G[fg, bg] = 1
    # CPA: pixel 1 (fg): -log(e / (e + 1 * e^0)); pixel 2 (bg): -log(e^2 / (e^2 + 0.1^0.8 * e^0))
    cpa_hand = (math.log(1 + math.exp(-1)) + math.log(1 + 0.1**0.8 * math.exp(-2))) / 2
    ce = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(-2))) / 2
    site = SimpleNamespace(memory={"mask": g, "gamma": torch.ones(2, dtype=torch.float64)})
    paper = PRR(RunConfig(task="tinyseg"), tiny_seg_task)
    assert float(paper.supervised_loss(site, logits, targets)) == pytest.approx(_hand_dice_loss() + cpa_hand, rel=1e-6)
    authors = PRR(RunConfig(task="tinyseg"), tiny_seg_task, cpa_ce_mix=0.5)  # 0.5 CPA + 0.5 CE beside Dice
    expected = _hand_dice_loss() + 0.5 * cpa_hand + 0.5 * ce
    assert float(authors.supervised_loss(site, logits, targets)) == pytest.approx(expected, rel=1e-6)


def test_classification_cpa_is_the_whole_loss(tiny_task):
    logits, targets = torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([0])
    g = cpa.conjoint_mask([10, 20, 30])
    site = SimpleNamespace(memory={"mask": g, "gamma": torch.ones(3, dtype=torch.float64)})
    loss = PRR(RunConfig(task="tiny"), tiny_task).supervised_loss(site, logits, targets)
    assert torch.equal(loss, cpa.cpa_loss(logits, targets, g.float(), gamma=torch.ones(3)))


# ----- joint augmentation ----------------------------------------------------------------------------------
def test_slice_augmentation_moves_the_mask_with_the_image():
    masks = torch.zeros(8, 32, 32, dtype=torch.long)
    masks[:, 4:14, 6:20] = 1  # off-centre, so flips and rotations move it
    images = (masks[:, None] * 255).to(torch.uint8)
    augment = SliceAugment(gamma=0.0, contrast=0.0, noise_std=0.0, affine_p=1.0)
    x, y = augment(images, masks, torch.Generator().manual_seed(3))
    assert y.dtype == torch.long and set(y.unique().tolist()) <= {0, 1}
    assert not torch.equal(y, masks)  # something moved
    agree = ((x[:, 0] > 0) == (y == 1)).float().mean()  # bright pixels are the mask's, up to the interpolated rim
    assert agree > 0.99
    again = augment(images, masks, torch.Generator().manual_seed(3))
    assert torch.equal(again[0], x) and torch.equal(again[1], y)


def test_the_papers_slice_augmentation_is_a_left_right_flip_and_a_rotation_only():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 1, 16, 16), generator=g, dtype=torch.uint8)
    masks = (images[:, 0] > 128).long()
    x, y = SliceAugment(rotate_deg=0.0)(images, masks, torch.Generator().manual_seed(1))  # the flips alone
    plain, mirrored = normalize(images), normalize(images).flip(-1)

    def close(a, b):  # per slice; 1e-5: float rounding of the identity resampling and of the [-1, 1] scaling
        return ((a - b).abs() < 1e-5).flatten(1).all(1)

    same, lr = close(x, plain), close(x, mirrored)
    assert bool((same | lr).all()) and 10 < int(lr.sum()) < 54  # each slice as it was or mirrored left-right, no grey change
    assert torch.equal(y[lr], masks[lr].flip(-1))
    # the extended option also flips front-back and changes the grey levels
    x, _ = SliceAugment.extended()(images, masks, torch.Generator().manual_seed(1))
    assert not bool((close(x, plain) | close(x, mirrored)).all())


# ----- models and optimisers from the method --------------------------------------------------------------------
def test_the_method_builds_models_and_the_configured_optimiser(tiny_seg_task, tiny_task):
    method = PRR(RunConfig(task="tinyseg", optimizer="adam", lr=1e-3), tiny_seg_task)
    assert isinstance(method.build_optimizer(method.build_model()), torch.optim.Adam)
    assert method.classifier_key == "head.weight"
    sgd = PRR(RunConfig(task="tiny"), tiny_task)
    assert isinstance(sgd.build_optimizer(sgd.build_model()), torch.optim.SGD) and sgd.classifier_key == "fc2.weight"
    state = torch.random.get_rng_state()
    sgd.reference_model  # noqa: B018 - built once, without consuming the caller's random numbers
    assert torch.equal(state, torch.random.get_rng_state())


def test_each_task_states_its_preprocessing_for_the_model_card():
    from prrfl.tasks.derm.task import DermTask
    from prrfl.tasks.prostate.task import ProstateTask

    derm, prostate = DermTask({"image_size": 48}).preprocessing(), ProstateTask({"image_size": 96}).preprocessing()
    assert (derm["image_size"], derm["channels"]) == (48, 3) and "bicubic resize to 48 x 48, uint8" in derm["steps"]
    assert (prostate["image_size"], prostate["channels"]) == (96, 1)
    assert any("0.5 and 99.5 percentiles" in step for step in prostate["steps"])


def test_each_task_spells_out_its_class_names_one_for_one_or_not_at_all():
    """class_long_names go into the model card and `prrfl predict`'s predicted_name column, by class index."""
    from prrfl.registry import task_class, task_names

    spelled = {}
    for name in task_names():
        task = task_class(name)
        assert len(task.class_long_names) in (0, task.num_classes), name
        spelled[name] = dict(zip(task.class_names, task.class_long_names))
    assert spelled["derm"]["mel"] == spelled["isic2019"]["MEL"] == "melanoma"
    assert spelled["derm"]["nv"] == spelled["isic2019"]["NV"] == "melanocytic nevus"


# ----- a task is one package -------------------------------------------------------------------------
def test_every_task_is_one_package_that_states_what_the_jobs_predict_and_data_commands_need(tmp_path):
    """What the job table, `prrfl predict` and the data command line know of a task, the task states: its settings
    under every job profile, what `prrfl predict` does with its inputs, and its package, whose `__main__` is its data
    command line (named in the error for an unprepared data root)."""
    import importlib.util

    from prrfl.flare.jobs import JOBS, PROFILES
    from prrfl.predict import PREDICTORS
    from prrfl.registry import task_class, task_names
    from prrfl.tasks.contract import PROFILE_NAMES

    assert task_names() == ["derm", "isic2019", "prostate"]
    for name in task_names():
        cls = task_class(name)
        assert sorted(cls.profiles) == sorted(PROFILE_NAMES) and cls.prediction in PREDICTORS
        assert {p: PROFILES[p][name] for p in PROFILE_NAMES} == cls.profiles
        assert cls.package() == f"prrfl.tasks.{name}" and importlib.util.find_spec(f"{cls.package()}.__main__")
        assert f"{name}_prr_paper" in JOBS and f"{name}_fedavg" in JOBS
        with pytest.raises(FileNotFoundError, match=f"python -m prrfl.tasks.{name} prepare"):
            cls({}).given_root(str(tmp_path))
