"""What leaves a site, and who may connect.

* A site's train result carries only the shared (non-BatchNorm) weights, the class counts, per-class
  prototypes and aggregate metrics: no images, labels or per-sample values.
* A client holding a certificate from another provisioning is refused by the server (mutual TLS).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_runtime

from prrfl.flare import task_protocol as P
from prrfl.messages import Download
from prrfl.site.trainer import run_round

ALLOWED_META = {"num_train", "class_counts", "method", "summary"}
ALLOWED_METHOD_META = {"prototypes", "prototype_present"}


def sent_by_site(task, tmp_path, method: str):
    """The FLModel a site sends after its first train task, built exactly as site_app.main builds it."""
    site = make_runtime(task, tmp_path, method=method)
    torch.manual_seed(0)
    initial = Download(params=task.build_model().state_dict())
    common = {P.CONFIG: site.cfg.to_dict(), P.RUN_ID: site.run_id, P.NUM_SITES: 2, P.GLOBAL_COUNTS: [20, 20, 20]}
    received = P.model_to_download(P.download_to_model(initial, common, 0, site.cfg.num_rounds))
    upload = run_round(site, received, 0)
    results = site.results()
    return site, P.upload_to_model(upload, {k: results[k] for k in ("best", "last", "ood", "cohort")}, received.params)


def numbers_in(value) -> list[int]:
    """Lengths of every list/array inside a nested value (to spot per-sample arrays)."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers_in(v)]
    if isinstance(value, (list, tuple)):
        return [len(value)] + [n for v in value for n in numbers_in(v)]
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return list(value.shape)
    return []


@pytest.mark.parametrize("method, bn_stays", [("prr", True), ("fedbn", True), ("fedavg", False)])
def test_a_site_sends_only_weights_counts_and_prototypes(tiny_task, tmp_path, method, bn_stays):
    site, sent = sent_by_site(tiny_task, tmp_path, method)
    model = site.models[site.method.upload_role]
    assert set(sent.params) == set(site.method.shared_keys(model))
    if bn_stays:
        assert not any("bn" in k or "running" in k or "num_batches" in k for k in sent.params), "BatchNorm left the site"
    assert set(sent.meta) <= ALLOWED_META
    assert set(sent.meta["method"]) <= ALLOWED_METHOD_META
    assert sent.meta["class_counts"] == site.data.class_counts and sent.meta["num_train"] == site.data.num_train
    if "prototypes" in sent.meta["method"]:
        assert np.asarray(sent.meta["method"]["prototypes"]).shape[0] == tiny_task.num_classes
    # nothing of per-sample size: no images, labels, logits or embeddings of single images
    sizes = {site.data.num_train, len(site.data.valid), len(site.data.test)}
    assert not sizes & set(numbers_in(sent.meta)), "a per-sample array is in the upload"


def log_text(kit: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (kit / "log.txt", kit / "deploy_console.log") if p.exists())


@pytest.mark.e2e
def test_a_client_from_another_provisioning_is_refused(tmp_path):
    from prrfl.flare.deployment import POC_TEMPLATE, Deployment, Processes, client_command, free_ports, make_project, provision

    ports = free_ports(2)
    ours = provision(make_project(POC_TEMPLATE, 1, *ports), tmp_path / "ours")
    theirs = provision(make_project(POC_TEMPLATE, 1, *ports), tmp_path / "theirs")  # same names and ports, other root CA
    site = theirs.sites[0]
    deployment = Deployment(ours)
    intruder = Processes({**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deployment.start_server()
        intruder.start(site, client_command(theirs, site), theirs.kit(site))
        deadline, refused = time.time() + 40, False
        while time.time() < deadline and not refused:
            time.sleep(2)
            assert site not in {c.name for c in deployment.sess.get_system_info().client_info}
            refused = any(word in log_text(theirs.kit(site)).lower() for word in ("certificate_verify", "handshake failed"))
        assert refused, "no TLS refusal in the intruder's log:\n" + log_text(theirs.kit(site))[-3000:]
        assert site not in {c.name for c in deployment.sess.get_system_info().client_info}
    finally:
        intruder.stop_all()
        deployment.stop()
