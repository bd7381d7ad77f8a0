"""NVIDIA's device plugin and GPU Feature Discovery on the real node, deployed as the GPU Operator does.

``hack/build-nvidia-plugins.sh`` builds both commands of ``github.com/NVIDIA/k8s-device-plugin`` and
their image, tagged as NVIDIA's (:data:`IMAGE`). :meth:`NvidiaPlugins.deploy` imports it into the
:class:`~devkit.realnode.RealNode`'s containerd and applies two DaemonSets in :data:`NAMESPACE`, each
under the RuntimeClass ``nvidia`` with ``NVIDIA_VISIBLE_DEVICES=all`` (as the GPU Operator sets it on
its operands), so the runtime wrapper (devkit/nvidia_runc.py) mounts the fake NVML where the toolkit
mounts the driver's library, and both talk to it through go-nvml exactly as they talk to a driver:

- the device plugin (:data:`PLUGIN_SELECTOR`), with the kubelet's device-plugins directory mounted at
  ``/var/lib/kubelet/device-plugins`` (the kubelet keeps it there whatever its ``--root-dir``); it
  registers ``nvidia.com/gpu`` with the kubelet, answers its
  Allocate with the GPU's UUID in ``NVIDIA_VISIBLE_DEVICES`` and withholds a GPU after a critical XID
  (:meth:`NvidiaPlugins.write_xid`) until its pod restarts (:meth:`NvidiaPlugins.restart_plugin`);
- GPU Feature Discovery (:data:`GFD_SELECTOR`), writing its labels to the features file NFD's worker
  reads (``features.d/gfd``, a host directory of the run). Its PCI reader (go-nvlib's nvpci) opens the
  GPUs' PCI functions under ``/sys``: NVIDIA's manifest mounts the host's ``/sys``; here a fake sysfs
  tree of the fake NVML's GPUs (devkit/fakesysfs.py) is mounted in its place, with a DMI product name.

Node Feature Discovery is not run (docs/devices.md says why): :meth:`NvidiaPlugins.apply_gfd_labels`
stands in for its worker and master, putting the features file's labels on the Node as NFD does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit import fakesysfs
from devkit.buildscript import built
from devkit.k8s import wait_for
from devkit.realnode import RUNTIME_CLASS, RealNode, RealNodeError, pods, ready

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "hack" / "build-nvidia-plugins.sh"
IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"  # hack/versions.env NVIDIA_DEVICE_PLUGIN_IMAGE
NAMESPACE = "gpu-operator"
RESOURCE = "nvidia.com/gpu"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
PLUGIN_SELECTOR = f"app={PLUGIN_APP}"  # the GPU Operator's label on the plugin's pods
GFD_APP = "gpu-feature-discovery"
GFD_SELECTOR = f"app={GFD_APP}"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
FEATURES_IN_CONTAINER = "/etc/kubernetes/node-feature-discovery/features.d"
MACHINE = "NVIDIA DGX H100"
HOSTNAME = "kubernetes.io/hostname"

# The fake NVML's GPUs (devkit/fakenvml/fakenvml.c's defaults): their PCI buses and H100 SXM5's device id.
FAKE_PCI_BUS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
H100_SXM_DEVICE_ID = 0x2330
GPUS = len(FAKE_PCI_BUS)
# The kubelet's device-plugins directory, its registration socket and every plugin's: a path the kubelet
# keeps of its own (not under its --root-dir), so the host's; devkit/realnode_host.py removes it after a
# run that created it.
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")

# Every NVML function the device plugin and GFD v0.17.4 resolve on the fake, recorded from the dynamic
# linker's bindings (LD_DEBUG=bindings) while they labelled, registered, allocated and health-checked
# on the real node; tests/unit/agent/test_fakenvml_abi.py holds the fake to exporting each of them.
NVML_CALLS = frozenset(
    {
        "nvmlInit_v2",
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo_v2",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetGpuFabricInfo",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        "nvmlEventSetCreate",
        "nvmlEventSetFree",
        "nvmlEventSetWait_v2",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
    }
)


def nvml_bus_id(index: int) -> str:
    """GPU ``index``'s PCI bus id as the fake NVML answers it (``00000000:18:00.0``)."""
    return f"00000000:{FAKE_PCI_BUS[index]:02X}:00.0"


def fabric_scenario(cluster_uuid: str, clique_id: int) -> list[str]:
    """Scenario lines that put every GPU of the fake in one NVLink clique, registered with the fabric
    manager (state 3 = NVML_GPU_FABRIC_STATE_COMPLETED, status NVML_SUCCESS)."""
    return [
        "gpu * fabric_state 3",
        "gpu * fabric_status 0",
        f"gpu * fabric_cluster {cluster_uuid}",
        f"gpu * fabric_clique {clique_id}",
    ]


def xid_line(seq: int, gpu: int, code: int) -> str:
    """The fake NVML's scenario line for an XID on GPU ``gpu`` (delivered once per event set)."""
    return f"xid {seq} gpu {gpu} code {code}"


