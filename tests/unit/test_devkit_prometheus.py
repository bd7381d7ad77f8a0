"""devkit/prometheus.py's pure parts: what an alert measures, Grafana's variables, and the chart's
ServiceMonitors as static targets (the real-node tier runs the server itself)."""

from __future__ import annotations

from typing import Any

import pytest

from devkit import prometheus as prom


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("max by (policy) (gpuhealth_breaker_open) == 1", "max by (policy) (gpuhealth_breaker_open)"),
        ('sum(increase(x{result!="Passed"}[1h])) > 0', 'sum(increase(x{result!="Passed"}[1h]))'),
        ('sum by (code) (rate(x{signal="XID"}[10m])) * 600 >= 3', 'sum by (code) (rate(x{signal="XID"}[10m])) * 600'),
        ('absent(up{job="op"} == 1)', 'up{job="op"} == 1'),
        ("count(a == 0)", "count(a == 0)"),  # inside parentheses: not the alert's threshold
        ('x{a=~"<|>"}', 'x{a=~"<|>"}'),  # inside a label matcher's quotes
    ],
)
def test_an_alert_measures_its_expression_without_its_threshold(expr: str, want: str) -> None:
    assert prom.measured(expr) == want


def test_grafana_variables_are_filled_in_as_grafana_would_and_a_stray_one_fails() -> None:
    dash: dict[str, Any] = {
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource"},
                {"name": "policy", "type": "query", "allValue": ".*", "current": {"value": "$__all"}},
            ]
        }
    }
    got = prom.grafana_expr('rate(x{policy=~"$policy"}[$__rate_interval]) / ${__interval}', dash, 1, 2)
    assert got == 'rate(x{policy=~".*"}[4s]) / 2s'
    assert prom.grafana_expr("rate(x[$__rate_interval])", dash, 15, 60) == "rate(x[75s])"
    with pytest.raises(prom.PrometheusError, match=r"\$node"):
        prom.grafana_expr('x{node="$node"}', dash, 1, 2)


def test_every_shipped_panel_query_is_filled_in_completely() -> None:
    dash = prom.dashboard()
    targets = prom.panel_targets(dash)
    assert len(targets) >= 20
    assert all("$" not in prom.grafana_expr(t.expr, dash, 1, 2) for t in targets)


def _slice(service: str, port: int, *pods: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "labels": {"kubernetes.io/service-name": service}},
        "ports": [{"name": "metrics", "port": port}, {"name": "health", "port": 1}],
        "endpoints": [{"addresses": [ip], "nodeName": node, "targetRef": {"name": pod}} for ip, node, pod in pods],
    }


def test_a_servicemonitor_becomes_the_static_targets_the_prometheus_operator_would_discover() -> None:
    monitor: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "namespaceSelector": {"matchNames": ["ns"]},
            "endpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}],
                }
            ],
        },
    }
    services = [
        {"metadata": {"namespace": "ns", "name": "agent-metrics", "labels": {"app": "agent", "x": "y"}}},
        {"metadata": {"namespace": "ns", "name": "other", "labels": {"app": "other"}}},
        {"metadata": {"namespace": "elsewhere", "name": "agent-metrics", "labels": {"app": "agent"}}},
    ]
    slices = [
        _slice("agent-metrics", 9401, ("10.0.0.2", "n1", "agent-a"), ("10.0.0.3", "n2", "agent-b")),
        _slice("other", 8080, ("10.0.0.9", "n1", "other-a")),
    ]
    (job,) = prom.scrape_configs([monitor], services, slices, 1)
    assert job["job_name"] == "serviceMonitor/ns/agent/0" and job["scrape_interval"] == "1s"
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [
        {
            "targets": [f"10.0.0.{i}:9401"],
            "labels": {
                "job": "agent-metrics",
                "namespace": "ns",
                "service": "agent-metrics",
                "pod": pod,
                "endpoint": "metrics",
                "node": node,
            },
        }
        for i, node, pod in ((2, "n1", "agent-a"), (3, "n2", "agent-b"))
    ]
    # A relabeling it does not translate fails, rather than scraping what the chart would not.
    monitor["spec"]["endpoints"][0]["relabelings"][0]["action"] = "drop"
    with pytest.raises(prom.PrometheusError, match="relabeling"):
        prom.scrape_configs([monitor], services, slices, 1)
    # A ServiceMonitor that selects nothing fails too.
    monitor["spec"]["selector"]["matchLabels"] = {"app": "none"}
    with pytest.raises(prom.PrometheusError, match="no target"):
        prom.scrape_configs([monitor], services, slices, 1)
