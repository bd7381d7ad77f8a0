"""The real-node tier: gpuhealth as it ships, installed as users install it, on a real kubelet.

The image is built from the unmodified Dockerfile (hack/build-image.sh); a real kubelet with
containerd, runc and the bridge CNI joins the control plane (devkit/realnode.py); ``helm install``
of charts/gpuhealth runs the operator Deployment and the agent DaemonSet in containers, as uid
65532 with read-only root filesystems and their ServiceAccounts' tokens. The agent finds the fake
NVML library where NVIDIA's container toolkit would mount the driver's (the RuntimeClass
``nvidia``), and the story runs through the installed product with the policy in Enforce: an XID
79 -> the operator Pod taints, cordons and drains the node; the agent's container is killed and
comes back with its journaled XID; ``helm upgrade`` to another image tag rolls both without
losing the verdict; the uninstall leaves nothing behind, in the cluster or on the host.

The one real node is the cluster's only node: it plays the GPU node and the node the operator runs
on, so the operator is given tolerations for the node's own quarantine (a real cluster runs the
operator off its GPU nodes, which the chart's default affinity prefers).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devkit.chart import CHART, run_uninstall
from devkit.cluster import LocalCluster
from devkit.fakenvml.build import build_fake_nvml
from devkit.k8s import GROUP, VERSION, Kube, refusals, wait_for
from devkit.realnode import Image, RealNode, apiserver_args, built_image, node_address
from devkit.realnode_host import BRIDGE, NFT_TABLE, STATE, link_exists, nft_table_exists
from devkit.tools import run

NS = "gpuhealth-system"
WORKLOADS = "workloads"
AGENT_USER = f"system:serviceaccount:{NS}:gpuhealth-agent"
PAUSE = "registry.k8s.io/pause:3.10.2"


@dataclass
class Env:
    cluster: LocalCluster
    node: RealNode
    image: Image
    kube: Kube


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    image = built_image()
    workdir = tmp_path_factory.mktemp("real-node")
    library = build_fake_nvml(workdir / "lib")
    cluster = LocalCluster(
        workdir / "cluster", nodes=0, apiserver_args=apiserver_args(node_address()), audit_users=[AGENT_USER]
    )
    cluster.start()
    node = RealNode(cluster, workdir / "node")
    try:
        node.start(library, [image.archive])
        yield Env(cluster, node, image, Kube(cluster.kubeconfig))
    finally:
        try:
            node.stop()
        finally:
            cluster.stop()
    # Whatever the test did, the host is as it was.
    assert not STATE.exists(), "the real node's record of host changes is still there"
    assert not link_exists(BRIDGE), f"bridge {BRIDGE} left behind"
    assert not nft_table_exists(), f"nft table {NFT_TABLE} left behind"
    assert not [p for p in Path("/sys/fs/cgroup").glob("*/kubepods") if p.exists()], "kubepods cgroups left behind"
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _names(p, str(node.socket))], "processes left"


def _names(cmdline: Path, needle: str) -> bool:
    try:
        return needle.encode() in cmdline.read_bytes()
    except OSError:
        return False


def helm(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    out = run("helm", f"--kubeconfig={cluster.kubeconfig}", *args, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def pods(e: Env, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = e.cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return list(json.loads(out)["items"])


def ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return pod["metadata"].get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conds
    )


def ready_pods(e: Env, selector: str, image: str) -> list[dict[str, Any]]:
    """The release's Ready pods of ``selector`` that run ``image``, once no other pod of it is left."""
    found = pods(e, NS, f"app.kubernetes.io/name={selector}")
    if not found or any(p["spec"]["containers"][0]["image"] != image or not ready(p) for p in found):
        return []
    return found


