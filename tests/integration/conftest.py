"""The real control plane for integration tests: started once per run, always torn down.

If it cannot be built or started, every integration test errors (never skips).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import LocalCluster
from tests.support.k8s import Kube, OperatorProcess

_ids = itertools.count()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=2)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def kube(cluster: LocalCluster) -> Kube:
    return Kube(cluster.kubeconfig)


@pytest.fixture(scope="session")
def operator(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, tmp_path_factory.mktemp("operator") / "operator.log").start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def group(cluster: LocalCluster, request: pytest.FixtureRequest) -> str:
    """A label value unique to the test, so each test owns its own nodes and policy."""
    return f"t{next(_ids)}-{request.node.name[:30].replace('_', '-').strip('-').lower()}"


def make_nodes(cluster: LocalCluster, group: str, count: int) -> list[str]:
    names = cluster.add_gpu_nodes(count, prefix=f"{group}-", labels={"gpuhealth-test": group})
    cluster.wait_nodes_ready(count, selector=f"gpuhealth-test={group}")
    return names


def policy_spec(group: str, **spec: object) -> dict[str, object]:
    base: dict[str, object] = {"nodeSelector": {"matchLabels": {"gpuhealth-test": group}}}
    base.update(spec)
    return base


__all__ = ["Path", "make_nodes", "policy_spec"]
