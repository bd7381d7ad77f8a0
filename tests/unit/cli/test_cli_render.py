"""Text rendering for `kubectl gpuhealth`: ages, the status table and footer, describe, explain, colours."""

from __future__ import annotations

import pytest

from gpuhealth.cli.describe_text import drain_lines, render_describe
from gpuhealth.cli.explain import explain
from gpuhealth.cli.explain_text import render_explain
from gpuhealth.cli.fleet import summarize
from gpuhealth.cli.nodeview import describe_node
from gpuhealth.cli.render import (
    format_money,
    human_age,
    render_status,
    status_rows,
    strip_ansi,
    table,
)
from tests.unit.cli.objects import NOW, ago, node, policy, report


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (-5, "0s"),
        (0, "0s"),
        (59, "59s"),
        (119, "119s"),
        (125, "2m5s"),
        (180, "3m"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600 + 4 * 60, "3h4m"),
        (5 * 3600, "5h"),
        (20 * 3600, "20h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (30 * 86400, "30d"),
        (800 * 86400, "2y"),
    ],
)
def test_human_age_reads_like_kubectl(seconds: float | None, text: str) -> None:
    assert human_age(seconds) == text


def test_money_lists_each_currency() -> None:
    assert format_money({"USD": 1234.5}) == "1,234.50 USD"
    assert format_money({"USD": 1, "EUR": 2}) == "2.00 EUR + 1.00 USD"


def test_table_pads_on_plain_text_and_styles_after() -> None:
    lines = table(["A", "BB"], [["x", "1"], ["long", "22"]], lambda n, col, cell: f"<{cell}>" if col == 0 else cell)
    assert lines == ["A      BB", "<x   >   1", "<long>   22"]


def _fleet(color: bool = False, wide: bool = False) -> str:
    nodes = [node("gpu-a", taint="XID79", cordoned=True), node("gpu-b"), node("gpu-c")]
    reports = [
        report("gpu-a", "Draining", since_s=2 * 3600, reason="XID79", healthyGPUs=7, lastXid="79 (GPU 3)"),
        report("gpu-b", "Healthy", since_s=600),
        report("gpu-c", "Unknown", since_s=3600, reason="AgentSilent", healthyGPUs=0),
    ]
    fleet = summarize(nodes, reports, [policy(cost={"gpuHourly": 2.5})], NOW)
    return render_status(fleet, color=color, wide=wide)


def test_status_table_and_footer() -> None:
    text = _fleet()
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "STATE", "REASON", "GPUS", "SINCE", "POLICY"]
    assert lines[1].split() == ["gpu-a", "Draining", "XID79", "7/8", "120m", "train"]
    assert lines[2].split() == ["gpu-c", "Unknown", "AgentSilent", "0/8", "60m", "train"]
    assert lines[3].split() == ["gpu-b", "Healthy", "-", "8/8", "10m", "train"]
    assert "3 nodes: 1 Draining, 1 Unknown, 1 Healthy" in text
    assert "GPUs: 15 healthy of 24" in text
    assert "Held out of service: 1 node, 8 GPUs, 16.0 GPU-hours (Draining 16.0) = 40.00 USD" in text
    assert "Unknown (agent silent, not counted above): 1 node, 8 GPUs, 8.00 GPU-hours unobserved = 20.00 USD" in text
    assert "\x1b[" not in text


def test_status_colours_the_state_only_when_asked_and_keeps_alignment() -> None:
    colored = _fleet(color=True)
    assert "\x1b[31mDraining" in colored and "\x1b[32mHealthy" in colored and "\x1b[35mUnknown" in colored
    assert strip_ansi(colored) == _fleet(color=False)


def test_status_wide_adds_marks_and_cost() -> None:
    lines = _fleet(wide=True).splitlines()
    assert lines[0].split()[6:] == ["LAST-XID", "TAINT", "CORDONED", "GPU-HOURS", "COST"]
    assert "79 (GPU 3)" in lines[1] and "XID79" in lines[1] and "16.0" in lines[1] and "40.00 USD" in lines[1]


