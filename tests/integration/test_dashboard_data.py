"""Every metric a dashboard panel or an alert reads is exported, with data, by a running system.

A small scenario (two GPU nodes with real agents on fake NVML, an XID 79 on one) runs against the
real operator; then the operator's and the agents' /metrics are scraped and every selector in the
Grafana dashboard and the PrometheusRule must match at least one exported series (equality label
matchers included). A gauge nothing sets, or a labelled counter with no series before its first
event, shows up here as an empty panel would.

The two nodes share an NVLink domain (the clique label), so the domain gauge has its series. The rack
gauge (``gpuhealth_rack_findings{policy,rack,reason}``) has a series only once a node of a rack reports
a power brake, and only an alert reads it (no series: the alert rightly stays silent); the scenario
brakes no GPU, so that one is held to being a metric the operator declares, which still catches a typo
(tests/integration/test_domains.py watches its values). The NIC alert's
``gpuhealth_faults_total{signal="NICDown"}`` has its series before any NIC fails: every signal's
starts at zero (controller/metrics.py).

This checks the selectors only; tests/integration/test_real_node.py has a real Prometheus evaluate
every panel's and every alert's whole expression (rates, quantiles, joins) over the installed chart.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from devkit import prometheus
from devkit.agents import AgentFleet
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, wait_for
from gpuhealth.controller import metrics as operator_metrics
from tests.integration.conftest import policy_spec

CLIQUE_LABEL = "nvidia.com/gpu.clique"
# Alert-only series that exist once a topology finding is evaluated (see the module docstring).
ONLY_DECLARED = {"gpuhealth_rack_findings"}
SELECTOR = re.compile(r"\b(gpuhealth_[a-z_]+)(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')

Series = list[tuple[str, dict[str, str], float]]


def used_selectors() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(metric, equality matchers) of every gpuhealth_* selector in the dashboard and the alerts."""
    exprs = [t.expr for t in prometheus.panel_targets(prometheus.dashboard())]
    exprs += [r["expr"] for r in prometheus.rules(prometheus.rule_spec())]
    found = set()
    for expr in exprs:
        for name, matchers in SELECTOR.findall(expr):
            eq = tuple(sorted((k, v) for k, op, v in MATCHER.findall(matchers) if op == "="))
            found.add((name, eq))
    return found


def scrape(port: int) -> Series:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def value(series: Series, name: str, **labels: str) -> float | None:
    return next((v for n, lab, v in series if n == name and labels.items() <= lab.items()), None)


def test_every_panel_and_alert_metric_is_exported_with_data(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, tmp_path: Path
) -> None:
    labels = {"gpuhealth-test": group, CLIQUE_LABEL: f"dashboard-{abs(hash(group)) % 32768}.1"}
    nodes = cluster.add_gpu_nodes(2, prefix=f"{group}-", labels=labels)
    cluster.wait_nodes_ready(2, selector=f"gpuhealth-test={group}")
    kube.apply_policy(group, policy_spec(group))
    agents = AgentFleet(cluster.kubeconfig, tmp_path / "agents", metrics=True).start(nodes)
    try:
        wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), timeout=60, what="agents reporting")
        agents[nodes[0]].inject_xid(gpu=3, code=79)
        wait_for(lambda: kube.our_taint(nodes[0]), timeout=60, what="XID 79 quarantine")
        # The capacity panel: the quarantined node's 8 GPUs are held out of service under this policy.
        held = wait_for(
            lambda: sum(
                v
                for n, lab, v in scrape(operator.metrics_port)
                if n == "gpuhealth_gpus_out_of_service" and lab["policy"] == group
            ),
            timeout=30,
            what="gpuhealth_gpus_out_of_service for the policy",
        )
        assert held == 8

        wait_for(
            lambda: value(scrape(agents[nodes[0]].metrics_port), "gpuhealth_agent_last_write_timestamp_seconds"),
            what="agent metrics",
        )
        series = scrape(operator.metrics_port)
        for a in agents.agents.values():
            series += scrape(a.metrics_port)
        assert value(series, "gpuhealth_faults_total", signal="XID", code="79")
        assert value(series, "gpuhealth_nodes", policy=group, state="Healthy") == 1
        # The operator's start-up ends (controller/process/firstpass.py): every node passed with its pods.
        wait_for(
            lambda: (value(scrape(operator.metrics_port), "gpuhealth_startup_seconds") or 0) > 0,
            timeout=60,
            what="gpuhealth_startup_seconds",
        )

        declared = {m.name for m in operator_metrics.REGISTRY.collect()}
        assert declared >= ONLY_DECLARED, (
            f"alerts read metrics the operator does not declare: {ONLY_DECLARED - declared}"
        )
        missing = [
            (name, dict(eq))
            for name, eq in sorted(used_selectors())
            if name not in ONLY_DECLARED
            and not any(n == name and dict(eq).items() <= lab.items() for n, lab, _ in series)
        ]
        assert len(used_selectors()) >= 15
        assert not missing, f"panels or alerts read series nothing exports: {missing}"
    finally:
        agents.stop()
