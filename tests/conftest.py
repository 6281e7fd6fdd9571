"""Shared fixtures: a tiny task (small CNN, random images) so the site loop runs in a second."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from prrfl.data.augment import normalize
from prrfl.tasks.classification import ClassificationTask
from prrfl.tasks.contract import Split
from prrfl.tasks.segmentation import SegmentationTask

torch.set_num_threads(1)  # the tests' models are tiny: more threads only contend (50x slower on a busy host)


class TinyNet(nn.Module):
    classifier_key = "fc2.weight"

    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4, 8, bias=False)
        self.fc2 = nn.Linear(8, num_classes, bias=False)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
        emb = torch.relu(self.fc1(h))
        return self.fc2(emb), emb


class TinyTask(ClassificationTask):
    """Three classes told apart by the mean of one colour channel, so learning is possible."""

    name = "tiny"
    num_classes = 3
    class_names = ("a", "b", "c")
    site_names = ("A", "B")

    def build_model(self):
        return TinyNet(self.num_classes)

    def preprocessing(self):
        return {"input": "random 8 x 8 images", "image_size": 8, "channels": 3, "steps": ["x / 127.5 - 1"]}

    def load_site(self, cohort, device, data_root=None):
        g = torch.Generator().manual_seed(0 if cohort == "A" else 1)

        def split(n: int) -> Split:
            labels = torch.arange(n) % 3
            images = torch.randint(0, 80, (n, 3, 8, 8), generator=g, dtype=torch.uint8)
            images[torch.arange(n), labels] += 120  # class c brightens channel c
            return Split(images=images.to(device), targets=labels.to(device))

        return self.site_data(cohort, train=split(30), valid=split(12), test=split(12))

    def train_transform(self, images, targets, generator):
        return normalize(images), targets

    def eval_transform(self, images, targets):
        return normalize(images), targets


class TinySegNet(nn.Module):
    """forward -> (logits [B, 2, H, W], feature map [B, 6, H/2, W/2])."""

    classifier_key = "head.weight"

    def __init__(self, num_classes: int = 2):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.head = nn.Conv2d(6, num_classes, 1, bias=False)

    def forward(self, x):
        features = torch.relu(self.bn(self.conv(x)))
        logits = F.interpolate(self.head(features), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return logits, features


class TinySegTask(SegmentationTask):
    """Bright discs on dark noise, one 'volume' of 3 slices per case: learnable in a few steps."""

    name = "tinyseg"
    num_classes = 2
    class_names = ("background", "target")
    site_names = ("A", "B")
    image_size = 16

    def build_model(self):
        return TinySegNet(self.num_classes)

    def preprocessing(self):
        return {"input": "random 16 x 16 slices", "image_size": 16, "channels": 1, "steps": ["x / 127.5 - 1"]}

    def load_site(self, cohort, device, data_root=None):
        g = torch.Generator().manual_seed(0 if cohort == "A" else 1)
        yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")

        def split(cases: int) -> Split:
            n = cases * 3
            centre = 4 + 8 * torch.rand(n, 2, generator=g)
            radius = 2 + 3 * torch.rand(n, generator=g)
            masks = ((yy - centre[:, :1, None]) ** 2 + (xx - centre[:, 1:, None]) ** 2 <= radius[:, None, None] ** 2).long()
            images = (torch.randint(0, 90, (n, 1, 16, 16), generator=g) + 140 * masks[:, None]).to(torch.uint8)
            groups = torch.arange(cases).repeat_interleave(3)
            return Split(images=images.to(device), targets=masks.to(device), groups=groups.to(device))

        return self.site_data(cohort, train=split(6), valid=split(2), test=split(3))

    def train_transform(self, images, targets, generator):
        return normalize(images), targets

    def eval_transform(self, images, targets):
        return normalize(images), targets


@pytest.fixture
def tiny_task() -> TinyTask:
    return TinyTask({})


@pytest.fixture
def tiny_seg_task() -> TinySegTask:
    return TinySegTask({})


@pytest.fixture
def example_net(tmp_path, monkeypatch):
    """The fourier_pfa example's `Net` class, from its model.py copied into tmp_path, where a FLARE recipe finds it
    beside a client script. Imported afresh for each test and forgotten after it: a `model` module another test
    imported from its own folder would make FLARE see two model.py for one destination."""
    import shutil
    import sys
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[1] / "examples/fourier_pfa/model.py", tmp_path / "model.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "model", raising=False)
    import model

    return model.Net


def our_processes(marker: str) -> list:
    """The processes whose command line names `marker` (a test's own workspace path)."""
    import psutil

    return [p for p in psutil.process_iter(["cmdline"]) if any(marker in part for part in (p.info["cmdline"] or []))]


@pytest.fixture
def poc_workspace(tmp_path, monkeypatch):
    """The FLARE POC workspace of one test (NVFLARE_POC_WORKSPACE, for the test and what it starts). Whatever
    the test's outcome, no process of it outlives the test: a POC left running holds its ports and its CPU for the
    tests after it."""
    from prrfl.flare.deployment import kill_process_tree

    poc = tmp_path / "poc"
    monkeypatch.setenv("NVFLARE_POC_WORKSPACE", str(poc))
    yield poc
    for proc in our_processes(str(poc)):
        kill_process_tree(proc.pid, grace=0)


@pytest.fixture
def flare_default_ports_held():
    """FLARE's default POC ports (8002, 8003) held by a listener for the test, as another FLARE POC on the machine
    holds them; a port that is already taken is held by someone else, which is the same case. The ports held."""
    import socket

    held = []
    for port in (8002, 8003):
        s = socket.socket()
        try:
            s.bind(("", port))
            s.listen()
            held.append(s)
        except OSError:
            s.close()
    yield [s.getsockname()[1] for s in held]
    for s in held:
        s.close()


def session_cache(tmp_path_factory) -> Path:
    """This test process's cache of synthetic federations: each federation a test asks for is built once and read by
    every later test and FLARE run that asks for the same data (the cache keys a federation by its settings)."""
    return tmp_path_factory.getbasetemp() / "prrfl_cache"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Synthetic federations generated by tests never touch the user's cache."""
    monkeypatch.setenv("PRRFL_CACHE", str(session_cache(tmp_path_factory)))


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every test starts with torch on one thread, whatever the test before it set (a site's start-up sets
    CPU cores / sites): float32 results depend on the thread count, so a test must not inherit another's."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


def make_runtime(task: TinyTask, tmp_path, site: str = "A", run_id: str = "run", **cfg_overrides):
    from prrfl.config import RunConfig
    from prrfl.registry import build_method
    from prrfl.site.state import SiteRuntime

    cfg = RunConfig.from_dict({"task": "tiny", "num_rounds": 3, "local_epochs": 2, "batch_size": 8, "lr": 0.05, **cfg_overrides})
    scalars: list[tuple[str, float, int]] = []
    runtime = SiteRuntime.start(
        site,
        cfg,
        task,
        build_method(cfg, task),
        task.load_site(site, torch.device("cpu")),
        tmp_path / site,
        model_seed=123,
        generator_seed=7,
        run_id=run_id,
        log_scalar=lambda tag, value, step: scalars.append((tag, value, step)),
    )
    runtime.scalars = scalars  # type: ignore[attr-defined]
    return runtime


def as_numpy(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}


def untimed(history: list[dict]) -> list[dict]:
    """A site's history without wall-clock timings (what must repeat exactly with the same seed)."""
    return [{k: v for k, v in h.items() if k != "timing"} for h in history]


# the smallest synthetic federation a FLARE end-to-end run trains on: 32 px, 2 % of Table I, no held-out
# minimum beyond one image per split (M = 8 would make it 378 images instead of 222; the default's minimum
# is tested in test_derm_data.py)
TINY_DATA = {"image_size": 32, "synthetic_scale": 0.02, "synthetic_raw_size": [96, 72], "heldout_min_per_class": 1}


def tiny_derm_config(**overrides):
    """derm_prr at 2 rounds x 1 epoch on TINY_DATA (overrides win), for simulator and POC runs."""
    from prrfl.config import RunConfig
    from prrfl.flare.jobs import job_config

    return RunConfig.from_dict({**job_config("derm_prr").to_dict(), "num_rounds": 2, "local_epochs": 1, "data": TINY_DATA, **overrides})


class SimulatorRun:
    """`nvflare simulator` on an exported job, every site a thread (prrfl.sweep's command), the federation cached at
    `cache`, started in the background: a test module starts its independent runs together and reads each when it
    needs it. A small FLARE run spends most of its wall time waiting (task polls, the processes' start and FLARE's
    shutdown grace), so runs side by side take little more than the longest of them."""

    def __init__(self, job, workspace, sites: int, cache, env: dict[str, str] | None = None):
        import os
        import subprocess

        from prrfl.sweep import simulator_command

        self.workspace = Path(workspace)
        self.out = self.workspace.with_name(self.workspace.name + ".out")
        self.err = self.out.with_suffix(".err")
        env = {**os.environ, "PRRFL_CACHE": str(cache), "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(simulator_command(job, workspace, sites), env=env, stdout=out, stderr=err, start_new_session=True)
        self.completed = None

    def result(self, timeout: float = 420):
        """The completed process (stdout and stderr as text), once the run has ended; a run past `timeout` is ended
        with its whole process tree and the test fails."""
        import subprocess

        if self.completed is None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.stop()
                raise
            text = (self.out.read_text(errors="replace"), self.err.read_text(errors="replace"))
            self.completed = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, *text)
        return self.completed

    def finished(self, timeout: float = 420):
        """(the workspace, the completed process) of a run that ended well (exit 0 asserted, its output shown if not)."""
        proc = self.result(timeout)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return self.workspace, proc

    def stop(self) -> None:
        """End the run and every process it started, if it still runs (a module whose tests failed first)."""
        from prrfl.flare.deployment import kill_process_tree

        if self.proc.poll() is None:
            kill_process_tree(self.proc.pid)


def finished_simulation(root, name: str, cfg, cache, sites: int = 2):
    """Export job `name` with `cfg` under `root` and run it to the end in the simulator, its federation in `cache`
    (exit 0 asserted): (its workspace, the completed process)."""
    from prrfl.flare.job_recipe import export_job

    return SimulatorRun(export_job(name, root / "jobs", cfg=cfg), root / "ws", sites, cache).finished()


@pytest.fixture(scope="session")
def tiny_derm_run(tmp_path_factory):
    """derm_prr at tiny_derm_config() run to the end in FLARE's simulator on 2 sites, once per test process: the run
    the simulator tests read and the recipe and POC tests compare their own runs with, value for value. (workspace,
    the finished simulator process); tests read it and write nothing into it."""
    return finished_simulation(tmp_path_factory.mktemp("tiny_derm_run"), "derm_prr", tiny_derm_config(), session_cache(tmp_path_factory))


DRILLS_HINT = "a fault drill: run it with --drills (every test) or -m drill (the drills alone)"


def pytest_addoption(parser):
    parser.addoption(
        "--drills",
        action="store_true",
        help="also run the fault drills (FLARE processes killed, frozen or interrupted, crashed runs resumed: about half an "
        "hour on two cores); they are skipped otherwise, unless -m selects them",
    )


def drills_wanted(config) -> bool:
    """The fault drills run with --drills or when the marker expression names them (-m drill)."""
    return bool(config.getoption("--drills")) or "drill" in (config.getoption("markexpr") or "")


def pytest_collection_modifyitems(config, items):
    if drills_wanted(config):
        return
    skip = pytest.mark.skip(reason=DRILLS_HINT)
    for item in items:
        if item.get_closest_marker("drill"):
            item.add_marker(skip)


def wait_for(condition, timeout: float, what: str) -> None:
    """Poll `condition` until it holds; fail the test after `timeout` seconds, saying what did not happen."""
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


# With pytest-xdist (CI's e2e stage: -n 2 --dist loadscope) every test module runs whole in one worker, so
# its module fixtures are built once, and the modules that start FLARE POC deployments (server and site
# processes on fixed local ports) form one unit together: two deployments at once on a 2-core machine made
# FLARE refuse job signatures and miss rounds. pytest 9 ignores xdist's own `xdist_group` renaming of test
# ids, so the grouping is done where xdist documents it can be changed: the scheduler's scope of a test id.
POC_MODULES = frozenset({"test_deploy_poc.py", "test_faults.py", "test_security.py"})


def work_unit(nodeid: str) -> str:
    """The work unit a test belongs to: its module, or "poc" for the modules that start POC deployments."""
    module = nodeid.split("::", 1)[0]
    return "poc" if module.rpartition("/")[2] in POC_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None  # any other --dist keeps xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ModuleScheduling(config, log)


def run_flare_script(root, files: dict[str, str], timeout: float = 400) -> str:
    """A FLARE job script `job.py` (with the other `files`, name -> text, and the example's model.py) written to
    `root` and run there with this checkout's prrfl importable, torch on one thread; job.py gets the simulator
    workspace `root/ws` as its argument. Its log; the test fails when it exits non-zero."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import prrfl

    root = Path(root)
    shutil.copy(Path(__file__).resolve().parents[1] / "examples" / "fourier_pfa" / "model.py", root / "model.py")
    for name, text in files.items():
        (root / name).write_text(text)
    custom = str(Path(prrfl.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([custom, str(root), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "job.py", str(root / "ws")], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return log
