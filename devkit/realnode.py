"""A real kubelet node beside the control plane: containerd, runc, the bridge CNI, host processes.

``hack/build-node.sh`` builds containerd and the kubelet (the control plane's Kubernetes version)
from Go modules and a local ``registry.k8s.io/pause`` image; runc, the CNI plugins and nftables
come from Debian (``hack/install-node-packages.sh``). This module runs them as processes of its
own, started and stopped by recorded pid like the control plane (devkit/cluster.py), and joins the
node to a :class:`~devkit.cluster.LocalCluster` whose API server listens on the node's address.

What stands in for the rest of a node:

- kube-proxy: one nft DNAT rule from the ``kubernetes`` Service IP:443 to the API server, so pods'
  in-cluster config works (pods cannot reach the host's loopback).
- NVIDIA's container toolkit: the ``nvidia`` runtime handler (devkit/nvidia_runc.py) bind-mounts
  the fake NVML library where the toolkit mounts the real one, for containers that ask for GPUs;
  the RuntimeClass ``nvidia`` selects it, as the chart's ``agent.runtimeClassName`` does.

:class:`Installed` is the one bring-up the real-node test and ``make demo REAL_NODE=1`` share: the
image, the control plane (with or without KWOK nodes beside), the node, and ``helm install`` of
charts/gpuhealth with that image, as a user installs it.

Everything the node changes on the host is recorded before it is changed and undone by
:meth:`RealNode.stop`, by the next start if a run was killed, and by ``make cluster-down``
(devkit/realnode_host.py says what and how). The
kubelet runs without ``/usr/sbin`` on its PATH so it finds no ``iptables`` and writes no chains
(it needs none: there is no kube-proxy). One real node per machine at a time (a lock).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from devkit import pidfile
from devkit.buildscript import built
from devkit.chart import CHART
from devkit.cluster import ClusterError, LocalCluster, free_port
from devkit.fakenvml.build import build_fake_nvml
from devkit.k8s import wait_for
from devkit.proc import Proc
from devkit.realnode_host import BRIDGE, LOCK, NFT_TABLE, STATE, STATE_DIR, record_host, teardown

REPO = Path(__file__).resolve().parents[1]
POD_SUBNET = "10.250.0.0/24"
SERVICE_IP = "10.96.0.1"  # the first address of devkit/cluster.py's --service-cluster-ip-range
RUNTIME_CLASS = "nvidia"
BUILD_NODE = REPO / "hack" / "build-node.sh"
BUILD_IMAGE = REPO / "hack" / "build-image.sh"
RUNC_WRAPPER = Path(__file__).with_name("nvidia_runc.py")


class RealNodeError(ClusterError):
    """The real node could not be built, started or cleaned up; the tier fails, never skips."""


def node_bin_dir() -> Path:
    """containerd, ctr, the shim, the kubelet and pause.tar (built once, then cached)."""
    return (
        Path(os.environ["GPUHEALTH_NODE_BIN_DIR"])
        if "GPUHEALTH_NODE_BIN_DIR" in os.environ
        else built(BUILD_NODE, RealNodeError)
    )


@dataclass(frozen=True)
class Image:
    """gpuhealth's image as hack/build-image.sh built it from the Dockerfile."""

    archive: Path
    ref: str  # e.g. localhost/gpuhealth:dev-0123456789abcdef
    id: str  # the config digest, sha256:...

    @property
    def repository(self) -> str:
        return self.ref.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


def built_image() -> Image:
    out = built(BUILD_IMAGE, RealNodeError)
    image_id = (out / "id").read_text().strip()
    return Image(out / "image.tar", (out / "ref").read_text().strip(), f"sha256:{image_id.removeprefix('sha256:')}")


def node_address() -> str:
    """The host's address on its default route: the API server listens and advertises there."""
    out = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.255"], capture_output=True, text=True)
    words = out.stdout.split()
    if out.returncode == 0 and "src" in words:
        return words[words.index("src") + 1]
    raise RealNodeError(f"no IPv4 default route to take the node's address from: {out.stderr.strip()}")


def apiserver_args(address: str) -> list[str]:
    """What a LocalCluster needs so that pods reach its API server (given to ``apiserver_args``)."""
    return ["--bind-address=0.0.0.0", f"--advertise-address={address}"]


# -- the node ----------------------------------------------------------------------------------------


