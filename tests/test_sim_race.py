"""The guard against FLARE's simulator start race (prrfl.flare.sim_race): each site's process is sent its own name
even when another site's thread writes its name between the write and the send."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import threading
from multiprocessing.reduction import ForkingPickler
from types import SimpleNamespace

import pytest

from prrfl.flare import sim_race


def interleaved_sends(build_ctx: dict) -> dict[str, str]:
    """The race of SimulatorClientRunner.do_one_task, forced: site-1's thread writes its name, site-2's thread writes
    its own, then each sends the shared dict the way the simulator does (multiprocessing's pickler); returns the name
    each site's process would receive."""
    received: dict[str, str] = {}
    site1_wrote, site2_wrote = threading.Event(), threading.Event()

    def site(name: str, before: threading.Event | None, after: threading.Event) -> None:
        if before is not None:
            before.wait(10)
        build_ctx["client_name"] = name
        after.set()
        if name == "site-1":
            site2_wrote.wait(10)  # site-2 writes before site-1 sends
        received[name] = pickle.loads(bytes(ForkingPickler.dumps(build_ctx)))["client_name"]

    threads = [
        threading.Thread(target=site, args=("site-1", None, site1_wrote)),
        threading.Thread(target=site, args=("site-2", site1_wrote, site2_wrote)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return received


def test_a_shared_dict_sends_site_2s_name_to_site_1_and_the_per_thread_one_does_not():
    assert interleaved_sends({"client_name": "site-0", "x": 1}) == {"site-1": "site-2", "site-2": "site-2"}  # the fault
    assert interleaved_sends(sim_race.PerThreadName({"client_name": "site-0", "x": 1})) == {"site-1": "site-1", "site-2": "site-2"}


def test_the_per_thread_dict_travels_as_a_plain_dict_with_the_other_keys_shared():
    ctx = sim_race.PerThreadName({"client_name": "site-0", "server_config": [{"name": "s"}]})
    assert ctx["client_name"] == ctx.get("client_name") == "site-0"  # no thread wrote one: the shared name
    ctx["client_name"] = "site-3"
    ctx["enable_byoc"] = True
    for sent in (pickle.loads(pickle.dumps(ctx)), copy.deepcopy(ctx)):
        assert type(sent) is dict
        assert sent == {"client_name": "site-3", "server_config": [{"name": "s"}], "enable_byoc": True}
    other: dict = {}
    t = threading.Thread(target=lambda: other.update(name=ctx["client_name"], missing=ctx.get("nope", "-")))
    t.start()
    t.join(10)
    assert other == {"name": "site-0", "missing": "-"}  # another thread does not see site-3


def test_install_patches_flares_client_runner_once_and_keeps_its_build_ctx(monkeypatch, tmp_path):
    from nvflare.private.fed.app.simulator import simulator_runner

    cls = simulator_runner.SimulatorClientRunner
    monkeypatch.setattr(cls, "__init__", cls.__init__)  # restored after the test
    monkeypatch.setattr(cls, sim_race._MARK, False, raising=False)
    assert sim_race.install() and sim_race.install()
    args = SimpleNamespace(workspace=str(tmp_path), set=[])
    shared = {"client_name": "site-2", "client_config": {}}
    runner = cls(str(tmp_path / "custom"), args, [], {}, SimpleNamespace(workspace=str(tmp_path)), shared)
    assert isinstance(runner.build_ctx, sim_race.PerThreadName)
    assert dict(runner.build_ctx) == shared
    assert runner.federated_clients == [] and runner.simulator_root == str(tmp_path)  # FLARE's own init ran


def test_outside_the_simulator_install_does_nothing_and_loads_no_simulator_code():
    code = "import sys; from prrfl.flare import sim_race; print(sim_race.install(), sim_race.RUNNER_MODULE in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("module_body", ["", "class SimulatorClientRunner: pass"])
def test_a_runner_of_another_shape_is_left_alone(monkeypatch, module_body):
    fake = SimpleNamespace()
    exec(module_body, fake.__dict__)
    monkeypatch.setitem(sys.modules, sim_race.RUNNER_MODULE, fake)
    installed = sim_race.install()
    assert installed is bool(module_body)
    if module_body:
        runner = fake.SimulatorClientRunner()  # no build_ctx: nothing to wrap, no error
        assert not hasattr(runner, "build_ctx")