def test_status_marks_dry_run_paused_policy_orphans_and_no_verdict() -> None:
    nodes = [node("a"), node("b", labels={"pool": "p"}), node("c", labels={"pool": "none"})]
    reports = [report("a", "Draining", since_s=60, dryRun=True, policy="dry"), report("gone", "Quarantined")]
    policies = [
        policy("dry", mode="DryRun", selector={"matchLabels": {"pool": "x"}}),
        policy("p", mode="Paused", selector={"matchLabels": {"pool": "p"}}),
        policy("train", selector={"matchLabels": {"pool": "q"}}),
    ]
    text = render_status(summarize(nodes, reports, policies, NOW))
    assert "Draining (DryRun)" in text and "dry (DryRun)" in text
    assert "p (Paused)" in text and "NoPolicy" in text and "gone (no Node)" in text
    assert "DryRun verdicts (no Node changed, not counted): 1" in text
    assert "1 node without spec.cost.gpuHourly" in text


def test_status_with_nothing_to_show() -> None:
    assert "No GPU nodes" in render_status(summarize([], [], [], NOW))


def test_status_without_out_of_service_nodes() -> None:
    text = render_status(summarize([node("a")], [report("a", "Healthy")], [policy()], NOW))
    assert "Held out of service: none" in text and "Unknown" not in text


def _describe(**kw: object) -> str:
    spec = {
        "agent": {"version": "0.1.0", "sources": ["nvml"]},
        "heartbeatTime": ago(5),
        "nvml": {"available": True, "driverVersion": "570.86.15"},
        "devices": [
            {
                "index": 0,
                "uuid": "GPU-0000",
                "model": "NVIDIA H100 80GB HBM3",
                "temperature": {"currentC": 45, "slowdownC": 90},
                "ecc": {"volatileUncorrected": 0, "aggregateUncorrected": 2},
                "remappedRows": {"corrected": 1, "uncorrected": 0, "pending": True, "failure": False},
            },
            {"index": 3, "uuid": "GPU-0003", "model": "NVIDIA H100 80GB HBM3", "lost": True, "unsupported": ["ecc"]},
        ],
        "xidEvents": [
            {"xid": 13, "gpu": 0, "time": ago(7200), "source": "nvml"},
            {"xid": 79, "gpu": 3, "uuid": "GPU-0003", "time": ago(120), "source": "nvml"},
        ],
    }
    rep = report(
        "gpu-a",
        "Draining",
        since_s=120,
        spec=spec,
        reason="XID79",
        message="GPU 3 (GPU-0003): XID 79 (GPU has fallen off the bus): reboot the node",
        healthyGPUs=7,
        lastXid="79 (GPU 3)",
        quarantines=[ago(120)],
        clearedBefore=ago(3600),
        drainAction="drain",
        evidence=[
            {
                "signal": "XID",
                "reason": "XID79",
                "action": "drain",
                "gpu": 3,
                "code": 79,
                "detail": "XID 79 (GPU has fallen off the bus): reboot the node",
                "since": ago(120),
            }
        ],
        drain={
            "phase": "Running",
            "total": 4,
            "waitingForCheckpoint": 1,
            "evicted": 2,
            "blockedByBudget": 1,
            "deadlineAt": ago(-60),
            "pods": {"u1": {"pod": "ns/p", "node": "gpu-a", "blocked": 1}},
        },
        **kw,
    )
    n = node(
        "gpu-a",
        taint="XID79",
        cordoned=True,
        labels={"gpuhealth.dev/state": "Draining"},
        annotations={
            "gpuhealth.dev/quarantine": '{"cordon":true,"reason":"XID79","since":"' + ago(120) + '","taint":true}'
        },
        conditions=[{"type": "GPUHealthy", "status": "False", "reason": "XID79", "message": "GPU 3: XID 79"}],
        other_taints=[{"key": "example.com/maint", "effect": "NoSchedule"}],
    )
    events = [
        {
            "type": "Warning" if i % 2 else "Normal",
            "reason": f"R{i}",
            "message": f"message {i}",
            "lastTimestamp": ago(1000 - i),
            "eventTime": None,
        }
        for i in range(12)
    ]
    model = describe_node("gpu-a", n, rep, policy(safety={"probation": "10m"}), events, NOW)
    return render_describe(model)


