"""Kueue's manager beside the local control plane, for the tests that need it (never a mock).

``hack/build-kueue.sh`` builds ``cmd/kueue`` and copies the CRDs and webhook configurations of the
same module (version pinned in ``hack/versions.env``). Here Kueue runs as a plain process with its
own kubeconfig, its internal cert management off: its webhook server listens on 127.0.0.1 with a
serving certificate signed by the test cluster's CA, and the API server reaches it by URL (the
webhook configurations and the CRD conversion webhooks are rewritten from ``service`` to ``url``).
Only the webhooks of what runs here are installed: Kueue's own kinds and batch/v1 Jobs. They are
removed before Kueue stops, so nothing else in the cluster ever waits on a webhook that is gone.
The process is recorded in the cluster's pidfile, so ``make cluster-down`` stops it too.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import ipaddress
import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devkit import pidfile
from devkit.cluster import REPO, ClusterError, LocalCluster, free_port
from devkit.k8s import Kube
from devkit.proc import Proc
from devkit.workloads import indexed_training_job

BUILD_SCRIPT = REPO / "hack" / "build-kueue.sh"
NAMESPACE = "kueue-system"
# The CRDs Kueue's own kustomization serves through its conversion webhook.
CONVERTED = ("workloads", "localqueues", "clusterqueues", "cohorts", "multikueueclusters")
WEBHOOK_CONFIGS = ("kueue-mutating-webhook-configuration", "kueue-validating-webhook-configuration")


class KueueError(ClusterError):
    """Kueue could not be built or started: the tests that need it fail, never skip."""


@functools.cache
def kueue_dir() -> Path:
    """Build (first time) or locate (cached) the Kueue manager, CRDs and webhook configurations."""
    if env := os.environ.get("GPUHEALTH_KUEUE_DIR"):
        return Path(env)
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise KueueError(f"hack/build-kueue.sh failed with exit code {proc.returncode}")
    out = Path(lines[-1])
    for needed in ("kueue", "crds", "webhooks.yaml"):
        if not (out / needed).exists():
            raise KueueError(f"{out / needed} missing after hack/build-kueue.sh")
    return out


def _serving_cert(pki: Path, out: Path) -> None:
    """tls.crt/tls.key for 127.0.0.1, signed by the test cluster's CA (which the API server trusts)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kueue-webhook")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )


def _ours(path: str) -> bool:
    """Webhooks of what this Kueue serves: its own kinds and batch/v1 Jobs (the only integration on)."""
    return "-kueue-x-k8s-io-" in path or path.endswith("-batch-v1-job")


def webhook_configs(source: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, reduced to ours and pointed at ``url`` instead of a Service."""
    out = []
    for doc in yaml.safe_load_all(source.read_text()):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if _ours(path):
                hook["clientConfig"] = {"url": url + path, "caBundle": ca_bundle}
                hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def crds(source: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's CRDs, with the conversion webhook of those Kueue converts reached at ``url``."""
    out = []
    for f in sorted(source.glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": url + "/convert", "caBundle": ca_bundle},
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


@dataclass
class Kueue:
    """One Kueue manager for ``cluster``; ``start`` installs and runs it, ``stop`` removes its webhooks
    and stops it. CRDs stay (other objects may still exist; they cost nothing without Kueue)."""

    cluster: LocalCluster
    # Extra feature gates (``Name=true``) and ``resources.deviceClassMappings`` of its configuration:
    # with ``DynamicResourceAllocation=true`` and a mapping, Kueue counts a Workload's DRA claims of a
    # mapped DeviceClass as that quota resource.
    feature_gates: tuple[str, ...] = ()
    device_class_mappings: list[dict[str, Any]] = field(default_factory=list)
    workdir: Path = field(default_factory=Path)
    proc: Proc | None = None
    webhook_port: int = 0

    def start(self, timeout: float = 90.0) -> Kueue:
        bin_dir = kueue_dir()
        self.workdir = self.cluster.workdir / "kueue"
        self.workdir.mkdir(exist_ok=True)
        pki = self.cluster.workdir / "pki"
        certs = self.workdir / "certs"
        _serving_cert(pki, certs)
        import base64

        ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        self.webhook_port = free_port()
        url = f"https://127.0.0.1:{self.webhook_port}"
        kubeconfig = self.workdir / "kubeconfig"
        kubeconfig.write_text(self.cluster.kubeconfig.read_text())
        self.cluster.apply_objects(crds(bin_dir / "crds", url, ca_bundle))
        self._wait_established(timeout)
        self.cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        health = free_port()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": self.webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": ["batch/job"]},
        }
        if self.device_class_mappings:
            config["resources"] = {"deviceClassMappings": self.device_class_mappings}
        (self.workdir / "config.yaml").write_text(yaml.safe_dump(config))
        self.proc = Proc(
            "kueue",
            [
                str(bin_dir / "kueue"),
                f"--config={self.workdir / 'config.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--visibility-server-port={free_port()}",
                "--feature-gates=" + ",".join(("VisibilityOnDemand=false", *self.feature_gates)),
                "--zap-log-level=2",
            ],
            self.workdir / "kueue.log",
        )
        # Its metrics certificate: where a real install mounts one (hack/build-kueue.sh explains).
        self.proc.start(env={**os.environ, "KUEUE_METRICS_CERT_DIR": str(certs)})
        assert self.proc.pid is not None
        pidfile.record(self.cluster.workdir, {"kueue": self.proc.pid})
        try:
            self._wait_ready(health, timeout)
            # Webhooks only once it serves them: a configuration without its server fails every Job.
            self.cluster.apply_objects(webhook_configs(bin_dir / "webhooks.yaml", url, ca_bundle))
            self._wait_webhooks(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_established(self, timeout: float) -> None:
        names = [f"crd/{p}.kueue.x-k8s.io" for p in ("workloads", "clusterqueues", "localqueues", "admissionchecks")]
        deadline = time.monotonic() + timeout
        while True:  # right after the apply a CRD may not have conditions yet: kubectl wait then errors
            proc = self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=10s", *names, check=False)
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise KueueError(f"Kueue's CRDs not established in {timeout}s: {proc.stderr.strip()}")
            time.sleep(0.5)

    def _wait_ready(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if not self.proc.alive():
                raise KueueError(f"kueue exited; see {self.proc.log}:\n{self.proc.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise KueueError(f"kueue not ready in {timeout}s; see {self.workdir / 'kueue.log'}")

    def _wait_webhooks(self, timeout: float) -> None:
        """Until the API server calls Kueue's webhooks (a dry-run ResourceFlavor goes through both)."""
        probe = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "webhook-probe"},
        }
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            proc = self.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False)
            if proc.returncode == 0:
                return
            last = proc.stderr.strip()
            time.sleep(0.5)
        raise KueueError(f"Kueue's webhooks not answering in {timeout}s: {last}")

    def stop(self) -> None:
        self.cluster.kubectl(
            "delete",
            "--ignore-not-found",
            "--wait=false",
            *[
                f"{kind}/{name}"
                for kind, name in zip(
                    ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"), WEBHOOK_CONFIGS, strict=True
                )
            ],
            check=False,
        )
        if self.proc is not None:
            self.proc.stop()


