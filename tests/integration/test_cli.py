"""`kubectl gpuhealth` against the real control plane and the running operator.

The plugin runs as a subprocess, both as its console script and through kubectl's plugin mechanism
(kubectl finds `kubectl-gpuhealth` on PATH; kubectl refuses flags before a plugin's name, so the
kubeconfig is passed after it or through KUBECONFIG).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import (
    Kube,
    OperatorProcess,
    ensure_namespace,
    healthy_spec,
    service_account_token,
    token_kubeconfig,
    wait_for,
)
from devkit.k8s import xid_event as xid
from tests.integration.conftest import make_nodes, policy_spec

BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-gpuhealth"
RELEASE = "gpuhealth.dev/release"
PAUSED_FROM = "gpuhealth.dev/paused-from"


def _env(cluster: LocalCluster | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NO_COLOR")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if cluster is not None:
        env["KUBECONFIG"] = str(cluster.kubeconfig)
    env.update(extra)
    return env


def plugin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script, with --kubeconfig."""
    return plugin_as(cluster.kubeconfig, *args)


def plugin_as(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script under ``kubeconfig`` (an admin's, or a user's own credentials)."""
    return subprocess.run(
        [str(PLUGIN), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )


def kubectl_plugin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl gpuhealth ...`: kubectl finds the plugin on PATH; the kubeconfig comes from KUBECONFIG."""
    return subprocess.run(
        [cluster.kubectl_bin, "gpuhealth", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(cluster),
        check=False,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    return proc.stdout


def one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, f"exit {proc.returncode}, wanted {code}: {proc.stdout}{proc.stderr}"
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def settle(kube: Kube, node: str, quiet: float = 2.0) -> str:
    """The node's state once it has not changed for ``quiet`` seconds (a drain may finish right away)."""
    last: list[Any] = [None, 0.0]

    def steady() -> str | None:
        state = kube.state(node)
        now = time.monotonic()
        if state != last[0]:
            last[0], last[1] = state, now
            return None
        return state if now - last[1] >= quiet else None

    return str(wait_for(steady, timeout=60, interval=0.25, what=f"a steady state on {node}"))


def _row(data: dict[str, Any], node: str) -> dict[str, Any]:
    return next(r for r in data["nodes"] if r["node"] == node)


def test_status_describe_and_explain_a_quarantined_node(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 3)
    bad = nodes[0]
    kube.apply_policy(group, policy_spec(group, cost={"gpuHourly": 2.5}))
    for n in nodes:
        kube.put_report(n, healthy_spec())
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), what="all healthy")
    kube.put_report(bad, healthy_spec(xids=[xid(79)]))
    wait_for(lambda: kube.our_taint(bad), what="gpuhealth taint on the XID 79 node")
    wait_for(lambda: kube.node_events(bad, "Quarantined"), what="Quarantined event")
    # XID 79 asks for a drain: Draining, then Quarantined once the (empty) node is drained.
    state = settle(kube, bad)
    assert state in ("Draining", "Quarantined")

    data = json.loads(ok(plugin(cluster, "status", "-l", f"gpuhealth-test={group}", "-o", "json")))
    assert {r["node"] for r in data["nodes"]} == set(nodes)
    row = _row(data, bad)
    assert row["state"] == state and row["reason"] == "XID79" and row["policy"] == group
    assert row["gpus"] == {"healthy": 7, "total": 8} and row["taint"] == "XID79" and row["cordoned"]
    assert row["outOfService"] and row["gpuHours"] > 0 and row["currency"] == "USD"
    assert abs(row["cost"] - row["gpuHours"] * 2.5) < 0.01
    assert data["nodes"][0]["node"] == bad  # the most urgent first
    totals = data["totals"]
    assert totals["byState"] == {state: 1, "Healthy": 2}
    assert totals["outOfService"]["nodes"] == 1 and totals["outOfService"]["gpus"] == 8
    assert set(totals["outOfService"]["gpuHoursByState"]) == {state}
    assert totals["outOfService"]["cost"]["USD"] == row["cost"]

    text = ok(plugin(cluster, "status", "--policy", group))
    line = next(line for line in text.splitlines() if line.startswith(bad))
    assert line.split()[1:4] == [state, "XID79", "7/8"] and line.split()[-1] == group
    assert f"3 nodes: 1 {state}, 2 Healthy" in text
    assert "Held out of service: 1 node, 8 GPUs" in text and "USD" in text
    assert "\x1b[" not in text  # not a TTY: no colour

    # The same through kubectl's plugin mechanism.
    via_kubectl = ok(kubectl_plugin(cluster, "status", "-l", f"gpuhealth-test={group}"))
    assert any(line.startswith(bad) and "XID79" in line for line in via_kubectl.splitlines())

    described = ok(plugin(cluster, "describe", bad))
    assert f"State:         {state}" in described and "Reason:        XID79" in described
    assert "XID 79 (GPU has fallen off the bus): reboot the node [gpuhealth: drain]" in described
    assert "Taint:         gpuhealth.dev/unhealthy=XID79:NoSchedule" in described
    assert "cordoned by gpuhealth" in described and f"gpuhealth.dev/state={state}" in described
    assert "GPUHealthy=False (XID79)" in described
    events = described[described.index("Events (") :]
    assert "Quarantined" in events and "GPUHealthAction" in events
    model = json.loads(ok(plugin(cluster, "describe", bad, "-o", "json")))
    assert model["xids"][0]["xid"] == 79 and "fallen off the bus" in model["xids"][0]["meaning"]
    assert model["marks"]["taint"]["value"] == "XID79" and model["marks"]["cordonOwner"] == "gpuhealth"
    assert len(model["devices"]) == 8 and model["evidence"][0]["code"] == 79
    assert {e["reason"] for e in model["events"]} >= {"Quarantined", "GPUHealthAction"}
    assert len(model["history"]["quarantines"]) == 1
    drain = kube.report(bad)["status"].get("drain")
    if drain:  # the drain controller's record, rendered whatever its keys
        assert model["drain"] == drain and "\nDrain:\n" in described

    # explain needs no cluster at all.
    proc = subprocess.run(
        [str(PLUGIN), "explain", "XID79"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(KUBECONFIG="/nonexistent/kubeconfig"),
        check=False,
    )
    out = ok(proc)
    assert "GPU has fallen off the bus" in out and "REBOOT_NODE" in out and "gpuhealth action:  drain" in out
    assert json.loads(ok(kubectl_plugin(cluster, "explain", "79", "-o", "json")))["defaultAction"] == "drain"

    err = one_line_error(plugin(cluster, "describe", f"{group}-missing"), 1)
    assert "not found" in err


def test_release_returns_an_awaiting_repair_node_to_probation(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    broken, fine = make_nodes(cluster, group, 2)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            rules={"xid": {"overrides": [{"code": 64, "action": "repair"}]}},
            # The first quarantine sends the node straight to AwaitingRepair (no drain controller needed).
            safety={"flapping": {"maxQuarantines": 1}, "probation": "1h", "maxUnhealthy": "100%"},
        ),
    )
    for n in (broken, fine):
        kube.put_report(n, healthy_spec())
    wait_for(lambda: kube.state(broken) == "Healthy" and kube.state(fine) == "Healthy", what="healthy")

    err = one_line_error(plugin(cluster, "release", fine), 2)
    assert "is Healthy, not AwaitingRepair" in err and "--force" in err
    assert RELEASE not in (kube.node(fine)["metadata"].get("annotations") or {})

    kube.put_report(broken, healthy_spec(xids=[xid(64)]))
    wait_for(lambda: kube.state(broken) == "AwaitingRepair", what="AwaitingRepair")
    wait_for(lambda: kube.our_taint(broken), what="taint")
    row = _row(json.loads(ok(plugin(cluster, "status", "-l", f"gpuhealth-test={group}", "-o", "json"))), broken)
    assert row["state"] == "AwaitingRepair" and row["reason"] == "Flapping" and row["outOfService"]

    # The node is repaired and rebooted: its agent reports no XID any more. It still waits for a human.
    kube.put_report(broken, healthy_spec(xids=[]))
    time.sleep(2)
    assert kube.state(broken) == "AwaitingRepair"

    out = ok(plugin(cluster, "release", broken))
    assert f"node/{broken} released at" in out and "Recovering" in out and "probation (1h under policy" in out
    wait_for(lambda: kube.state(broken) == "Recovering", what="Recovering after release")
    wait_for(
        lambda: RELEASE not in (kube.node(broken)["metadata"].get("annotations") or {}),
        what="the operator removes the release annotation",
    )
    status = kube.report(broken)["status"]
    # The reason keeps naming the fault; the message and the event say a human released it.
    assert status["reason"] == "Flapping" and "released by a human" in status["message"] and status["clearedBefore"]
    assert kube.our_taint(broken) is not None, "probation keeps the taint"
    wait_for(lambda: kube.node_events(broken, "Released"), what="Released event")
    described = ok(plugin(cluster, "describe", broken))
    assert "State:         Recovering" in described and "cleared by a human" in described and "left" in described

    # Not AwaitingRepair any more: a second release is refused, --force is accepted.
    assert "is Recovering" in one_line_error(plugin(cluster, "release", broken), 2)
    assert "Forced" in ok(plugin(cluster, "release", broken, "--force"))


def _mode(kube: Kube, name: str) -> tuple[str, str | None]:
    p = kube.get_policy(name)
    return p["spec"]["mode"], (p["metadata"].get("annotations") or {}).get(PAUSED_FROM)


def test_pause_and_resume_a_policy(cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group, safety={"maxUnhealthy": "100%"}))
    kube.put_report(node, healthy_spec())
    wait_for(lambda: kube.state(node) == "Healthy", what="healthy")

    out = ok(kubectl_plugin(cluster, "pause", group))
    assert f"gpuhealthpolicy/{group} paused (was Enforce)" in out
    assert _mode(kube, group) == ("Paused", "Enforce")
    # `ghp`, not `gpuhealth`: the CRDs' category `gpuhealth` shadows that short name once kubectl's
    # discovery cache knows it (kubectl expands categories first), and `get gpuhealth NAME` then fails.
    got = cluster.kubectl("get", "ghp", group).stdout
    assert got.splitlines()[0].split()[:2] == ["NAME", "MODE"] and got.splitlines()[1].split()[:2] == [group, "Paused"]
    assert "already Paused" in ok(plugin(cluster, "pause", group))

    # Paused: a fault changes nothing.
    kube.put_report(node, healthy_spec(xids=[xid(79)]))
    time.sleep(3)
    assert kube.our_taint(node) is None and kube.state(node) == "Healthy"

    out = ok(plugin(cluster, "resume", group))
    assert "mode Enforce (as before the pause)" in out
    assert _mode(kube, group) == ("Enforce", None)
    assert cluster.kubectl("get", "ghp", group).stdout.splitlines()[1].split()[1] == "Enforce"
    wait_for(lambda: kube.our_taint(node), what="the resumed policy acts")

    # A DryRun policy is paused and resumed back into DryRun; --mode overrides.
    kube.apply_policy(group, {"mode": "DryRun"})
    ok(plugin(cluster, "pause", group))
    assert _mode(kube, group) == ("Paused", "DryRun")
    ok(plugin(cluster, "resume", group))
    assert _mode(kube, group) == ("DryRun", None)
    ok(plugin(cluster, "pause", group))
    ok(plugin(cluster, "resume", group, "--mode", "Enforce"))
    assert _mode(kube, group) == ("Enforce", None)

    assert "nothing to resume" in ok(plugin(cluster, "resume", group))
    assert "not paused" in one_line_error(plugin(cluster, "resume", group, "--mode", "DryRun"), 2)
    assert "not found" in one_line_error(plugin(cluster, "pause", f"{group}-missing"), 1)


