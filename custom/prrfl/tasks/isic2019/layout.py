"""The facts of Fed-ISIC2019 in one place: classes, centres, FLamby's split counts, on-disk names.

Fed-ISIC2019 is FLamby's federated split of the ISIC 2019 training set: 23,247 dermoscopy images from six sources
(centres 0-5), eight diagnoses, some of them absent at some centres, each centre's images split 80/20 into FLamby's
train and test folds. FLamby's resize script leaves every image with a shorter side of 224 px.

The class counts below are those of FLamby's `train_test_split` file (per centre, per fold, per target). FCA's
Table 1 gives the same totals for BCN, MSK, ViDIR Modern and ViDIR Legacy (vienna_dias); for two centres its digits
do not add up to FLamby's totals, and the split file settles both: at Rosendahl SCC is 186 (the table reads 18;
HAM10000's 295 "akiec" lesions of that cohort are ISIC 2019's AK 109 + SCC 186), at ViDIR MoleMax VASC is 54 (the
table reads 43; 3,954 images in all, as FLamby's 3163 + 791).
"""

from __future__ import annotations

from prrfl.data.manifest import MANIFEST_NAME  # noqa: F401 - re-exported (prepared layout)

CLASS_NAMES: tuple[str, ...] = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")  # FLamby's `target` 0..7
CLASS_LONG_NAMES: tuple[str, ...] = (  # ISIC 2019's diagnoses, spelled out
    "melanoma",
    "melanocytic nevus",
    "basal cell carcinoma",
    "actinic keratosis",
    "benign keratosis",
    "dermatofibroma",
    "vascular lesion",
    "squamous cell carcinoma",
)
NUM_CLASSES = len(CLASS_NAMES)
UNKNOWN_CLASS = "UNK"  # ISIC 2019's ninth column: no training image has it; a row that does is refused

# FLamby's centre index -> the name of its source (the site names of the task, in FLARE site order)
CENTRES: tuple[str, ...] = ("BCN", "HAM_vidir_molemax", "HAM_vidir_modern", "HAM_rosendahl", "MSK", "HAM_vienna_dias")
FOLDS: tuple[str, ...] = ("train", "test")
SPLITS: tuple[str, ...] = ("train", "valid", "test")  # prepared: FLamby's train fold gives train and valid

# FLamby's split file, per centre: images per class (CLASS_NAMES order) in its train and test folds
COUNTS: dict[str, dict[str, tuple[int, ...]]] = {
    "BCN": {"train": (2279, 3363, 2245, 606, 923, 97, 87, 330), "test": (578, 843, 564, 131, 215, 27, 24, 101)},
    "HAM_vidir_molemax": {"train": (20, 2977, 2, 0, 96, 23, 45, 0), "test": (4, 743, 0, 0, 28, 7, 9, 0)},
    "HAM_vidir_modern": {"train": (533, 1470, 174, 20, 379, 40, 64, 11), "test": (147, 362, 37, 1, 96, 11, 18, 0)},
    "HAM_rosendahl": {"train": (276, 649, 223, 86, 406, 20, 3, 144), "test": (66, 154, 73, 23, 84, 10, 0, 42)},
    "MSK": {"train": (166, 349, 0, 0, 140, 0, 0, 0), "test": (49, 66, 0, 0, 49, 0, 0, 0)},
    "HAM_vienna_dias": {"train": (58, 276, 5, 0, 6, 4, 2, 0), "test": (9, 74, 0, 0, 4, 0, 1, 0)},
}

# FLamby's files, as its download and resize scripts leave them
IMAGES_DIR = "ISIC_2019_Training_Input_preprocessed"  # <image>.jpg, shorter side 224 px
SPLIT_CSV = "train_test_split"  # FLamby's dataset_creation_scripts/train_test_split (a CSV without extension)
CSV_COLUMNS: tuple[str, ...] = ("image", *CLASS_NAMES, UNKNOWN_CLASS, "target", "center", "fold", "fold2")
SHORT_SIDE = 224  # FLamby's resize_images.py: every image's shorter side

SYNTHETIC_MARKER = "synthetic.json"  # written by the generator beside the CSV


def centre_index(name: str) -> int:
    """FLamby's index of a centre given by name, with an error listing the names."""
    if name not in CENTRES:
        raise ValueError(f"unknown Fed-ISIC2019 centre {name!r}; expected one of {list(CENTRES)}")
    return CENTRES.index(name)
