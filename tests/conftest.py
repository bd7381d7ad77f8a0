"""Run-wide hooks: how ``make test`` spreads the tests over its workers (pytest-xdist).

Each test module goes to one worker whole, so a module's fixtures (a policy, its nodes, an operator)
are set up once and its tests run in order; each worker starts its own control plane (the session
fixture in tests/integration/conftest.py, on free ports). The modules that change the host itself
share one scope and so one worker: the real node (a bridge, nft rules, cgroups) and ``make
cluster-down``'s test, whose ``down`` undoes whatever a real node left on the host.

The scopes are this file's own scheduler (``pytest_xdist_make_scheduler``, xdist's public hook), not
``xdist_group`` marks: xdist 3.8 applies a mark by rewriting ``item._nodeid``, which pytest 9.2 no
longer reads, so under ``--dist loadgroup`` every test became its own unit and a module's fixtures
(a second real node on the same host among them) were set up on both workers.
tests/unit/test_xdist_scopes.py runs real workers and fails if a module is ever split again.

``make test`` builds only the control plane before the tests; the tools that a few modules alone need
build behind the first tests (the Makefile's ``test``). Those modules (``BEHIND``) run after all the
others, and each waits for its builds before its first test starts: outside that test's timeout, since
a build is not the test's time. A build script holds a lock of its own, so the wait is the background
build's, or a build of its own where the tests run without make (``pytest tests/...``). A build that
fails here is left to the module's own fixtures, which fail loudly with the script's error.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Generator
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

HOST_MODULES = frozenset({"test_real_node.py", "test_device_plugin.py", "test_cluster_down.py"})

TESTS = Path(__file__).resolve().parent
HACK = TESTS.parent / "hack"
# Module (under tests/) -> the build scripts it needs beyond the control plane (what
# devkit/{tools,kueue,realnode,nvidia_plugins}.py run).
BEHIND: dict[str, tuple[str, ...]] = {
    "alerts/test_alert_rules.py": ("build-tools.sh",),
    "integration/test_chart.py": ("build-tools.sh",),
    "integration/test_chart_install.py": ("build-tools.sh",),
    "integration/test_agent_sidecar.py": ("build-tools.sh",),
    "integration/test_kueue.py": ("build-kueue.sh",),
    "integration/test_real_node.py": ("build-tools.sh", "build-node.sh", "build-image.sh"),
    "integration/test_device_plugin.py": (
        "build-tools.sh",
        "build-node.sh",
        "build-image.sh",
        "build-nvidia-plugins.sh",
    ),
    # The host group's other module: the group is scheduled whole, so it goes last whole.
    "integration/test_cluster_down.py": ("build-node.sh",),
}


def _module(item: pytest.Item) -> str:
    return item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else item.path.name


def scope_of(nodeid: str) -> str:
    """The unit one worker takes whole: the host's modules together, every other module alone."""
    module = nodeid.split("::", 1)[0]
    return "host" if module.rsplit("/", 1)[-1] in HOST_MODULES else module


class ModuleScopes(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no annotations
    """xdist's scope scheduler (a unit goes to one worker whole, units in collection order) with
    :func:`scope_of` for its scopes."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling:
    return ModuleScopes(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _module(item) in BEHIND)  # stable: the order within each part is kept


@functools.cache
def _ready(script: str) -> None:
    """Run (or wait for, behind its lock) one build script, once per process; its outcome is the
    fixtures' to report."""
    subprocess.run(["bash", str(HACK / script)], stdout=subprocess.DEVNULL, check=False)


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Outermost around each test (``tryfirst``), so outside pytest-timeout's timer: a module's builds."""
    for script in BEHIND.get(_module(item), ()):
        _ready(script)
    return (yield)
