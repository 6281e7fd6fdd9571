"""`PersonalizedFedAvgRecipe` in FLARE's simulator (SimEnv), with a hello-pt style Client API script (train, evaluate
the received model, log a metric with FLARE's SummaryWriter, answer validate tasks): FLARE's own
`add_experiment_tracking` and `add_cross_site_evaluation` work on it, the latter scoring every client's final
personalized model at every client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_flare_script

pytestmark = pytest.mark.e2e


JOB = """
import sys
from model import Net
from nvflare.recipe import SimEnv
from nvflare.recipe.utils import add_cross_site_evaluation, add_experiment_tracking
from prrfl.flare.components import FedBNAggregator
from prrfl.flare.components.recipe import PersonalizedFedAvgRecipe

recipe = PersonalizedFedAvgRecipe(
    name="recipe_check", model=Net(), train_script="client.py", num_rounds=2, min_clients=2, aggregator=FedBNAggregator()
)
add_experiment_tracking(recipe, "tensorboard")
add_cross_site_evaluation(recipe)
run = recipe.execute(SimEnv(num_clients=2, workspace_root=sys.argv[1]))
print("RESULT", run.get_result())
"""

CLIENT = """
import torch
import nvflare.client as flare
from nvflare.client.tracking import SummaryWriter
from model import Net

flare.init()
site = flare.get_site_name()
torch.manual_seed(sum(map(ord, site)))  # any site name (site-1, a hospital)
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 3, (16,))
net = Net()
writer = SummaryWriter()
while flare.is_running():
    received = flare.receive()
    if flare.is_submit_model():  # cross-site evaluation asks for the client's own model
        flare.send(flare.FLModel(params=net.state_dict()))
        continue
    net.load_state_dict(received.params, strict=False)
    net.eval()
    with torch.no_grad():
        accuracy = float((net(x).argmax(1) == y).float().mean())
    if flare.is_evaluate():
        flare.send(flare.FLModel(metrics={"accuracy": accuracy}))
        continue
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    writer.add_scalar("accuracy", accuracy, received.current_round)
    flare.send(flare.FLModel(params=net.state_dict(), metrics={"accuracy": accuracy}, meta={"NUM_STEPS_CURRENT_ROUND": 2}))
"""


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("recipe")
    return root / "ws", run_flare_script(root, {"job.py": JOB, "client.py": CLIENT})


def test_cross_site_evaluation_scores_every_clients_personalized_model_at_every_client(recipe_run):
    ws, log = recipe_run
    matrix_files = list(ws.rglob("cross_site_val/cross_val_results.json"))
    assert len(matrix_files) == 1, log[-3000:]
    matrix = json.loads(matrix_files[0].read_text())
    assert set(matrix) == {"site-1", "site-2"}  # data sites
    for row in matrix.values():
        # each client's final personalized model, served by the server named after its client (FLARE's SRV_ prefix),
        # beside the models the clients submitted themselves
        assert set(row) == {"SRV_site-1", "SRV_site-2", "site-1", "site-2"}, row
        assert all(0 <= score["accuracy"] <= 1 for score in row.values())
    assert "saved the final model of each of 2 clients" in log


def test_experiment_tracking_writes_the_clients_metrics(recipe_run):
    ws, _ = recipe_run
    assert list(ws.rglob("events.out.tfevents.*")), "no TensorBoard event file under the workspace"


POC_JOB = """
import sys
from pathlib import Path
from model import Net
from prrfl.flare.components import FourierAggregator
from prrfl.flare.components.recipe import PersonalizedFedAvgRecipe
from prrfl.flare.job_recipe import FreePortPocEnv, end_poc_processes

recipe = PersonalizedFedAvgRecipe(
    name="recipe_poc", model=Net(), train_script="client.py", num_rounds=2, min_clients=2, aggregator=FourierAggregator()
)
env = FreePortPocEnv(num_clients=2)  # FLARE's PocEnv, on free ports rather than 8002/8003
run = recipe.execute(env)
try:
    result = run.get_result(timeout=300, clean_up=False)
finally:
    end_poc_processes(env.poc_workspace)
print("STATUS", run.get_status())
print("MODELS", sorted(p.name for p in Path(result).rglob("models/*.pt")))
"""


def test_the_recipe_runs_on_pocenv(tmp_path, poc_workspace, flare_default_ports_held):
    """The same recipe on FLARE's PocEnv: a server and two client processes over gRPC on localhost, the job
    submitted by the admin, every client's personalized model (and best model) saved on the server; on ports of
    its own while FLARE's default ones are taken."""
    from conftest import our_processes

    poc = poc_workspace
    log = run_flare_script(tmp_path, {"job.py": POC_JOB, "client.py": CLIENT}, timeout=500)
    assert "STATUS FINISHED:COMPLETED" in log, log[-3000:]
    assert "MODELS ['site-1.best.pt', 'site-1.pt', 'site-2.best.pt', 'site-2.pt']" in log
    assert not our_processes(str(poc)), "POC processes left running"
