"""Decoding one raw image into the prepared form: RGB, centre square crop on the shorter side, resized.

Torch-free so that preparation worker processes start fast.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

log = logging.getLogger(__name__)

_CONVERTIBLE = {"L", "LA", "P", "PA", "RGBA", "RGBX", "CMYK", "YCbCr", "1", "I;16", "I"}


def centre_square(width: int, height: int) -> tuple[int, int, int, int]:
    """Box (left, top, right, bottom) of the centred square whose side is the shorter image side."""
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def load_square(path: str | Path, size: int) -> np.ndarray:
    """uint8 (3, size, size) CHW: the image at `path`, RGB, centre-cropped to a square, bicubic-resized.

    Grayscale, palette, RGBA and CMYK images are converted to RGB (logged); unreadable or corrupt
    files raise ValueError naming the path. JPEG decoding uses PIL's draft mode (DCT scaling) when
    the image is at least twice the target size, which is faster and, followed by the antialiased
    bicubic resize, visually equivalent.
    """
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                if im.format == "JPEG":
                    w, h = im.size
                    scale = 2 * size / min(w, h)
                    if scale < 1:
                        im.draft("RGB", (max(1, int(w * scale)), max(1, int(h * scale))))
                im.load()
                if im.mode != "RGB":
                    if im.mode not in _CONVERTIBLE:
                        raise ValueError(f"{path}: unsupported image mode {im.mode!r}")
                    log.info("%s: converting mode %s to RGB", path, im.mode)
                    im = _to_rgb(im)
                box = centre_square(*im.size)
                out = im.resize((size, size), Image.Resampling.BICUBIC, box=box)
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {path}") from None
    except (
        OSError,
        UnidentifiedImageError,
        SyntaxError,
        Image.DecompressionBombWarning,
        Image.DecompressionBombError,
    ) as e:
        raise ValueError(f"cannot read image {path}: {e}") from e
    return np.ascontiguousarray(np.asarray(out, dtype=np.uint8).transpose(2, 0, 1))


def _to_rgb(im: Image.Image) -> Image.Image:
    if im.mode in ("I;16", "I"):  # 16-bit grayscale: scale to 8 bits before converting
        a = np.asarray(im, dtype=np.float64)
        top = a.max() or 1.0
        im = Image.fromarray((a * (255.0 / top)).astype(np.uint8), "L")
    if im.mode in ("LA", "PA", "RGBA", "P"):
        im = im.convert("RGBA")
        bg = Image.new("RGBA", im.size, (0, 0, 0, 255))
        im = Image.alpha_composite(bg, im)
    return im.convert("RGB")
