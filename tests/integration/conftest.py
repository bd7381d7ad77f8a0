"""The real control plane for integration tests: started once per run, always torn down.

If it cannot be built or started, every integration test errors (never skips).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from devkit.cluster import LocalCluster
from devkit.diagnose import diagnose
from devkit.gpunodes import gpu_node_manifest
from devkit.k8s import Kube, OperatorProcess
from devkit.rbac import rbac_installed as _rbac_installed

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the test item, so a fixture's teardown can tell that the test failed."""
    report: pytest.TestReport = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def group(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A label value unique to the test, so each test owns its own nodes and policy. When the test
    fails, what the cluster and the operator made of its nodes is printed (``devkit/diagnose.py``)."""
    name = f"t{next(_ids)}-{request.node.name[:30].replace('_', '-').strip('-').lower()}"
    yield name
    failed = getattr(request.node, "report_call", None)
    if failed is None or not failed.failed or "kube" not in request.fixturenames:
        return
    op = request.getfixturevalue("operator") if "operator" in request.fixturenames else None
    print(f"--- diagnosis of {name} ---\n{diagnose(request.getfixturevalue('kube'), name, op)}")


def make_nodes(cluster: LocalCluster, group: str, count: int) -> list[str]:
    names = cluster.add_gpu_nodes(count, prefix=f"{group}-", labels={"gpuhealth-test": group})
    cluster.wait_nodes_ready(count, selector=f"gpuhealth-test={group}")
    return names


def make_dra_node(cluster: LocalCluster, group: str, name: str) -> str:
    """One node of the group without device-plugin GPUs (a DRA node: the test publishes its slices),
    waited for by its own hostname label, so nodes the group already has do not stand in for it."""
    manifest = gpu_node_manifest(name, labels={"gpuhealth-test": group}, device_plugin=False)
    cluster.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(manifest))  # as add_gpu_nodes
    cluster.wait_nodes_ready(1, selector=f"kubernetes.io/hostname={name}")
    return name


def policy_spec(group: str, **spec: object) -> dict[str, object]:
    base: dict[str, object] = {"nodeSelector": {"matchLabels": {"gpuhealth-test": group}}}
    base.update(spec)
    return base


__all__ = ["Path", "make_dra_node", "make_nodes", "policy_spec"]


@pytest.fixture(scope="module")
def rbac_installed(cluster: LocalCluster) -> Iterator[None]:
    """gpuhealth installed from manifests/ with its admission policy in force, for one test module."""
    with _rbac_installed(cluster):
        yield
