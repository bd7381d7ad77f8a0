"""`status` groups by NVLink domain and rack; `describe` shows a node's domain and rack."""

from __future__ import annotations

from gpuhealth.cli.describe_text import render_describe
from gpuhealth.cli.fleet import summarize
from gpuhealth.cli.nodeview import describe_node
from gpuhealth.cli.render import render_status
from tests.unit.cli.objects import NOW, node, policy, report

CLIQUE = "nvidia.com/gpu.clique"
RACK = "topology.kubernetes.io/rack"


def _fleet() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    nodes = [
        node(f"d{i}", labels={CLIQUE: "abc.1", RACK: "r1"}, taint="ImexDomain" if i < 4 else None) for i in range(4)
    ]
    nodes += [node(f"p{i}", labels={RACK: "r2"}) for i in range(3)]
    reports = [report(f"d{i}", "Draining", reason="ImexDomain") for i in range(4)]
    reports += [report("p0", "Degraded", reason="RackPowerBrake"), report("p1", "Degraded", reason="RackPowerBrake")]
    reports += [report("p2", "Healthy")]
    return nodes, reports


def test_status_has_one_line_per_domain_and_rack() -> None:
    nodes, reports = _fleet()
    fleet = summarize(nodes, reports, [policy()], NOW)
    text = render_status(fleet)
    assert "Domain abc.1: 4 nodes, 4 out of service, 0 degraded (ImexDomain 4)" in text
    assert "Rack r1: 4 nodes, 4 out of service, 0 degraded (ImexDomain 4)" in text
    assert "Rack r2: 3 nodes, 0 out of service, 2 degraded (RackPowerBrake 2)" in text
    groups = fleet.to_json()["groups"]
    assert [(g["kind"], g["name"]) for g in groups] == [("Domain", "abc.1"), ("Rack", "r1"), ("Rack", "r2")]
    assert {r["node"]: (r["domain"], r["rack"]) for r in fleet.to_json()["nodes"]}["p2"] == (None, "r2")


def test_status_reads_the_labels_the_policy_names() -> None:
    nodes = [node("a", labels={"example.com/nvl": "x.2", "rack": "east"})]
    topo = {"domainLabel": "example.com/nvl", "rackLabel": "rack"}
    fleet = summarize(nodes, [report("a", "Healthy")], [policy(topology=topo)], NOW)
    assert "Domain x.2: 1 node, 0 out of service, 0 degraded" in render_status(fleet)
    assert "Rack east" in render_status(fleet)


def test_no_line_without_the_labels() -> None:
    fleet = summarize([node("a")], [report("a", "Healthy")], [policy()], NOW)
    assert "Domain" not in render_status(fleet) and "Rack" not in render_status(fleet)


def test_describe_shows_the_domain_and_rack_and_the_domain_finding() -> None:
    n = node("d2", labels={CLIQUE: "abc.1", RACK: "r1"}, taint="ImexDomain")
    message = "NVLink domain nvidia.com/gpu.clique=abc.1 (4 nodes): recovery action RecoverImexDomain on GPU 3"
    r = report("d2", "Draining", reason="ImexDomain", message=message)
    m = describe_node("d2", n, r, policy(), [], NOW)
    assert m["topology"]["domain"] == "abc.1" and m["topology"]["rack"] == "r1"
    text = render_describe(m)
    assert "NVLink domain abc.1, rack r1" in text
    assert "RecoverImexDomain" in text and "ImexDomain" in text
