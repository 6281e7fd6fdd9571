"""The figures of a report: per-site curves over training, the retrogress bars and the segmentation overlays,
written small enough to keep in git."""

from __future__ import annotations

import io
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prrfl.metrics import label
from prrfl.naming import cohort_labels
from prrfl.report.runs import SiteResult
from prrfl.report.stats import sample_std
from prrfl.report.tables import ordered
from prrfl.storage import atomic_write_bytes

log = logging.getLogger(__name__)


# ----- figures -----------------------------------------------------------------------------
Curve = tuple[np.ndarray, np.ndarray, np.ndarray]  # x (epochs done), mean and sample std over seeds


def site_curves(results: Sequence[SiteResult], metric: str) -> dict[str, Curve]:
    """cohort -> the site's per-epoch test curve (mean and std over seeds). The 'epoch' record of
    round r-1 and the 'download' record of round r share an x: sorted by round, the curve falls
    straight down by the retrogress at each communication."""
    points: dict[str, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        for h in r.history:
            if h["kind"] in ("epoch", "download"):
                points[r.cohort][(h["epochs_done"], h["round"])].append(h["test"][metric])
    curves = {}
    for cohort, by_x in points.items():
        keys = sorted(by_x)
        x = np.array([k[0] for k in keys], dtype=float)
        curves[cohort] = (x, np.array([np.mean(by_x[k]) for k in keys]), np.array([sample_std(by_x[k]) for k in keys]))
    return curves


def _communication_epochs(results: Sequence[SiteResult]) -> list[int]:
    return sorted({h["epochs_done"] for r in results for h in r.history if h["kind"] == "download"})


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def site_colours(cohorts: Iterable[str]) -> dict[str, Any]:
    """One fixed colour per cohort, the same in every figure."""
    plt = _pyplot()
    palette = plt.get_cmap("tab10").colors
    return {c: palette[i % len(palette)] for i, c in enumerate(sorted(cohorts))}


def plot_curves(method: str, results: Sequence[SiteResult], colours: dict[str, Any], path: Path, metric: str) -> Path:
    """Fig. 1 of the paper for one method: test metric of each site over the local epochs, the
    communication rounds marked; with several seeds the mean and a ±1 std band."""
    plt = _pyplot()
    seeds = len({r.seed for r in results})
    names = cohort_labels((r.site, r.cohort) for r in results)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for epoch in _communication_epochs(results):
        ax.axvline(epoch, color="0.88", lw=0.8, zorder=0)
    for cohort, (x, mean, std) in sorted(site_curves(results, metric).items(), key=lambda item: names[item[0]]):  # site-1 first
        ax.plot(x, mean, color=colours[cohort], lw=1.6, label=names[cohort])
        if seeds > 1:
            ax.fill_between(x, mean - std, mean + std, color=colours[cohort], alpha=0.15, lw=0)
    ax.set_ylim(0, 100)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("local epochs done (grey lines: communication rounds)")
    ax.set_ylabel(f"test {label(metric)} (%)")
    spread = f"mean ± std of {seeds} seeds" if seeds > 1 else f"seed {results[0].seed}"
    ax.set_title(f"{method}: test {label(metric)} per site over training ({spread})")
    ax.legend(title="site", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)  # never over a curve
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


EXAMPLES_FILE = "examples.npz"  # written by a segmentation site beside its results.json
OVERLAYS = "overlays.jpg"  # MRI slices: a JPEG
# Okabe and Ito's colour-blind-safe pair, both bright on a dark or a light slice
TRUTH_COLOUR, TRUTH_NAME = "#56B4E9", "sky blue"
PREDICTION_COLOUR, PREDICTION_NAME = "#E69F00", "orange"


def plot_overlays(results: Sequence[SiteResult], methods: Sequence[str], path: Path, site_order: Sequence[str] = ()) -> Path | None:
    """Fig. 4 of the TMI paper (`overlays_figure`), written as a JPEG; None when no run wrote examples."""
    fig = overlays_figure(results, methods, site_order)
    return None if fig is None else _save(fig, path, dpi=72)  # about 160 px a slice: the synthetic slices are 64-128 px


def overlays_figure(results: Sequence[SiteResult], methods: Sequence[str], site_order: Sequence[str] = ()):
    """Fig. 4 of the TMI paper: one test slice per site (columns, each named by its site label) for each method
    (rows), the true contour in sky blue and the method's predicted contour in orange (a pair colour-blind readers
    tell apart), from each run's examples file (the lowest seed of each method; the first example of each site, i.e. the largest prostate
    section of its first test volume). The examples are the reported model's: the other models a run scored
    (`<method>/deputy`, `<method>/trained`) have no row. The title stands above the slices and the colour legend
    below them, the constrained layout keeping room for both. None when no run wrote examples."""
    chosen: dict[tuple[str, str], Any] = {}
    names = cohort_labels((r.site, r.cohort) for r in results)
    for r in sorted(results, key=lambda r: r.seed):
        file = r.path.parent / EXAMPLES_FILE
        if not r.other_model and (r.method, r.cohort) not in chosen and file.is_file():
            with np.load(file) as z:
                chosen[(r.method, r.cohort)] = {k: z[k][0] for k in ("image", "truth", "prediction")}
    rows = [m for m in methods if any(k[0] == m for k in chosen)]
    cohorts = ordered((k[1] for k in chosen), site_order)
    if not rows:
        return None
    plt = _pyplot()
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(
        len(rows), len(cohorts), figsize=(2.2 * len(cohorts), 2.3 * len(rows) + 0.6), squeeze=False, layout="constrained"
    )
    for i, method in enumerate(rows):
        for j, cohort in enumerate(cohorts):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            example = chosen.get((method, cohort))
            if example is not None:
                ax.imshow(example["image"], cmap="gray", vmin=0, vmax=255)
                for mask, colour in ((example["truth"], TRUTH_COLOUR), (example["prediction"], PREDICTION_COLOUR)):
                    if mask.any():
                        ax.contour(mask, levels=[0.5], colors=colour, linewidths=1.2)
            if i == 0:
                ax.set_title(names[cohort], fontsize=10)
            if j == 0:
                ax.set_ylabel(method, fontsize=10)
    fig.suptitle(f"Test slices: ground truth ({TRUTH_NAME}) and prediction ({PREDICTION_NAME})", fontsize=10)
    handles = [
        Line2D([], [], color=TRUTH_COLOUR, lw=2, label=f"ground truth ({TRUTH_NAME})"),
        Line2D([], [], color=PREDICTION_COLOUR, lw=2, label=f"prediction ({PREDICTION_NAME})"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    return fig


REPORTED_COLOUR = "#0072B2"  # Okabe and Ito's blue and orange: the two bars of a method
SHARED_COLOUR = "#E69F00"


def plot_retrogress(
    summary: dict[str, tuple[float, float, int]],
    path: Path,
    reference: str,
    metric: str,
    shared: dict[str, tuple[float, float, int]] | None = None,
) -> Path:
    """The retrogress bars (`retrogress_figure`), written as a PNG."""
    return _save(retrogress_figure(summary, reference, metric, shared), path)


def retrogress_figure(
    summary: dict[str, tuple[float, float, int]],
    reference: str,
    metric: str,
    shared: dict[str, tuple[float, float, int]] | None = None,
):
    """Bar per method: mean drop of the test metric right after a communication round, ±1 std; with
    `shared`, a second bar beside it for the shared model (the one the download overwrites) where measured.
    One colour per kind of bar, the same for every method; the legend names exactly the bars drawn (one entry
    per `ax.bar` call), the reference is named in the axis label."""
    plt = _pyplot()
    methods = list(summary)
    shared = {m: v for m, v in (shared or {}).items() if m in summary}
    width = 0.4 if shared else 0.8
    x = np.arange(len(methods)) - (width / 2 if shared else 0.0)
    fig, ax = plt.subplots(figsize=(max(6.0, (1.6 if shared else 1.1) * len(methods) + 2), 4.8))
    means, stds = [summary[m][0] for m in methods], [summary[m][1] for m in methods]
    ax.bar(x, means, width, yerr=stds, capsize=4, color=REPORTED_COLOUR, alpha=0.85, label="reported model")
    labels = [f"{m}\n{mean:.1f} ± {std:.1f}" for m, mean, std in zip(methods, means, stds)]  # under the bars, clear of error bars
    if shared:
        at = [i for i, m in enumerate(methods) if m in shared]
        ax.bar(
            x[at] + width,
            [shared[methods[i]][0] for i in at],
            width,
            yerr=[shared[methods[i]][1] for i in at],
            capsize=4,
            color=SHARED_COLOUR,
            alpha=0.85,
            label="shared model (uploaded, then overwritten)",
        )
        labels = [f"{lab}\nshared {shared[m][0]:.1f} ± {shared[m][1]:.1f}" if m in shared else lab for lab, m in zip(labels, methods)]
    ax.legend(fontsize=8)  # the labels of the bars above, nothing else
    ax.set_xticks(np.arange(len(methods)), labels, fontsize=8 if shared else None)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel(f"method (the reference: {reference})")
    ax.set_ylabel(f"test {label(metric)} drop (points)")
    ax.set_title(
        f"Retrogress: test {label(metric)} lost right after a communication round\n(mean ± std over sites, rounds and seeds)", fontsize=11
    )
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.15)
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, -1.0), max(high, 1.0))  # all-zero bars (PRR alone) read as 0 points, not as noise
    return fig


JPEG_QUALITY = 70


def _save(fig, path: Path, dpi: int = 90) -> Path:
    """The figure, written atomically and small enough to keep in git: a plot as a PNG of at most 256 colours
    (lossless for matplotlib's flat colours and lines), an image (.jpg: MRI slices) as a JPEG."""
    from PIL import Image

    if fig.get_layout_engine() is None:  # a figure laid out by its own engine (constrained) keeps it
        fig.tight_layout()
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=dpi)
    _pyplot().close(fig)
    out = io.BytesIO()
    with Image.open(rendered) as image:
        if path.suffix == ".jpg":
            image.convert("RGB").save(out, format="jpeg", quality=JPEG_QUALITY, optimize=True)
        else:
            image.convert("RGB").quantize(colors=256, dither=Image.Dither.NONE).save(out, format="png", optimize=True)
    return atomic_write_bytes(path, out.getvalue())