# -- what the Kueue tests write and read -----------------------------------------------------------

KG, KV = "kueue.x-k8s.io", "v1beta2"
CONTROLLER = "gpuhealth.dev/healthy-capacity"


def kueue_queue(
    cluster: LocalCluster, group: str, ns: str, gpus: int, with_check: bool = True, resource: str = "nvidia.com/gpu"
) -> str:
    """A ResourceFlavor for the group's nodes, gpuhealth's AdmissionCheck, a ClusterQueue using both
    with ``gpus`` of quota (of ``resource``), and a LocalQueue in ``ns``; returns the AdmissionCheck's name."""
    check = f"gpuhealth-{group}"[:63]
    cluster.apply_objects(
        [
            {
                "apiVersion": f"{KG}/{KV}",
                "kind": "ResourceFlavor",
                "metadata": {"name": f"gpu-{group}"[:63]},
                "spec": {"nodeLabels": {"gpuhealth-test": group}},
            },
            {
                "apiVersion": f"{KG}/{KV}",
                "kind": "AdmissionCheck",
                "metadata": {"name": check},
                "spec": {"controllerName": CONTROLLER},
            },
            {
                "apiVersion": f"{KG}/{KV}",
                "kind": "ClusterQueue",
                "metadata": {"name": f"cq-{group}"[:63]},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "resourceGroups": [
                        {
                            "coveredResources": [resource],
                            "flavors": [
                                {
                                    "name": f"gpu-{group}"[:63],
                                    "resources": [{"name": resource, "nominalQuota": gpus}],
                                }
                            ],
                        }
                    ],
                    **({"admissionChecksStrategy": {"admissionChecks": [{"name": check}]}} if with_check else {}),
                },
            },
            {
                "apiVersion": f"{KG}/{KV}",
                "kind": "LocalQueue",
                "metadata": {"name": "training", "namespace": ns},
                "spec": {"clusterQueue": f"cq-{group}"[:63]},
            },
        ]
    )
    return check


def cq_active(cluster: LocalCluster, group: str) -> bool:
    out = cluster.kubectl("get", "clusterqueue", f"cq-{group}"[:63], "-o", "json").stdout
    conds = json.loads(out).get("status", {}).get("conditions") or []
    return any(c["type"] == "Active" and c["status"] == "True" for c in conds)


def queued_job(name: str, prefer: str, ns: str, group: str, ranks: int = 4) -> dict[str, Any]:
    job = indexed_training_job(name, prefer, ranks=ranks, namespace=ns, node_selector={"gpuhealth-test": group})
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "training"}
    job["spec"]["suspend"] = True
    return job


def claiming(job: dict[str, Any], template: str) -> dict[str, Any]:
    """``job`` whose ranks get their GPUs from a claim of ``template`` each (DRA), not ``nvidia.com/gpu``."""
    spec = job["spec"]["template"]["spec"]
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    for c in spec["containers"]:
        c["resources"] = {"claims": [{"name": "gpu"}]}
    return job


def workload(kube: Kube, ns: str, job: str) -> dict[str, Any] | None:
    items = kube.custom.list_namespaced_custom_object(KG, KV, ns, "workloads")["items"]
    return next(
        (w for w in items if any(r.get("name") == job for r in w["metadata"].get("ownerReferences") or [])), None
    )


def our_check(wl: dict[str, Any] | None, check: str) -> dict[str, Any]:
    for c in ((wl or {}).get("status") or {}).get("admissionChecks") or []:
        if c["name"] == check:
            return c  # type: ignore[no-any-return]
    return {}


def cond(wl: dict[str, Any] | None, type_: str) -> bool:
    return any(
        c["type"] == type_ and c["status"] == "True" for c in ((wl or {}).get("status") or {}).get("conditions") or []
    )


def evictions(wl: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list((((wl or {}).get("status") or {}).get("schedulingStats") or {}).get("evictions") or [])


def workload_events(kube: Kube, ns: str, name: str, reason: str) -> list[Any]:
    evs = kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e for e in evs if e.reason == reason and e.involved_object.kind == "Workload"]
