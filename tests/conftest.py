"""Run-wide hooks: how ``make test`` spreads the tests over its workers (pytest-xdist).

Each test module goes to one worker whole, so a module's fixtures (a policy, its nodes, an operator)
are set up once and its tests run in order; each worker starts its own control plane (the session
fixture in tests/integration/conftest.py, on free ports). The modules that change the host itself
share one group and so one worker: the real node (a bridge, nft rules, cgroups) and ``make
cluster-down``'s test, whose ``down`` undoes whatever a real node left on the host.
"""

from __future__ import annotations

import pytest

HOST_MODULES = frozenset({"test_real_node.py", "test_cluster_down.py"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = "host" if item.path.name in HOST_MODULES else str(item.path)
        item.add_marker(pytest.mark.xdist_group(group))