@dataclass
class RealNode:
    """containerd + kubelet in ``workdir``, registered as ``name`` with ``cluster``."""

    cluster: LocalCluster
    workdir: Path
    name: str = "real-gpu-node"
    labels: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    address: str = ""
    bin_dir: Path | None = None
    procs: dict[str, Proc] = field(default_factory=dict)
    _lock: IO[str] | None = None

    # The fake NVML the nvidia runtime mounts into GPU containers, and its scenario.
    @property
    def nvml_dir(self) -> Path:
        return self.workdir / "nvml"

    @property
    def scenario(self) -> Path:
        return self.nvml_dir / "scenario" / "scenario"

    @property
    def emit_log(self) -> Path:
        return self.nvml_dir / "out" / "emitted"

    @property
    def pod_resources_dir(self) -> Path:
        """The kubelet's pod-resources directory (``<--root-dir>/pod-resources``): ``kubelet.sock``."""
        return self.workdir / "kubelet" / "root" / "pod-resources"

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        assert self.bin_dir
        proc = subprocess.run(
            [str(self.bin_dir / "ctr"), f"--address={self.socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def start(self, library: Path, images: Sequence[Path] = ()) -> RealNode:
        """Join the node, with ``library`` as its fake NVML and ``images`` (archives) imported."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bin_dir = self.bin_dir or node_bin_dir()
        self.address = self.address or node_address()
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        lock = open(LOCK, "w")  # noqa: SIM115 (held until stop)
        fcntl.flock(lock, fcntl.LOCK_EX)
        self._lock = lock
        try:
            teardown()  # a killed run's leftovers, from its own record
            self._record()
            self._prepare_nvml(library)
            self._start_containerd()
            for archive in [self.bin_dir / "pause.tar", *images]:
                self.ctr("images", "import", str(archive), timeout=300)
            self._network()
            self._start_kubelet()
            self._wait_ready()
            self.cluster.apply_objects(
                [
                    {
                        "apiVersion": "node.k8s.io/v1",
                        "kind": "RuntimeClass",
                        "metadata": {"name": RUNTIME_CLASS},
                        "handler": RUNTIME_CLASS,
                    }
                ]
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _record(self) -> None:
        assert self.bin_dir
        state = {
            "workdir": str(self.workdir),
            "containerd_socket": str(self.socket),
            "ctr": str(self.bin_dir / "ctr"),
            "cluster_workdir": str(self.cluster.workdir),
            "host": record_host(),
        }
        tmp = STATE.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, STATE)

    def _prepare_nvml(self, library: Path) -> None:
        (self.nvml_dir / "scenario").mkdir(parents=True, exist_ok=True)
        (self.nvml_dir / "out").mkdir(parents=True, exist_ok=True)
        lib = self.nvml_dir / "libnvidia-ml.so.1"
        shutil.copyfile(library, lib)
        # The agent runs as 65532: the library and the scenario must be readable, the log writable.
        lib.chmod(0o755)
        for d in (self.nvml_dir, self.nvml_dir / "scenario"):
            d.chmod(0o755)
        (self.nvml_dir / "out").chmod(0o777)
        self.write_scenario([])
        # Every ancestor of the run's directory must be traversable by 65532 for the bind mounts.
        for parent in self.workdir.parents:
            if parent == Path("/"):
                break
            mode = parent.stat().st_mode
            if not mode & 0o001:
                parent.chmod(mode | 0o001)

    def write_scenario(self, lines: list[str]) -> None:
        tmp = self.scenario.with_suffix(".tmp")
        tmp.write_text("".join(f"{line}\n" for line in lines))
        tmp.chmod(0o644)
        os.replace(tmp, self.scenario)  # atomic: the library never reads half a file

    def _proc(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(name, args, self.workdir / f"{name}.log")
        self.procs[name] = p
        p.start(env)
        pidfile.record(self.workdir / f"{name}-pids", {name: p.pid or 0})
        return p

    def _start_containerd(self) -> None:
        assert self.bin_dir
        d = self.workdir / "containerd"
        (d / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        wrapper = d / "nvidia-runc"
        runc = shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin:/bin")
        if not runc:
            raise RealNodeError("runc not found: bash hack/install-node-packages.sh")
        wrapper.write_text(
            "#!/bin/sh\n"
            f"exec /usr/bin/python3 {RUNC_WRAPPER} --runc {runc} --lib {self.nvml_dir / 'libnvidia-ml.so.1'} "
            f'--scenario-dir {self.nvml_dir / "scenario"} --emit-dir {self.nvml_dir / "out"} -- "$@"\n'
        )
        wrapper.chmod(0o755)
        cri = "plugins.'io.containerd.cri.v1.runtime'"
        runtimes = f"{cri}.containerd.runtimes"
        config = f"""version = 3
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{d / "opt"}"
[{cri}]
  # The rootless setting: this machine cannot lower oom_score_adj (no CAP_SYS_RESOURCE), and
  # without it every sandbox fails in runc create.
  restrict_oom_score_adj = true
[{cri}.containerd]
  default_runtime_name = "runc"
[{runtimes}.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtimes}.runc.options]
  BinaryName = "{runc}"
  Root = "{d / "runc"}"
[{runtimes}.{RUNTIME_CLASS}]
  runtime_type = "io.containerd.runc.v2"
[{runtimes}.{RUNTIME_CLASS}.options]
  BinaryName = "{wrapper}"
  Root = "{d / "runc"}"
[{cri}.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "{d / "cni" / "net.d"}"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "registry.k8s.io/pause:3.10.2"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        (d / "config.toml").write_text(config)
        p = self._proc("containerd", [str(self.bin_dir / "containerd"), f"--config={d / 'config.toml'}"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.socket.exists() and self.ctr("version", check=False, timeout=10).returncode == 0:
                return
            if not p.alive():
                raise RealNodeError(f"containerd exited; see {p.log}")
            time.sleep(0.2)
        raise RealNodeError(f"containerd did not answer in 60s; see {p.log}")

    def _network(self) -> None:
        """The bridge CNI for pods, and the Service IP of the API server for their in-cluster config."""
        conf = {
            "cniVersion": "1.0.0",
            "name": "gpuhealth-realnode",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "containerd" / "cni" / "ipam"),
                    },
                }
            ],
        }
        (self.workdir / "containerd" / "cni" / "net.d" / "10-gpuhealth.conflist").write_text(json.dumps(conf))
        rules = (
            f"table ip {NFT_TABLE} {{\n"
            "  chain prerouting {\n"
            "    type nat hook prerouting priority dstnat; policy accept;\n"
            f"    ip daddr {SERVICE_IP} tcp dport 443 dnat to {self.address}:{self.cluster.api_port}\n"
            "  }\n"
            "}\n"
        )
        out = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if out.returncode != 0:
            raise RealNodeError(f"nft: {out.stderr.strip()}")

    def _start_kubelet(self) -> None:
        assert self.bin_dir
        d = self.workdir / "kubelet"
        (d / "pki").mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This machine mounts cgroup v1 hierarchies; v1.37 runs on them only when told to.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": self.address,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True}},
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.workdir / "pod-logs"),
            "resolvConf": "/etc/resolv.conf",
            "clusterDomain": "cluster.local",
            "failSwapOn": False,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 99,
            "imageGCLowThresholdPercent": 98,
            "serializeImagePulls": False,
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "localStorageCapacityIsolation": True,
        }
        (d / "config.json").write_text(json.dumps(config))
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        # No /usr/sbin: the kubelet then finds no iptables and writes no chains on the host.
        env = {**os.environ, "PATH": "/usr/local/bin:/usr/bin:/bin"}
        self._proc(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={d / 'config.json'}",
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--root-dir={d / 'root'}",
                f"--cert-dir={d / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.address}",
                f"--node-labels={labels}",
                "--v=1",
            ],
            env=env,
        )

    def _wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.cluster.kubectl(
                "get",
                "node",
                self.name,
                "--ignore-not-found",
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status} {.spec.taints[*].key}",
                check=False,
            ).stdout
            if out.startswith("True") and "node.kubernetes.io/" not in out:
                return
            if not self.procs["kubelet"].alive():
                raise RealNodeError(f"the kubelet exited; see {self.procs['kubelet'].log}")
            time.sleep(0.5)
        raise RealNodeError(f"{self.name} not Ready in {timeout}s; see {self.workdir}/kubelet.log")

    def container_id(self, namespace: str, pod: str, container: str) -> str:
        status = json.loads(self.cluster.kubectl("get", "pod", "-n", namespace, pod, "-o", "json").stdout)["status"]
        for c in status.get("containerStatuses") or []:
            if c["name"] == container and c.get("containerID"):
                return str(c["containerID"]).split("://", 1)[1]
        raise RealNodeError(f"{namespace}/{pod} has no running container {container}")

    def kill_container(self, container_id: str) -> None:
        """SIGKILL a container's processes (a crash the kubelet answers with a restart)."""
        self.ctr("tasks", "kill", "--signal=SIGKILL", container_id)

    def stop(self) -> list[str]:
        """Stop everything and undo every host change; returns what was undone."""
        try:
            done = teardown(control_plane=False)
            for p in self.procs.values():
                p.stop(signal.SIGKILL)
            return done
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None


