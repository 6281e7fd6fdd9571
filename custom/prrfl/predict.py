"""A site's saved best model on new cases at a hospital, without the federation (`prrfl predict`).

The model is rebuilt from its card (`prrfl.inference.load_saved_model`) and every input goes through
the functions that prepared the training data, at the card's image size: a dermoscopic image through
`prrfl.tasks.derm.images.load_square`, a prostate MRI volume through `reader.load_image` and
`prepare.prepare_image`; then the task's `eval_transform`, as in evaluation. Nothing about the
preprocessing is typed by the user.

* derm: one CSV, a row per image in sorted order: file, predicted class (`predicted`, the card's class name,
  e.g. `mel`; `predicted_name`, spelled out), `p_<class>` per class in the card's class order (softmax, 4
  decimals), flag, model, model_warning.
* prostate: per volume `<stem>_mask.nii.gz` (uint8 class indices, 1 = prostate) on the input's voxel grid,
  with its affine and header (its description names the model's weights): the predicted slices are taken back
  through the preparation's geometry (nearest neighbour), and `summary.csv` with each mask's voxels and
  millilitres per class, flag, model, model_warning.

Every row names the model it came from (`model`: `SavedModel.describe`, the same in every row), and what says
the output may not deserve trust is said in it, not only on stderr: `model_warning` (the same in every row,
empty when none) when the card's validation metrics put the model at chance level (`chance_level`) or an older
card could not be checked; a `flag` column naming why an input is implausible for the model (`image_flags`,
`volume_flags`): its prediction is still written, the user decides. An unreadable input is skipped with a
warning naming it and the rest goes on (`Prediction.skipped`). Progress lines with the time left go to
`progress` (`Progress`).

The output appears whole or not at all: the CSV is written atomically, the mask folder built beside
`out` and renamed. Errors are ValueError / FileNotFoundError naming the file (one line in the CLI).
"""

from __future__ import annotations

import csv
import io
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from prrfl.errors import error_message
from prrfl.inference import SavedModel, card_path, load_saved_model
from prrfl.progress import duration, time_left
from prrfl.storage import save_text
from prrfl.tasks.prostate.layout import MASK_TAGS, NIFTI_SUFFIXES, nifti_stem

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
MASK_SUFFIX = "_mask.nii.gz"
SUMMARY = "summary.csv"
FLAG = "flag"  # the output column of an input's implausibility reasons ("; "-joined, empty when none)
MODEL_COLUMNS = ["model", "model_warning"]  # the last output columns: the same in every row (Batch.model)
PROBABILITY_DECIMALS = 4  # of the CSV's p_<class>: a decision never hangs on the 5th decimal of a softmax
PROGRESS_SECONDS = 5.0  # at most one progress line this often

# Chance level, read from the card's validation metrics (percent), by the metrics the task reports:
# classification (auc, bacc) is at chance when AUC <= CHANCE_AUC or bACC <= 100/K + CHANCE_BACC_MARGIN;
# segmentation (dice) when Dice < CHANCE_DICE. A metric the card lacks, or NaN, is not judged.
CHANCE_AUC = 55.0  # a random ranking scores 50; +5 for a site's few validation images (8 per class by default)
# Any constant answer (e.g. the majority class for every image) scores exactly 100/K balanced accuracy (mean
# per-class recall); with 8 validation images per class, one image more right moves it by 100/(8K) (4.2 for K=3).
CHANCE_BACC_MARGIN = 5.0
# Labelling every voxel prostate scores Dice 2f/(1+f) for a prostate share f of the volume (2.5-4 %: 5-8),
# an empty mask 0: under 20 the model has not learnt where the gland is.
CHANCE_DICE = 20.0

# Implausible inputs (flagged, not refused).
# Training inputs were never enlarged more than 2x on their way to the model (raw dermoscopy >= 450 px on the
# shorter side, MR in-plane 384-512 px, synthetic volumes 1/3 of that, vs image sizes <= 256): an input whose
# square (derm: cropped to its shorter side; MR: padded to its longer) is under half the model's size
# carries less detail than any image the model learnt from.
MIN_SIZE_FRACTION = 0.5
# Derm, on the model's uint8 input: JPEG noise on a uniform fill stays under 1 grey level, the flattest
# synthetic training image varies by 39, real dermoscopy (skin texture, lesion, vignetting) by tens.
NEAR_CONSTANT_STD = 4.0
# MR has no intensity unit: std / mean |intensity| of the raw volume, about 0.5 for a pelvic volume (air,
# fat, muscle, gland); under 2 % it is a flat fill or noise on one level, which percentile scaling would
# stretch into an image.
NEAR_CONSTANT_CV = 0.02


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
    inputs: int  # predictions written
    task: str
    writes: str  # what was written for each input (Predictor.writes)
    skipped: tuple[str, ...] = ()  # one line per unreadable input, naming it and why
    flagged: int = 0  # predictions written with a flag