def test_policy_doc_examples_are_accepted_by_the_api_server(cluster: LocalCluster) -> None:
    """Every policy in docs/policy.md passes the CRD's schema and CEL rules (server-side dry run)."""
    from tests.unit.cli.test_cli_docs import DOCS, policy_objects

    objs = policy_objects(DOCS / "policy.md")
    assert len(objs) >= 8
    for obj in objs:
        body = {"apiVersion": "gpuhealth.dev/v1alpha1", "kind": "GPUHealthPolicy", **obj}
        proc = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(body))
        defaulted = json.loads(proc.stdout)["spec"]
        assert defaulted["mode"] in ("Enforce", "DryRun", "Paused") and "safety" in defaulted


def _split_kubeconfig(cluster: LocalCluster, tmp_path: Path) -> str:
    """The cluster's kubeconfig as two files (server and context in one, the user in the other),
    joined as a KUBECONFIG list: only a merge of both reaches the cluster."""
    full = json.loads(cluster.kubeconfig.read_text())
    a, b = tmp_path / "clusters.json", tmp_path / "users.json"
    a.write_text(json.dumps({k: v for k, v in full.items() if k != "users"}))
    b.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "users": full["users"]}))
    return f"{a}{os.pathsep}{b}"


def test_a_merged_kubeconfig_list_works_for_plugin_and_operator(
    cluster: LocalCluster, kube: Kube, group: str, tmp_path: Path
) -> None:
    merged = _split_kubeconfig(cluster, tmp_path)
    nodes = make_nodes(cluster, group, 1)
    env = _env(KUBECONFIG=merged)
    proc = subprocess.run(
        [str(PLUGIN), "status", "-l", f"gpuhealth-test={group}", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert {r["node"] for r in json.loads(ok(proc))["nodes"]} == set(nodes)
    # The operator: its own client and Kopf's login both come from the same merged list.
    kube.apply_policy(group, policy_spec(group))
    log = tmp_path / "operator.log"
    op = OperatorProcess(cluster, log, kubeconfig_flag=False, env={"KUBECONFIG": merged})
    op.start()
    try:
        wait_for(lambda: "acting (this replica leads)" in log.read_text(), what="the operator acting (Kopf logged in)")
        assert "watching" in log.read_text() and "Traceback" not in log.read_text()
    finally:
        op.stop()


GPU = "nvidia.com/gpu"


def _with_kubelet_health(kube: Kube, ns: str, name: str, resource_id: str, health: str) -> dict[str, Any]:
    """Write the pod's status as a kubelet with KEP-4680 does: its container's allocatedResourcesStatus
    (containerStatuses is an atomic list, so the whole list goes back), through the status subresource."""
    pod = kube.api.sanitize_for_serialization(kube.core.read_namespaced_pod(name, ns))
    statuses = pod["status"]["containerStatuses"]
    for cs in statuses:
        cs["allocatedResourcesStatus"] = [{"name": GPU, "resources": [{"resourceID": resource_id, "health": health}]}]
    kube.core.patch_namespaced_pod_status(name, ns, {"status": {"containerStatuses": statuses}})
    back = kube.api.sanitize_for_serialization(kube.core.read_namespaced_pod(name, ns))
    return back["status"]["containerStatuses"][0]  # type: ignore[no-any-return]


def _reader_kubeconfig(cluster: LocalCluster, kube: Kube, group: str, ns: str, tmp_path: Path) -> Path:
    """An on-call user who reads gpuhealth's objects and Nodes, and pods only in ``ns``."""
    name = f"oncall-{group}"[:60]
    kube.core.create_namespaced_service_account(ns, {"metadata": {"name": name}})
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": ["gpuhealth.dev"], "resources": ["gpunodehealths", "gpuhealthpolicies"], "verbs": ["get"]},
    ]
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": ns}]
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subject,
        }
    )
    rbac.create_namespaced_role(
        ns, {"metadata": {"name": name}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subject,
        },
    )
    return token_kubeconfig(cluster, service_account_token(kube, ns, name), tmp_path / "oncall.kubeconfig")