# -- the chart installed on the node -------------------------------------------------------------------

NAMESPACE = "gpuhealth-system"
RELEASE = "gpuhealth"
# The real node is also where the operator runs (a real cluster runs it off its GPU nodes, which the
# chart's default affinity prefers): it tolerates its own node's quarantine and cordon.
OPERATOR_TOLERATIONS = [
    {"key": "gpuhealth.dev/unhealthy", "operator": "Exists"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]


def pods(cluster: LocalCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return list(json.loads(out)["items"])


def ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return pod["metadata"].get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conds
    )


@dataclass
class Installed:
    """The control plane, the real node with gpuhealth's image imported, and the chart's release on it."""

    cluster: LocalCluster
    node: RealNode
    image: Image

    @classmethod
    def start(
        cls, workdir: Path, *, kwok_nodes: int = 0, audit_users: Sequence[str] = (), name: str = "real-gpu-node"
    ) -> Installed:
        """Build (or take from the cache) the image and the node's pieces; start the cluster and the node."""
        image = built_image()
        library = build_fake_nvml(workdir / "lib")
        cluster = LocalCluster(
            workdir / "cluster",
            nodes=kwok_nodes,
            apiserver_args=apiserver_args(node_address()),
            audit_users=audit_users,
        )
        cluster.start()
        node = RealNode(cluster, workdir / "node", name=name)
        try:
            node.start(library, [image.archive])
        except BaseException:
            cluster.stop()
            raise
        return cls(cluster, node, image)

    def stop(self) -> None:
        try:
            self.node.stop()
        finally:
            self.cluster.stop()

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        out = self.cluster.helm(*args)
        if out.returncode != 0:
            raise RealNodeError(f"helm {args[0]}: {out.stdout}{out.stderr}")
        return out

    def install(
        self, policy: Mapping[str, Any] | None, values: Sequence[str] = (), *, pod_resources: bool = False
    ) -> None:
        """``helm install`` of charts/gpuhealth with the built image (pull policy Never), one operator
        replica on the real node and the agent under the RuntimeClass ``nvidia``, into a namespace
        labelled for Pod Security "restricted" (docs/install.md); ``policy``: the chart's first
        policy's spec (merged over the chart's), None for no policy of the chart's; ``values``:
        further ``--set`` style arguments; ``pod_resources``: the agent reads this kubelet's
        pod-resources socket (``agent.podResources``, its directory under the node's ``--root-dir``),
        in a namespace labelled "privileged" as docs/install.md says it must be (a hostPath).
        Returns once every pod of the release is Ready."""
        self.cluster.kubectl("create", "namespace", NAMESPACE)
        level = "privileged" if pod_resources else "restricted"
        self.cluster.kubectl("label", "namespace", NAMESPACE, f"pod-security.kubernetes.io/enforce={level}")
        if pod_resources:
            values = [*self.pod_resources_values(), *values]
        chosen = (
            [f"--set-json=policy.spec={json.dumps(policy)}"] if policy is not None else ["--set=policy.create=false"]
        )
        self.helm(
            "install",
            RELEASE,
            str(CHART),
            f"--namespace={NAMESPACE}",
            f"--set=image.repository={self.image.repository}",
            f"--set=image.tag={self.image.tag}",
            "--set=image.pullPolicy=Never",
            f"--set=agent.runtimeClassName={RUNTIME_CLASS}",
            "--set=operator.replicas=1",
            f"--set-json=operator.tolerations={json.dumps(OPERATOR_TOLERATIONS)}",
            *chosen,
            *values,
            "--wait",
            "--timeout=300s",
        )

    def pod_resources_values(self) -> list[str]:
        """The chart values that make the agent read this node's kubelet's pod-resources socket."""
        return [
            "--set=agent.podResources.enabled=true",
            f"--set=agent.podResources.hostPath={self.node.pod_resources_dir}",
        ]

    def ready_pods(self, name: str, image: str | None = None) -> list[dict[str, Any]]:
        """The release's Ready pods of app ``name`` that run ``image`` (default: the built one), once
        no other pod of it is left; [] until then."""
        found = pods(self.cluster, NAMESPACE, f"app.kubernetes.io/name={name}")
        want = image or self.image.ref
        if not found or any(p["spec"]["containers"][0]["image"] != want or not ready(p) for p in found):
            return []
        return found

    def operator_pod(self, timeout: float = 180) -> dict[str, Any]:
        """The release's one operator Pod, Ready, on the real node."""
        (op,) = wait_for(lambda: self.ready_pods("gpuhealth-operator"), timeout=timeout, what="operator Ready")
        if op["spec"]["nodeName"] != self.node.name:
            raise RealNodeError(f"the operator Pod runs on {op['spec']['nodeName']}, not on {self.node.name}")
        return op
