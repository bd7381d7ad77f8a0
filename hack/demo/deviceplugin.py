"""`make demo REAL_NODE=1`'s device-plugin story (issue #50), on the real node before the XID 79 story.

NVIDIA's own device plugin and GPU Feature Discovery serve the real node's GPUs (devkit/nvidia_plugins.py,
as the GPU Operator deploys them) and the chart's agent reads the kubelet's pod-resources socket, so it
names the pod on each GPU. Two pods hold one GPU each. An XID 48 on pod A's GPU: NVIDIA's plugin marks
the GPU Unhealthy and the kubelet withholds it (allocatable 7); gpuhealth moves only pod A (no taint, no
cordon); pod B, on another GPU, keeps running. The GPU climbs its repair ladder: the reset Job and the
validation Job run in real containers on the node (gpuhealth's image standing in for ``nvidia-smi -r``
and ``dcgmi diag``, devkit/ladder.py); after its probation the operator restarts the plugin's pod
(NVIDIA's plugin keeps an Unhealthy GPU so until it restarts), and the GPU counts back only once
allocatable is 8 again. Pod B is then deleted, so that the training job's ranks fill the node.

The real node has a policy of its own (:func:`policy`: the demo's, with reset and validation Jobs that
run on a real node); the fleet's policy leaves it out (:func:`fleet_policy`).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from kubernetes import client

from devkit import nvidia_plugins as nv
from devkit.dra import fake_nvml_uuid
from devkit.k8s import Kube, wait_for
from devkit.ladder import nvml_reset_job_template, nvml_validation_job_template
from devkit.realnode import RUNTIME_CLASS, RealNode
from hack.demo.common import NS, REMEDIATION_NS, Timeline

APP = "dp-serving"
POD_A, POD_B = "dp-a", "dp-b"
HOSTNAME = "kubernetes.io/hostname"
GPU_OUT = "gpuhealth.dev/gpu-out"
XID = 48  # a double-bit ECC error: NVIDIA's plugin marks the GPU Unhealthy, the catalog's remedy is a reset


def policy(demo: dict[str, Any], node: str, image: str) -> dict[str, Any]:
    """The demo's policy for the real node alone, its reset and validation Jobs in real containers there."""
    spec = copy.deepcopy(demo)
    spec["nodeSelector"] = {"matchLabels": {HOSTNAME: node}}
    # The chart's agent renews its heartbeat every 30 s (the demo's host-process agents, faster): the
    # fleet's 30 s would find it silent between two renewals, and a GPU's drain waits while its node's
    # facts are Unknown. The policy's default, as a user's install has it.
    spec["rules"]["agentSilence"] = {"after": "2m"}
    # The story's pods do not checkpoint (no annotation): a drain waits maxWait (1h by default) for such
    # a pod to finish before it evicts it. The training ranks checkpoint on request and are not affected.
    spec["actions"] = {"drain": {"maxWait": "5s"}}
    spec["remediation"] = {"enabled": True, "jobTemplate": nvml_reset_job_template(image, RUNTIME_CLASS)}
    spec["validation"] = {"enabled": True, "jobTemplate": nvml_validation_job_template(image, RUNTIME_CLASS)}
    return spec


def fleet_policy(demo: dict[str, Any], node: str) -> dict[str, Any]:
    """The demo's policy without the real node (it has its own)."""
    spec = copy.deepcopy(demo)
    spec["nodeSelector"]["matchExpressions"].append({"key": HOSTNAME, "operator": "NotIn", "values": [node]})
    return spec


def pod(name: str, node: str, image: str) -> dict[str, Any]:
    """A pod holding one ``nvidia.com/gpu`` on ``node`` (the scheduler places it, the plugin allocates)."""
    return nv.gpu_pod(name, NS, image, "server", node=node, labels={"app": APP})


def _pod(kube: Kube, name: str) -> Any:
    """The pod (a V1Pod), or None once it is gone."""
    try:
        return kube.core.read_namespaced_pod(name, NS)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def _gpu_of(kube: Kube, node: str, name: str) -> int | None:
    """The GPU the agent's report names ``name`` under."""
    for d in kube.report(node)["spec"].get("devices") or []:
        if any(p.get("name") == name and p.get("namespace") == NS for p in d.get("pods") or []):
            return int(d["index"])
    return None