class Progress:
    """Lines such as "predict: 1200/5000 images, 25 s, about 80 s left" to `report`, at most one every
    PROGRESS_SECONDS (none for a batch done sooner), the time left from the pace so far. `report` None: silent."""

    def __init__(self, total: int, noun: str, report: Callable[[str], None] | None, clock: Callable[[], float] = time.monotonic):
        self.total, self.noun, self.report, self.clock = total, noun, report, clock
        self.start = self.last = clock()

    def update(self, done: int) -> None:
        now = self.clock()
        if self.report is None or done >= self.total or now - self.last < PROGRESS_SECONDS or not done:
            return
        self.last = now
        elapsed = now - self.start
        self.report(f"predict: {done}/{self.total} {self.noun}, {duration(elapsed)}, {time_left(elapsed, done, self.total)}")


@dataclass
class Batch:
    """One call's inputs as they go through: the output rows (the flag column last) and the skipped inputs."""

    total: int  # inputs to predict
    table: Path  # the CSV that holds the flag column, for messages
    model: list[str]  # MODEL_COLUMNS of every row
    progress: Progress
    rows: list[list] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def readable(self, files: Iterable[Path], load: Callable[[Path], object]) -> Iterator[tuple[Path, object]]:
        """(file, load(file)) of each file that loads; one that does not (ValueError or OSError naming it, the
        loaders' convention for a corrupt, truncated or unusable file) is skipped with a warning."""
        for path in files:
            try:
                loaded = load(path)
            except (ValueError, OSError) as e:
                self.skipped.append(error_message(e))
                log.warning("skipped: %s", self.skipped[-1])
                continue
            yield path, loaded

    def add(self, row: list, flags: Iterable[str | None]) -> None:
        self.rows.append([*row, "; ".join(f for f in flags if f)])

    def advanced(self) -> None:
        """Progress after each input or chunk: inputs written or skipped so far."""
        self.progress.update(len(self.rows) + len(self.skipped))

    def csv(self, header: list[str]) -> str:
        """The rows as CSV text, the flag and MODEL_COLUMNS last; a ValueError when no input could be read
        (nothing is to be written)."""
        if not self.rows:
            raise ValueError(f"none of the {self.total} input(s) could be read (each named above): nothing written")
        return _csv_text([*header, FLAG, *MODEL_COLUMNS], [[*row, *self.model] for row in self.rows])

    @property
    def flagged(self) -> int:
        return sum(bool(row[-1]) for row in self.rows)


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


@dataclass(frozen=True)
class Request:
    """What a predictor writes to, and with: `out`, `batch_size` inputs (images or slices) per forward pass,
    the MODEL_COLUMNS of every row, and where progress lines go (None: nowhere)."""

    out: Path
    batch_size: int
    model: list[str]
    progress: Callable[[str], None] | None

    def batch(self, total: int, table: Path, noun: str) -> Batch:
        return Batch(total, table, self.model, Progress(total, noun, self.progress))


