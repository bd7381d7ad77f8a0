"""Small helpers for tests and scripts that talk to the local control plane (real API, no mocks)."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import urllib3
from kubernetes import client, config

from devkit.cluster import LocalCluster, free_port

GROUP, VERSION = "gpuhealth.dev", "v1alpha1"
T = TypeVar("T")


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# What a poll may meet while the API server is briefly away or an object is not there yet. Anything
# else raised by a predicate (KeyError, TypeError, a failed assert) is a bug in the test or the code
# under test, and is raised at once instead of being waited out as a timeout.
TRANSIENT: tuple[type[BaseException], ...] = (client.exceptions.ApiException, urllib3.exceptions.HTTPError, OSError)


def wait_for(
    fn: Callable[[], T | Literal[False] | None], timeout: float = 30.0, interval: float = 0.2, what: str = "condition"
) -> T:
    """Poll until ``fn`` returns something truthy (the result, never None or False); fail with the last
    value otherwise. Only :data:`TRANSIENT` errors are polled through."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except TRANSIENT as e:  # the API may be briefly unavailable in chaos scenarios
            last = e
        if last and not isinstance(last, BaseException):
            return last  # type: ignore[no-any-return]
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def holds(fn: Callable[[], object], seconds: float, interval: float = 0.2, what: str = "condition") -> int:
    """Poll ``fn`` for ``seconds`` and fail the moment it is falsy: the opposite of :func:`wait_for`,
    for what must stay true for a while (a dead agent's node never turning Healthy). Returns the
    number of samples taken, so a caller can assert the window was really observed."""
    deadline = time.monotonic() + seconds
    samples = 0
    while time.monotonic() < deadline:
        try:
            ok = fn()
        except TRANSIENT:
            time.sleep(interval)  # the API briefly away says nothing either way
            continue
        if not ok:
            raise AssertionError(f"{what} stopped holding after {samples} samples")
        samples += 1
        time.sleep(interval)
    return samples


class Kube:
    """Typed-enough access to the test cluster."""

    def __init__(self, kubeconfig: Path) -> None:
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.policy = client.PolicyV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)

    def node(self, name: str) -> dict[str, Any]:
        return self.api.sanitize_for_serialization(self.core.read_node(name))  # type: ignore[no-any-return]

    def taints(self, name: str) -> list[dict[str, Any]]:
        return list(self.node(name)["spec"].get("taints") or [])

    def our_taint(self, name: str) -> dict[str, Any] | None:
        return next((t for t in self.taints(name) if t["key"] == "gpuhealth.dev/unhealthy"), None)

    def condition(self, name: str) -> dict[str, Any] | None:
        """The Node's GPUHealthy condition, or None. The operator writes it after the taint and cordon
        (a separate status patch), so a test waits for it rather than reading it with the taint."""
        conditions = (self.node(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "GPUHealthy"), None)

    def report(self, name: str) -> dict[str, Any]:
        return self.custom.get_cluster_custom_object(GROUP, VERSION, "gpunodehealths", name)  # type: ignore[no-any-return]

    def state(self, name: str) -> str | None:
        try:
            return (self.report(name).get("status") or {}).get("state")
        except client.ApiException:
            return None

    def _create_or_patch(self, plural: str, kind: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "spec": dict(spec)}
        try:
            return self.custom.create_cluster_custom_object(GROUP, VERSION, plural, body)  # type: ignore[no-any-return]
        except client.ApiException as e:
            if e.status != 409:
                raise
        return self.custom.patch_cluster_custom_object(  # type: ignore[no-any-return]
            GROUP, VERSION, plural, name, {"spec": dict(spec)}, _content_type="application/merge-patch+json"
        )

    def put_report(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Write a report the way the agent does (create or merge-patch the spec)."""
        return self._create_or_patch("gpunodehealths", "GPUNodeHealth", name, {"nodeName": name, **spec})

    def apply_policy(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        return self._create_or_patch("gpuhealthpolicies", "GPUHealthPolicy", name, spec)

    def get_policy(self, name: str) -> dict[str, Any]:
        return self.custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", name)  # type: ignore[no-any-return]

    def delete_policy(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", name)
        except client.ApiException as e:
            if e.status != 404:
                raise

    def node_events(self, name: str, reason: str | None = None) -> list[Any]:
        evs = self.core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
        return [e for e in evs if reason is None or e.reason == reason]

    def await_events(self, name: str, *reasons: str, timeout: float = 30.0) -> list[Any]:
        """The Node's Events of ``reasons``, once every one of them has been posted.

        The operator posts Events in the background, after the writes they announce
        (``controller/act/events.py``): a test that saw the status or the Node change must wait for
        the announcement, not read it at once. Only the named reasons' Events come back: a test that
        asserts some other reason is absent reads :meth:`node_events` after this returns."""
        wanted = set(reasons)
        return wait_for(
            lambda: (
                (evs := [e for e in self.node_events(name) if e.reason in wanted])
                and wanted <= {e.reason for e in evs}
                and evs
            ),
            timeout=timeout,
            what=f"the Events {', '.join(reasons)} on {name}",
        )


def xid_event(code: int, gpu: int = 3) -> dict[str, object]:
    """An XID event as the agent reports it, happening now on GPU ``gpu``."""
    return {
        "xid": code,
        "gpu": gpu,
        "uuid": f"GPU-{gpu:08d}-0000-0000-0000-000000000000",
        "time": utcnow(),
        "source": "simulated",
    }


def ensure_namespace(kube: Kube, name: str) -> str:
    """Create the namespace if missing and wait for its default service account (pods need it)."""
    try:
        kube.core.create_namespace({"metadata": {"name": name}})
    except client.ApiException as e:
        if e.status != 409:
            raise
    wait_for(lambda: kube.core.read_namespaced_service_account("default", name), what="default service account")
    return name


def healthy_spec(gpus: int = 8, xids: list[dict[str, Any]] | None = None, **overrides: Any) -> dict[str, Any]:
    """A fresh report of ``gpus`` healthy H100s, as the agent would publish it."""
    now = utcnow()
    devices = [
        {
            "index": i,
            "uuid": f"GPU-{i:08d}-0000-0000-0000-000000000000",
            "pciBusId": f"00000000:{0x10 + i:02X}:00.0",
            "model": "NVIDIA H100 80GB HBM3",
            "migMode": "Disabled",
            "eccMode": "Enabled",
            "ecc": {
                "volatileUncorrected": 0,
                "volatileCorrected": 0,
                "aggregateUncorrected": 0,
                "aggregateCorrected": 0,
            },
            "remappedRows": {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False},
            "temperature": {"currentC": 45, "slowdownC": 90, "shutdownC": 95},
            "clockEventReasons": 0,
        }
        for i in range(gpus)
    ]
    spec: dict[str, Any] = {
        "agent": {"version": "test", "sources": ["simulated"]},
        "heartbeatTime": now,
        "observedTime": now,
        "nvml": {"available": True, "driverVersion": "570.00"},
        "devices": devices,
        "xidEvents": xids or [],
    }
    spec.update(overrides)
    return spec


@dataclass
class OperatorProcess:
    """gpuhealth-operator as its own process, against the test cluster."""

    cluster: LocalCluster
    log: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    kubeconfig_flag: bool = True  # False: credentials come from ``env`` (KUBECONFIG), as in a shell

    def start(self, wait: bool = True) -> OperatorProcess:
        """Start the process; with ``wait``, return once its metrics answer and its watches are up."""
        self.metrics_port = free_port()
        exe = Path(sys.executable).parent / "gpuhealth-operator"
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                [
                    str(exe),
                    *([f"--kubeconfig={self.cluster.kubeconfig}"] if self.kubeconfig_flag else []),
                    f"--metrics-port={self.metrics_port}",
                    "--tick=1",
                    # The agents' heartbeat Leases, where a gpuhealth install (and AgentFleet) puts them.
                    f"--lease-namespace={GPUHEALTH_NAMESPACE}",
                    *self.extra_args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0, settle: float = 1.0) -> None:
        import urllib.request

        def up() -> bool:
            assert self.popen is not None
            if self.popen.poll() is not None:
                raise AssertionError(f"operator exited with {self.popen.returncode}; see {self.log}")
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=1) as r:
                return bool(r.status == 200)

        wait_for(up, timeout, what="operator metrics endpoint")
        time.sleep(settle)  # watches established after the initial list

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()  # type: ignore[no-any-return]

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The sum of the operator's samples of ``name`` whose labels include ``labels``; None if it
        exports no such sample."""
        total: float | None = None
        for line in self.metrics().splitlines():
            m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)", line)
            if not m or m.group(1) != name:
                continue
            if labels and not all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
                continue
            total = (total or 0.0) + float(m.group(3))
        return total

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen and self.popen.poll() is None:
            self.popen.send_signal(sig)
            self.popen.wait(15)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