def _restarts(p: Any) -> int:
    return sum(c.restart_count for c in p.status.container_statuses or [])


def _jobs(kube: Kube, node: str, prefix: str) -> list[Any]:
    got = kube.batch.list_namespaced_job(REMEDIATION_NS, label_selector=f"gpuhealth.dev/node={node}").items
    return [j for j in got if j.metadata.name.startswith(prefix)]


def _ended(job: Any) -> str:
    return next(
        (c.type for c in job.status.conditions or [] if c.type in ("Complete", "Failed") and c.status == "True"), ""
    )


def run(kube: Kube, node: RealNode, plugins: nv.NvidiaPlugins, timeline: Timeline) -> dict[str, Any]:
    """The story, each step a timeline row. Returns the summary's ``device_plugin`` key."""
    name = node.name
    node.cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}])
    wait_for(lambda: kube.core.read_namespaced_service_account("default", NS), what="namespace ready")
    node.cluster.apply_objects([pod(n, name, plugins.image) for n in (POD_A, POD_B)])

    def placed() -> dict[str, int] | None:
        got = {n: _gpu_of(kube, name, n) for n in (POD_A, POD_B)}
        return {n: g for n, g in got.items() if g is not None} if None not in got.values() else None

    gpus = wait_for(placed, timeout=120, what="both pods holding a GPU, named under it in the agent's report")
    a, b = gpus[POD_A], gpus[POD_B]
    pod_a, pod_b = _pod(kube, POD_A), _pod(kube, POD_B)
    old_plugin = plugins.plugin_pod()
    timeline.add(
        f"{name}: NVIDIA's device plugin serves {nv.gpu_counts(node)[1]} nvidia.com/gpu; {NS}/{POD_A} on GPU {a}, "
        f"{NS}/{POD_B} on GPU {b} (the agent reads the kubelet's pod-resources socket)"
    )
    at = time.time()
    plugins.write_xid(a, XID)
    timeline.add(f"{name}: fault injected: XID {XID} on GPU {a} ({fake_nvml_uuid(a)})", at)

    seen: dict[str, float] = {}
    # (allocatable, GPU a's state, node tainted or cordoned, the plugin's pod restarted yet)
    samples: list[tuple[int, str, bool, bool]] = []

    def note(key: str, row: str) -> None:
        if key not in seen:
            seen[key] = time.time()
            timeline.add(row, seen[key])

    def step() -> bool:
        alloc = nv.gpu_counts(node)[1]
        status = kube.report(name).get("status") or {}
        dev: dict[str, Any] = next((d for d in status.get("devices") or [] if d["index"] == a), {})
        rec = (status.get("remediation") or {}).get(str(a)) or {}
        n = kube.node(name)
        blocked = bool(n["spec"].get("unschedulable")) or any(
            t["key"] in (GPU_OUT, "gpuhealth.dev/unhealthy") for t in n["spec"].get("taints") or []
        )
        samples.append((alloc, str(dev.get("state", "")), blocked, "restart" in seen))
        if alloc == nv.GPUS - 1:
            note("withheld", f"{name}: the device plugin withholds GPU {a}: allocatable nvidia.com/gpu {alloc} of 8")
        if dev.get("keptOffBy"):
            note(
                "held", f"{name}: GPU {a} held out, {dev.get('state')}, keptOffBy {dev['keptOffBy']}; node not tainted"
            )
        now_a = _pod(kube, POD_A)
        if now_a is None or now_a.metadata.uid != pod_a.metadata.uid or now_a.metadata.deletion_timestamp:
            note("moved", f"{name}: {NS}/{POD_A} (GPU {a}) evicted; {NS}/{POD_B} (GPU {b}) keeps running")
        for prefix, key, what in (
            ("gpuhealth-reset-", "reset", "reset"),
            ("gpuhealth-validate-", "valid", "validation"),
        ):
            for j in _jobs(kube, name, prefix):
                note(f"{key}-job", f"{name}: {what} Job {REMEDIATION_NS}/{j.metadata.name} for GPU {a}")
                if (end := _ended(j)) != "":
                    note(f"{key}-end", f"{name}: {what} Job {end} (its pod ran in a real container on the node)")
        if rec.get("phase") == "RestartingPlugin" and (rec.get("plugin") or {}).get("deleted"):
            note("restart", f"{name}: operator restarted the device plugin's pod {rec['plugin'].get('pod')}")
        if alloc == nv.GPUS and "withheld" in seen:
            note("offered", f"{name}: the restarted plugin offers GPU {a} again: allocatable nvidia.com/gpu 8 of 8")
        if dev.get("state") == "InService" and "withheld" in seen:
            note("back", f"{name}: GPU {a} back in service ({time.time() - at:.1f}s after the XID)")
            return True
        return False

    wait_for(step, timeout=420, interval=0.3, what=f"GPU {a} of {name} back in service")
    new_plugin = plugins.plugin_pod()
    after_b = _pod(kube, POD_B)
    resets, validations = _jobs(kube, name, "gpuhealth-reset-"), _jobs(kube, name, "gpuhealth-validate-")
    out = {
        "node": name,
        "gpu": a,
        "uuid": fake_nvml_uuid(a),
        # Before the plugin's restart: the GPU withheld. While its pod restarts the kubelet takes every GPU of
        # the plugin out of allocatable until the new pod registers them.
        "allocatable_withheld": min(s[0] for s in samples if not s[3]),
        "allocatable_while_restarting": min((s[0] for s in samples if s[3]), default=-1),
        "allocatable_after_repair": nv.gpu_counts(node)[1],
        "moved_pods": [f"{NS}/{POD_A}"] if "moved" in seen else [],
        "kept_pod": {
            "pod": f"{NS}/{POD_B}",
            "gpu": b,
            "same_uid": after_b is not None and after_b.metadata.uid == pod_b.metadata.uid,
            "restarts": _restarts(after_b) if after_b is not None else -1,
            "phase": after_b.status.phase if after_b is not None else "Gone",
        },
        "node_tainted_or_cordoned": any(s[2] for s in samples),
        "reset_jobs": [f"{j.metadata.name}: {_ended(j)}" for j in resets],
        "validation_jobs": [f"{j.metadata.name}: {_ended(j)}" for j in validations],
        "plugin_restarted": new_plugin["metadata"]["uid"] != old_plugin["metadata"]["uid"],
        "returned_while_withheld": any(alloc < nv.GPUS and state == "InService" for alloc, state, _, _ in samples),
        "returned_s": round(seen["back"] - at, 1),
    }
    # Pod B's GPU goes to the training job's ranks.
    kube.core.delete_namespaced_pod(POD_B, NS, grace_period_seconds=1)
    wait_for(lambda: _pod(kube, POD_B) is None, timeout=60, what=f"{NS}/{POD_B} deleted")
    return out


