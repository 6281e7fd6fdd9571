"""CI's e2e stage runs in two pytest-xdist workers (-n 2 --dist loadscope): every module whole in one worker,
and the modules that start FLARE POC deployments all in the same one (tests/conftest.py). Checked on a
run of stand-in modules, since a pytest or xdist upgrade can silently undo a grouping (pytest 9 did so
for xdist's `xdist_group`)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("xdist")
pytest_plugins = ["pytester"]

_OURS = Path(__file__).with_name("conftest.py").read_text()
CONFTEST = "import pytest\n" + _OURS[_OURS.index("# With pytest-xdist") :]  # the grouping alone: no torch to import
RECORD = """
import os
from pathlib import Path

def _record(name):
    Path(os.environ["RECORD_DIR"], name).write_text(os.environ.get("PYTEST_XDIST_WORKER", "main"))
"""


def test_the_poc_modules_share_one_worker_and_every_module_stays_whole(pytester, tmp_path, monkeypatch):
    pytester.makeconftest(CONFTEST)
    monkeypatch.setenv("RECORD_DIR", str(tmp_path))
    modules = ["test_faults", "test_deploy_poc", "test_security", "test_recipe", "test_sim_faults", "test_crosseval"]
    for module in modules:
        tests = "".join(f"\ndef test_{i}():\n    _record('{module}.{i}')\n" for i in range(3))
        pytester.makepyfile(**{module: RECORD + tests})
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadscope", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3 * len(modules))
    worker = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert len(worker) == 3 * len(modules)
    per_module = {m: {w for name, w in worker.items() if name.startswith(m + ".")} for m in modules}
    assert all(len(ws) == 1 for ws in per_module.values()), per_module  # each module whole in one worker
    poc = {next(iter(per_module[m])) for m in ("test_faults", "test_deploy_poc", "test_security")}
    assert len(poc) == 1, per_module  # every POC module in the same worker
    assert set(worker.values()) == {"gw0", "gw1"}  # and the other worker had work too