def test_describe_shows_state_devices_xids_marks_history_drain_and_events() -> None:
    text = _describe()
    assert "State:         Draining   since" in text and "(2m ago)" in text
    assert "Policy:        train (Enforce)" in text and "GPUs:          7/8 healthy" in text
    assert "Agent:         0.1.0 (nvml), heartbeat 5s ago, driver 570.86.15" in text
    # devices
    assert "45C (slowdown 90C)" in text and "0/2" in text and "1/0 pending" in text
    assert "LOST" in text and "ecc" in text
    # XIDs, newest first, with their meaning; the cleared one says so
    xid_lines = [line for line in text.splitlines() if "[gpuhealth: drain]" in line]
    assert len(xid_lines) == 1 and xid_lines[0].split()[:3] == ["2m", "3", "79"]
    assert text.index("XID 79 (GPU has fallen off the bus): reboot the node [gpuhealth") < text.index("XID 13")
    assert "[gpuhealth: ignore] (cleared by release)" in text
    # marks
    assert "Taint:         gpuhealth.dev/unhealthy=XID79:NoSchedule" in text
    assert "cordoned by gpuhealth" in text and "gpuhealth.dev/state=Draining" in text
    assert "GPUHealthy=False (XID79): GPU 3: XID 79" in text and "example.com/maint=:NoSchedule" in text
    # history
    assert "1 in the flapping window (at 3 within 24h the node goes to AwaitingRepair)" in text
    assert f"evidence before {ago(3600)} cleared by a human" in text
    # drain: whatever keys it has, known ones first
    assert "Phase:" in text and "Pods total:" in text and "Waiting for checkpoint:" in text
    assert "Blocked by budget:" in text and "ns/p: blocked=1, node=gpu-a" in text and "Deadline at:" in text
    # the last 10 events, oldest first
    assert "R0 " not in text and "R1 " not in text and "R2 " in text and "R11" in text
    assert text.index("R2 ") < text.index("R11")


def test_describe_foreign_cordon_lifted_taint_and_pending_release() -> None:
    n = node(
        "n",
        cordoned=True,
        annotations={
            "gpuhealth.dev/quarantine": '{"cordon":false,"reason":"XID79","since":"","taint":true,'
            '"liftedByOthers":["taint"]}',
            "gpuhealth.dev/release": ago(10),
        },
    )
    text = render_describe(describe_node("n", n, report("n", "AwaitingRepair"), None, [], NOW))
    assert "cordoned by someone else (gpuhealth never lifts it)" in text
    assert "someone else removed gpuhealth's taint (LiftedByOthers)" in text
    assert "Taint:         none" in text
    assert f"requested at {ago(10)}, not processed by the operator yet" in text
    assert "GPUHealthy not set" in text


def test_describe_without_report_or_node() -> None:
    text = render_describe(describe_node("n", node("n"), None, None, [], NOW))
    assert "no GPUNodeHealth report" in text and "(none reported)" in text and "Events" in text
    text = render_describe(describe_node("gone", None, report("gone", "Unknown"), None, [], NOW))
    assert "gone (no such Node)" in text and "(the Node does not exist)" in text


def test_describe_probation_left() -> None:
    rep = report("n", "Recovering", since_s=300, healthySince=ago(240))
    text = render_describe(describe_node("n", node("n"), rep, policy(safety={"probation": "10m"}), [], NOW))
    assert "Probation:       10m; clean since" in text and "6m left" in text


def test_drain_lines_render_the_drain_record_whatever_its_keys() -> None:
    record = {
        "phase": "Running",
        "startedAt": ago(60),
        "fatal": False,
        "total": 2,
        "waitingForCheckpoint": 1,
        "evicted": 1,
        "blockedByBudget": 0,
        "timedOut": ["ml/gang-a"],
        "pods": {
            "uid-2": {"pod": "ml/train-1", "node": "n", "requestedAt": ago(50)},
            "uid-1": {"pod": "ml/train-0", "node": "n", "evictedAt": ago(30), "blocked": 2},
        },
        "somethingNew": {"a": 1},
    }
    lines = drain_lines(record)
    labels = [line.split(":")[0].strip() for line in lines if not line.startswith("    ")]
    assert labels == [
        "Phase",
        "Pods total",
        "Waiting for checkpoint",
        "Evicted",
        "Blocked by budget",
        "Fatal fault",
        "Started at",
        "Something new",
        "Timed out",
        "Pods",
    ]
    assert any("Timed out:" in line and "1: ml/gang-a" in line for line in lines)
    assert any("Something new:" in line and '{"a":1}' in line for line in lines)
    pods = [line.strip() for line in lines if line.startswith("    ")]
    assert pods[0].startswith("ml/train-0: blocked=2, evictedAt=") and pods[1].startswith("ml/train-1: node=n")
    assert drain_lines({"phase": "Completed", "pods": {}})[1].split() == ["Pods:", "none"]