def misses(summary: dict[str, Any]) -> list[str]:
    """What the device-plugin story must have shown; nothing for a run without a real node."""
    if not summary.get("real_node"):
        return []
    d = summary.get("device_plugin") or {}
    if not d:
        return ["the device-plugin story did not run on the real node"]
    out = []
    if d.get("allocatable_withheld") != nv.GPUS - 1:
        out.append(f"allocatable went down to {d.get('allocatable_withheld')}, expected 7: the plugin withholding it")
    if d.get("moved_pods") != [f"{NS}/{POD_A}"]:
        out.append(f"moved pods {d.get('moved_pods')}, expected only {NS}/{POD_A}")
    kept = d.get("kept_pod") or {}
    if not (kept.get("same_uid") and kept.get("restarts") == 0 and kept.get("phase") == "Running"):
        out.append(f"the pod on another GPU did not keep running untouched: {kept}")
    if d.get("node_tainted_or_cordoned"):
        out.append("the node was tainted or cordoned for one GPU the plugin withholds")
    if [r.rpartition(": ")[2] for r in d.get("reset_jobs") or []] != ["Complete"]:
        out.append(f"reset Jobs {d.get('reset_jobs')}, expected one Complete")
    if [v.rpartition(": ")[2] for v in d.get("validation_jobs") or []] != ["Complete"]:
        out.append(f"validation Jobs {d.get('validation_jobs')}, expected one Complete")
    if not d.get("plugin_restarted"):
        out.append("the device plugin's pod was not restarted")
    if d.get("allocatable_after_repair") != nv.GPUS or d.get("returned_while_withheld"):
        out.append(
            f"allocatable {d.get('allocatable_after_repair')} after the repair, the GPU back while withheld: "
            f"{d.get('returned_while_withheld')}; expected 8, and back only once offered"
        )
    return out
