"""`make demo REAL_NODE=1`: the first story (the XID 79 node) on a real kubelet node, through the
installed chart.

devkit/realnode.py brings it up exactly as tests/integration/test_real_node.py does (the image
from the Dockerfile, containerd + kubelet, ``helm install`` of charts/gpuhealth with that image,
pull policy Never): the operator is the chart's Pod, pinned to the real node, and the only
operator of the demo; the real node's agent is the chart's DaemonSet Pod there, reading the fake
NVML that the RuntimeClass ``nvidia`` mounts, while the KWOK nodes of the other stories keep their
host-process agents (the DaemonSet is kept to the real node). The demo's own policy is the only
policy (the chart's first policy is not created).

NVIDIA's own device plugin and GPU Feature Discovery run on the node as the GPU Operator runs them
(devkit/nvidia_plugins.py), and the agent reads the kubelet's pod-resources socket: the device-plugin
story (hack/demo/deviceplugin.py) runs there first. The training job's ranks then run in real
containers (the pause image, already on the node), their GPUs allocated by the plugin, and the XID 79
written into the node's fake NVML scenario takes the node out, from the agent Pod's report to the
operator Pod's taint, cordon, checkpoint requests and evictions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from devkit import nvidia_plugins as nv
from devkit.k8s import Kube
from devkit.realnode import Installed

# containerd's pinned sandbox image: on the node without a pull, and a process that runs until stopped.
TRAINER_IMAGE = "registry.k8s.io/pause:3.10.2"
HOSTNAME = "kubernetes.io/hostname"


def start(workdir: Path, kwok_nodes: int) -> Installed:
    """The control plane with ``kwok_nodes`` fake GPU nodes beside the real one (not yet installed)."""
    return Installed.start(workdir, kwok_nodes=kwok_nodes)


def install(installed: Installed) -> tuple[dict[str, Any], nv.NvidiaPlugins]:
    """NVIDIA's device plugin and GFD on the real node (it then advertises its 8 GPUs), and helm install
    (no policy of the chart's: the demo applies its own), the operator and the agent on the real node
    only, the agent reading the kubelet's pod-resources socket. Returns the operator Pod once Ready,
    and the plugins."""
    name = installed.node.name
    plugins = nv.NvidiaPlugins.deploy(installed.node)
    installed.install(
        None,
        [f"--set-json={part}.nodeSelector={json.dumps({HOSTNAME: name})}" for part in ("operator", "agent")],
        pod_resources=True,
    )
    return installed.operator_pod(), plugins


def inject_xid(plugins: nv.NvidiaPlugins, gpu: int, code: int) -> None:
    """An XID in the real node's fake NVML scenario (the agent Pod's library and the plugin read it)."""
    plugins.write_xid(gpu, code)


def containers(kube: Kube, namespace: str, app: str, node: str) -> dict[str, str]:
    """The app's pods on ``node`` and the containerd ID of each one's container (read from the API)."""
    out = {}
    for p in kube.core.list_namespaced_pod(namespace, label_selector=f"app={app}").items:
        statuses = p.status.container_statuses or []
        if p.spec.node_name == node and statuses and statuses[0].container_id:
            out[p.metadata.name] = statuses[0].container_id
    return out


def summary(installed: Installed, operator_pod: dict[str, Any], ranks: dict[str, str]) -> dict[str, Any]:
    return {
        "real_node": True,
        "real_node_name": installed.node.name,
        "operator_pod": operator_pod["metadata"]["name"],
        "image": installed.image.ref,
        "image_digest": installed.image.id,
        "real_node_ranks": ranks,
    }


def misses(summary: dict[str, Any]) -> list[str]:
    """What a REAL_NODE run must also show; nothing for a run without it."""
    if not summary.get("real_node"):
        return []
    out = []
    node = summary.get("real_node_name")
    if summary.get("quarantined_nodes") != [node]:
        out.append(f"quarantined nodes {summary.get('quarantined_nodes')}, expected only the real node {node}")
    if not str(summary.get("image_digest", "")).startswith("sha256:"):
        out.append(f"no image digest: {summary.get('image_digest')!r}")
    ranks = summary.get("real_node_ranks") or {}
    if len(ranks) != 4 or not all(c.startswith("containerd://") for c in ranks.values()):
        out.append(f"the training ranks on the real node ran in {ranks}, expected 4 containerd containers")
    return out