@dataclass(frozen=True)
class Built:
    """What hack/build-nvidia-plugins.sh leaves: the two commands and their image's archive."""

    bin_dir: Path

    @property
    def archive(self) -> Path:
        return self.bin_dir / "image.tar"

    @property
    def ref(self) -> str:
        return (self.bin_dir / "image.ref").read_text().strip()


def built_plugins() -> Built:
    """Build (first time) or find (cached) the device plugin, GFD and their image."""
    return Built(built(BUILD, RealNodeError))


def _daemonset(name: str, image: str, container: dict[str, Any], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    labels = {"app": name, "app.kubernetes.io/part-of": "gpu-operator"}
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, *container.pop("env", [])]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "runtimeClassName": RUNTIME_CLASS,
                    "priorityClassName": "system-node-critical",
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    # The GPU Operator's default, and gpuhealth's gpu-out taint as docs/install.md asks
                    # (the DaemonSet controller starts no pod on a node whose taint it does not tolerate).
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "gpuhealth.dev/gpu-out", "operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": name,
                            "image": image,
                            "imagePullPolicy": "Never",
                            "env": env,
                            **container,
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }


def plugin_daemonset(image: str, device_plugins: Path) -> dict[str, Any]:
    """NVIDIA's static manifest (deployments/static/nvidia-device-plugin.yml) as the GPU Operator runs it:
    envvar device lists of GPU UUIDs, no device specs (the node has no /dev/nvidia* to pass)."""
    return _daemonset(
        PLUGIN_APP,
        image,
        {
            "command": ["nvidia-device-plugin"],
            "env": [
                {"name": "FAIL_ON_INIT_ERROR", "value": "true"},
                {"name": "DEVICE_LIST_STRATEGY", "value": "envvar"},
                {"name": "DEVICE_ID_STRATEGY", "value": "uuid"},
                {"name": "MIG_STRATEGY", "value": "single"},
            ],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}],
        },
        [{"name": "device-plugin", "hostPath": {"path": str(device_plugins), "type": "Directory"}}],
    )


def gfd_daemonset(image: str, features: Path, sysfs: Path) -> dict[str, Any]:
    """NVIDIA's static GFD manifest (deployments/static/gpu-feature-discovery-daemonset.yaml): labels
    written to the features file every ``sleep-interval``, ``/sys`` from the host (here: the fake tree)."""
    return _daemonset(
        GFD_APP,
        image,
        {
            "command": ["gpu-feature-discovery"],
            "env": [
                {"name": "MIG_STRATEGY", "value": "single"},
                {"name": "GFD_SLEEP_INTERVAL", "value": "5s"},
                {"name": "GFD_NO_TIMESTAMP", "value": "true"},
            ],
            "volumeMounts": [
                {"name": "output-dir", "mountPath": FEATURES_IN_CONTAINER},
                {"name": "host-sys", "mountPath": "/sys", "readOnly": True},
            ],
        },
        [
            {"name": "output-dir", "hostPath": {"path": str(features), "type": "DirectoryOrCreate"}},
            {"name": "host-sys", "hostPath": {"path": str(sysfs), "type": "Directory"}},
        ],
    )


def write_fake_sysfs(root: Path, gpus: int = GPUS) -> None:
    """The fake NVML's GPUs as PCI functions, NUMA node per socket half (as the fake's topology), and the
    DMI product name GFD labels ``nvidia.com/gpu.machine`` from."""
    for i in range(gpus):
        fakesysfs.write_gpu_pci(root, nvml_bus_id(i), device_id=H100_SXM_DEVICE_ID, numa_node=i // 4)
    dmi = root / "class" / "dmi" / "id"
    dmi.mkdir(parents=True, exist_ok=True)
    (dmi / "product_name").write_text(MACHINE + "\n")
    for d in [root, *root.rglob("*")]:
        if d.is_dir():
            d.chmod(0o755)


def gpu_counts(node: RealNode) -> tuple[int, int]:
    """The Node's ``nvidia.com/gpu`` (capacity, allocatable) as the kubelet last reported them."""
    status = json.loads(node.cluster.kubectl("get", "node", node.name, "-o", "json").stdout)["status"]
    return (
        int((status.get("capacity") or {}).get(RESOURCE, "0")),
        int((status.get("allocatable") or {}).get(RESOURCE, "0")),
    )


def gpu_pod(
    name: str,
    namespace: str,
    image: str,
    container: str,
    *,
    node: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod asking for one ``nvidia.com/gpu`` that prints its environment (``NVIDIA_VISIBLE_DEVICES``,
    read back with ``container_log`` and ``uuid_in``) and stays up; pinned to ``node`` if given."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    spec: dict[str, Any] = {"nodeSelector": {HOSTNAME: node}} if node else {}
    spec |= {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": container,
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "env; exec sleep 3600"],
                "resources": {"limits": {RESOURCE: "1"}},
            }
        ],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def container_log(node: RealNode, pod: dict[str, Any]) -> str:
    """Every container log line of ``pod``, read on the node (without the CRI time/stream prefix)."""
    meta = pod["metadata"]
    d = node.workdir / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    lines: list[str] = []
    for f in sorted(d.glob("*/*.log")):
        lines += [ln.split(" ", 3)[-1] for ln in f.read_text(errors="replace").splitlines()]
    return "\n".join(lines)


