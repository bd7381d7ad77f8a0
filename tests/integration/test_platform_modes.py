"""Platform modes on the real control plane: a node held by gpuhealth's taint alone (``spec.actions.cordon:
false``, for platforms that repair a node left cordoned) and the taint's effect (``spec.actions.taintEffect``).

Every version of the Node the API server hands out during an episode is read through a watch, so a
cordon that lasted one write between two polls would still be seen."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kubernetes import watch

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, healthy_spec, wait_for
from devkit.k8s import ensure_namespace as namespace
from devkit.k8s import xid_event as xid
from tests.integration.conftest import make_nodes, policy_spec

TAINT = "gpuhealth.dev/unhealthy"


@dataclass
class NodeVersions:
    """Each version of one Node seen by a watch: (resourceVersion, unschedulable, gpuhealth's taint)."""

    seen: list[tuple[str, bool, dict[str, Any] | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def cordoned(self) -> list[str]:
        return [rv for rv, unschedulable, _ in self.seen if unschedulable]

    def taints(self) -> list[dict[str, Any] | None]:
        return [t for _, _, t in self.seen]


@contextmanager
def every_version(kube: Kube, node: str) -> Iterator[NodeVersions]:
    """Watch ``node`` from its current resourceVersion until the block ends; a watch that times out
    resumes from the last version it saw, so no version is skipped."""
    out = NodeVersions()
    stop = threading.Event()
    rv = kube.core.read_node(node).metadata.resource_version

    def run() -> None:
        nonlocal rv
        while not stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(
                    kube.core.list_node, field_selector=f"metadata.name={node}", resource_version=rv, timeout_seconds=5
                ):
                    obj = ev["object"]
                    rv = obj.metadata.resource_version
                    ours = next((t for t in obj.spec.taints or [] if t.key == TAINT), None)
                    taint = None if ours is None else {"value": ours.value, "effect": ours.effect}
                    out.seen.append((rv, bool(obj.spec.unschedulable), taint))
                    if stop.is_set():
                        break
            except Exception as e:  # the stream ends or breaks: resume from the last version seen
                out.errors.append(repr(e))
            finally:
                w.stop()

    t = threading.Thread(target=run, name=f"watch-{node}", daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join(timeout=15)


def gpu_pod(name: str, node: str) -> dict[str, Any]:
    """A bare pod asking for one GPU on ``node``, through the scheduler (so taints and cordons apply)."""
    return {
        "metadata": {"name": name, "labels": {"app": "taint-only"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


def live(kube: Kube, ns: str) -> list[Any]:
    pods = kube.core.list_namespaced_pod(ns, label_selector="app=taint-only").items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def scheduling_message(kube: Kube, ns: str, pod: str) -> str:
    p = kube.core.read_namespaced_pod(pod, ns)
    cond = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
    return "" if cond is None or cond.status != "False" else str(cond.message or "")


def test_taint_only_xid79_never_cordons_drains_keeps_new_pods_off_and_recovers(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    ns = namespace(kube, f"taint-only-{group}"[:60])
    kube.apply_policy(group, policy_spec(group, safety={"probation": "3s"}, actions={"cordon": False}))
    kube.put_report(node, healthy_spec())
    wait_for(lambda: kube.state(node) == "Healthy", what="Healthy verdict")
    for i in range(2):
        kube.core.create_namespaced_pod(ns, gpu_pod(f"w{i}", node))
    wait_for(lambda: len([p for p in live(kube, ns) if p.status.phase == "Running"]) == 2, what="2 pods running")

    with every_version(kube, node) as versions:
        kube.put_report(node, healthy_spec(xids=[xid(79)]))
        taint = wait_for(lambda: kube.our_taint(node), what="gpuhealth's taint")
        assert taint["value"] == "XID79" and taint["effect"] == "NoSchedule"
        # The taint and the eviction keep work off: the drain still runs, and moves both pods.
        wait_for(lambda: not live(kube, ns), timeout=60, what="the drain evicts both pods")
        wait_for(lambda: kube.state(node) == "Quarantined", what="drain complete")
        assert kube.report(node)["status"]["drain"]["phase"] == "Completed"
        # A new pod for this node is kept off by the taint alone (the scheduler says so), not a cordon.
        kube.core.create_namespaced_pod(ns, gpu_pod("late", node))
        msg = wait_for(lambda: scheduling_message(kube, ns, "late"), what="the new pod refused by the scheduler")
        # The message counts every node of the shared cluster (other tests' cordoned nodes among them):
        # it must name a taint; that this node is not cordoned is the watch's and the Node's to say.
        assert "untolerated taint" in msg, msg
        assert not kube.node(node)["spec"].get("unschedulable"), "the node is not cordoned"
        assert {t["key"] for t in kube.taints(node)} == {TAINT}, "the only taint there is gpuhealth's"
        n = kube.node(node)
        own = n["metadata"]["annotations"]["gpuhealth.dev/quarantine"]
        assert '"taintOnly":true' in own and '"cordon":false' in own
        cond = wait_for(lambda: (c := kube.condition(node)) and c["status"] == "False" and c, what="GPUHealthy=False")
        assert "taint alone" in cond["message"] and "not cordoned" in cond["message"]
        quarantined = kube.await_events(node, "Quarantined")
        assert quarantined and "taint alone" in quarantined[0].message
        # A restarted operator reads the record: it finishes the episode and never cordons.
        operator.kill()
        operator.start()
        kube.put_report(node, healthy_spec(xids=[]))  # repaired: the XID history is gone
        wait_for(lambda: kube.state(node) == "Healthy", timeout=30, what="return to service after probation")
        wait_for(lambda: kube.our_taint(node) is None, what="gpuhealth's taint lifted")
        wait_for(lambda: kube.core.read_namespaced_pod("late", ns).status.phase == "Running", what="the pod lands")
        wait_for(lambda: versions.taints() and versions.taints()[-1] is None, what="the watch saw the lift")

    assert any(t is not None for t in versions.taints()), f"the watch saw no taint: {versions}"
    assert versions.cordoned() == [], f"gpuhealth cordoned the node at {versions.cordoned()}"
    assert not kube.node(node)["spec"].get("unschedulable")


def test_noexecute_effect_is_written_and_a_mode_switch_converges_while_held(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    cordon_level = {"xid": {"overrides": [{"code": 48, "action": "cordon"}]}}
    spec = policy_spec(group, rules=cordon_level, actions={"taintEffect": "NoExecute", "cordon": True})
    kube.apply_policy(group, spec)
    kube.put_report(node, healthy_spec())
    wait_for(lambda: kube.state(node) == "Healthy", what="Healthy verdict")
    kube.put_report(node, healthy_spec(xids=[xid(48)]))
    taint = wait_for(lambda: kube.our_taint(node), what="gpuhealth's taint")
    assert taint == {"key": TAINT, "value": "XID48", "effect": "NoExecute"}
    assert kube.node(node)["spec"].get("unschedulable") is True
    # Turned taint-only while held: the next pass lifts the cordon gpuhealth set and keeps the taint.
    kube.apply_policy(group, {**spec, "actions": {"taintEffect": "NoExecute", "cordon": False}})
    n = wait_for(
        lambda: not (n := kube.node(node))["spec"].get("unschedulable") and n, what="gpuhealth's cordon lifted"
    )
    assert '"taintOnly":true' in n["metadata"]["annotations"]["gpuhealth.dev/quarantine"]
    assert kube.our_taint(node) == taint and kube.state(node) == "Quarantined"
    wait_for(
        lambda: any("taint alone" in e.message for e in kube.node_events(node, "GPUHealthAction")),
        what="the uncordon announced with its reason",
    )
    # ... and back: the next pass cordons the node held by the taint alone; the effect follows too.
    kube.apply_policy(group, {**spec, "actions": {"taintEffect": "NoSchedule", "cordon": True}})
    wait_for(lambda: kube.node(node)["spec"].get("unschedulable") is True, what="cordoned again")
    wait_for(lambda: (kube.our_taint(node) or {}).get("effect") == "NoSchedule", what="the taint's effect follows")
    own = kube.node(node)["metadata"]["annotations"]["gpuhealth.dev/quarantine"]
    assert '"cordon":true' in own and "taintOnly" not in own
