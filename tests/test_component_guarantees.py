"""The FLARE components' guarantees in FLARE's simulator, with a stock Client API script (hello-pt style: receive,
change the weights, send; nothing of prrfl at the clients): a client whose upload holds a NaN is refused by name for
that round, and no other client's model is touched by it; a client that raises is reported as failed, not as late;
FLARE's round events fire as its FedAvg fires them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import run_flare_script

pytestmark = pytest.mark.e2e

SITES = ("site-1", "site-2", "site-3")

JOB = """
import sys
from model import Net
from widgets import RoundEvents
from nvflare.client.config import ExchangeFormat, TransferType
from nvflare.job_config.api import FedJob
from nvflare.job_config.script_runner import ScriptRunner
from prrfl.flare.components import FourierAggregator, PersonalizedFedAvg

job = FedJob(name="guarantees", min_clients=3)
job.set_app_packages(["prrfl"])
job.to_server(PersonalizedFedAvg(num_rounds=3, aggregator=FourierAggregator(weighting="samples"), model=Net(), min_clients=2))
job.to_server(RoundEvents(), id="round_events")
job.to_clients(ScriptRunner(script="client.py", params_transfer_type=TransferType.DIFF, server_expected_format=ExchangeFormat.PYTORCH))
job.simulator_run(sys.argv[1], n_clients=3)
"""
# the same job with the clients' ScriptRunner left at FLARE's default exchange format (NUMPY)
JOB_NUMPY = JOB.replace(", server_expected_format=ExchangeFormat.PYTORCH", "").replace("num_rounds=3", "num_rounds=1")

CLIENT = """
import nvflare.client as flare

flare.init()
site = flare.get_site_name()
while flare.is_running():
    model = flare.receive()
    params = {k: v.clone() for k, v in model.params.items()}
    for k, v in params.items():  # "training": every client moves its weights its own way
        if v.is_floating_point():
            v.add_(0.01 * int(site[-1]))
    if site == "site-2" and model.current_round == 0:
        params["conv2.weight"].view(-1)[0] = float("nan")
    if site == "site-3" and model.current_round == 2:
        raise RuntimeError("the disk of site-3 is full")
    flare.send(flare.FLModel(params=params, meta={"NUM_STEPS_CURRENT_ROUND": 10}))
"""


WIDGETS = """
from nvflare.apis.fl_component import FLComponent
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType

EVENTS = (AppEventType.ROUND_STARTED, AppEventType.BEFORE_AGGREGATION, AppEventType.AFTER_AGGREGATION, AppEventType.ROUND_DONE)


class RoundEvents(FLComponent):
    def handle_event(self, event_type, fl_ctx):
        if event_type in EVENTS:
            result = fl_ctx.get_prop(AppConstants.AGGREGATION_RESULT) if event_type == AppEventType.AFTER_AGGREGATION else None
            outputs = sorted(result) if isinstance(result, dict) else ""
            self.log_info(fl_ctx, f"heard {event_type} round {fl_ctx.get_prop(AppConstants.CURRENT_ROUND)} {outputs}")
"""


def run_job(root: Path, job: str) -> str:
    """The job in FLARE's simulator from `root`; its log."""
    return run_flare_script(root, {"job.py": job, "client.py": CLIENT, "widgets.py": WIDGETS})


@pytest.fixture(scope="module")
def poisoned_run(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("guarantees")
    return root / "ws", run_job(root, JOB)


def test_a_nan_upload_is_refused_by_name_and_poisons_no_client(poisoned_run):
    ws, log = poisoned_run
    assert "round 0: the result of site-2 cannot be used: site-2: parameter conv2.weight holds NaN or Inf" in log
    models = {s: torch.load(ws / "server" / "simulate_job" / "models" / f"{s}.pt") for s in SITES}
    for site, state in models.items():
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), site
    assert "round 1 done: aggregated ['site-1', 'site-2', 'site-3']" in log  # site-2 is back once its upload is usable


