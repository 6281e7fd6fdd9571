"""Each simulated site's process is told its own name: a guard against a race in FLARE's simulator.

FLARE's simulator (2.9.0) starts a site's process in `SimulatorClientRunner.do_one_task`, which runs in one
thread per site. That method writes the site's name into `build_ctx`, one dict shared by all the threads,
and sends the dict to the new process a little later, after it has connected. On a loaded machine another
thread can write its own site's name in between, so two processes receive the same name: the second
registers as a second endpoint of that site ("evicted for exceeding limit 1"), looks for the site's app in
the wrong workspace ("Can not find prrfl_site.py") and never answers; the run then starts without it, or
not at all (docs/failures.md).

`install()` gives every runner a `build_ctx` whose "client_name" belongs to the thread that wrote it, and
which is sent as a plain dict carrying that thread's name, so the interleaving no longer matters. It is
called by the server workflow, which FLARE builds in the simulator's process before any site is started,
and it does nothing outside the simulator (the runner's module is not loaded there) or where FLARE's
runner no longer has this shape.
"""

from __future__ import annotations

import copy
import functools
import logging
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)

RUNNER_MODULE = "nvflare.private.fed.app.simulator.simulator_runner"
NAME = "client_name"
_MARK = "_prrfl_per_thread_client_name"


class PerThreadName(dict):
    """A dict whose "client_name" is per thread; pickled or copied, it is a plain dict with the current
    thread's name (or the shared one where this thread wrote none)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._local = threading.local()

    def __setitem__(self, key: Any, value: Any) -> None:
        if key == NAME:
            self._local.name = value
        else:
            super().__setitem__(key, value)

    def __getitem__(self, key: Any) -> Any:
        if key == NAME and hasattr(self._local, "name"):
            return self._local.name
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def snapshot(self) -> dict:
        out = dict(self)
        if hasattr(self._local, "name"):
            out[NAME] = self._local.name
        return out

    def __reduce__(self):
        return dict, (self.snapshot(),)

    def __deepcopy__(self, memo: dict) -> dict:
        return copy.deepcopy(self.snapshot(), memo)


def install() -> bool:
    """Patch FLARE's simulator client runner of this process; True where it is (or already was) patched."""
    module = sys.modules.get(RUNNER_MODULE)
    runner = getattr(module, "SimulatorClientRunner", None) if module is not None else None
    if runner is None:
        return False
    if getattr(runner, _MARK, False):
        return True
    original = runner.__init__

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if isinstance(getattr(self, "build_ctx", None), dict) and not isinstance(self.build_ctx, PerThreadName):
            self.build_ctx = PerThreadName(self.build_ctx)

    runner.__init__ = __init__
    setattr(runner, _MARK, True)
    log.info("FLARE simulator: each site's process is sent its own name (guard against the simulator's start race, docs/failures.md)")
    return True
