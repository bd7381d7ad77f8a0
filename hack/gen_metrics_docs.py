"""Render the metrics reference in docs/install.md from the registries that serve them.

    python -m hack.gen_metrics_docs           # rewrite the block in docs/install.md
    python -m hack.gen_metrics_docs --check   # exit 1 when the block is stale

Each metric is declared once, where it is registered (``controller/metrics.py`` for the operator,
``agent/metrics.py`` for the agent) with its name, type, labels and help text. The reference users read
is rendered from those declarations, so a metric added, renamed or relabelled in the code changes the
document when this runs, and the drift test (``tests/unit/test_metrics_docs.py``) fails until it has.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from devkit.docblocks import check, stale_docs, write_docs
from gpuhealth.agent.metrics import AgentMetrics
from gpuhealth.controller import metrics as operator_metrics

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "install.md"
BEGIN = "<!-- metrics:begin (python -m hack.gen_metrics_docs) -->"
END = "<!-- metrics:end -->"


def metrics(holder: object) -> list[MetricWrapperBase]:
    """The metrics an object holds as attributes (the operator's module, the agent's ``AgentMetrics``), once each."""
    unique = {id(m): m for m in vars(holder).values() if isinstance(m, MetricWrapperBase)}
    return list(unique.values())


def rows(found: list[MetricWrapperBase], registry: CollectorRegistry) -> list[str]:
    """One table row per metric: name, type, labels, help; every family ``registry`` serves must be one."""
    served = {family.name for family in registry.collect()}
    named = {m._name for m in found}
    if served != named:
        raise SystemExit(f"served and held metrics differ: {sorted(served ^ named)}")
    out = []
    for m in sorted(found, key=lambda m: m._name):
        name = m._name + ("_total" if m._type == "counter" else "")
        labels = ", ".join(f"`{label}`" for label in m._labelnames) or "none"
        text = m._documentation.replace("|", "\\|")
        out.append(f"| `{name}` | {m._type} | {labels} | {text} |")
    return out


def block() -> str:
    """The rendered block, markers included."""
    head = "| metric | type | labels | what it says |\n| --- | --- | --- | --- |"
    agent = AgentMetrics(CollectorRegistry(auto_describe=True))
    parts = [
        BEGIN,
        "The operator (port 8080, `operator/gpuhealth/controller/metrics.py`):",
        "",
        head,
        *rows(metrics(operator_metrics), operator_metrics.REGISTRY),
        "",
        "The agent (port 9401, `operator/gpuhealth/agent/metrics.py`; the ServiceMonitor adds a `node` label):",
        "",
        head,
        *rows(metrics(agent), agent.registry),
        END,
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/install.md is stale")
    args = parser.parse_args(argv)
    rendered = {DOC: [block()]}
    if args.check:
        return check(stale_docs(rendered), "hack.gen_metrics_docs")
    write_docs(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
