"""The real-node tier: gpuhealth as it ships, installed as users install it, on a real kubelet.

The image is built from the unmodified Dockerfile (hack/build-image.sh); a real kubelet with
containerd, runc and the bridge CNI joins the control plane (devkit/realnode.py); ``helm install``
of charts/gpuhealth runs the operator Deployment and the agent DaemonSet in containers, as uid
65532 with read-only root filesystems and their ServiceAccounts' tokens. The agent finds the fake
NVML library where NVIDIA's container toolkit would mount the driver's (the RuntimeClass
``nvidia``), and the story runs through the installed product with the policy in Enforce: an XID
79 -> the operator Pod taints, cordons and drains the node. Before that, an uncorrected ECC error
on one GPU (published by a DRA ResourceSlice) -> the operator Pod holds that GPU out and climbs its
repair ladder: the reset Job's pod runs in a real container on the node (gpuhealth's own image
stands in for ``nvidia-smi -r``, finding the GPU through the fake NVML) and exits 0, and the GPU
comes back through probation. After the XID, the agent's container is killed and comes back with
its journaled XID; ``helm upgrade`` to another image tag rolls both without losing the verdict; the
uninstall leaves nothing behind, in the cluster or on the host.

A real Prometheus (devkit/prometheus.py) scrapes the installed operator and agent through the
story, their ServiceMonitors' targets as static ones, and loads the PrometheusRule's groups. Before
the upgrade, every dashboard query is evaluated over the story as Grafana would draw it, and every
alert as its rule evaluates it: none may error, each the story feeds must have data, and those it
cannot feed are listed below with why (the list must match what Prometheus found, both ways).

The one real node is the cluster's only node: it plays the GPU node and the node the operator runs
on, so the operator is given tolerations for the node's own quarantine (a real cluster runs the
operator off its GPU nodes, which the chart's default affinity prefers).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devkit import dra, realnode
from devkit import prometheus as prom
from devkit.chart import CHART, helm_template, run_uninstall
from devkit.cluster import LocalCluster
from devkit.k8s import GROUP, VERSION, Kube, refusals, wait_for
from devkit.ladder import nvml_reset_job_template
from devkit.realnode import NAMESPACE as NS
from devkit.realnode import RUNTIME_CLASS, Image, Installed, RealNode, ready
from devkit.realnode_host import BRIDGE, NFT_TABLE, STATE, link_exists, nft_table_exists
from devkit.timeparse import parse_time

REMEDIATION_NS = "gpuhealth-remediation"  # the chart's remediation.namespace
WORKLOADS = "workloads"
AGENT_USER = f"system:serviceaccount:{NS}:gpuhealth-agent"
PAUSE = "registry.k8s.io/pause:3.10.2"

# Prometheus scrapes and evaluates every second; the dashboard is drawn at a 2 s step, so Grafana's
# $__rate_interval is max(2 s + 1 s, 4 * 1 s) = 4 s (devkit/prometheus.py, grafana_expr).
SCRAPE_S, STEP_S = 1, 2
# Dashboard queries (panel title, legend) that the story cannot give data, and why.
UNFED_QUERIES: dict[tuple[str, str], str] = {
    **{
        ("Time between failures per GPU (seconds)", q): (
            "observed when a GPU back in service is taken out again: the story's repaired GPU (5) is not, "
            "its XID is on GPU 3"
        )
        for q in ("p10", "p50")
    },
}
# Dashboard queries the story moves off zero: a line drawn flat at 0 is data, but does not show the story.
# Not among them: "Actions by kind", whose (action, reason, mode) series start with the first action, at 1,
# so rate() shows no increase for the first of each (the reasons are open: XID codes among them), and
# "GPUs out of service by state", which counts a node's GPUs by its GPU count label or nvidia.com/gpu
# capacity, neither of which the real node has without a device plugin (its report's 8 GPUs do not count).
MOVED: set[tuple[str, str]] = {
    ("Quarantined", "Quarantined"),
    ("Degraded", "Degraded"),
    ("GPU nodes by state", "{{state}}"),
    ("Detection to taint (seconds)", "p50"),
    ("Faults by signal (per hour)", "{{signal}}"),
    ("XID faults by code (per hour)", "XID {{code}}"),
    ("Hottest GPU per node (°C)", "{{node}}"),
    ("Uncorrected ECC errors (volatile) per node", "{{node}}"),
    ("Repair ladder steps by result (per hour)", "{{step}} {{result}}"),
    ("MTTR by step (seconds, fault to return to service)", "p50 {{step}}"),
}
# Alerts whose measured side (devkit/prometheus.py, measured) the story cannot give series, and why.
UNFED_ALERTS: dict[str, str] = {
    "GPUHealthRackPowerBrake": "gpuhealth_rack_findings has a series once a rack's nodes are braked: no GPU is",
    "GPUHealthDomainOut": "gpuhealth_domain_findings has a series for an NVLink domain: the node has no clique label",
}
# Alerts whose full expression holds at the story's end (before the upgrade): none. One node's XID 79
# quarantine is what gpuhealth handles alone; GPUHealthXIDRate wants three faults of a code in 10
# minutes, and the others a breaker, a node awaiting repair, a silent agent, a drain or an NVML hang.
FIRING: set[str] = set()


@dataclass
class Env:
    installed: Installed
    cluster: LocalCluster
    node: RealNode
    image: Image
    kube: Kube


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    installed = Installed.start(tmp_path_factory.mktemp("real-node"), audit_users=[AGENT_USER])
    node = installed.node
    try:
        yield Env(installed, installed.cluster, node, installed.image, Kube(installed.cluster.kubeconfig))
    finally:
        installed.stop()
    # Whatever the test did, the host is as it was.
    assert not STATE.exists(), "the real node's record of host changes is still there"
    assert not link_exists(BRIDGE), f"bridge {BRIDGE} left behind"
    assert not nft_table_exists(), f"nft table {NFT_TABLE} left behind"
    assert not [p for p in Path("/sys/fs/cgroup").glob("*/kubepods") if p.exists()], "kubepods cgroups left behind"
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _names(p, str(node.socket))], "processes left"


def _names(cmdline: Path, needle: str) -> bool:
    try:
        return needle.encode() in cmdline.read_bytes()
    except OSError:
        return False


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[prom.Prometheus]:
    server = prom.Prometheus(tmp_path / "prometheus", interval_s=SCRAPE_S)
    try:
        yield server
    finally:
        server.stop()


def pods(e: Env, namespace: str, selector: str) -> list[dict[str, Any]]:
    return realnode.pods(e.cluster, namespace, selector)


def get(url: str) -> str:
    """The body of a 200 answer, or "" (not up yet: refused, timed out, another status)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body: bytes = r.read()
            return body.decode() if r.status == 200 else ""
    except OSError:
        return ""