def test_explain_text() -> None:
    text = render_explain(explain(79))
    assert text.startswith("XID 79: GPU has fallen off the bus (")
    assert "Immediate action:  REBOOT_NODE: reboot the node" in text
    assert "gpuhealth action:  drain:" in text and "What to do:" in text and "Application error: no" in text


def test_describe_takes_the_heartbeat_from_the_agents_lease_when_it_is_newer() -> None:
    """With a Lease the report is written only when a fact changes; its renewal is the heartbeat."""
    rep = report("n", "Healthy")
    rep["spec"]["heartbeatTime"] = ago(3600)
    lease = {"metadata": {"name": "n"}, "spec": {"holderIdentity": "n", "renewTime": ago(12)}}
    model = describe_node("n", node("n"), rep, None, [], NOW, lease=lease)
    assert model["agent"]["heartbeatAgeSeconds"] == 12 and model["agent"]["leaseRenewTime"] == ago(12)
    assert "heartbeat 12s ago" in render_describe(model)
    # An older agent without a Lease: the report's own heartbeat, as before.
    assert describe_node("n", node("n"), rep, None, [], NOW)["agent"]["heartbeatAgeSeconds"] == 3600


def test_describe_and_status_show_the_clock_offset_while_a_node_is_skewed() -> None:
    skewed = report(
        "a", "Healthy", spec={"heartbeatTime": ago(-600)}, clockSkew={"offsetSeconds": 600, "since": ago(5)}
    )
    text = render_describe(describe_node("a", node("a"), skewed, None, [], NOW))
    line = next(ln for ln in text.splitlines() if ln.startswith("Clock skew"))
    assert "+600s (ahead)" in line and ago(5) in line
    fleet = summarize([node("a"), node("b")], [skewed, report("b", "Healthy")], [policy()], NOW)
    headers, rows = status_rows(fleet)
    col = headers.index("CLOCK-SKEW")
    assert {r[0]: r[col] for r in rows} == {"a": "+600s (ahead)", "b": "-"}
    assert {n["node"]: n["clockSkewSeconds"] for n in fleet.to_json()["nodes"]} == {"a": 600, "b": None}
    # No node skewed: no column, and describe says nothing of clocks.
    plain = summarize([node("b")], [report("b", "Healthy")], [policy()], NOW)
    assert "CLOCK-SKEW" not in status_rows(plain)[0]
    assert "Clock skew" not in render_describe(describe_node("b", node("b"), report("b", "Healthy"), None, [], NOW))


def test_describe_names_a_hung_nvml_call_and_the_age_of_the_newest_sample() -> None:
    hang = {"call": "nvmlDeviceGetTotalEccErrors", "since": ago(90), "lastSampleTime": ago(100)}
    rep = report("a", "Unknown", spec={"heartbeatTime": ago(5), "nvml": {"available": True, "unresponsive": hang}})
    lease = {
        "metadata": {"annotations": {"gpuhealth.dev/sampled-at": ago(100)}},
        "spec": {"renewTime": ago(2)},
    }
    text = render_describe(describe_node("a", node("a"), rep, None, [], NOW, lease=lease))
    line = next(ln for ln in text.splitlines() if ln.startswith("Agent"))
    assert f"NVML UNRESPONSIVE: nvmlDeviceGetTotalEccErrors since {ago(90)}" in line
    assert "newest sample 1m40s ago" in line or "newest sample 100s ago" in line, line


