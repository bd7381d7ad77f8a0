"""NVIDIA's own device plugin and GPU Feature Discovery (v0.17.4, built from source by
hack/build-nvidia-plugins.sh) on the real kubelet node, over the fake NVML.

Both run as the GPU Operator runs them (devkit/nvidia_plugins.py): DaemonSets under the RuntimeClass
``nvidia`` with ``NVIDIA_VISIBLE_DEVICES=all``, so the runtime wrapper mounts the fake library where the
toolkit mounts the driver's and go-nvml loads it as it loads a driver. The plugin registers the fake's 8
GPUs with the real kubelet, which allocates one to a real pod by its UUID; an XID 48 written into the
fake's scenario reaches the plugin through nvmlEventSetWait as it reaches the agent, the plugin marks
that GPU Unhealthy and the kubelet withholds it, until the plugin's pod restarts ("there is no way to
recover from the Unhealthy state"). GFD's ``nvidia.com/gpu.clique`` is the fake's fabric
``<clusterUuid>.<cliqueId>``, put on the Node by the stand-in for Node Feature Discovery. gpuhealth's
agent, installed with ``agent.podResources.enabled`` (uid 0 without capabilities, the kubelet's socket
being root's alone), names each pod under the UUID of the GPU the plugin gave it.

One node for the module; the tests run in order and share it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devkit import nvidia_plugins as nv
from devkit.dra import fake_nvml_uuid
from devkit.k8s import GROUP, VERSION, Kube, holds, wait_for
from devkit.realnode import RUNTIME_CLASS, Installed, RealNode
from devkit.realnode_host import STATE
from gpuhealth.api.report import PodHold, parse_report

CLUSTER_UUID = "6e0e8f2a-5c1b-4d3e-9f70-3a1b2c4d5e6f"
CLIQUE = 32766  # the cliqueId GB200 racks report; the cluster UUID tells such racks apart
WORKLOADS = "default"


@dataclass
class Env:
    installed: Installed
    node: RealNode
    plugins: nv.NvidiaPlugins
    gpu: int = -1  # the index of the GPU the test pod holds (set by the pod's test)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    kubelet_dir_existed = nv.DEVICE_PLUGINS.parent.exists()
    installed = Installed.start(tmp_path_factory.mktemp("device-plugin"))
    try:
        plugins = nv.NvidiaPlugins.deploy(installed.node, nv.fabric_scenario(CLUSTER_UUID, CLIQUE))
        yield Env(installed, installed.node, plugins)
    finally:
        installed.stop()
    assert not STATE.exists(), "the real node's record of host changes is still there"
    if not kubelet_dir_existed:
        assert not nv.DEVICE_PLUGINS.parent.exists(), f"{nv.DEVICE_PLUGINS.parent} left behind"


def gpu_pod(image: str, name: str) -> dict[str, Any]:
    """A pod asking for one ``nvidia.com/gpu`` that prints its environment and stays up."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "work",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "env; exec sleep 3600"],
                    "resources": {"limits": {nv.RESOURCE: "1"}},
                }
            ],
        },
    }


def running_with_gpus(e: Env, name: str) -> tuple[dict[str, Any], list[str]] | None:
    pod = json.loads(e.node.cluster.kubectl("get", "pod", "-n", WORKLOADS, name, "-o", "json").stdout)
    uuids = nv.uuid_in(nv.container_log(e.node, pod))
    return (pod, uuids) if pod["status"].get("phase") == "Running" and uuids else None


FAKE_UUIDS = [fake_nvml_uuid(i) for i in range(nv.GPUS)]


def test_the_real_plugin_registers_the_fakes_eight_gpus_with_the_kubelet(env: Env) -> None:
    assert nv.gpu_counts(env.node) == (nv.GPUS, nv.GPUS)
    pod = env.plugins.plugin_pod()
    assert pod["spec"]["runtimeClassName"] == RUNTIME_CLASS and pod["spec"]["nodeName"] == env.node.name
    assert (nv.DEVICE_PLUGINS / "nvidia-gpu.sock").is_socket(), "the plugin's socket beside the kubelet's"
    log = nv.container_log(env.node, pod)
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in log, log[-2000:]


def test_a_pod_asking_for_one_gpu_runs_with_the_uuid_of_one_gpu_of_the_fake(env: Env) -> None:
    env.node.cluster.apply_objects([gpu_pod(env.plugins.image, "one-gpu")])
    _, uuids = wait_for(lambda: running_with_gpus(env, "one-gpu"), timeout=90, what="the GPU pod Running")
    assert len(uuids) == 1 and uuids[0] in FAKE_UUIDS, uuids
    env.gpu = FAKE_UUIDS.index(uuids[0])


