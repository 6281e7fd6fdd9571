"""README's "Your own FLARE job", run as README writes it (the code block is read from README.md) beside the
fourier_pfa example's client.py and model.py, in FLARE's simulator with cross-site evaluation: 2 sites, 5 rounds,
the example's in-memory images (24 training and 9 validation images of 32 px per site)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_flare_script

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fourier_pfa"
SITES = ("site-1", "site-2")


def readme_job() -> str:
    """The one Python block of README.md's section "Your own FLARE job"."""
    text = (ROOT / "README.md").read_text()
    assert "\n## Your own FLARE job\n" in text, "README.md has no section 'Your own FLARE job'"
    section = text.split("\n## Your own FLARE job\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, f"README.md's 'Your own FLARE job' holds {len(blocks)} Python blocks, expected 1"
    return blocks[0]


def test_the_examples_readme_shows_readmes_job_unchanged():
    example = (EXAMPLE / "README.md").read_text()
    assert f"```python\n{readme_job()}```" in example, "examples/fourier_pfa/README.md and README.md show different jobs"


@pytest.mark.e2e
def test_readmes_own_flare_job_runs_the_example_client_with_cross_site_evaluation(tmp_path, monkeypatch):
    # FLARE's own setting for SimEnv's workspace root, so that the block runs unchanged and writes under tmp_path
    monkeypatch.setenv("NVFLARE_SIMULATOR_WORKSPACE_ROOT", str(tmp_path / "ws"))
    files = {"job.py": readme_job(), **{name: (EXAMPLE / name).read_text() for name in ("client.py", "prepare_data.py")}}
    log = run_flare_script(tmp_path, files)

    matrix_files = list((tmp_path / "ws").rglob("cross_site_val/cross_val_results.json"))
    assert len(matrix_files) == 1, log[-3000:]
    matrix = json.loads(matrix_files[0].read_text())
    assert set(matrix) == set(SITES), matrix  # the data sites
    for data_site, row in matrix.items():
        # every site's personalized model as the server keeps it (SRV_<site>) and as the site submitted it (<site>)
        assert set(row) == {*SITES, *(f"SRV_{s}" for s in SITES)}, (data_site, row)
        assert all(0 <= score["accuracy"] <= 1 for score in row.values()), (data_site, row)
    for site in SITES:
        assert f"{site}: no --data_root, training on prepare_data.py's images of {site}" in log
        personal = [float(x) for x in re.findall(rf"{site} round \d+: phase \w+, personal valid accuracy ([\d.]+)", log)]
        assert len(personal) == 5, log[-3000:]  # each of README's 5 rounds trained
        # the model the site submitted is its best personalized one: at home it scores its best validation accuracy
        assert matrix[site][site]["accuracy"] == pytest.approx(max(personal), abs=5e-4)
    assert "saved the final model of each of 2 clients" in log
    # FLARE put the module client.py imports its images from into the job, as it does model.py
    assert list((tmp_path / "ws").rglob("custom/prepare_data.py")), "the job does not carry prepare_data.py"
