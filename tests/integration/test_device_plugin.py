"""NVIDIA's own device plugin and GPU Feature Discovery (v0.17.4, built from source by
hack/build-nvidia-plugins.sh) on the real kubelet node, over the fake NVML, and gpuhealth installed
beside them: the whole device-plugin story (docs/devices.md, "What a device-plugin-only cluster gets").

Both run as the GPU Operator runs them (devkit/nvidia_plugins.py): DaemonSets under the RuntimeClass
``nvidia`` with ``NVIDIA_VISIBLE_DEVICES=all``, so the runtime wrapper mounts the fake library where the
toolkit mounts the driver's and go-nvml loads it as it loads a driver. The plugin registers the fake's 8
GPUs with the real kubelet, which allocates one to a real pod by its UUID. gpuhealth's chart is
installed with ``agent.podResources.enabled`` (uid 0 without capabilities, the kubelet's socket being
root's alone), so its agent names each pod under the UUID of the GPU the plugin gave it, and a policy
in Enforce with a repair ladder whose reset and validation Jobs run in real containers on the node.

- An XID 48 written into the fake's scenario reaches the plugin through nvmlEventSetWait as it reaches
  the agent: the plugin marks that GPU Unhealthy and the kubelet withholds it (allocatable 7), and
  gpuhealth moves only that GPU's pod, with no taint and no cordon; the pods on other GPUs never
  restart. The GPU is reset and validated, and because NVIDIA's plugin has "no way to recover from the
  Unhealthy state", the operator restarts the plugin's pod; the GPU counts back only once allocatable
  is 8 again.
- An ECC fault the plugin does not see: gpuhealth's NoSchedule taint ``gpuhealth.dev/gpu-out``, no
  cordon, only that GPU's pod moved.
- GFD's ``nvidia.com/gpu.clique`` (put on the Node by the stand-in for Node Feature Discovery) is the
  report's fabric ``<clusterUuid>.<cliqueId>``, and a fabric fault takes out the NVLink domain that
  label names: with one real node, that node.

One node for the module; the tests run in order and share it.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devkit import nvidia_plugins as nv
from devkit.dra import fake_nvml_uuid
from devkit.k8s import GROUP, VERSION, Kube, wait_for
from devkit.ladder import nvml_reset_job_template, nvml_validation_job_template
from devkit.realnode import RUNTIME_CLASS, Installed, RealNode
from devkit.realnode_host import STATE
from gpuhealth.api.report import PodHold, parse_report

CLUSTER_UUID = "6e0e8f2a-5c1b-4d3e-9f70-3a1b2c4d5e6f"
CLIQUE = 32766  # the cliqueId GB200 racks report; the cluster UUID tells such racks apart
WORKLOADS = "default"
REMEDIATION_NS = "gpuhealth-remediation"  # the chart's remediation.namespace
GPU_OUT = "gpuhealth.dev/gpu-out"
# The fabric health mask (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*, api/fabric.py): ROUTE_UNHEALTHY (bits 4-5)
# 1, true; the other boolean sub-fields 2, false; INCORRECT_CONFIGURATION (bits 8-11) 1, none.
ROUTE_UNHEALTHY_MASK = 0x2 | 0x2 << 2 | 0x1 << 4 | 0x2 << 6 | 0x1 << 8


@dataclass
class Env:
    installed: Installed
    node: RealNode
    plugins: nv.NvidiaPlugins
    kube: Kube
    gpu: int = -1  # the index of the GPU the first test pod holds (set by the pod's test)
    pods: dict[str, int] = field(default_factory=dict)  # the story's pods on the node: GPU index by name


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    kubelet_dir_existed = nv.DEVICE_PLUGINS.parent.exists()
    installed = Installed.start(tmp_path_factory.mktemp("device-plugin"))
    try:
        plugins = nv.NvidiaPlugins.deploy(installed.node, nv.fabric_scenario(CLUSTER_UUID, CLIQUE))
        yield Env(installed, installed.node, plugins, Kube(installed.cluster.kubeconfig))
    finally:
        installed.stop()
    assert not STATE.exists(), "the real node's record of host changes is still there"
    if not kubelet_dir_existed:
        assert not nv.DEVICE_PLUGINS.parent.exists(), f"{nv.DEVICE_PLUGINS.parent} left behind"


def gpu_pod(image: str, name: str) -> dict[str, Any]:
    """A pod asking for one ``nvidia.com/gpu`` that prints its environment and stays up."""
    return nv.gpu_pod(name, WORKLOADS, image, "work")


def get_pod(e: Env, name: str) -> dict[str, Any] | None:
    out = e.node.cluster.kubectl("get", "pod", "-n", WORKLOADS, name, "-o", "json", "--ignore-not-found").stdout
    return json.loads(out) if out.strip() else None


def running_with_gpus(e: Env, name: str) -> tuple[dict[str, Any], list[str]] | None:
    pod = get_pod(e, name)
    if pod is None:
        return None
    uuids = nv.uuid_in(nv.container_log(e.node, pod))
    return (pod, uuids) if pod["status"].get("phase") == "Running" and uuids else None


def untouched(e: Env, pod: dict[str, Any]) -> bool:
    """The pod is the same one (uid), still Running and bound, its container never restarted."""
    now = get_pod(e, pod["metadata"]["name"])
    return (
        now is not None
        and now["metadata"]["uid"] == pod["metadata"]["uid"]
        and not now["metadata"].get("deletionTimestamp")
        and now["status"].get("phase") == "Running"
        and [c["restartCount"] for c in now["status"]["containerStatuses"]] == [0]
    )


def gone(e: Env, pod: dict[str, Any]) -> bool:
    now = get_pod(e, pod["metadata"]["name"])
    return (
        now is None
        or now["metadata"]["uid"] != pod["metadata"]["uid"]
        or bool(now["metadata"].get("deletionTimestamp"))
    )


def device(e: Env, index: int) -> dict[str, Any]:
    status = e.kube.report(e.node.name).get("status") or {}
    return next((d for d in status.get("devices") or [] if d["index"] == index), {})


def ladder(e: Env, index: int) -> dict[str, Any]:
    status = e.kube.report(e.node.name).get("status") or {}
    return dict((status.get("remediation") or {}).get(str(index)) or {})


def gpu_out(e: Env) -> dict[str, Any] | None:
    return next((t for t in e.kube.taints(e.node.name) if t["key"] == GPU_OUT), None)


def cordoned(e: Env) -> bool:
    return bool(e.kube.node(e.node.name)["spec"].get("unschedulable"))


def jobs(e: Env, prefix: str) -> list[Any]:
    """The node's Jobs in the remediation namespace whose names start with ``prefix``."""
    got = e.kube.batch.list_namespaced_job(REMEDIATION_NS, label_selector=f"gpuhealth.dev/node={e.node.name}")
    return [j for j in got.items if j.metadata.name.startswith(prefix)]


