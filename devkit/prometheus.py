"""A real Prometheus server for the real-node tier, and the reading of what it evaluates.

The server is built by ``hack/build-tools.sh`` from the same Prometheus module as promtool. It runs
on the host beside the real node and scrapes the installed chart's operator and agent pods on their
pod addresses, which the host reaches on the node's CNI bridge. There is no Prometheus Operator: the
chart's ServiceMonitors are turned into static targets here (:func:`scrape_configs`) the way the
Prometheus Operator would discover them, from the EndpointSlices of the Services they select, with
the labels it gives every target (``job`` the Service's name, ``namespace``, ``service``, ``pod``,
``endpoint``) and the ServiceMonitor's own relabelings (only the ``sourceLabels`` to ``targetLabel``
copy the chart uses; any other fails loudly rather than scraping something the chart does not).

The dashboard's queries are Grafana's: :func:`grafana_expr` fills in its variables the way Grafana
would for the dashboard as it opens (every template variable at its default, ``All``).
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devkit.cluster import free_port
from devkit.k8s import wait_for
from devkit.proc import Proc
from devkit.tools import tool

REPO = Path(__file__).resolve().parents[1]
COMPONENT = REPO / "manifests" / "components" / "prometheus"
DASHBOARD = COMPONENT / "dashboards" / "gpuhealth.json"
PROMETHEUS_RULE = COMPONENT / "prometheusrule.yaml"


class PrometheusError(RuntimeError):
    """The server failed, or answered a query with an error."""


# -- what the dashboard and the rules ask ---------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One query of a dashboard panel."""

    panel: str  # the panel's title
    legend: str  # its legendFormat (or refId): which of the panel's queries
    expr: str


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def rule_spec() -> dict[str, Any]:
    """The PrometheusRule's spec (its ``groups``, as a Prometheus rule file has them)."""
    spec: dict[str, Any] = yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]
    return spec


def panel_targets(dash: Mapping[str, Any]) -> list[Target]:
    """Every query of every panel (rows included, though they carry none), in the dashboard's order."""
    return [
        Target(p["title"], str(t.get("legendFormat") or t.get("refId") or ""), t["expr"])
        for p in dash["panels"]
        for t in p.get("targets", [])
    ]


