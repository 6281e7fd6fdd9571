"""examples/fourier_pfa end to end in FLARE's simulator: 2 sites, 2 rounds, 32 px images, 33 per site."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import prrfl
from prrfl.algorithms.pfa import conv_to_matrix, low_frequency_band, pfa_threshold

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fourier_pfa"
SITES = ("site-1", "site-2")
ROUNDS = 2


def run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A script of the example, importing this checkout's prrfl, torch on one thread (2-core machines)."""
    custom = str(Path(prrfl.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([custom, os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLE / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def fourier_run(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("fourier_pfa")
    run("prepare_data.py", "--out", str(root / "data"), "--sites", "2", "--train_per_class", "8", "--valid_per_class", "3", cwd=root)
    proc = run(
        "job.py",
        *("--aggregator", "fourier", "--rounds", str(ROUNDS), "--sites", "2"),
        *("--data_root", str(root / "data"), "--workspace", str(root / "ws")),
        cwd=root,  # job.py works from any folder
    )
    return root / "ws", proc.stdout + proc.stderr


def final_models(ws: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {site: torch.load(ws / "server" / "simulate_job" / "models" / f"{site}.pt") for site in SITES}


def test_the_job_ends_with_every_sites_final_model_saved(fourier_run):
    ws, log = fourier_run
    models = final_models(ws)
    assert "round 1 done" in log and "saved the final model of each of 2 clients" in log
    for site in SITES:
        assert f"{site} round {ROUNDS - 1}: phase" in log  # each site trained the last round
    keys = set(models["site-1"])
    assert {"conv1.weight", "bn1.running_mean", "fc2.weight"} <= keys and set(models["site-2"]) == keys
    assert any(not torch.equal(models["site-1"][k], models["site-2"][k]) for k in keys)  # personalized: not one model


@pytest.mark.parametrize("key", ["conv2.weight", "fc1.weight"])
def test_the_last_round_shares_the_low_frequencies_and_keeps_the_rest_personal(fourier_run, key):
    """PFA's output for each site is the real part of a spectrum whose low-frequency box holds the sites'
    average. The real part mixes each coefficient with its conjugate mirror; inside the box minus its first
    row and column (the box [c-b, c+b) is asymmetric) the mirror is inside too, so there the sites' spectra
    must be equal, up to the float32 rounding of the saved weights (~1e-7 here, against a spectrum of size ~1).
    Outside the box each site keeps its own spectrum, trained on its own images."""
    ws, _ = fourier_run
    r = pfa_threshold(ROUNDS - 1, ROUNDS)  # the aggregator's default schedule: 0.48 in the last round
    spectra = []
    for state in final_models(ws).values():
        weight = state[key].double()
        matrix = conv_to_matrix(weight) if weight.ndim == 4 else weight  # the aggregator's default "paper" layout
        spectra.append(torch.fft.fftshift(torch.fft.fft2(matrix)))
    difference = (spectra[0] - spectra[1]).abs()
    rows, cols = (low_frequency_band(n, r) for n in difference.shape)
    assert rows.stop - rows.start > 2 and cols.stop - cols.start > 2
    inside = difference[rows.start + 1 : rows.stop, cols.start + 1 : cols.stop]
    outside = torch.ones_like(difference, dtype=torch.bool)
    outside[rows, cols] = False
    assert inside.max() < 1e-5
    assert (difference[outside] > 1e-4).float().mean() > 0.95  # 10x the tolerance: genuinely different