def ended(e: Env, job: Any) -> str:
    """How the Job ended ("Complete" or "Failed"), or "" while it runs."""
    conds = e.kube.batch.read_namespaced_job(job.metadata.name, REMEDIATION_NS).status.conditions or []
    return next((c.type for c in conds if c.type in ("Complete", "Failed") and c.status == "True"), "")


def ran_in_a_real_container(e: Env, job: Any, says: str) -> None:
    """The Job's one pod ran on the node under the RuntimeClass ``nvidia``, exited 0 and said ``says``."""
    (pod,) = e.kube.core.list_namespaced_pod(REMEDIATION_NS, label_selector=f"job-name={job.metadata.name}").items
    assert pod.spec.node_name == e.node.name and pod.spec.runtime_class_name == RUNTIME_CLASS
    (cs,) = pod.status.container_statuses
    assert cs.container_id.startswith("containerd://") and cs.state.terminated.exit_code == 0, cs
    log = nv.container_log(
        e.node, {"metadata": {"namespace": REMEDIATION_NS, "name": pod.metadata.name, "uid": pod.metadata.uid}}
    )
    assert says in log, log


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


# The policy: Enforce, pods drained without a checkpoint handshake (none of them checkpoints), a short
# probation, and the repair ladder for the faults of the story: one reset, whose Job's pod runs
# gpuhealth's own image on the node as the stand-in for ``nvidia-smi -r``, then a validation Job the
# same way for ``dcgmi diag``. spec.remediation.devicePlugin keeps its defaults: the GPU Operator's
# namespace and labels, which devkit/nvidia_plugins.py deploys the plugin with.
def story_policy(image: str) -> dict[str, Any]:
    return {
        "mode": "Enforce",
        "safety": {"probation": "5s", "maxUnhealthyGPUs": 8},
        "actions": {"drain": {"checkpointMode": "none", "maxWait": "1s"}},
        "remediation": {
            "enabled": True,
            "ladders": [
                {
                    "reasons": ["EccUncorrected", "XID48"],
                    "steps": [{"type": "GPUReset", "timeout": "5m", "attempts": 1}, {"type": "Replace"}],
                }
            ],
            "jobTemplate": nvml_reset_job_template(image, RUNTIME_CLASS),
        },
        "validation": {
            "enabled": True,
            "timeout": "5m",
            "jobTemplate": nvml_validation_job_template(image, RUNTIME_CLASS),
        },
    }


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
    # Nothing is wrong yet: the policy in Enforce acts only in the tests after this one.
    env.installed.install(story_policy(env.installed.image.ref), pod_resources=True)
    kube = env.kube
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
    assert len(body["spec"]["devices"]) == nv.GPUS
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
    wait_for(lambda: kube.state(env.node.name) == "Healthy", timeout=60, what="a Healthy verdict under Enforce")
    env.pods["one-gpu"] = env.gpu