def service_account_token(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    pod: Mapping[str, Any] | None = None,
    expiration_seconds: int = 3600,
) -> str:
    """A token for a service account (TokenRequest API), as a pod of that account would get one.

    With ``pod`` (the Pod object, scheduled), the token is bound to that pod: the API server then
    adds the pod's name, uid and node (``authentication.kubernetes.io/node-name``) to the
    authenticated user's extra, exactly as for the token the kubelet mounts.
    """
    spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    resp = kube.core.create_namespaced_service_account_token(
        name, namespace, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    )
    return str(resp.status.token)


def token_kubeconfig(cluster: LocalCluster, token: str, path: Path, user: str = "token-user") -> Path:
    """Write a kubeconfig for ``token`` against the test cluster (its server and CA) and return its path."""
    import json

    from devkit.pki import kubeconfig_for

    path.write_text(json.dumps(kubeconfig_for(cluster.server, cluster.workdir / "pki" / "ca.crt", token, user)))
    return path


MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
GPUHEALTH_NAMESPACE = "gpuhealth-system"


def install_gpuhealth(cluster: LocalCluster, kustomization: str = "base") -> subprocess.CompletedProcess[str]:
    """Install manifests/crds, then ``manifests/<kustomization>`` (server-side apply; idempotent)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(MANIFESTS / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/clusterkopfpeerings.kopf.dev")
    return cluster.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(MANIFESTS / kustomization))


def remove_gpuhealth_workloads(cluster: LocalCluster) -> None:
    """Delete the installed operator Deployment and agent DaemonSet (KWOK "runs" their pods on the
    fake GPU nodes; other tests should not find them there). RBAC, admission policy and namespace stay."""
    cluster.kubectl(
        "delete",
        "-n",
        GPUHEALTH_NAMESPACE,
        "deployment/gpuhealth-operator",
        "daemonset/gpuhealth-agent",
        "--ignore-not-found",
        "--wait=false",
    )


_STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
_REFUSED = re.compile(r"\b403\b|[Ff]orbidden")


def refusals(log_text: str) -> list[str]:
    """The lines of an operator log that tell of a refused request (403, Forbidden), each read without
    its timestamp: "22:09:29,403" is a time, not a status code."""
    return [ln for ln in log_text.splitlines() if _REFUSED.search(_STAMP.sub("", ln))]
