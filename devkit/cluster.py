"""A real local Kubernetes control plane for tests, the demo and benchmarks.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as plain processes from the
binaries that ``hack/build-control-plane.sh`` builds; KWOK plays the kubelet of fake GPU nodes.
Nothing here is a mock: the scheduler really places pods, the controllers really recreate them, and
the API server really enforces schemas, CEL rules, RBAC, admission and PodDisruptionBudgets.

Only processes this module started are ever stopped, by their pid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit import pidfile
from devkit.buildscript import built
from devkit.gpunodes import gpu_node_manifest
from devkit.pki import kubeconfig_for, write_pki
from devkit.proc import Proc
from devkit.tools import kube_env, run

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "hack" / "build-control-plane.sh"
CRDS = REPO / "crds"

ADMIN_TOKEN = "gpuhealth-admin-token"
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/general/pod-create.yaml",
    "pod/general/pod-init-container-running.yaml",
    "pod/general/pod-init-container-completed.yaml",
    "pod/general/pod-ready.yaml",
    "pod/general/pod-delete.yaml",
)
# Stages of our own (devkit/kwok/): how gpuhealth's reset and validation Jobs end on KWOK nodes.
REPO_KWOK_STAGES = ("pod-remediation.yaml", "pod-validation.yaml")


class ClusterError(RuntimeError):
    """The control plane could not be built or started; tests must fail, never skip."""


def control_plane_bin_dir() -> Path:
    """Build (first time) or locate (cached) the control-plane binaries."""
    if env := os.environ.get("GPUHEALTH_BIN_DIR"):
        return Path(env)
    return built(BUILD_SCRIPT, ClusterError)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalCluster:
    """etcd + kube-apiserver + controller-manager + scheduler + kwok, in ``workdir``."""

    workdir: Path
    nodes: int = 4
    bin_dir: Path | None = None
    apiserver_args: Sequence[str] = ()
    # Extra static identities: token -> (user, groups). Benchmarks and chaos tests use them to tell
    # the operator's and the agents' requests apart in the audit log.
    extra_tokens: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # Users whose requests the API server writes to workdir/audit.log (Metadata level).
    audit_users: Sequence[str] = ()
    # etcd syncs its WAL to disk like a real one (the chaos suite's crash scenarios); off by default,
    # as the integration tests need speed more than durability.
    etcd_fsync: bool = False
    procs: dict[str, Proc] = field(default_factory=dict)
    etcd_port: int = 0
    api_port: int = 0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def kubectl_bin(self) -> str:
        return os.environ.get("KUBECTL", str(Path(sys.executable).parent / "kubectl"))

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bin_dir = self.bin_dir or control_plane_bin_dir()
        for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
            if not (self.bin_dir / b).exists():
                raise ClusterError(f"missing control-plane binary {self.bin_dir / b}")
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        if not (pki / "ca.crt").exists():
            write_pki(pki, ADMIN_TOKEN)
            with open(pki / "tokens.csv", "a") as f:
                for token, (user, groups) in self.extra_tokens.items():
                    f.write(f'{token},{user},{user},"{groups}"\n')
        self.etcd_port = self.etcd_port or free_port()
        self.api_port = self.api_port or free_port()
        self.kubeconfig.write_text(json.dumps(kubeconfig_for(self.server, pki / "ca.crt", ADMIN_TOKEN)))
        try:
            self._start_etcd()
            self._start_apiserver()
            self._wait_ready()
            self._start_controllers()
            self._start_kwok()
            self._write_pidfile()
            self.apply(CRDS)
            self.wait_crds_established()
            if self.nodes:
                self.add_gpu_nodes(self.nodes)
                self.wait_nodes_ready(self.nodes)
        except BaseException:
            self.stop()
            raise
        return self

    def _proc(self, name: str, args: list[str]) -> Proc:
        p = Proc(name, args, self.workdir / f"{name}.log")
        self.procs[name] = p
        p.start()
        return p

    def _start_etcd(self) -> None:
        peer = free_port()
        assert self.bin_dir
        self._proc(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                *([] if self.etcd_fsync else ["--unsafe-no-fsync"]),
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_port}/health", timeout=1) as r:
                    if b"true" in r.read():
                        return
            except OSError:
                pass
            if not self.procs["etcd"].alive():
                raise ClusterError(f"etcd exited; see {self.procs['etcd'].log}")
            time.sleep(0.2)
        raise ClusterError(f"etcd not healthy in 30s; see {self.procs['etcd'].log}")

    def _start_apiserver(self) -> None:
        pki = self.workdir / "pki"
        assert self.bin_dir
        self._proc(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                "--profiling=false",
                "--event-ttl=2h",
                "--endpoint-reconciler-type=none",
                *self._audit_args(),
                *self.apiserver_args,
            ],
        )

    def _audit_args(self) -> list[str]:
        if not self.audit_users:
            return []
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "users": list(self.audit_users)}, {"level": "None"}],
        }
        path = self.workdir / "audit-policy.json"
        path.write_text(json.dumps(policy))
        return [f"--audit-policy-file={path}", f"--audit-log-path={self.audit_log}", "--audit-log-format=json"]

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def kubeconfig_with_token(self, token: str, path: Path, user: str = "user") -> Path:
        """A kubeconfig for another identity on this cluster."""
        path.write_text(json.dumps(kubeconfig_for(self.server, self.workdir / "pki" / "ca.crt", token, user)))
        return path

    def _wait_ready(self, timeout: float = 90.0) -> None:
        ctx = ssl.create_default_context(cafile=str(self.workdir / "pki" / "ca.crt"))
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            req = urllib.request.Request(f"{self.server}/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            try:
                with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
                    if r.status == 200:
                        return
            except OSError as e:
                last = str(e)
            if not self.procs["kube-apiserver"].alive():
                raise ClusterError(f"kube-apiserver exited; see {self.procs['kube-apiserver'].log}")
            time.sleep(0.3)
        raise ClusterError(f"kube-apiserver not ready in {timeout}s ({last}); see its log")

    def _start_controllers(self) -> None:
        pki = self.workdir / "pki"
        kc = str(self.kubeconfig)
        assert self.bin_dir
        self._proc(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--controllers=*",
                "--concurrent-gc-syncs=5",
                "--node-monitor-grace-period=60s",
            ],
        )
        self._proc(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
            ],
        )

    def _start_kwok(self) -> None:
        assert self.bin_dir
        stages = self.bin_dir / "kwok-stages"
        self._proc(
            "kwok",
            [
                str(self.bin_dir / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{free_port()}",
                "--cidr=10.64.0.0/12",
                "--node-ip=10.0.0.1",
                *[f"--config={stages / s}" for s in KWOK_STAGES],
                *[f"--config={REPO / 'devkit' / 'kwok' / s}" for s in REPO_KWOK_STAGES],
            ],
        )

    def _write_pidfile(self) -> None:
        """Record pid and start time of each process (``make cluster-down`` stops exactly these)."""
        pidfile.record(self.workdir, {n: p.pid for n, p in self.procs.items() if p.pid is not None})

    def stop(self) -> None:
        for name in ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            if p := self.procs.get(name):
                p.stop()

    def restart(self, name: str, down_for: float = 0.0, sig: int = signal.SIGTERM) -> None:
        """Stop one component (``sig``: SIGKILL for a crash) and start it again with the same
        arguments (chaos scenarios)."""
        p = self.procs[name]
        p.stop(sig)
        time.sleep(down_for)
        p.start()
        if name == "kube-apiserver":
            self._wait_ready()
        self._write_pidfile()

    # -- helpers ---------------------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
            check=False,
            env=kube_env(self.kubeconfig),
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def helm(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """helm against this cluster (the caller reads the exit status)."""
        return run("helm", f"--kubeconfig={self.kubeconfig}", *args, timeout=timeout, env=kube_env(self.kubeconfig))

    def apply(self, path: Path | str) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))

    def apply_objects(self, objs: Iterable[dict[str, Any]]) -> None:
        """Apply as a stream of documents, never as a ``v1 List``: kubectl checks a List against the whole
        cluster's OpenAPI v2 document (which the API server rebuilds after every CRD change: 32 s and a
        timeout on a loaded machine, a failed test run), each plain object against its own group's v3."""
        stream = "\n---\n".join(json.dumps(obj) for obj in objs)
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=stream)

    def wait_crds_established(self) -> None:
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/gpuhealthpolicies.gpuhealth.dev",
            "crd/gpunodehealths.gpuhealth.dev",
        )

    def add_gpu_nodes(
        self,
        count: int,
        prefix: str = "gpu-node-",
        start: int = 0,
        gpus: int = 8,
        labels: Mapping[str, str] | None = None,
    ) -> list[str]:
        names = [f"{prefix}{i:04d}" for i in range(start, start + count)]
        nodes = [gpu_node_manifest(n, gpus=gpus, labels=labels) for n in names]
        for i in range(0, len(nodes), 200):
            chunk = nodes[i : i + 200]
            # --validate=false: the API server validates the Nodes anyway; kubectl's own check first fetches
            # the whole OpenAPI document, which on a loaded machine timed out (32 s) and failed a test run.
            self.kubectl(
                "create",
                "--validate=false",
                "-f",
                "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": chunk}),
            )
        return names

    def wait_nodes_ready(
        self, count: int, timeout: float = 120.0, selector: str = "nvidia.com/gpu.present=true"
    ) -> None:
        """Wait until ``count`` nodes are Ready *and schedulable*.

        A new node first gets the node controller's ``node.kubernetes.io/not-ready`` taint, lifted a
        moment after KWOK marks it Ready; a test that places pods before then sees them land
        elsewhere. So a node counts only once Ready without such a taint, seen twice in a row.
        """
        deadline = time.monotonic() + timeout
        ready = 0
        streak = 0
        while time.monotonic() < deadline:
            out = self.kubectl(
                "get",
                "nodes",
                "-l",
                selector,
                "-o",
                "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}"
                "{' '}{.spec.taints[*].key}{'\\n'}{end}",
            ).stdout
            ready = sum(
                1 for line in out.splitlines() if line.split()[:1] == ["True"] and "node.kubernetes.io/" not in line
            )
            streak = streak + 1 if ready >= count else 0
            if streak >= 2:
                return
            time.sleep(0.5)
        raise ClusterError(f"only {ready}/{count} fake GPU nodes became Ready and schedulable in {timeout}s")