def start_pods(e: Env, *names: str) -> dict[str, dict[str, Any]]:
    """Pods that each hold one GPU, Running and named under their GPU in the agent's report."""
    e.node.cluster.apply_objects([gpu_pod(e.plugins.image, n) for n in names])
    for n in names:

        def up(pod: str = n) -> tuple[dict[str, Any], list[str]] | None:
            return running_with_gpus(e, pod)

        _, (uuid,) = wait_for(up, timeout=90, what=f"{n} Running with a GPU")
        e.pods[n] = FAKE_UUIDS.index(uuid)

    def reported() -> bool:
        spec = e.kube.report(e.node.name)["spec"]
        named = {p["name"]: d["index"] for d in spec["devices"] for p in d.get("pods") or []}
        return all(named.get(n) == i for n, i in e.pods.items())

    wait_for(reported, timeout=60, what=f"{', '.join(e.pods)} under their GPUs in the report")
    return {n: p for n in e.pods if (p := get_pod(e, n)) is not None}


# The module's setup (the node, the plugins' image) counts too.
@pytest.mark.timeout(600)
def test_an_xid_48_costs_its_pod_and_the_gpu_returns_once_the_restarted_plugin_offers_it(env: Env) -> None:
    """The plugin withholds the GPU by itself, so gpuhealth drains only its pod and writes nothing to the
    Node; the repair (reset, validation, probation) ends with the operator restarting the plugin's pod,
    and the GPU counts back only when allocatable shows it."""
    e, name = env, env.node.name
    before = start_pods(e, "second-gpu", "third-gpu")
    a, b = e.pods["one-gpu"], e.pods["second-gpu"]
    plugin_before = e.plugins.plugin_pod()
    # An application XID (13: the plugin skips it, gpuhealth ignores one) on B's GPU, a double-bit ECC
    # XID (48) on A's.
    e.plugins.write_xid(b, 13)
    e.plugins.write_xid(a, 48)
    wait_for(lambda: nv.gpu_counts(e.node) == (nv.GPUS, nv.GPUS - 1), timeout=90, what="allocatable 7")
    delivered = e.node.emit_log.read_text()
    assert f"gpu {a} code 48" in delivered and f"gpu {b} code 13" in delivered, delivered
    log = nv.container_log(e.node, plugin_before)
    assert f"Xid=48 on Device={FAKE_UUIDS[a]}; marking device as unhealthy" in log, log[-2000:]

    wait_for(lambda: gone(e, before["one-gpu"]), timeout=90, what="one-gpu evicted")
    assert device(e, a)["keptOffBy"] == "DevicePlugin"
    assert gpu_out(e) is None and e.kube.our_taint(name) is None and not cordoned(e), "the plugin withholds it"
    # gpuhealth saw the XID with the plugin, before the kubelet's next node status: it trusted the
    # plugin (actions/plugin_hold.py), and the count has shown it since.
    events = " ".join(ev.message for ev in e.kube.await_events(name, "DeviceQuarantined"))
    assert "withheld by the device plugin" in events, events
    assert f"{WORKLOADS}/one-gpu" in events and "second-gpu" not in events and "third-gpu" not in events

    # The reset Job's pod runs in a real container, then the validation Job's. NVIDIA's "no way to recover
    # from the Unhealthy state": the GPU stays withheld through the whole repair, until the operator
    # deletes the plugin's pod (phase RestartingPlugin); it counts back only once allocatable is 8.
    seen: list[tuple[str, int, str]] = []  # (the ladder's phase, allocatable, the GPU's state)

    def returned() -> bool:
        phase, (_, alloc) = str(ladder(e, a).get("phase", "")), nv.gpu_counts(e.node)
        state = str(device(e, a).get("state", ""))
        seen.append((phase, alloc, state))
        assert gpu_out(e) is None and not cordoned(e), f"the node tainted or cordoned at {seen[-1]}"
        return state == "InService"

    wait_for(returned, timeout=300, interval=0.5, what=f"GPU {a} back in service")
    phases = [p for p, _, _ in seen]
    assert "RestartingPlugin" in phases, phases
    plugin_deleted_at = phases.index("RestartingPlugin")
    assert all(alloc == nv.GPUS - 1 for _, alloc, _ in seen[:plugin_deleted_at]), seen
    assert all(state != "InService" for _, alloc, state in seen if alloc < nv.GPUS), seen
    assert nv.gpu_counts(e.node) == (nv.GPUS, nv.GPUS)
    (reset,) = jobs(e, "gpuhealth-reset-")
    (validation,) = jobs(e, "gpuhealth-validate-")
    assert ended(e, reset) == ended(e, validation) == "Complete"
    ran_in_a_real_container(e, reset, f"GPU {a} {FAKE_UUIDS[a]}: reset")
    ran_in_a_real_container(e, validation, f"GPU {a} {FAKE_UUIDS[a]}: diagnostic passed")
    plugin_after = e.plugins.plugin_pod()
    assert plugin_after["metadata"]["uid"] != plugin_before["metadata"]["uid"], "the operator restarted the plugin"
    e.kube.await_events(name, "GPUReset", "RestartingDevicePlugin", "DevicePluginOffersGPU", "ReturnedToService")
    reasons = [ev.reason for ev in e.kube.node_events(name)]
    assert "DevicePluginNotRestarted" not in reasons and "DevicePluginWithholdsGPU" not in reasons, reasons
    # The pods on the other GPUs never noticed any of it, and the node was never cordoned or tainted.
    for pod in ("second-gpu", "third-gpu"):
        assert untouched(e, before[pod]), f"{pod} was touched"
    assert gpu_out(e) is None and e.kube.our_taint(name) is None and not cordoned(e)
    wait_for(lambda: e.kube.report(name)["status"].get("inServiceGPUs") == nv.GPUS, timeout=30, what="8 in service")
    del e.pods["one-gpu"]