def image_ids(pod: dict[str, Any]) -> set[str]:
    return {str(c.get("imageID", "")) for c in pod["status"].get("containerStatuses") or []}


def agent_token(e: Env, pod: dict[str, Any]) -> str:
    """The ServiceAccount token the kubelet mounted into the agent's container (read on the host)."""
    root = e.node.workdir / "kubelet" / "root" / "pods" / pod["metadata"]["uid"] / "volumes"
    tokens = list(root.glob("kubernetes.io~projected/*/token"))
    assert len(tokens) == 1, f"one projected token expected under {root}: {tokens}"
    token: str = tokens[0].read_text().strip()
    return token


def pod_log(e: Env, pod: dict[str, Any]) -> str:
    """Every container log of ``pod`` on the node (each CRI line without its time/stream prefix)."""
    meta = pod["metadata"]
    d = e.node.workdir / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    lines = []
    for f in sorted(d.glob("*/*.log")):
        lines += [ln.split(" ", 3)[-1] for ln in f.read_text(errors="replace").splitlines()]
    return "\n".join(lines)


def audited_writes(e: Env, resource: str) -> list[dict[str, Any]]:
    entries = []
    for line in e.cluster.audit_log.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:  # the line the API server is writing right now
            continue
    return [
        a
        for a in entries
        if a.get("stage") == "ResponseComplete"
        and a["verb"] in ("create", "patch", "update")
        and (a.get("objectRef") or {}).get("resource") == resource
        and a["user"]["username"] == AGENT_USER
    ]


