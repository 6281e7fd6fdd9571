"""FLARE glue that needs no running FLARE: job folders, upload checks, site naming."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from prrfl.config import RunConfig
from prrfl.flare.jobs import JOBS, export_job, job_config, job_files
from prrfl.flare.validation import upload_problem
from prrfl.methods.base import Upload
from prrfl.tasks.derm import DermTask

JOBS_DIR = Path(__file__).resolve().parents[1] / "jobs"


@pytest.mark.parametrize("name", sorted(JOBS))
def test_committed_job_folders_match_the_code(name, tmp_path):
    exported = export_job(name, tmp_path)
    assert job_files(exported) == job_files(JOBS_DIR / name), "run `prrfl jobs export`"


def test_job_folder_shape_and_config(tmp_path):
    job = export_job("derm_prr", tmp_path)
    server = json.loads((job / "app/config/config_fed_server.json").read_text())
    client = json.loads((job / "app/config/config_fed_client.json").read_text())
    workflow = server["workflows"][0]
    assert workflow["path"] == "prrfl.flare.workflow.PersonalizedWorkflow"
    assert RunConfig.from_dict(workflow["args"]["config"]) == job_config("derm_prr")
    assert any(c["path"].endswith("TBAnalyticsReceiver") for c in server["components"])
    assert any(c["path"].endswith("ConvertToFedEvent") for c in client["components"])
    executor = client["executors"][0]["executor"]
    assert executor["args"]["task_script_path"] == "prrfl_site.py"
    assert sorted(p.name for p in (job / "app/custom").iterdir()) == ["prrfl_site.py"]
    bundled = export_job("derm_prr", tmp_path / "b", bundle=True)
    assert (bundled / "app/custom/prrfl/algorithms/pfa.py").exists()


def test_paper_job_carries_the_paper_schedule():
    cfg = job_config("derm_prr_paper")
    assert (cfg.num_rounds, cfg.local_epochs, cfg.lr, cfg.batch_size, cfg.lr_step_epochs) == (50, 5, 1e-2, 16, 25)
    assert cfg.data["image_size"] == 128 and cfg.data["synthetic_scale"] == 1.0


def _upload(**overrides):
    ref = {"w": torch.zeros(2, 3), "n": torch.zeros((), dtype=torch.long)}
    values = dict(
        site="s",
        params={k: v.clone() for k, v in ref.items()},
        num_train=6,
        class_counts=[1, 2, 3],
        meta={"prototypes": [[0.0] * 4] * 3, "prototype_present": [True] * 3},
    )
    values.update(overrides)
    return Upload(**values), ref


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({}, None),
        ({"params": {"w": torch.zeros(2, 3)}}, "missing \\['n'\\]"),
        ({"params": {"w": torch.zeros(2, 3), "n": torch.zeros(()), "x": torch.zeros(1)}}, "unexpected \\['x'\\]"),
        ({"params": {"w": torch.zeros(3, 2), "n": torch.zeros(())}}, "shape \\(3, 2\\)"),
        ({"params": {"w": torch.full((2, 3), math.nan), "n": torch.zeros(())}}, "NaN or Inf"),
        ({"class_counts": [1, -2, 7]}, "non-negative"),
        ({"class_counts": [1, 2]}, "3 non-negative"),
        ({"num_train": 5}, "num_train 5"),
        ({"meta": {"prototypes": [[0.0] * 4] * 2, "prototype_present": [True] * 2}}, "one row per class"),
        ({"meta": {"prototypes": [[math.inf] * 4] * 3, "prototype_present": [True] * 3}}, "prototypes hold NaN"),
    ],
)
def test_malformed_uploads_are_rejected_with_a_reason(overrides, reason):
    upload, ref = _upload(**overrides)
    problem = upload_problem(upload, ref, num_classes=3)
    if reason is None:
        assert problem is None
    else:
        assert problem is not None and re.search(reason, problem), problem


def test_flare_site_names_map_to_cohorts():
    task = DermTask({})
    assert [task.cohort_of(f"site-{i}") for i in range(1, 5)] == ["A", "B", "C", "D"]
    assert task.cohort_of("C") == "C"
    with pytest.raises(ValueError, match="cannot map FLARE site 'site-5'"):
        task.cohort_of("site-5")
    with pytest.raises(ValueError, match="unknown derm data option"):
        DermTask({"img_size": 32})
