"""An in-memory fake behind the controller's Kube port (``gpuhealth.kube.client.KubePort``).

Only for unit tests of the controller's rooms; everything that talks to a real API is tested on the
real control plane. It keeps what the API server would: resourceVersions (a patch carrying a stale
one is a 409), merge-patch semantics, Evictions marking a pod as deleting, and a log of every write.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from kubernetes.client.rest import ApiException

from devkit.gpunodes import status_write
from gpuhealth.kube.aio import AsyncKube
from tests.unit.builders import merge_patch, report_obj

T = TypeVar("T")


def _error(status: int) -> ApiException:
    reasons = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 429: "TooManyRequests"}
    return ApiException(status=status, reason=reasons.get(status))


class FakeKube:
    def __init__(self) -> None:
        self._rv = itertools.count(100)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.reports: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}  # the agents' node Leases, by node
        self.events: list[dict[str, Any]] = []
        self.writes: list[tuple[str, str]] = []  # (verb, object)
        self.refuse_evictions: dict[str, int] = {}  # pod name -> HTTP status an Eviction gets
        self.refuse_pod_deletes: dict[str, int] = {}  # namespace -> HTTP status a pod's delete gets there
        self.slices: list[dict[str, Any]] = []
        self.claims: list[dict[str, Any]] = []
        self.rules: dict[str, dict[str, Any]] = {}  # DeviceTaintRules by name, anyone's
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> Job
        self._uids = itertools.count(1)
        # Kueue: served or not; Workloads by (namespace, name), AdmissionChecks and ResourceFlavors by name.
        self.kueue = False
        self.workloads: dict[tuple[str, str], dict[str, Any]] = {}
        self.admission_checks: dict[str, dict[str, Any]] = {}
        self.flavors: dict[str, dict[str, Any]] = {}

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(obj)

    def _patch(self, store: dict[Any, dict[str, Any]], key: Any, patch: Mapping[str, Any]) -> dict[str, Any]:
        if key not in store:
            raise _error(404)
        want = (patch.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != store[key]["metadata"]["resourceVersion"]:
            raise _error(409)
        body = {k: v for k, v in patch.items() if k != "metadata"}
        meta = {k: v for k, v in (patch.get("metadata") or {}).items() if k != "resourceVersion"}
        if meta:
            body["metadata"] = meta
        store[key] = merge_patch(store[key], body)
        return self._stamp(store[key])

    # -- seeding ---------------------------------------------------------------------------------

    def add_node(self, name: str, labels: Mapping[str, str] | None = None, gpus: int = 8) -> dict[str, Any]:
        body = {
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", **(labels or {})}},
            "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)}},
        }
        self.nodes[name] = body
        return self._stamp(body)

    def add_report(self, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        self.reports[obj["metadata"]["name"]] = obj
        return self._stamp(obj)

    def add_policy(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        obj = {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 1}, "spec": dict(spec)}
        self.policies[name] = obj
        return self._stamp(obj)

    def add_pod(
        self, namespace: str, name: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        obj = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{namespace}-{name}",
                "annotations": dict(annotations or {}),
                "ownerReferences": [{"kind": "ReplicaSet", "name": f"{name}-rs", "controller": True}],
            },
            "spec": {"nodeName": node},
            "status": {"phase": "Running"},
        }
        self.pods[namespace, name] = obj
        return self._stamp(obj)

    # -- the port --------------------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise _error(404)
        return copy.deepcopy(self.nodes[name])

    def list_nodes(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = lambda o: o
    ) -> list[dict[str, Any]]:
        key, _, value = label_selector.partition("=")
        return [transform(copy.deepcopy(n)) for n in self.nodes.values() if n["metadata"]["labels"].get(key) == value]

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.writes.append(("patch", f"node/{name}"))
        return self._patch(self.nodes, name, patch)

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """As the API server's status strategy: metadata kept (with its precondition), spec ignored,
        conditions merged by type."""
        self.writes.append(("patch", f"node/{name}/status"))
        return self._patch(self.nodes, name, status_write(self.nodes.get(name) or {}, patch))

    def list_pods_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]] = lambda p: p
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]:
        return [transform(copy.deepcopy(p)) for p in self.pods.values()], "1", None

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        return iter(())

    def list_leases_rv(
        self, namespace: str, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]:
        return [transform(copy.deepcopy(lease)) for lease in self.leases.values()], "1", None

    def watch_leases(
        self, namespace: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]:
        return iter(())

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.writes.append(("patch", f"pod/{namespace}/{name}"))
        return self._patch(self.pods, (namespace, name), patch)

    def evict_pod(self, namespace: str, name: str, uid: str | None, resource_version: str | None = None) -> None:
        self.writes.append(("evict", f"pod/{namespace}/{name}"))
        if (namespace, name) not in self.pods:
            raise _error(404)
        if resource_version is not None and resource_version != self.pods[namespace, name]["metadata"].get(
            "resourceVersion"
        ):
            raise _error(409)  # the API server's precondition: the pod changed since it was read
        if name in self.refuse_evictions:
            raise _error(self.refuse_evictions[name])
        self.pods[namespace, name]["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        self._stamp(self.pods[namespace, name])  # a graceful deletion is a write: a new resourceVersion

    def force_delete_pod(self, namespace: str, name: str, uid: str | None) -> None:
        self.writes.append(("force-delete", f"pod/{namespace}/{name}"))
        self.pods.pop((namespace, name), None)

    def list_nodes_rv(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = lambda o: o
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]:
        return self.list_nodes(label_selector, transform), "1", None

    def watch_nodes(self, label_selector: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        return iter(())

    def list_custom_rv(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = lambda o: o
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]:
        return self.list_custom(plural, transform), "1", None

    def watch_custom(self, plural: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        return iter(())

    def list_custom(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = lambda o: o
    ) -> list[dict[str, Any]]:
        store = self.reports if plural == "gpunodehealths" else self.policies
        return [transform(copy.deepcopy(o)) for o in store.values()]

    def get_report(self, name: str) -> dict[str, Any]:
        if name not in self.reports:
            raise _error(404)
        return copy.deepcopy(self.reports[name])

    def create_report(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.writes.append(("create", f"report/{body['metadata']['name']}"))
        if body["metadata"]["name"] in self.reports:
            raise _error(409)
        return self.add_report(body)

    def patch_report_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.writes.append(("patch", f"report/{name}/status"))
        return self._patch(self.reports, name, patch)

    def delete_report(self, name: str, uid: str | None) -> None:
        self.writes.append(("delete", f"report/{name}"))
        if name not in self.reports:
            raise _error(404)
        if uid and self.reports[name]["metadata"].get("uid") != uid:
            raise _error(409)
        del self.reports[name]

    def patch_policy_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self.writes.append(("patch", f"policy/{name}/status"))
        self._patch(self.policies, name, patch)

    # -- DRA -------------------------------------------------------------------------------------

    def list_resource_slices_rv(self, transform: Callable[[dict[str, Any]], Any]) -> tuple[list[Any], str]:
        return [transform(copy.deepcopy(s)) for s in self.slices], "1"

    def watch_resource_slices(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        return iter(())

    def list_resource_claims(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.claims)

    def list_device_taint_rules(self) -> list[dict[str, Any]]:
        """Like the real port: only rules with gpuhealth's label."""
        return [
            copy.deepcopy(r)
            for r in self.rules.values()
            if (r["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpuhealth"
        ]

    def create_device_taint_rule(self, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self.writes.append(("create", f"devicetaintrule/{name}"))
        if name in self.rules:
            raise _error(409)
        obj = copy.deepcopy(dict(body))
        obj["metadata"]["uid"] = f"rule-uid-{next(self._uids)}"
        self.rules[name] = obj
        return self._stamp(obj)

    def delete_device_taint_rule(self, name: str, uid: str | None = None) -> None:
        self.writes.append(("delete", f"devicetaintrule/{name}"))
        if name not in self.rules:
            raise _error(404)
        if uid and self.rules[name]["metadata"]["uid"] != uid:
            raise _error(409)
        del self.rules[name]

    # -- remediation -----------------------------------------------------------------------------

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        if (namespace, name) not in self.jobs:
            raise _error(404)
        return copy.deepcopy(self.jobs[(namespace, name)])

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self.writes.append(("create", f"job/{namespace}/{name}"))
        if (namespace, name) in self.jobs:
            raise _error(409)
        self.jobs[(namespace, name)] = copy.deepcopy(dict(body))
        return self._stamp(self.jobs[(namespace, name)])

    def delete_job(self, namespace: str, name: str) -> None:
        self.writes.append(("delete", f"job/{namespace}/{name}"))
        if self.jobs.pop((namespace, name), None) is None:
            raise _error(404)

    def finish_job(self, namespace: str, name: str, condition: str) -> None:
        """What the Job controller writes once the Job's pod ended: ``Complete`` or ``Failed``."""
        self.jobs[(namespace, name)]["status"] = {"conditions": [{"type": condition, "status": "True"}]}

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """A graceful delete with a uid precondition: 404 gone, 409 another pod of that name."""
        self.writes.append(("delete", f"pod/{namespace}/{name}"))
        if namespace in self.refuse_pod_deletes:
            raise _error(self.refuse_pod_deletes[namespace])
        if (namespace, name) not in self.pods:
            raise _error(404)
        if self.pods[namespace, name]["metadata"].get("uid") != uid:
            raise _error(409)
        del self.pods[namespace, name]

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.pods.values() if (p.get("spec") or {}).get("nodeName") == node]

    # -- Kueue -----------------------------------------------------------------------------------

    def kueue_served(self) -> bool:
        return self.kueue

    def kueue_allowed(self) -> bool:
        return self.kueue

    def list_workloads_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]:
        if not self.kueue:
            raise _error(404)
        return [transform(copy.deepcopy(w)) for w in self.workloads.values()], "1"

    def watch_workloads(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        return iter(())

    def list_admission_checks_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]:
        if not self.kueue:
            raise _error(404)
        return [transform(copy.deepcopy(c)) for c in self.admission_checks.values()], "1"

    def watch_admission_checks(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        return iter(())

    def apply_workload_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of entries of the list map ``status.admissionChecks`` (by name)."""
        key = (namespace, name)
        if key not in self.workloads:
            raise _error(404)
        wl = self.workloads[key]
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != wl["metadata"]["resourceVersion"]:
            raise _error(409)
        checks = wl.setdefault("status", {}).setdefault("admissionChecks", [])
        for entry in body["status"]["admissionChecks"]:
            for i, c in enumerate(checks):
                if c["name"] == entry["name"]:
                    checks[i] = dict(entry)
                    break
            else:
                checks.append(dict(entry))
        self.writes.append(("apply", f"workload/{namespace}/{name}"))
        return self._stamp(wl)

    def apply_admission_check_status(self, name: str, body: Mapping[str, Any]) -> None:
        if name not in self.admission_checks:
            raise _error(404)
        self.admission_checks[name].setdefault("status", {})["conditions"] = list(body["status"]["conditions"])
        self.writes.append(("apply", f"admissioncheck/{name}"))
        self._stamp(self.admission_checks[name])

    def get_resource_flavor(self, name: str) -> dict[str, Any]:
        if name not in self.flavors:
            raise _error(404)
        return copy.deepcopy(self.flavors[name])

    def post_event(
        self,
        kind: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        api_version: str = "v1",
        at: dt.datetime | None = None,
        namespace: str = "",
    ) -> None:
        self.events.append(
            {"kind": kind, "name": name, "type": type_, "reason": reason, "message": message, "namespace": namespace}
        )

    def reasons(self, name: str | None = None) -> list[str]:
        return [e["reason"] for e in self.events if name is None or e["name"] == name]


class InlineExecutor(Executor):
    """Runs each call at once on the caller's thread: the fake's calls are instant, and a test then
    sees every write in the order it was made."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as e:
            done.set_exception(e)
        return done


def inline(kube: FakeKube) -> AsyncKube:
    """The rooms' async port over the fake, each call run inline."""
    return AsyncKube(kube, InlineExecutor())


def crash_looping_fleet() -> FakeKube:
    """Three nodes with two workloads each under a restart-loop policy; both of n1's pods crash-loop
    (a restart loop the pods alone show: the reports are clean)."""
    kube = FakeKube()
    kube.add_policy("p", {"restartLoop": {"minWorkloads": 2, "minRestarts": 3, "window": "10m"}})
    for n in ("n1", "n2", "n3"):
        kube.add_node(n)
        kube.add_report(report_obj(name=n))
        for app in ("svc-a", "svc-b"):
            kube.add_pod("apps", f"{app}-{n}", n)
            pod = kube.pods["apps", f"{app}-{n}"]
            pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": f"{app}-rs", "controller": True}]
            if n == "n1":
                pod["status"]["containerStatuses"] = [
                    {
                        "restartCount": 5,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2025-01-01T12:00:05Z"}},
                    }
                ]
    return kube
