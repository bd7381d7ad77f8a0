"""`helm install` of charts/gpuhealth on a real control plane, and an uninstall that leaves no marks.

The module runs its own control plane: the chart owns cluster-wide objects (ClusterRoles,
admission policies, the peering object) that the kustomize tests in the shared cluster also
create, and "nothing left on any Node" must mean every Node. A real operator process acts on the
fake GPU nodes (KWOK runs the installed pods only as far as scheduling and phase go, so they never
execute); the uninstall runs the exact block from docs/install.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit import chart
from devkit.chart import CHART, run_uninstall
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, healthy_spec, wait_for, xid_event
from devkit.tools import tools_bin_dir

NS = "gpuhealth-system"


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("chart-cluster"), nodes=3)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def helm(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    out = cluster.helm(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def gpuhealth_marks(node: dict[str, object]) -> list[str]:
    """Everything of gpuhealth's on a Node (as JSON): taints, labels, annotations, conditions."""
    meta = node["metadata"]
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    assert isinstance(meta, dict) and isinstance(spec, dict) and isinstance(status, dict)
    found = [f"taint {t['key']}" for t in spec.get("taints") or [] if t["key"].startswith("gpuhealth.dev/")]
    found += [f"label {k}" for k in meta.get("labels") or {} if k.startswith("gpuhealth.dev/")]
    found += [f"annotation {k}" for k in meta.get("annotations") or {} if k.startswith("gpuhealth.dev/")]
    found += [f"condition {c['type']}" for c in status.get("conditions") or [] if c["type"] == "GPUHealthy"]
    return found


def test_helm_install_runs_then_uninstall_leaves_no_marks(own_cluster: LocalCluster, tmp_path: Path) -> None:
    cluster = own_cluster
    kube = Kube(cluster.kubeconfig)
    nodes = sorted(n.metadata.name for n in kube.core.list_node().items)
    broken, healthy, human = nodes
    cluster.kubectl("create", "namespace", NS)
    cluster.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted")

    helm(
        cluster,
        "install",
        "gpuhealth",
        str(CHART),
        f"--namespace={NS}",
        "--set=policy.spec.mode=Enforce",
        "--wait",
        "--timeout=180s",
    )
    assert "gpuhealth" in helm(cluster, "list", f"--namespace={NS}", "-q").stdout
    # What the release installed, running as far as KWOK goes: both operator replicas Ready, an
    # agent on every GPU node (admitted under Pod Security "restricted").
    wait_for(
        lambda: (
            json.loads(cluster.kubectl("get", "-n", NS, "deploy/gpuhealth-operator", "-o", "json").stdout)[
                "status"
            ].get("readyReplicas")
            == 2
        ),
        timeout=60,
        what="both operator replicas Ready",
    )

    def running_agents() -> list[str]:
        pods = json.loads(
            cluster.kubectl(
                "get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=gpuhealth-agent", "-o", "json"
            ).stdout
        )["items"]
        return sorted(p["spec"]["nodeName"] for p in pods if p["status"]["phase"] == "Running")

    # helm --wait accepts a DaemonSet within its maxUnavailable (10%, one of three nodes here).
    wait_for(lambda: running_agents() == nodes, timeout=60, what="an agent Running on every GPU node")
    for obj in (
        "validatingadmissionpolicy/gpuhealth-agent-own-node",
        "validatingadmissionpolicy/gpuhealth-operator-policy-spec",
        "validatingadmissionpolicy/gpuhealth-approver-identity",
        "clusterrole/gpuhealth-operator",
        "clusterrole/gpuhealth-agent",
        "clusterkopfpeering/gpuhealth",
        "gpuhealthpolicy/default",
    ):
        cluster.kubectl("get", obj)

    # The operator (a real process; the installed pods do not execute under KWOK) acts on the
    # chart's policy: one node quarantined (taint, cordon, label, annotation, condition), one
    # Healthy (label, condition), one cordoned by a human before gpuhealth saw it.
    cluster.kubectl("cordon", human)
    operator = OperatorProcess(cluster, tmp_path / "operator.log").start()
    try:
        for n in nodes:
            kube.put_report(n, healthy_spec())
        kube.put_report(broken, healthy_spec(xids=[xid_event(79)]))
        wait_for(lambda: kube.our_taint(broken), timeout=60, what="quarantine of the broken node")
        wait_for(lambda: kube.state(healthy) == "Healthy" and kube.state(human) == "Healthy", what="verdicts")
        wait_for(lambda: gpuhealth_marks(kube.node(healthy)), what="the healthy node's label and condition")
        assert kube.node(broken)["spec"].get("unschedulable") is True

        proc = run_uninstall(cluster.kubeconfig, cluster.kubectl_bin, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        operator.stop()

    for n in kube.core.list_node().items:
        node = kube.node(n.metadata.name)
        assert gpuhealth_marks(node) == [], f"{n.metadata.name} still carries {gpuhealth_marks(node)}"
        assert bool(node["spec"].get("unschedulable")) == (n.metadata.name == human), n.metadata.name
    assert helm(cluster, "list", f"--namespace={NS}", "-q").stdout.strip() == ""
    for obj in (
        "deploy/gpuhealth-operator",
        "ds/gpuhealth-agent",
        "validatingadmissionpolicy/gpuhealth-agent-own-node",
        "clusterrole/gpuhealth-operator",
        "clusterkopfpeering/gpuhealth",
        "gpuhealthpolicy/default",
    ):
        assert cluster.kubectl("get", "-n", NS, obj, "--ignore-not-found", "-o", "name").stdout.strip() == "", obj


def test_helm_and_the_documented_uninstall_cache_discovery_beside_the_kubeconfig(
    own_cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With HOME unset, helm and kubectl cache discovery in ``.kube/cache`` under the working
    directory (how a real-node run once left 280 files in the checkout, committed); devkit's give
    them the cluster's own directory instead (``devkit/tools.py`` ``kube_env``)."""
    tools_bin_dir()  # found (or built) first: the build script's cache is under HOME
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("KUBECACHEDIR", raising=False)
    cache = own_cluster.workdir / "kube-cache"
    server = f"127.0.0.1_{own_cluster.api_port}"

    # --validate asks the API server what it serves, the discovery helm caches.
    own_cluster.helm("template", "gpuhealth", str(CHART), "--validate")
    assert not (checkout / ".kube").exists()
    assert (cache / "discovery" / server / "servergroups.json").exists()

    # The documented uninstall's environment (its block swapped for one discovery call: nothing to
    # uninstall here).
    for found in cache.iterdir():
        shutil.rmtree(found)
    monkeypatch.setattr(chart, "uninstall_block", lambda: "kubectl api-resources >/dev/null\n")
    proc = run_uninstall(own_cluster.kubeconfig, own_cluster.kubectl_bin, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not (checkout / ".kube").exists()
    assert (cache / "discovery" / server / "servergroups.json").exists()