def test_an_ecc_fault_the_plugin_does_not_see_taints_the_node_noschedule_and_moves_only_its_pod(env: Env) -> None:
    e, name = env, env.node.name
    assert "second-gpu" in e.pods, "runs after the XID 48 test"
    b, c = e.pods["second-gpu"], e.pods["third-gpu"]
    before = {n: p for n in ("second-gpu", "third-gpu") if (p := get_pod(e, n)) is not None}
    e.plugins.write_facts([f"gpu {b} ecc_volatile_uncorrected 1", f"gpu {b} ecc_aggregate_uncorrected 1"])
    taint = wait_for(lambda: gpu_out(e), timeout=90, what="gpuhealth's gpu-out taint")
    assert (taint["value"], taint["effect"]) == (f"gpu-{b}", "NoSchedule"), taint
    wait_for(lambda: gone(e, before["second-gpu"]), timeout=90, what="second-gpu evicted")
    assert device(e, b)["keptOffBy"] == "NodeTaint"
    assert nv.gpu_counts(e.node) == (nv.GPUS, nv.GPUS), "the plugin does not see an ECC counter"
    assert e.kube.our_taint(name) is None and not cordoned(e), "one GPU's fault must not take the node"
    assert untouched(e, before["third-gpu"]), f"third-gpu (GPU {c}) was touched"
    status = e.kube.report(name)["status"]
    assert status["state"] == "Degraded" and status["inServiceGPUs"] == nv.GPUS - 1, status
    events = " ".join(ev.message for ev in e.kube.await_events(name, "DeviceQuarantined"))
    assert f"{WORKLOADS}/second-gpu" in events and "node tainted NoSchedule" in events, events
    del e.pods["second-gpu"]