def gpu_rules(kube: Kube) -> set[str]:
    got = kube.custom.list_cluster_custom_object(
        dra.G, dra.V, "devicetaintrules", label_selector="app.kubernetes.io/managed-by=gpuhealth"
    )
    return {r["metadata"]["name"] for r in got.get("items") or []}


def reset_jobs(kube: Kube, node: str) -> list[Any]:
    return list(kube.batch.list_namespaced_job(REMEDIATION_NS, label_selector=f"gpuhealth.dev/node={node}").items)


def job_ended(kube: Kube, job: str) -> str:
    """How the Job ended ("Complete" or "Failed"), or "" while it runs."""
    conds = kube.batch.read_namespaced_job(job, REMEDIATION_NS).status.conditions or []
    return next((c.type for c in conds if c.type in ("Complete", "Failed") and c.status == "True"), "")


def ladder(kube: Kube, node: str, index: int) -> dict[str, Any]:
    return dict(((kube.report(node).get("status") or {}).get("remediation") or {}).get(str(index)) or {})


def scrape_jobs(e: Env) -> list[dict[str, Any]]:
    """The chart's ServiceMonitors (rendered with them on: the test cluster has no Prometheus
    Operator CRDs to install them) as static targets, from the release's Services and EndpointSlices."""
    monitors = [o for o in helm_template("--set=metrics.serviceMonitor.enabled=true") if o["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"gpuhealth-operator", "gpuhealth-agent"}
    got = json.loads(e.cluster.kubectl("get", "services,endpointslices", "-n", NS, "-o", "json").stdout)["items"]
    services = [o for o in got if o["kind"] == "Service"]
    slices = [o for o in got if o["kind"] == "EndpointSlice"]
    return prom.scrape_configs(monitors, services, slices, SCRAPE_S)


def targets_up(server: prom.Prometheus, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The active targets once there is one per static target and every one was scraped up; [] until."""
    want = sum(len(g["targets"]) for j in jobs for g in j["static_configs"])
    got = server.targets()
    return got if len(got) == want and all(t["health"] == "up" for t in got) else []


def evaluate_dashboard_and_alerts(server: prom.Prometheus) -> None:
    """Every dashboard query over the story so far and every rule now: no error, data where the story
    gives it, and the lists of what it cannot feed exactly what Prometheus found empty."""
    dash, spec = prom.dashboard(), prom.rule_spec()
    names = [prom.rule_name(r) for r in prom.rules(spec)]
    # The rule manager loaded every rule and evaluated each after the story's last step, cleanly.
    since = dt.datetime.now(dt.UTC)

    def evaluated() -> list[dict[str, Any]]:
        states = server.rule_states()
        done = [r for r in states if (parse_time(r.get("lastEvaluation")) or since) > since]
        return states if len(done) == len(states) == len(names) else []

    states = wait_for(evaluated, timeout=30, what="every rule evaluated by the server after the story")
    assert sorted(r["name"] for r in states) == sorted(names)
    assert [(r["name"], r.get("lastError")) for r in states if r["health"] != "ok"] == []

    # -- the dashboard, as Grafana draws it over the story (a query error raises PrometheusError).
    # Steps back from now, so the last point is now: a state scraped a moment ago (the quarantine) is drawn.
    end = time.time()
    start = end - STEP_S * int((end - server.started_at) // STEP_S)
    targets = prom.panel_targets(dash)
    assert {(t.panel, t.legend) for t in targets} >= set(UNFED_QUERIES), "UNFED_QUERIES names no such query"
    assert {(t.panel, t.legend) for t in targets} >= MOVED, "MOVED names no such query"
    empty, moved = set(), set()
    for t in targets:
        expr = prom.grafana_expr(t.expr, dash, SCRAPE_S, STEP_S)
        got = server.query_range(expr, start, end, STEP_S)
        drawn = [(s.labels, len(s.finite()), max((v for _, v in s.finite()), default=None)) for s in got]
        print(f"panel {t.panel!r} [{t.legend}]: {expr} -> (labels, points, max) {drawn}")
        if not any(s.finite() for s in got):
            empty.add((t.panel, t.legend))
        if any(v != 0 for s in got for _, v in s.finite()):
            moved.add((t.panel, t.legend))
    assert empty == set(UNFED_QUERIES), (
        f"empty for the story but not listed: {sorted(empty - set(UNFED_QUERIES))}; "
        f"listed but with data: {sorted(set(UNFED_QUERIES) - empty)}"
    )
    assert moved >= MOVED, f"drawn flat at 0 through the story: {sorted(MOVED - moved)}"

    # -- the alerts, as the rule manager evaluates them now: what each measures has series (with the
    #    labels its annotations print), and exactly the story's alerts hold.
    assert set(UNFED_ALERTS) <= set(names), "UNFED_ALERTS names no such alert"
    unfed, holding = set(), set()
    for rule in prom.rules(spec):
        name = prom.rule_name(rule)
        got = server.query(prom.measured(rule["expr"]))
        print(f"rule {name}: {prom.measured(rule['expr'])} -> {[(s.labels, s.samples) for s in got]}")
        if not got:
            unfed.add(name)
        printed = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule.get("annotations") or {})))
        assert all(printed <= s.labels.keys() for s in got), f"{name} prints {printed}, has {[s.labels for s in got]}"
        if server.query(rule["expr"]):
            holding.add(name)
    # The story's one XID 79 counts toward GPUHealthXIDRate's three (its series starts at zero).
    (xid,) = [r for r in prom.rules(spec) if prom.rule_name(r) == "GPUHealthXIDRate"]
    counted = {s.labels["code"]: s.samples[-1][1] for s in server.query(prom.measured(xid["expr"]))}
    assert counted["79"] >= 1, counted
    listed = set(UNFED_ALERTS)
    assert unfed == listed, f"unfed but not listed: {sorted(unfed - listed)}; listed but fed: {sorted(listed - unfed)}"
    assert holding == FIRING, f"alerts that hold: {sorted(holding)}"


# The module's setup (the image, when its inputs changed, a control plane and the node) counts too.
@pytest.mark.timeout(1200)
def test_installed_chart_runs_the_story_on_a_real_node(
    env: Env, tmp_path: Path, prometheus: prom.Prometheus, record_testsuite_property: Callable[[str, object], None]
) -> None:
    e = env
    node, kube, name = e.node, e.kube, e.node.name
    print(f"image under test: {e.image.ref} ({e.image.id})")
    e.installed.install(
        {
            "mode": "Enforce",
            "safety": {"probation": "10s", "maxUnhealthyGPUs": 8},
            # The repair ladder for an uncorrected ECC error: one reset, whose Job's pod runs gpuhealth's
            # own image on the node as the stand-in for the GPU tool, else the GPU waits for a human.
            "remediation": {
                "enabled": True,
                "ladders": [
                    {
                        "reasons": ["EccUncorrected"],
                        "steps": [{"type": "GPUReset", "timeout": "5m", "attempts": 1}, {"type": "Replace"}],
                    }
                ],
                "jobTemplate": nvml_reset_job_template(e.image.ref, RUNTIME_CLASS),
            },
        }
    )

    # -- the operator Pod: Ready, its liveness endpoint and metrics answer on the Pod's address.
    op = e.installed.operator_pod()
    op_ip = op["status"]["podIP"]
    wait_for(lambda: get(f"http://{op_ip}:8081/healthz"), timeout=60, what="operator liveness endpoint")
    wait_for(lambda: "gpuhealth_" in get(f"http://{op_ip}:8080/metrics"), timeout=60, what="operator metrics")

    # -- the agent Pod on the real node, the fake NVML where the toolkit would mount it.
    (agent,) = wait_for(lambda: e.installed.ready_pods("gpuhealth-agent"), timeout=180, what="agent Ready")
    assert agent["spec"]["nodeName"] == name and agent["spec"]["runtimeClassName"] == "nvidia"
    assert {e.image.id} == image_ids(op) | image_ids(agent), f"ran {image_ids(op) | image_ids(agent)}"
    print(f"ran image {e.image.ref} with digest {e.image.id} on {name}")
    record_testsuite_property("real-node-image", f"{e.image.ref}@{e.image.id}")  # in build/junit.xml
    wait_for(lambda: get(f"http://{agent['status']['podIP']}:9401/healthz"), timeout=60, what="agent /healthz")
    # -- a Prometheus scrapes both from here on, as the chart's ServiceMonitors would have it.
    began = time.monotonic()
    jobs = scrape_jobs(e)
    prometheus.start(jobs, prom.rule_spec())
    up = wait_for(lambda: targets_up(prometheus, jobs), timeout=60, what="Prometheus scraping operator and agent")
    assert {(t["labels"]["job"], t["labels"].get("node")) for t in up} == {
        ("gpuhealth-operator-metrics", None),
        ("gpuhealth-agent-metrics", name),
    }
    prometheus_s = time.monotonic() - began

    def report_gpus() -> int:
        try:
            return len(kube.report(name)["spec"].get("devices") or [])
        except client.ApiException:
            return 0

    wait_for(lambda: report_gpus() == 8, timeout=120, what="the agent's report of 8 GPUs")
    wait_for(lambda: kube.state(name) == "Healthy", timeout=120, what="a Healthy verdict from the operator Pod")
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(name, NS)
    assert lease.spec.holder_identity == name
    # Written with the agent's own ServiceAccount token, bound to its pod on this node.
    for resource in ("gpunodehealths", "leases"):

        def written(r: str = resource) -> list[dict[str, Any]]:
            return audited_writes(e, r)

        writes = wait_for(written, timeout=60, what=f"the agent's {resource} writes")
        assert {w["user"]["extra"]["authentication.kubernetes.io/node-name"][0] for w in writes} == {name}

    # -- the admission policy refuses that token a write to another node's report.
    as_agent = Kube(e.cluster.kubeconfig_with_token(agent_token(e, agent), tmp_path / "agent.kubeconfig"))
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUNodeHealth",
        "metadata": {"name": "another-gpu-node"},
        "spec": {"nodeName": "another-gpu-node"},
    }

    # A new admission policy is enforced once the API server has loaded it, a moment after the
    # install: wait for that with dry runs (admitted or refused, a dry run stores nothing).
    def in_force() -> bool:
        try:
            as_agent.custom.create_cluster_custom_object(GROUP, VERSION, "gpunodehealths", body, dry_run="All")
        except client.ApiException as exc:
            if exc.status == 403:
                return True
            raise
        return False

    wait_for(in_force, timeout=60, what="the agent admission policy in force")
    with pytest.raises(client.ApiException) as refused:
        as_agent.custom.create_cluster_custom_object(GROUP, VERSION, "gpunodehealths", body)
    assert refused.value.status == 403, refused.value.body
    assert f"it runs on {name}, not on another-gpu-node" in str(refused.value.body)

    # -- an uncorrected ECC error on GPU 5, which a DRA driver publishes: the operator Pod holds that GPU
    #    out (a DeviceTaintRule, the node stays in service), then its reset Job's pod runs in a real
    #    container on the node, finds the GPU through the fake NVML and exits 0; the test plays the
    #    GPU after the reset (clean volatile counters) and it returns after probation.
    dra.publish_device_classes(kube)
    dra.publish_slices(kube, [name])  # the fake NVML's UUIDs, as NVIDIA's DRA driver would publish them
    bad, rule = 5, f"gpuhealth-{name}-gpu-5"
    ecc = [f"gpu {bad} ecc_volatile_uncorrected 1", f"gpu {bad} ecc_aggregate_uncorrected 1"]
    node.write_scenario(ecc)
    wait_for(lambda: rule in gpu_rules(kube), timeout=120, what=f"GPU {bad} held out by {rule}")
    assert kube.our_taint(name) is None, "one GPU's fault must not take the node"
    (job,) = wait_for(lambda: reset_jobs(kube, name), timeout=120, what=f"the reset Job for GPU {bad}")
    job_name = job.metadata.name
    wait_for(lambda: job_ended(kube, job_name) == "Complete", timeout=240, what="the reset Job succeeded")
    (reset_pod,) = kube.core.list_namespaced_pod(REMEDIATION_NS, label_selector=f"job-name={job_name}").items
    assert reset_pod.spec.node_name == name and reset_pod.spec.runtime_class_name == RUNTIME_CLASS
    (cs,) = reset_pod.status.container_statuses
    assert cs.container_id.startswith("containerd://") and cs.image_id == e.image.id, (cs.container_id, cs.image_id)
    assert cs.state.terminated.exit_code == 0, cs.state.terminated
    # The container ran under containerd on this node, and saw the GPU through the (fake) NVML.
    info = node.ctr("containers", "info", cs.container_id.split("://", 1)[1], check=False)
    assert info.returncode == 0, f"containerd does not know the reset container: {info.stderr}"
    meta = reset_pod.metadata
    reset_log = pod_log(e, {"metadata": {"namespace": REMEDIATION_NS, "name": meta.name, "uid": meta.uid}})
    assert f"GPU {bad} {dra.fake_nvml_uuid(bad)}: reset" in reset_log, reset_log
    print(f"reset Job {REMEDIATION_NS}/{job_name}: pod {reset_pod.metadata.name} ran container {cs.container_id}")
    wait_for(lambda: ladder(kube, name, bad).get("phase") == "Verifying", timeout=60, what="waiting for clean facts")
    assert rule in gpu_rules(kube), "a Job's success alone returns nothing: the facts must be clean"
    clean = [f"gpu {bad} ecc_volatile_uncorrected 0", f"gpu {bad} ecc_aggregate_uncorrected 1"]
    node.write_scenario(clean)  # what nvidia-smi -r leaves: volatile counters cleared
    wait_for(lambda: rule not in gpu_rules(kube), timeout=120, what=f"GPU {bad} back after probation")
    wait_for(lambda: kube.state(name) == "Healthy", timeout=60, what="the node Healthy again")
    kube.await_events(name, "GPUReset", "RemediationSucceeded", "ReturnedToService")
    assert len(reset_jobs(kube, name)) == 1, "one reset, one Job"

    # -- a workload on the node, then an XID 79 from the fake NVML: the operator Pod taints,
    #    cordons and drains the node.
    e.cluster.kubectl("create", "namespace", WORKLOADS)
    e.cluster.apply_objects(
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "trainer", "namespace": WORKLOADS},
                "spec": {
                    "nodeName": name,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": PAUSE, "imagePullPolicy": "Never"}],
                },
            }
        ]
    )
    wait_for(
        lambda: [p for p in pods(e, WORKLOADS, "") if p["status"].get("phase") == "Running"],
        timeout=120,
        what="the workload Running",
    )
    node.write_scenario([*clean, "xid 1 gpu 3 code 79"])
    taint = wait_for(lambda: kube.our_taint(name), timeout=120, what="the operator Pod's taint")
    assert taint["value"] == "XID79"
    assert kube.node(name)["spec"].get("unschedulable") is True
    wait_for(lambda: not pods(e, WORKLOADS, ""), timeout=180, what="the workload drained off the node")
    wait_for(lambda: kube.state(name) == "Quarantined", timeout=120, what="Quarantined after the drain")

    # -- the agent's container is killed: the kubelet restarts it in the same Pod (same emptyDir),
    #    and its report still carries the XID, from its journal: NVML delivered it only once.
    killed_at = dt.datetime.now(dt.UTC)
    node.kill_container(node.container_id(NS, agent["metadata"]["name"], "agent"))

    def restarted() -> bool:
        p = json.loads(e.cluster.kubectl("get", "pod", "-n", NS, agent["metadata"]["name"], "-o", "json").stdout)
        return ready(p) and p["status"]["containerStatuses"][0]["restartCount"] >= 1

    wait_for(restarted, timeout=180, what="the agent container restarted and Ready")

    def republished() -> bool:
        spec = kube.report(name)["spec"]
        return dt.datetime.fromisoformat(spec["heartbeatTime"].replace("Z", "+00:00")) > killed_at

    wait_for(republished, timeout=120, what="a report from the restarted agent")
    assert [(x["xid"], x["gpu"]) for x in kube.report(name)["spec"]["xidEvents"]] == [(79, 3)]
    assert node.emit_log.read_text().count("xid 1 ") == 1, node.emit_log.read_text()
    assert kube.our_taint(name) is not None

    # -- Prometheus has seen the story: its last state scraped, every panel and alert evaluated.
    began = time.monotonic()
    scraped = [
        'gpuhealth_nodes{state="Quarantined"} == 1',
        f'gpuhealth_agent_last_write_timestamp_seconds{{node="{name}"}} > {killed_at.timestamp()}',
    ]
    for q in scraped:

        def seen(q: str = q) -> list[prom.Series]:
            return prometheus.query(q)

        wait_for(seen, timeout=60, what=f"Prometheus scraped {q}")
    evaluate_dashboard_and_alerts(prometheus)
    prometheus.stop()
    prometheus_s += time.monotonic() - began
    print(f"Prometheus: {prometheus_s:.1f}s of the story's time (its start, the last scrapes, the evaluation)")

    # -- helm upgrade to another tag of the image: both roll, the verdict stays.
    new_ref = f"{e.image.repository}:{e.image.tag}-upgrade"
    node.ctr("images", "tag", "--force", e.image.ref, new_ref)
    e.installed.helm(
        "upgrade",
        "gpuhealth",
        str(CHART),
        f"--namespace={NS}",
        "--reuse-values",
        f"--set=image.tag={e.image.tag}-upgrade",
        "--wait",
        "--timeout=300s",
    )
    wait_for(lambda: e.installed.ready_pods("gpuhealth-operator", new_ref), timeout=240, what="operator rolled")
    (new_agent,) = wait_for(
        lambda: e.installed.ready_pods("gpuhealth-agent", new_ref), timeout=240, what="agent rolled"
    )
    assert new_agent["metadata"]["uid"] != agent["metadata"]["uid"]
    assert kube.our_taint(name) is not None and kube.node(name)["spec"].get("unschedulable") is True
    assert kube.state(name) == "Quarantined"

    # -- RBAC enforced for real: nothing the installed operator or agent asked was refused.
    # The rolled agent has started once its log says so (the pod is Ready when its container starts).
    wait_for(lambda: "agent started for node" in pod_log(e, new_agent), timeout=120, what="the rolled agent started")
    for p in pods(e, NS, ""):
        log = pod_log(e, p)
        assert log, f"no log of {p['metadata']['name']}"
        assert refusals(log) == [], f"{p['metadata']['name']} was refused: {refusals(log)}"
        # Their probes held: the kubelet restarted nothing of the rolled release.
        assert [c["restartCount"] for c in p["status"]["containerStatuses"]] == [0], p["metadata"]["name"]

    # -- uninstall as docs/install.md says: nothing of gpuhealth's is left, on the node or in it.
    proc = run_uninstall(e.cluster.kubeconfig, e.cluster.kubectl_bin, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = kube.node(name)
    assert not [t for t in n["spec"].get("taints") or [] if t["key"].startswith("gpuhealth.dev/")]
    assert not n["spec"].get("unschedulable")
    assert not [
        k
        for k in {**n["metadata"].get("labels", {}), **n["metadata"].get("annotations", {})}
        if k.startswith("gpuhealth.dev/")
    ]
    assert not [c for c in n["status"].get("conditions") or [] if c["type"] == "GPUHealthy"]
    wait_for(lambda: not pods(e, NS, ""), timeout=120, what="no gpuhealth pod left")
    for obj in (
        "deploy/gpuhealth-operator",
        "ds/gpuhealth-agent",
        "validatingadmissionpolicy/gpuhealth-agent-own-node",
        "clusterrole/gpuhealth-operator",
        "clusterrole/gpuhealth-agent",
        "clusterkopfpeering/gpuhealth",
        "gpuhealthpolicy/default",
    ):
        left = e.cluster.kubectl("get", "-n", NS, obj, "--ignore-not-found", "-o", "name").stdout.strip()
        assert left == "", f"{obj} left behind"

    def gpuhealth_containers() -> list[str]:
        out = node.ctr("containers", "ls").stdout.splitlines()[1:]
        return [line for line in out if "gpuhealth" in line]

    wait_for(lambda: not gpuhealth_containers(), timeout=120, what="no gpuhealth container left on the node")