def test_a_client_that_raises_is_reported_as_failed_not_late(poisoned_run):
    _, log = poisoned_run
    # the script's exception ends the in-process task as aborted (FLARE's return code), which is named
    assert re.search(
        r"round 2: no result from site-3: its task failed \((TASK_ABORTED|EXECUTION_EXCEPTION)\); that client's log says why", log
    )
    assert "deadline" not in log.split("round 2 (rounds 0-2)")[1]  # no deadline was set: none is blamed
    assert "round 2 done: aggregated ['site-1', 'site-2']" in log


def test_flares_round_events_fire_as_fedavg_fires_them(poisoned_run):
    _, log = poisoned_run
    heard = re.findall(r"heard (\w+) round (\d+) ?(.*)", log)
    want = []
    for r, outputs in ((0, "['site-1', 'site-3']"), (1, "['site-1', 'site-2', 'site-3']"), (2, "['site-1', 'site-2']")):
        want += [("_round_started", str(r), ""), ("_before_aggregation", str(r), ""), ("_after_aggregation", str(r), outputs)]
        want += [("_round_done", str(r), "")]
    assert [(e.strip(), n, o.strip()) for e, n, o in heard] == want


def test_each_round_after_the_first_says_the_time_left_at_the_pace_so_far(poisoned_run):
    """The round line a FLARE user watches: 0-based as the results are, and from the second round on the time left at
    this job's pace so far (prrfl.progress.time_left: nothing is measured before the first round ends)."""
    _, log = poisoned_run
    sending = {
        int(r): rest for r, rest in re.findall(r"round (\d) \(rounds 0-2\): sending each of 3 clients its own model(.*)$", log, re.M)
    }
    assert sorted(sending) == [0, 1, 2]
    assert "left" not in sending[0]
    for r in (1, 2):
        assert re.search(r"; about \d+ (s|min|h)\b.* left$", sending[r]), sending[r]


def test_a_client_left_at_the_numpy_exchange_format_stops_the_job_naming_the_fix(tmp_path):
    """The clients cannot decode the torch tensors they are sent and fetch their task again and again: instead of
    waiting for ever (no deadline is set), the job stops at once with one error that says what to change."""
    log = run_job(tmp_path, JOB_NUMPY)  # within the subprocess timeout: no hang
    assert re.search(
        r"round 0: site-\d asked for its task \d+ times without taking it: its Client API cannot read the model the server "
        r"sent \(torch tensors\)\. Give the clients' ScriptRunner server_expected_format=ExchangeFormat\.PYTORCH",
        log,
    )
    assert "round 0 done" not in log


def test_num_clients_samples_a_subset_each_round_as_fedavg_and_timeout_zero_sets_no_deadline(tmp_path):
    """FLARE FedAvg's round semantics: `num_clients` of the connected clients, chosen at random by FLARE's
    `sample_clients`, train in a round; the others keep their model; timeout=0 is no deadline, as FedAvg's."""
    job = JOB.replace("model=Net(), min_clients=2)", "model=Net(), min_clients=1, num_clients=2, timeout=0)")
    log = run_flare_script(
        tmp_path, {"job.py": job.replace("num_rounds=3", "num_rounds=2"), "client.py": CLEAN_CLIENT, "widgets.py": WIDGETS}
    )
    assert log.count("num_clients (2) is less than the number of available clients. Returning a random subset") == 2
    for r in (0, 1):
        assert f"round {r} (rounds 0-1): sending each of 2 clients its own model" in log
    done = re.findall(r"round (\d) done: aggregated (\[.*?\])", log)
    assert [clients.count("site-") for _, clients in done] == [2, 2]
    assert "deadline" not in log


CLEAN_CLIENT = """
import nvflare.client as flare

flare.init()
site = flare.get_site_name()
while flare.is_running():
    model = flare.receive()
    params = {k: v + 0.01 * int(site[-1]) if v.is_floating_point() else v for k, v in model.params.items()}
    flare.send(flare.FLModel(params=params, meta={"NUM_STEPS_CURRENT_ROUND": 10}))
"""