def test_describe_shows_the_kubelets_health_of_a_held_out_gpu_beside_gpuhealths(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, tmp_path: Path
) -> None:
    """A device-plugin node: GPU 2 (time-sliced) held by three pods and one that is gone; the kubelet
    reports one pod's GPU 2 Unhealthy, another pod's container carries no allocatedResourcesStatus,
    the third pod is in a namespace the on-call user may not read."""
    (node,) = make_nodes(cluster, group, 1)
    ns = ensure_namespace(kube, f"kh-{group}"[:60])
    other = ensure_namespace(kube, f"kh2-{group}"[:60])
    # ECC is not fatal: none-mode pods may run on for maxWait, so the pods are there while GPU 2 drains.
    kube.apply_policy(
        group,
        policy_spec(
            group, safety={"maxUnhealthyGPUs": 8}, actions={"drain": {"checkpointMode": "none", "maxWait": "1h"}}
        ),
    )
    pods = [(ns, "on-gpu-2"), (ns, "shares-gpu-2"), (other, "other-team"), (ns, "on-gpu-0")]
    for pns, name in pods:
        kube.core.create_namespaced_pod(pns, dra.extended_resource_pod(pns, name, node, GPU))

    def running() -> bool:
        return all(kube.core.read_namespaced_pod(n, p).status.phase == "Running" for p, n in pods)

    wait_for(running, timeout=60, what=f"the pods running on {node}")
    spec = healthy_spec()
    spec["podResources"] = {"available": True}
    uuid2 = spec["devices"][2]["uuid"]
    holds = {0: [(ns, "on-gpu-0")], 2: [*pods[:3], (ns, "gone")]}
    for d in spec["devices"]:
        d["pods"] = [
            {"namespace": p, "name": n, "container": "main", "resource": GPU} for p, n in holds.get(d["index"], [])
        ]
    # The API server keeps the field (ResourceHealthStatus is on by default in 1.37), a replica's ID included.
    kept = _with_kubelet_health(kube, ns, "on-gpu-2", f"{uuid2}::1", "Unhealthy")
    assert kept["allocatedResourcesStatus"][0]["resources"] == [{"resourceID": f"{uuid2}::1", "health": "Unhealthy"}]
    _with_kubelet_health(kube, ns, "on-gpu-0", spec["devices"][0]["uuid"], "Healthy")
    kube.put_report(node, spec)
    wait_for(lambda: kube.state(node) == "Healthy", timeout=30, what="healthy")
    spec["devices"][2]["ecc"]["volatileUncorrected"] = 1
    kube.put_report(node, spec)

    def held() -> bool:
        devices = (kube.report(node).get("status") or {}).get("devices") or []
        return any(d["index"] == 2 and d.get("keptOffBy") and d["state"] != "InService" for d in devices)

    wait_for(held, timeout=30, what="GPU 2 held out on the device-plugin route")

    text = ok(plugin(cluster, "describe", node))
    section = text[text.index("Pods on held-out GPUs") :].split("\n\n")[0]
    rows = {ln.split()[3]: ln for ln in section.splitlines()[2:] if ln.startswith("  2 ")}
    assert set(rows) == {f"{ns}/on-gpu-2", f"{ns}/shares-gpu-2", f"{other}/other-team", f"{ns}/gone"}, section
    assert "(EccUncorrected)" in rows[f"{ns}/on-gpu-2"] and rows[f"{ns}/on-gpu-2"].split()[-2:] == ["main", "Unhealthy"]
    assert rows[f"{ns}/shares-gpu-2"].endswith("not reported by the kubelet")
    assert rows[f"{ns}/gone"].endswith("pod not found (gone)")
    assert f"{ns}/on-gpu-0" not in section  # GPU 0 is in service
    model = json.loads(ok(plugin(cluster, "describe", node, "-o", "json")))
    by_pod = {f"{r['namespace']}/{r['name']}": r for r in model["kubeletHealth"]}
    assert by_pod[f"{ns}/on-gpu-2"]["kubelet"]["health"] == "Unhealthy"
    assert by_pod[f"{ns}/on-gpu-2"]["kubelet"]["resourceIds"] == [f"{uuid2}::1"]
    assert by_pod[f"{other}/other-team"]["kubelet"]["health"] is None

    # An on-call user who may read pods in one namespace only: the other pod is a row, not a failure.
    kc = _reader_kubeconfig(cluster, kube, group, ns, tmp_path)
    proc = subprocess.run(
        [str(PLUGIN), "--kubeconfig", str(kc), "describe", node],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    text = ok(proc)
    line = next(ln for ln in text.splitlines() if f"{other}/other-team" in ln)
    assert "cannot read the pod:" in line and "Forbidden (403)" in line
    assert next(ln for ln in text.splitlines() if f"{ns}/on-gpu-2" in ln).endswith("Unhealthy")