def predict(
    model_path: str | Path,
    input_path: str | Path,
    out: str | Path,
    device: str = "cpu",
    batch_size: int | None = None,
    progress: Callable[[str], None] | None = log.info,
    *,
    accept_unverified_card: bool = False,
) -> Prediction:
    """The predictions of a best model (card beside it) for the images or volumes at `input_path`, written
    to `out` (module docstring). `batch_size`: images or slices per forward pass (default the task's);
    `progress`: where the progress lines go (`Progress`; None: nowhere); `accept_unverified_card`: as
    `load_saved_model`'s."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    saved = load_saved_model(model_path, device, accept_unverified_card=accept_unverified_card)
    check_preprocessing(saved)
    task = saved.card["task"]
    predictor = PREDICTORS[saved.task.prediction]
    model = f"{saved.path} (a {task} model)"
    files = list_inputs(input_path, predictor.kind, [p.kind for p in PREDICTORS.values() if p.kind != predictor.kind], model)
    warnings = list(saved.warnings)  # logged by load_saved_model
    chance = chance_level(saved.card)
    if chance:
        warnings.append(
            f"{card_path(saved.path)}: the model is at chance level on its validation split ({chance}): its predictions say little"
        )
        log.warning("%s", warnings[-1])
    request = Request(Path(out), batch_size or saved.task.eval_batch_size, [saved.describe(), "; ".join(warnings)], progress)
    batch = predictor.run(saved, files, request)
    if batch.flagged:
        log.warning("%d of %d inputs flagged: see the %s column of %s", batch.flagged, len(batch.rows), FLAG, batch.table)
    return Prediction(Path(out), len(batch.rows), task, predictor.writes, tuple(batch.skipped), batch.flagged)


def chance_level(card: dict) -> str | None:
    """Why the card's validation metrics put its model at chance level (the rule above CHANCE_AUC), or None."""
    valid = (card.get("metrics") or {}).get("valid") or {}
    auc, bacc, dice = (valid.get(m) for m in ("auc", "bacc", "dice"))
    classes = len(card.get("class_names") or ())
    reasons = []
    if isinstance(auc, (int, float)) and auc <= CHANCE_AUC:
        reasons.append(f"AUC {auc:.1f} <= {CHANCE_AUC:g}")
    if isinstance(bacc, (int, float)) and classes and bacc <= 100 / classes + CHANCE_BACC_MARGIN:
        constant = 100 / classes
        reasons.append(
            f"balanced accuracy {bacc:.1f} <= {constant + CHANCE_BACC_MARGIN:.1f}, one class for every input scores {constant:.1f}"
        )
    if isinstance(dice, (int, float)) and dice < CHANCE_DICE:
        reasons.append(f"Dice {dice:.1f} < {CHANCE_DICE:g}")
    return "; ".join(reasons) or None


def size_flag(shape: tuple[int, int], side: int, size: int) -> str | None:
    """The flag of an input whose square side before resizing (`side`) is under MIN_SIZE_FRACTION of the
    model's image size; `shape` (width x height, or the volume's in-plane size) is for the message."""
    if side >= MIN_SIZE_FRACTION * size:
        return None
    return f"smaller than 1/{round(1 / MIN_SIZE_FRACTION)} of the training size ({shape[0]}x{shape[1]} px vs {size} px)"


def image_flags(shape: tuple[int, int], square: np.ndarray, size: int) -> list[str | None]:
    """The implausibility flags of a dermoscopic image of `shape` (width, height), given the model's input
    `square` made from it."""
    std = float(square.std())
    constant = f"near-constant image (std {std:.1f} of 255)" if std < NEAR_CONSTANT_STD else None
    return [size_flag(shape, min(shape), size), constant]


def volume_flags(image: np.ndarray, size: int) -> list[str | None]:
    """The implausibility flags of an MR volume (RAS+ [X, Y, Z] intensities, as read for preparation)."""
    shape = image.shape[:2]
    variation = float(image.std() / max(float(np.abs(image).mean()), np.finfo(np.float32).tiny))
    constant = f"near-constant volume (std {variation:.1%} of its mean intensity)" if variation < NEAR_CONSTANT_CV else None
    return [size_flag(shape, max(shape), size), constant]


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


def _class_names(saved: SavedModel, key: str = "class_names") -> list[str]:
    """The card's class names (`key` class_names) or the same spelled out (class_long_names: a card of format 1
    has none, and gets the task's spelling of each of its class names)."""
    names = saved.card.get(key)
    if not names and key == "class_long_names":
        spelled = dict(zip(saved.task.class_names, saved.task.class_long_names))
        names = [spelled.get(n, n) for n in _class_names(saved)]
    names = list(names or saved.task.class_names)
    if len(names) != saved.task.num_classes:
        raise ValueError(f"{card_path(saved.path)}: {len(names)} {key} for a {saved.task.num_classes}-class model")
    return names