def rules(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every alerting and recording rule of a PrometheusRule spec."""
    return [r for g in spec["groups"] for r in g["rules"]]


def rule_name(rule: Mapping[str, Any]) -> str:
    return str(rule.get("alert") or rule["record"])


def grafana_expr(expr: str, dash: Mapping[str, Any], scrape_interval_s: int, step_s: int) -> str:
    """``expr`` as Grafana sends it for a range query of step ``step_s`` (its ``$__interval``) to a data
    source whose scrape interval is ``scrape_interval_s``: ``$__rate_interval`` is Grafana's
    max($__interval + scrape interval, 4 * scrape interval); a template variable is its default, which
    for an ``All`` with an ``allValue`` is that value. A variable left over fails."""
    values = {
        "__rate_interval": f"{max(step_s + scrape_interval_s, 4 * scrape_interval_s)}s",
        "__interval": f"{step_s}s",
    }
    for var in (dash.get("templating") or {}).get("list", []):
        current = (var.get("current") or {}).get("value")
        if var.get("type") == "query" and current == "$__all" and "allValue" in var:
            values[var["name"]] = var["allValue"]

    def fill(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise PrometheusError(f"no value for the dashboard variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", fill, expr)


_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")


def measured(expr: str) -> str:
    """What an alert measures: its expression without its last top-level comparison (``X > 0`` -> ``X``),
    or ``absent(X)``'s ``X``. It has series whenever the metrics it reads do, firing or not, so an
    alert that is rightly silent still shows whether it reads anything (and with which labels)."""
    e = expr.strip()
    if e.startswith("absent(") and e.endswith(")"):
        return e[len("absent(") : -1].strip()
    depth, quoted, cut = 0, False, -1
    i = 0
    while i < len(e):
        c = e[i]
        if c == '"' and (i == 0 or e[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and c in "([{":
            depth += 1
        elif not quoted and c in ")]}":
            depth -= 1
        elif not quoted and depth == 0 and (op := next((o for o in _COMPARISONS if e.startswith(o, i)), None)):
            cut = i
            i += len(op)
            continue
        i += 1
    return e[:cut].strip() if cut >= 0 else e


# -- the ServiceMonitors as static targets --------------------------------------------------------


def _relabel(relabelings: Sequence[Mapping[str, Any]], meta: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for r in relabelings:
        if set(r) != {"sourceLabels", "targetLabel"}:
            raise PrometheusError(f"a relabeling this static translation does not know: {dict(r)}")
        out[r["targetLabel"]] = ";".join(meta.get(s, "") for s in r["sourceLabels"])
    return out


def scrape_configs(
    servicemonitors: Sequence[Mapping[str, Any]],
    services: Sequence[Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
    interval_s: int,
) -> list[dict[str, Any]]:
    """One scrape job per ServiceMonitor endpoint, its targets the addresses of the selected Services'
    EndpointSlices on the endpoint's named port, every scrape every ``interval_s`` seconds."""
    jobs = []
    for sm in servicemonitors:
        spec, ns = sm["spec"], sm["metadata"]["namespace"]
        want = spec["selector"]["matchLabels"]
        allowed = spec.get("namespaceSelector", {}).get("matchNames", [ns])
        chosen = [
            s
            for s in services
            if s["metadata"]["namespace"] in allowed and want.items() <= (s["metadata"].get("labels") or {}).items()
        ]
        for i, ep in enumerate(spec["endpoints"]):
            groups = []
            for svc in chosen:
                name, svc_ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
                for sl in slices:
                    labels = sl["metadata"].get("labels") or {}
                    if sl["metadata"]["namespace"] != svc_ns or labels.get("kubernetes.io/service-name") != name:
                        continue
                    port = next((p["port"] for p in sl.get("ports") or [] if p.get("name") == ep["port"]), None)
                    if port is None:
                        continue
                    for e in sl.get("endpoints") or []:
                        pod = (e.get("targetRef") or {}).get("name", "")
                        meta = {"__meta_kubernetes_pod_node_name": e.get("nodeName", "")}
                        target_labels = {
                            "job": name,
                            "namespace": svc_ns,
                            "service": name,
                            "pod": pod,
                            "endpoint": ep["port"],
                            **_relabel(ep.get("relabelings") or [], meta),
                        }
                        groups += [{"targets": [f"{a}:{port}"], "labels": target_labels} for a in e["addresses"]]
            if not groups:
                raise PrometheusError(f"ServiceMonitor {ns}/{sm['metadata']['name']} endpoint {i}: no target")
            jobs.append(
                {
                    "job_name": f"serviceMonitor/{ns}/{sm['metadata']['name']}/{i}",
                    "metrics_path": ep.get("path", "/metrics"),
                    "scrape_interval": f"{interval_s}s",
                    "static_configs": groups,
                }
            )
    return jobs


# -- the server -----------------------------------------------------------------------------------

Sample = tuple[float, float]  # (unix time, value)


@dataclass
class Series:
    labels: dict[str, str]
    samples: list[Sample]

    def finite(self) -> list[Sample]:
        return [(t, v) for t, v in self.samples if math.isfinite(v)]


@dataclass
class Prometheus:
    """A Prometheus server on 127.0.0.1 with its data in ``workdir``; stopped by :meth:`stop`."""

    workdir: Path
    interval_s: int = 1
    port: int = 0
    proc: Proc | None = None
    started_at: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, jobs: list[dict[str, Any]], rule_spec: Mapping[str, Any] | None = None) -> Prometheus:
        """Write prometheus.yml (and the rules' file), run the server, and return once it is ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config = {
            "global": {"scrape_interval": f"{self.interval_s}s", "evaluation_interval": f"{self.interval_s}s"},
            "scrape_configs": jobs,
        }
        if rule_spec is not None:
            rules_file = self.workdir / "rules.yaml"
            rules_file.write_text(yaml.safe_dump({"groups": rule_spec["groups"]}, sort_keys=False))
            self.config["rule_files"] = [str(rules_file)]
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.port = free_port()
        self.proc = Proc(
            "prometheus",
            [
                str(tool("prometheus")),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            self.workdir / "prometheus.log",
        )
        self.started_at = time.time()
        self.proc.start()
        wait_for(self._ready, timeout=60, what=f"Prometheus ready (log: {self.proc.log})")
        return self

    def _ready(self) -> bool:
        if self.proc is None or not self.proc.alive():
            raise PrometheusError(f"Prometheus exited: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        if self.proc is None or not self.proc.log.exists():
            return ""
        return "\n".join(self.proc.log.read_text(errors="replace").splitlines()[-lines:])

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of an HTTP API answer; its error, warnings or infos as :class:`PrometheusError`."""
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400/422: the query's error is in the body
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        # A query that runs but is likely wrong answers with annotations: a warning (histogram_quantile
        # over series without an "le" label) or an info (rate() of a metric not named like a counter,
        # a gauge). Either fails here, as an error would.
        if notes := [*(body.get("warnings") or []), *(body.get("infos") or [])]:
            raise PrometheusError(f"{path} {params}: {notes}")
        return body["data"]

    def query(self, expr: str) -> list[Series]:
        """An instant query now, as the rule manager evaluates an alert."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr!r} is a {data['resultType']}, not a vector")
        return [Series(r["metric"], [(float(r["value"][0]), float(r["value"][1]))]) for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step_s: int) -> list[Series]:
        """A range query, as Grafana draws a time-series or stat panel."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step_s}s")
        return [Series(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]]

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return active

    def rule_states(self) -> list[dict[str, Any]]:
        """Every loaded rule as /api/v1/rules reports it: its health, last error and alerts."""
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