@dataclass
class NvidiaPlugins:
    """The device plugin and GFD running on ``node``, over the fake NVML's scenario ``base`` (plus XIDs)."""

    node: RealNode
    image: str
    base: list[str] = field(default_factory=list)
    xids: list[str] = field(default_factory=list)

    @property
    def features_dir(self) -> Path:
        return self.node.workdir / "nfd" / "features.d"

    @property
    def sysfs(self) -> Path:
        return self.node.workdir / "nvidia-sysfs"

    @classmethod
    def deploy(cls, node: RealNode, base: Sequence[str] = (), built: Built | None = None) -> NvidiaPlugins:
        """Import the image, write the scenario ``base``, apply both DaemonSets and return once the plugin
        is Ready and the kubelet reports all the fake's GPUs allocatable."""
        b = built or built_plugins()
        node.ctr("images", "import", str(b.archive), timeout=300)
        plugins = cls(node, b.ref, list(base))
        plugins._write()
        write_fake_sysfs(plugins.sysfs)
        plugins.features_dir.mkdir(parents=True, exist_ok=True)
        node.cluster.kubectl("create", "namespace", NAMESPACE)
        daemonsets = [
            plugin_daemonset(b.ref, DEVICE_PLUGINS),
            gfd_daemonset(b.ref, plugins.features_dir, plugins.sysfs),
        ]
        for ds in daemonsets:  # the real node only: KWOK nodes beside it (the demo's) have no NVML to serve
            ds["spec"]["template"]["spec"]["nodeSelector"][HOSTNAME] = node.name
        node.cluster.apply_objects(daemonsets)
        plugins.plugin_pod()
        wait_for(lambda: gpu_counts(node) == (GPUS, GPUS), timeout=90, what=f"{GPUS} {RESOURCE} allocatable")
        return plugins

    def _write(self) -> None:
        self.node.write_scenario([*self.base, *self.xids])

    def write_facts(self, lines: Sequence[str]) -> None:
        """Scenario lines beside the base (ECC counters, a fabric mask...); a later line of the same fact
        wins, as the fake reads the file top to bottom. XIDs written so far stay."""
        self.base.extend(lines)
        self._write()

    def write_xid(self, gpu: int, code: int) -> int:
        """An XID on GPU ``gpu`` through the fake NVML, as the driver raises one; returns its sequence."""
        seq = len(self.xids) + 1
        self.xids.append(xid_line(seq, gpu, code))
        self._write()
        return seq

    def plugin_pod(self, timeout: float = 120, other_than: str = "") -> dict[str, Any]:
        """The plugin's one pod, Ready (and, with ``other_than``, not the pod of that uid)."""

        def one() -> dict[str, Any] | None:
            found = [
                p
                for p in pods(self.node.cluster, NAMESPACE, PLUGIN_SELECTOR)
                if p["spec"].get("nodeName") == self.node.name
            ]
            live = [p for p in found if p["metadata"]["uid"] != other_than]
            return live[0] if len(live) == 1 and len(found) == 1 and ready(live[0]) else None

        return wait_for(one, timeout=timeout, what="the device plugin's pod Ready")

    def restart_plugin(self) -> dict[str, Any]:
        """Delete the plugin's pod (its DaemonSet makes a new one): the only way NVIDIA's plugin forgets a
        GPU it marked Unhealthy. Returns the new pod, Ready."""
        old = self.plugin_pod()
        self.node.cluster.kubectl("delete", "pod", "-n", NAMESPACE, old["metadata"]["name"], "--wait=false")
        return self.plugin_pod(other_than=old["metadata"]["uid"])

    def features(self) -> dict[str, str]:
        """GFD's labels as it last wrote them to the features file ({} before its first write)."""
        path = self.features_dir / "gfd"
        if not path.exists():
            return {}
        pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        return {k.strip(): v.strip() for k, v in pairs}

    def apply_gfd_labels(self, timeout: float = 60) -> dict[str, str]:
        """The stand-in for Node Feature Discovery: once GFD has written its features file, put its labels
        on the Node as nfd-worker and nfd-master do (the ``nvidia.com`` names as they are). Returns them."""
        labels = wait_for(self.features, timeout=timeout, what="GFD's features file")
        self.node.cluster.kubectl(
            "label", "node", self.node.name, "--overwrite", *(f"{k}={v}" for k, v in sorted(labels.items()))
        )
        return labels


def uuid_in(env_dump: str) -> list[str]:
    """The GPU UUIDs ``NVIDIA_VISIBLE_DEVICES`` names in an ``env`` listing ([] when unset)."""
    for line in env_dump.splitlines():
        if line.startswith("NVIDIA_VISIBLE_DEVICES="):
            return [u for u in line.split("=", 1)[1].split(",") if u]
    return []