def test_gfd_labels_the_node_with_the_reports_fabric_clique(env: Env) -> None:
    labels = env.plugins.apply_gfd_labels()
    assert labels[nv.CLIQUE_LABEL] == f"{CLUSTER_UUID}.{CLIQUE}"
    node = json.loads(env.node.cluster.kubectl("get", "node", env.node.name, "-o", "json").stdout)
    got = node["metadata"]["labels"]
    assert got[nv.CLIQUE_LABEL] == f"{CLUSTER_UUID}.{CLIQUE}"
    assert got["nvidia.com/gpu.count"] == str(nv.GPUS) and got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert got["nvidia.com/gpu.machine"] == "NVIDIA-DGX-H100"
    # The same clique gpuhealth's agent reports from NVML's fabric info, on every GPU.
    devices = env.kube.report(env.node.name)["spec"]["devices"]
    cliques = {
        f"{(d.get('fabric') or {}).get('clusterUuid')}.{(d.get('fabric') or {}).get('cliqueId')}" for d in devices
    }
    assert cliques == {got[nv.CLIQUE_LABEL]}, cliques


def test_a_fabric_fault_takes_out_the_nvlink_domain_the_gfd_label_names(env: Env) -> None:
    """ROUTE_UNHEALTHY on one GPU is its NVLink domain's fault (docs/devices.md, "Topology"): every node
    whose ``nvidia.com/gpu.clique`` is this node's leaves service as one decision, here the node alone."""
    e, name = env, env.node.name
    sick = e.pods["third-gpu"]
    before = get_pod(e, "third-gpu")
    assert before is not None
    at = time.monotonic()
    e.plugins.write_facts([f"gpu {sick} fabric_mask {ROUTE_UNHEALTHY_MASK:#x}", f"gpu {sick} fabric_summary 2"])
    taint = wait_for(lambda: e.kube.our_taint(name), timeout=120, what="the node taken out for its domain")
    assert taint["value"] == "ImexDomain" and cordoned(e)
    status = e.kube.report(name)["status"]
    assert status["reason"] == "ImexDomain", status
    domain = f"NVLink domain {nv.CLIQUE_LABEL}={CLUSTER_UUID}.{CLIQUE} (1 node"  # the label, this node alone
    assert domain in status["message"], status["message"]
    wait_for(lambda: gone(e, before), timeout=120, what="the domain's node drained")
    print(f"domain out and drained {time.monotonic() - at:.1f}s after the fabric fault")