def get(url: str) -> str:
    """The body of a 200 answer, or "" (not up yet: refused, timed out, another status)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body: bytes = r.read()
            return body.decode() if r.status == 200 else ""
    except OSError:
        return ""


def image_ids(pod: dict[str, Any]) -> set[str]:
    return {str(c.get("imageID", "")) for c in pod["status"].get("containerStatuses") or []}


def agent_token(e: Env, pod: dict[str, Any]) -> str:
    """The ServiceAccount token the kubelet mounted into the agent's container (read on the host)."""
    root = e.node.workdir / "kubelet" / "root" / "pods" / pod["metadata"]["uid"] / "volumes"
    tokens = list(root.glob("kubernetes.io~projected/*/token"))
    assert len(tokens) == 1, f"one projected token expected under {root}: {tokens}"
    token: str = tokens[0].read_text().strip()
    return token


def pod_log(e: Env, pod: dict[str, Any]) -> str:
    """Every container log of ``pod`` on the node (each CRI line without its time/stream prefix)."""
    meta = pod["metadata"]
    d = e.node.workdir / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    lines = []
    for f in sorted(d.glob("*/*.log")):
        lines += [ln.split(" ", 3)[-1] for ln in f.read_text(errors="replace").splitlines()]
    return "\n".join(lines)


def audited_writes(e: Env, resource: str) -> list[dict[str, Any]]:
    entries = []
    for line in e.cluster.audit_log.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:  # the line the API server is writing right now
            continue
    return [
        a
        for a in entries
        if a.get("stage") == "ResponseComplete"
        and a["verb"] in ("create", "patch", "update")
        and (a.get("objectRef") or {}).get("resource") == resource
        and a["user"]["username"] == AGENT_USER
    ]