def _csv_text(header: list[str], rows: list[list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


# ----- dermoscopy: one CSV ----------------------------------------------------------------------
def _classify(saved: SavedModel, files: list[Path], request: Request) -> Batch:
    from PIL import Image

    from prrfl.tasks.derm.images import load_square

    out = request.out
    if out.is_dir():
        raise ValueError(f"{out} is a folder, but a {saved.card['task']} model writes one CSV file: give --out a file name")
    size = saved.task.preprocessing()["image_size"]
    names, long_names = _class_names(saved), _class_names(saved, "class_long_names")

    def load(path: Path) -> tuple[np.ndarray, list[str | None]]:
        square = load_square(path, size)
        with Image.open(path) as im:  # the header only: the size before cropping and resizing
            return square, image_flags(im.size, square, size)

    batch = request.batch(len(files), out, "images")
    for chunk in _chunks(files, request.batch_size):
        loaded = list(batch.readable(chunk, load))
        if loaded:
            probs = _probabilities(saved, np.stack([square for _, (square, _) in loaded]))
            for (path, (_, flags)), p in zip(loaded, probs.tolist()):
                c = int(np.argmax(p))  # of the probabilities before rounding
                batch.add([path.name, names[c], long_names[c], *(f"{v:.{PROBABILITY_DECIMALS}f}" for v in p)], flags)
        batch.advanced()
    save_text(batch.csv(["file", "predicted", "predicted_name", *(f"p_{n}" for n in names)]), out)
    return batch


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


def _mask_image(mask: np.ndarray, source, num_classes: int, weights_sha256: str):
    """The NIfTI of a uint8 mask on its source's voxel grid: the source's affine and header (data type,
    scaling and display range set for labels; its description names the model by its weights' sha256)."""
    image = type(source)(mask.astype(np.uint8), source.affine, header=source.header.copy())
    image.set_data_dtype(np.uint8)
    header = image.header
    header.set_slope_inter(1, 0)
    header["cal_min"], header["cal_max"] = 0, num_classes - 1
    header["descrip"] = f"prrfl predicted mask, model sha256 {weights_sha256[:12]}".encode()  # 80 bytes at most
    return image


def _segment(saved: SavedModel, files: list[Path], request: Request) -> Batch:
    import nibabel as nib

    from prrfl.data.publish import build_dir
    from prrfl.tasks.prostate.prepare import prepare_image, restore_labels
    from prrfl.tasks.prostate.reader import from_canonical, load_image

    out = request.out
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, but a {saved.card['task']} model writes a folder of masks: give --out a folder")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name != SUMMARY and not p.name.endswith(MASK_SUFFIX))
        if foreign:
            raise ValueError(f"output folder {out} holds other files ({', '.join(foreign[:3])}): give --out a new or empty folder")
    size = saved.task.preprocessing()["image_size"]
    names = _class_names(saved)
    stems = dict(_volume_inputs(files))
    batch = request.batch(len(stems), out / SUMMARY, "volumes")

    def write(folder: Path) -> None:
        for path, volume in batch.readable(stems, load_image):
            stem = stems[path]
            slices = prepare_image(volume.image, size)
            chunks = _chunks(slices, request.batch_size)
            labels = np.concatenate([_probabilities(saved, c).argmax(dim=1).numpy() for c in chunks])
            mask = from_canonical(restore_labels(labels.astype(np.uint8), volume.image.shape), volume.ornt)
            nib.save(_mask_image(mask, volume.source, len(names), saved.weights_sha256), folder / f"{stem}{MASK_SUFFIX}")
            voxel_ml = abs(float(np.linalg.det(volume.source.affine[:3, :3]))) / 1000.0
            counts = [int((mask == c).sum()) for c in range(1, len(names))]
            row = [path.name, f"{stem}{MASK_SUFFIX}", "x".join(map(str, mask.shape)), *counts, *(f"{n * voxel_ml:.3f}" for n in counts)]
            batch.add(row, volume_flags(volume.image, size))
            batch.advanced()
        header = ["file", "mask", "shape", *(f"voxels_{n}" for n in names[1:]), *(f"ml_{n}" for n in names[1:])]
        (folder / SUMMARY).write_text(batch.csv(header))

    build_dir(out, write, overwrite=True)
    return batch


@dataclass(frozen=True)
class Predictor:
    kind: InputKind  # the inputs it takes
    run: Callable[[SavedModel, list[Path], Request], Batch]  # writes their predictions, says what happened to them
    writes: str  # what it writes per input, for messages


# what a task predicts (its Task.prediction): images classified into one CSV, or volumes segmented into masks
PREDICTORS: dict[str, Predictor] = {
    "images": Predictor(IMAGES, _classify, "class probabilities"),
    "volumes": Predictor(VOLUMES, _segment, "masks"),
}