def test_status_counts_slow_gpus_apart_from_broken() -> None:
    nodes = [node("gpu-a", taint="NICDown", cordoned=True), node("gpu-b"), node("gpu-c", taint="NICDegraded")]
    slow_gpu = {"index": 3, "state": "Quarantined", "reason": "NVLinkDegraded", "since": ago(600)}
    reports = [
        report("gpu-a", "Draining", since_s=600, reason="NICDown", healthyGPUs=0),
        report("gpu-b", "Degraded", since_s=600, reason="DeviceQuarantined", healthyGPUs=7, devices=[slow_gpu]),
        report("gpu-c", "Quarantined", since_s=600, reason="NICDegraded", healthyGPUs=0),
    ]
    fleet = summarize(nodes, reports, [policy()], NOW)
    out = fleet.to_json()["totals"]["outOfService"]
    assert (out["gpus"], out["slowGpus"], out["brokenGpus"]) == (17, 9, 8)
    assert "Of the GPUs held out: 9 slow, not broken (maxSlow), 8 broken" in render_status(fleet)


def test_describe_shows_a_declared_fact_in_its_own_column_and_in_json() -> None:
    """A fact with a label in api/device_facts.py (InfoROM) is a column of the Devices table and a key of
    describe -o json, with no CLI code of its own: corrupt, valid, and unknown (not supported)."""
    spec = {
        "heartbeatTime": ago(5),
        "devices": [
            {"index": 0, "uuid": "GPU-0000", "inforomCorrupt": True},
            {"index": 1, "uuid": "GPU-0001", "inforomCorrupt": False},
            {"index": 2, "uuid": "GPU-0002", "unsupported": ["inforomCorrupt"]},
        ],
    }
    model = describe_node("n", node("n"), report("n", "Degraded", spec=spec), policy(), [], NOW)
    assert [d["inforomCorrupt"] for d in model["devices"]] == [True, False, None]
    lines = render_describe(model).splitlines()
    header = next(line for line in lines if line.strip().startswith("IDX"))
    assert header.split() == [
        "IDX",
        "UUID",
        "MODEL",
        "TEMP",
        "ECC-UNC(VOL/AGG)",
        "REMAP(C/U)",
        "LOST",
        "INFOROM",
        "UNSUPPORTED",
    ]
    rows = {line.split()[0]: line.split() for line in lines if line.strip().startswith(("0 ", "1 ", "2 "))}
    assert (
        rows["0"][-2:] == ["CORRUPT", "-"]
        and rows["1"][-2:] == ["ok", "-"]
        and rows["2"][-2:] == ["-", "inforomCorrupt"]
    )


# --- taint-only mode (spec.actions.cordon: false) -------------------------------------------------

_TAINT_ONLY_ANN = {
    "gpuhealth.dev/quarantine": '{"cordon":false,"reason":"XID79","since":"t","taint":true,"taintOnly":true}'
}


def test_describe_says_a_node_is_held_by_the_taint_alone() -> None:
    n = node("n", taint="XID79", annotations=_TAINT_ONLY_ANN)
    model = describe_node("n", n, report("n", "Draining", reason="XID79"), policy(actions={"cordon": False}), [], NOW)
    assert model["marks"]["ownership"]["taintOnly"] is True
    text = render_describe(model)
    (cordon,) = [line for line in text.splitlines() if line.strip().startswith("Cordon:")]
    assert "not cordoned" in cordon and "taint alone" in cordon and "spec.actions.cordon: false" in cordon
    (own,) = [line for line in text.splitlines() if line.strip().startswith("Ownership:")]
    assert "owns taint" in own and "taint only" in own


def test_status_says_a_node_is_held_by_the_taint_alone() -> None:
    nodes = [node("a", taint="XID79", annotations=_TAINT_ONLY_ANN), node("b", taint="XID79", cordoned=True)]
    reports = [report("a", "Quarantined", reason="XID79"), report("b", "Quarantined", reason="XID79")]
    fleet = summarize(nodes, reports, [policy()], NOW)
    by_node = {r.node: r for r in fleet.rows}
    assert by_node["a"].to_json()["heldBy"] == "taint"
    assert by_node["b"].to_json()["heldBy"] == "taint+cordon"
    _, rows = status_rows(fleet, wide=True)
    cells = {row[0]: row for row in rows}
    assert cells["a"][8] == "no (taint only)" and cells["b"][8] == "yes"
