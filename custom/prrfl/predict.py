"""A site's saved best model on new cases at a hospital, without the federation (`prrfl predict`).

The model is rebuilt from its card (`prrfl.inference.load_saved_model`) and every input goes through
the functions that prepared the training data, at the card's image size: a dermoscopic image through
`prrfl.data.derm.images.load_square`, a prostate MRI volume through `reader.load_image` and
`prepare.prepare_image`; then the task's `eval_transform`, as in evaluation. Nothing about the
preprocessing is typed by the user.

* derm: one CSV, a row per image in sorted order: file, predicted class, `p_<class>` per class in the
  card's class order (softmax).
* prostate: per volume `<stem>_mask.nii.gz` (uint8 class indices, 1 = prostate) on the input's voxel grid,
  with its affine and header: the predicted slices are taken back through the preparation's geometry
  (nearest neighbour), and `summary.csv` with each mask's voxels and millilitres per class.

The output appears whole or not at all: the CSV is written atomically, the mask folder built beside
`out` and renamed. Errors are ValueError / FileNotFoundError naming the file (one line in the CLI).
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prrfl.data.prostate.layout import MASK_TAGS, NIFTI_SUFFIXES, nifti_stem
from prrfl.inference import SavedModel, card_path, load_saved_model
from prrfl.storage import save_text

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
MASK_SUFFIX = "_mask.nii.gz"
SUMMARY = "summary.csv"


@dataclass(frozen=True)
class InputKind:
    noun: str  # what the model takes, for messages
    suffixes: tuple[str, ...]  # file name endings, lower case

    def matches(self, path: Path) -> bool:
        return path.name.lower().endswith(self.suffixes)

    def describe(self) -> str:
        return f"{self.noun} ({', '.join(self.suffixes)})"


IMAGES = InputKind("JPEG/PNG images", IMAGE_SUFFIXES)
VOLUMES = InputKind("NIfTI volumes", NIFTI_SUFFIXES)


@dataclass(frozen=True)
class Prediction:
    out: Path
    inputs: int
    task: str


def check_preprocessing(saved: SavedModel) -> None:
    """The card's stated preprocessing must be what its config builds: same image size and channels
    (a ValueError naming the card otherwise). Steps worded otherwise than this code's are a warning."""
    stated, built = saved.card.get("preprocessing"), saved.task.preprocessing()
    card_file = card_path(saved.path)
    if not isinstance(stated, dict):
        raise ValueError(f"{card_file}: the model card states no preprocessing")
    for key in ("image_size", "channels"):
        if stated.get(key) != built[key]:
            raise ValueError(
                f"{card_file}: its preprocessing says {key} {stated.get(key)!r} but its config builds {key} {built[key]!r}; "
                "the card does not describe its model"
            )
    if stated.get("steps") != built["steps"]:
        log.warning("%s: the preprocessing steps it states differ in wording from this code's: %s", card_file, built["steps"])