def agent_processes() -> list[dict[str, str]]:
    """``/proc/<pid>/status`` of each ``gpuhealth-agent`` process running in a pod of the node."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"gpuhealth-agent" in (proc / "cmdline").read_bytes() and "kubepods" in (proc / "cgroup").read_text():
                lines = (proc / "status").read_text().splitlines()
                out.append({k: v.strip() for k, _, v in (line.partition(":") for line in lines)})
        except OSError:
            continue
    return out


def test_the_installed_agent_names_the_pod_under_its_gpus_uuid(env: Env) -> None:
    """The agent reads the kubelet's pod-resources socket (agent.podResources, docs/agent.md "Which pods
    hold each GPU") and names the pod the real plugin gave a GPU under that GPU's UUID, and under no
    other; a pod that leaves its GPU leaves the report at once."""
    assert env.gpu >= 0, "runs after the pod's test"
    # Why the agent container takes uid 0: the kubelet makes the socket's directory 0750 and the socket
    # 0755, both root's, and connecting needs write permission on the socket.
    d = env.node.pod_resources_dir
    dir_st, sock_st = os.stat(d), os.stat(d / "kubelet.sock")
    assert stat.S_ISSOCK(sock_st.st_mode)
    assert (dir_st.st_uid, dir_st.st_gid, stat.S_IMODE(dir_st.st_mode)) == (0, 0, 0o750)
    assert (sock_st.st_uid, stat.S_IMODE(sock_st.st_mode) & 0o022) == (0, 0), "the socket is writable by others"
    env.installed.install(None, pod_resources=True)  # no policy: gpuhealth only reports here
    kube = Kube(env.installed.cluster.kubeconfig)
    # The agent's process on the host: uid 0 with every capability dropped and no new privileges (it
    # connects as the socket's owner, never by CAP_DAC_OVERRIDE).
    (proc,) = wait_for(agent_processes, timeout=30, what="the agent's process")
    assert proc["Uid"].split()[0] == "0", proc["Uid"]
    assert int(proc["CapEff"], 16) == int(proc["CapPrm"], 16) == int(proc["CapBnd"], 16) == 0, proc
    assert proc["NoNewPrivs"] == "1"

    def held() -> dict[str, Any] | None:
        body: dict[str, Any] = kube.custom.get_cluster_custom_object(GROUP, VERSION, "gpunodehealths", env.node.name)
        spec = body.get("spec") or {}
        return body if any(d.get("pods") for d in spec.get("devices") or []) else None

    body = wait_for(held, timeout=120, what="the agent's report naming a GPU's pod")
    assert body["spec"]["podResources"] == {"available": True}
    report = parse_report(body)
    holding = {d.uuid: report.holders(d.index) for d in report.devices if report.holders(d.index)}
    assert holding == {FAKE_UUIDS[env.gpu]: (PodHold(WORKLOADS, "one-gpu", "work", nv.RESOURCE),)}
    # A second pod on another GPU, named under that one; deleted, it leaves the report.
    env.node.cluster.apply_objects([gpu_pod(env.plugins.image, "another-gpu")])
    _, (other,) = wait_for(lambda: running_with_gpus(env, "another-gpu"), timeout=90, what="the second GPU pod")
    assert other != FAKE_UUIDS[env.gpu]

    def names(uuid: str, pod: str | None) -> bool:
        body = kube.custom.get_cluster_custom_object(GROUP, VERSION, "gpunodehealths", env.node.name)
        (device,) = [d for d in body["spec"]["devices"] if d.get("uuid") == uuid]
        return [p["name"] for p in device.get("pods") or []] == ([pod] if pod else [])

    wait_for(lambda: names(other, "another-gpu"), timeout=60, what=f"another-gpu under {other}")
    env.node.cluster.kubectl("delete", "pod", "-n", WORKLOADS, "another-gpu", "--wait=false")
    wait_for(lambda: names(other, None), timeout=60, what=f"another-gpu gone from {other}")
    assert names(FAKE_UUIDS[env.gpu], "one-gpu")


def test_an_xid_48_makes_the_plugin_withhold_that_gpu_until_its_pod_restarts(env: Env) -> None:
    gpu = env.gpu
    assert gpu >= 0, "runs after the pod's test"
    other = (gpu + 1) % nv.GPUS
    # An application XID (13: the plugin skips it) on another GPU, and a double-bit ECC XID on the pod's.
    env.plugins.write_xid(other, 13)
    env.plugins.write_xid(gpu, 48)
    wait_for(lambda: nv.gpu_counts(env.node) == (nv.GPUS, nv.GPUS - 1), timeout=90, what="allocatable 7")
    delivered = env.node.emit_log.read_text()
    assert f"gpu {gpu} code 48" in delivered and f"gpu {other} code 13" in delivered, delivered
    log = nv.container_log(env.node, env.plugins.plugin_pod())
    assert f"Xid=48 on Device={FAKE_UUIDS[gpu]}; marking device as unhealthy" in log, log[-2000:]
    # NVIDIA's "no way to recover from the Unhealthy state": the GPU stays withheld while the plugin runs,
    # across the kubelet's status reports (every 10 s here).
    holds(lambda: nv.gpu_counts(env.node) == (nv.GPUS, nv.GPUS - 1), seconds=12, what="allocatable stays 7")
    env.plugins.restart_plugin()
    wait_for(lambda: nv.gpu_counts(env.node) == (nv.GPUS, nv.GPUS), timeout=90, what="allocatable 8 again")
    # The pod on that GPU was never touched by any of it.
    assert running_with_gpus(env, "one-gpu") is not None


def test_gfd_labels_the_node_with_the_fakes_fabric_clique(env: Env) -> None:
    labels = env.plugins.apply_gfd_labels()
    assert labels[nv.CLIQUE_LABEL] == f"{CLUSTER_UUID}.{CLIQUE}"
    node = json.loads(env.node.cluster.kubectl("get", "node", env.node.name, "-o", "json").stdout)
    got = node["metadata"]["labels"]
    assert got[nv.CLIQUE_LABEL] == f"{CLUSTER_UUID}.{CLIQUE}"
    assert got["nvidia.com/gpu.count"] == str(nv.GPUS) and got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert got["nvidia.com/gpu.machine"] == "NVIDIA-DGX-H100"