# The module's setup (the image, when its inputs changed, a control plane and the node) counts too.
@pytest.mark.timeout(1200)
def test_installed_chart_runs_the_story_on_a_real_node(
    env: Env, tmp_path: Path, record_testsuite_property: Callable[[str, object], None]
) -> None:
    e = env
    node, kube, name = e.node, e.kube, e.node.name
    e.cluster.kubectl("create", "namespace", NS)
    e.cluster.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted")
    tolerations = [
        {"key": "gpuhealth.dev/unhealthy", "operator": "Exists"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    ]
    print(f"image under test: {e.image.ref} ({e.image.id})")
    helm(
        e.cluster,
        "install",
        "gpuhealth",
        str(CHART),
        f"--namespace={NS}",
        f"--set=image.repository={e.image.repository}",
        f"--set=image.tag={e.image.tag}",
        "--set=image.pullPolicy=Never",
        "--set=policy.spec.mode=Enforce",
        "--set=agent.runtimeClassName=nvidia",
        "--set=operator.replicas=1",
        f"--set-json=operator.tolerations={json.dumps(tolerations)}",
        "--wait",
        "--timeout=300s",
    )

    # -- the operator Pod: Ready, its liveness endpoint and metrics answer on the Pod's address.
    (op,) = wait_for(lambda: ready_pods(e, "gpuhealth-operator", e.image.ref), timeout=180, what="operator Ready")
    op_ip = op["status"]["podIP"]
    wait_for(lambda: get(f"http://{op_ip}:8081/healthz"), timeout=60, what="operator liveness endpoint")
    wait_for(lambda: "gpuhealth_" in get(f"http://{op_ip}:8080/metrics"), timeout=60, what="operator metrics")
    assert op["spec"]["nodeName"] == name

    # -- the agent Pod on the real node, the fake NVML where the toolkit would mount it.
    (agent,) = wait_for(lambda: ready_pods(e, "gpuhealth-agent", e.image.ref), timeout=180, what="agent Ready")
    assert agent["spec"]["nodeName"] == name and agent["spec"]["runtimeClassName"] == "nvidia"
    assert {e.image.id} == image_ids(op) | image_ids(agent), f"ran {image_ids(op) | image_ids(agent)}"
    print(f"ran image {e.image.ref} with digest {e.image.id} on {name}")
    record_testsuite_property("real-node-image", f"{e.image.ref}@{e.image.id}")  # in build/junit.xml
    wait_for(lambda: get(f"http://{agent['status']['podIP']}:9401/healthz"), timeout=60, what="agent /healthz")

    def report_gpus() -> int:
        try:
            return len(kube.report(name)["spec"].get("devices") or [])
        except client.ApiException:
            return 0

    wait_for(lambda: report_gpus() == 8, timeout=120, what="the agent's report of 8 GPUs")
    wait_for(lambda: kube.state(name) == "Healthy", timeout=120, what="a Healthy verdict from the operator Pod")
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(name, NS)
    assert lease.spec.holder_identity == name
    # Written with the agent's own ServiceAccount token, bound to its pod on this node.
    for resource in ("gpunodehealths", "leases"):

        def written(r: str = resource) -> list[dict[str, Any]]:
            return audited_writes(e, r)

        writes = wait_for(written, timeout=60, what=f"the agent's {resource} writes")
        assert {w["user"]["extra"]["authentication.kubernetes.io/node-name"][0] for w in writes} == {name}

    # -- the admission policy refuses that token a write to another node's report.
    as_agent = Kube(e.cluster.kubeconfig_with_token(agent_token(e, agent), tmp_path / "agent.kubeconfig"))
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUNodeHealth",
        "metadata": {"name": "another-gpu-node"},
        "spec": {"nodeName": "another-gpu-node"},
    }

    # A new admission policy is enforced once the API server has loaded it, a moment after the
    # install: wait for that with dry runs (admitted or refused, a dry run stores nothing).
    def in_force() -> bool:
        try:
            as_agent.custom.create_cluster_custom_object(GROUP, VERSION, "gpunodehealths", body, dry_run="All")
        except client.ApiException as exc:
            if exc.status == 403:
                return True
            raise
        return False

    wait_for(in_force, timeout=60, what="the agent admission policy in force")
    with pytest.raises(client.ApiException) as refused:
        as_agent.custom.create_cluster_custom_object(GROUP, VERSION, "gpunodehealths", body)
    assert refused.value.status == 403, refused.value.body
    assert f"it runs on {name}, not on another-gpu-node" in str(refused.value.body)

    # -- a workload on the node, then an XID 79 from the fake NVML: the operator Pod taints,
    #    cordons and drains the node.
    e.cluster.kubectl("create", "namespace", WORKLOADS)
    e.cluster.apply_objects(
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "trainer", "namespace": WORKLOADS},
                "spec": {
                    "nodeName": name,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": PAUSE, "imagePullPolicy": "Never"}],
                },
            }
        ]
    )
    wait_for(
        lambda: [p for p in pods(e, WORKLOADS, "") if p["status"].get("phase") == "Running"],
        timeout=120,
        what="the workload Running",
    )
    node.write_scenario(["xid 1 gpu 3 code 79"])
    taint = wait_for(lambda: kube.our_taint(name), timeout=120, what="the operator Pod's taint")
    assert taint["value"] == "XID79"
    assert kube.node(name)["spec"].get("unschedulable") is True
    wait_for(lambda: not pods(e, WORKLOADS, ""), timeout=180, what="the workload drained off the node")
    wait_for(lambda: kube.state(name) == "Quarantined", timeout=120, what="Quarantined after the drain")

    # -- the agent's container is killed: the kubelet restarts it in the same Pod (same emptyDir),
    #    and its report still carries the XID, from its journal: NVML delivered it only once.
    killed_at = dt.datetime.now(dt.UTC)
    node.kill_container(node.container_id(NS, agent["metadata"]["name"], "agent"))

    def restarted() -> bool:
        p = json.loads(e.cluster.kubectl("get", "pod", "-n", NS, agent["metadata"]["name"], "-o", "json").stdout)
        return ready(p) and p["status"]["containerStatuses"][0]["restartCount"] >= 1

    wait_for(restarted, timeout=180, what="the agent container restarted and Ready")

    def republished() -> bool:
        spec = kube.report(name)["spec"]
        return dt.datetime.fromisoformat(spec["heartbeatTime"].replace("Z", "+00:00")) > killed_at

    wait_for(republished, timeout=120, what="a report from the restarted agent")
    assert [(x["xid"], x["gpu"]) for x in kube.report(name)["spec"]["xidEvents"]] == [(79, 3)]
    assert node.emit_log.read_text().count("xid 1 ") == 1, node.emit_log.read_text()
    assert kube.our_taint(name) is not None

    # -- helm upgrade to another tag of the image: both roll, the verdict stays.
    new_ref = f"{e.image.repository}:{e.image.tag}-upgrade"
    node.ctr("images", "tag", "--force", e.image.ref, new_ref)
    helm(
        e.cluster,
        "upgrade",
        "gpuhealth",
        str(CHART),
        f"--namespace={NS}",
        "--reuse-values",
        f"--set=image.tag={e.image.tag}-upgrade",
        "--wait",
        "--timeout=300s",
    )
    wait_for(lambda: ready_pods(e, "gpuhealth-operator", new_ref), timeout=240, what="operator rolled")
    (new_agent,) = wait_for(lambda: ready_pods(e, "gpuhealth-agent", new_ref), timeout=240, what="agent rolled")
    assert new_agent["metadata"]["uid"] != agent["metadata"]["uid"]
    assert kube.our_taint(name) is not None and kube.node(name)["spec"].get("unschedulable") is True
    assert kube.state(name) == "Quarantined"

    # -- RBAC enforced for real: nothing the installed operator or agent asked was refused.
    # The rolled agent has started once its log says so (the pod is Ready when its container starts).
    wait_for(lambda: "agent started for node" in pod_log(e, new_agent), timeout=120, what="the rolled agent started")
    for p in pods(e, NS, ""):
        log = pod_log(e, p)
        assert log, f"no log of {p['metadata']['name']}"
        assert refusals(log) == [], f"{p['metadata']['name']} was refused: {refusals(log)}"
        # Their probes held: the kubelet restarted nothing of the rolled release.
        assert [c["restartCount"] for c in p["status"]["containerStatuses"]] == [0], p["metadata"]["name"]

    # -- uninstall as docs/install.md says: nothing of gpuhealth's is left, on the node or in it.
    proc = run_uninstall(e.cluster.kubeconfig, e.cluster.kubectl_bin, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = kube.node(name)
    assert not [t for t in n["spec"].get("taints") or [] if t["key"].startswith("gpuhealth.dev/")]
    assert not n["spec"].get("unschedulable")
    assert not [
        k
        for k in {**n["metadata"].get("labels", {}), **n["metadata"].get("annotations", {})}
        if k.startswith("gpuhealth.dev/")
    ]
    assert not [c for c in n["status"].get("conditions") or [] if c["type"] == "GPUHealthy"]
    wait_for(lambda: not pods(e, NS, ""), timeout=120, what="no gpuhealth pod left")
    for obj in (
        "deploy/gpuhealth-operator",
        "ds/gpuhealth-agent",
        "validatingadmissionpolicy/gpuhealth-agent-own-node",
        "clusterrole/gpuhealth-operator",
        "clusterrole/gpuhealth-agent",
        "clusterkopfpeering/gpuhealth",
        "gpuhealthpolicy/default",
    ):
        left = e.cluster.kubectl("get", "-n", NS, obj, "--ignore-not-found", "-o", "name").stdout.strip()
        assert left == "", f"{obj} left behind"

    def gpuhealth_containers() -> list[str]:
        out = node.ctr("containers", "ls").stdout.splitlines()[1:]
        return [line for line in out if "gpuhealth" in line]

    wait_for(lambda: not gpuhealth_containers(), timeout=120, what="no gpuhealth container left on the node")