def list_inputs(path: str | Path, kind: InputKind, others: Sequence[InputKind], model: str) -> list[Path]:
    """The input files of `kind`: `path` itself, or the files of the folder `path` (not its sub-folders),
    sorted by name. A missing path, a file or a folder of another kind, a folder with none are refused."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such input file or folder")
    wrong = f"but {model} takes {kind.describe()}"
    if path.is_file():
        if kind.matches(path):
            return [path]
        other = next((o for o in others if o.matches(path)), None)
        raise ValueError(f"{path} is {'one of the ' + other.noun if other else 'not one of the ' + kind.noun}, {wrong}")
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    chosen = [p for p in files if kind.matches(p)]
    if not chosen:
        found = [o.noun for o in others if any(o.matches(p) for p in files)]
        if found:
            raise ValueError(f"input folder {path} holds {' and '.join(found)}, {wrong}")
        raise ValueError(f"input folder {path} holds no {kind.describe()}")
    if len(chosen) < len(files):
        log.warning("%s: %d file(s) that are not %s ignored", path, len(files) - len(chosen), kind.noun)
    return chosen


def predict(
    model_path: str | Path,
    input_path: str | Path,
    out: str | Path,
    device: str = "cpu",
    batch_size: int | None = None,
) -> Prediction:
    """The predictions of a best model (card beside it) for the images or volumes at `input_path`, written
    to `out` (module docstring). `batch_size`: images or slices per forward pass (default the task's)."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    saved = load_saved_model(model_path, device)
    check_preprocessing(saved)
    task = saved.card["task"]
    if task not in PREDICTORS:
        raise ValueError(f"{card_path(saved.path)}: no prediction for task '{task}' (known: {sorted(PREDICTORS)})")
    kind, run = PREDICTORS[task]
    model = f"{saved.path} (a {task} model)"
    files = list_inputs(input_path, kind, [k for k, _ in PREDICTORS.values() if k != kind], model)
    count = run(saved, files, Path(out), batch_size or saved.task.eval_batch_size)
    return Prediction(Path(out), count, task)


# ----- shared -----------------------------------------------------------------------------------
def _chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@torch.no_grad()
def _probabilities(saved: SavedModel, stored: np.ndarray) -> torch.Tensor:
    """Softmax over classes (dim 1) of the model on stored uint8 inputs [B,C,S,S], through the task's
    evaluation transform, on the CPU."""
    device = next(saved.model.parameters()).device
    images = torch.from_numpy(stored).to(device)
    inputs, _ = saved.task.eval_transform(images, torch.zeros(len(images), dtype=torch.long, device=device))
    logits, _ = saved.model(inputs)
    return torch.softmax(logits.float(), dim=1).cpu()


def _class_names(saved: SavedModel) -> list[str]:
    names = list(saved.card.get("class_names") or saved.task.class_names)
    if len(names) != saved.task.num_classes:
        raise ValueError(f"{card_path(saved.path)}: {len(names)} class names for a {saved.task.num_classes}-class model")
    return names


def _csv_text(header: list[str], rows: list[list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


# ----- dermoscopy: one CSV ----------------------------------------------------------------------
def _classify(saved: SavedModel, files: list[Path], out: Path, batch_size: int) -> int:
    from prrfl.data.derm.images import load_square

    if out.is_dir():
        raise ValueError(f"{out} is a folder, but a {saved.card['task']} model writes one CSV file: give --out a file name")
    size = saved.task.preprocessing()["image_size"]
    names = _class_names(saved)
    rows = []
    for chunk in _chunks(files, batch_size):
        probs = _probabilities(saved, np.stack([load_square(p, size) for p in chunk]))
        for path, p in zip(chunk, probs.tolist()):
            rows.append([path.name, names[int(np.argmax(p))], *(f"{v:.9g}" for v in p)])  # 9 digits: the float32 exactly
    save_text(_csv_text(["file", "predicted", *(f"p_{n}" for n in names)], rows), out)
    return len(rows)


# ----- prostate MRI: a mask per volume ------------------------------------------------------------
def _volume_inputs(files: list[Path]) -> list[tuple[Path, str]]:
    """(file, output stem) of the image volumes; the masks of a raw case layout beside them are skipped."""
    chosen: dict[str, Path] = {}
    for path in files:
        stem = nifti_stem(path.name) or path.name
        if stem.endswith(MASK_TAGS) or path.name.endswith(MASK_SUFFIX):
            log.info("%s: a mask, not an image volume; skipped", path)
            continue
        if stem in chosen:
            raise ValueError(f"{path} and {chosen[stem].name} would both write {stem}{MASK_SUFFIX}; keep one of them")
        chosen[stem] = path
    if not chosen:
        where = files[0] if len(files) == 1 else f"input folder {files[0].parent}"
        raise ValueError(f"{where}: only masks of a case layout (*{MASK_TAGS[0]}.nii.gz, *{MASK_SUFFIX}), no image volume")
    return [(p, s) for s, p in chosen.items()]


def _mask_image(mask: np.ndarray, source, num_classes: int):
    """The NIfTI of a uint8 mask on its source's voxel grid: the source's affine and header (data type,
    scaling and display range set for labels)."""
    image = type(source)(mask.astype(np.uint8), source.affine, header=source.header.copy())
    image.set_data_dtype(np.uint8)
    header = image.header
    header.set_slope_inter(1, 0)
    header["cal_min"], header["cal_max"] = 0, num_classes - 1
    header["descrip"] = b"prrfl predicted mask"
    return image


def _segment(saved: SavedModel, files: list[Path], out: Path, batch_size: int) -> int:
    import nibabel as nib

    from prrfl.data.build import build_dir
    from prrfl.data.prostate.prepare import prepare_image, restore_labels
    from prrfl.data.prostate.reader import from_canonical, load_image

    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, but a {saved.card['task']} model writes a folder of masks: give --out a folder")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name != SUMMARY and not p.name.endswith(MASK_SUFFIX))
        if foreign:
            raise ValueError(f"output folder {out} holds other files ({', '.join(foreign[:3])}): give --out a new or empty folder")
    size = saved.task.preprocessing()["image_size"]
    names = _class_names(saved)
    inputs = _volume_inputs(files)

    def write(folder: Path) -> None:
        rows = []
        for path, stem in inputs:
            volume = load_image(path)
            slices = prepare_image(volume.image, size)
            labels = np.concatenate([_probabilities(saved, c).argmax(dim=1).numpy() for c in _chunks(slices, batch_size)])
            mask = from_canonical(restore_labels(labels.astype(np.uint8), volume.image.shape), volume.ornt)
            nib.save(_mask_image(mask, volume.source, len(names)), folder / f"{stem}{MASK_SUFFIX}")
            voxel_ml = abs(float(np.linalg.det(volume.source.affine[:3, :3]))) / 1000.0
            counts = [int((mask == c).sum()) for c in range(1, len(names))]
            rows.append(
                [path.name, f"{stem}{MASK_SUFFIX}", "x".join(map(str, mask.shape)), *counts, *(f"{n * voxel_ml:.3f}" for n in counts)]
            )
        header = ["file", "mask", "shape", *(f"voxels_{n}" for n in names[1:]), *(f"ml_{n}" for n in names[1:])]
        (folder / SUMMARY).write_text(_csv_text(header, rows))

    build_dir(out, write, overwrite=True)
    return len(inputs)


# task -> (the inputs it takes, the function that writes their predictions and returns how many it wrote)
PREDICTORS: dict[str, tuple[InputKind, Callable[[SavedModel, list[Path], Path, int], int]]] = {
    "derm": (IMAGES, _classify),
    "prostate": (VOLUMES, _segment),
}
