"""The invalid policies and reports bad_input sends, each with the field path the API server must name."""

from __future__ import annotations

from typing import Any

from devkit.k8s import healthy_spec, utcnow


def _long(n: int) -> str:
    return "x" * n


def bad_policies() -> list[tuple[str, Any, str]]:
    """(what, spec, the exact field path the API server's refusal must name)."""
    o = "spec.rules.xid.overrides"
    d = "spec.actions.drain"
    r = "spec.rules.xid.applicationRepeat"
    th = "spec.rules.thermal"
    cases: list[tuple[str, Any, str]] = [
        ("unknown mode", {"mode": "Sometimes"}, "spec.mode"),
        ("mode of the wrong type", {"mode": 5}, "spec.mode"),
        ("priority too high", {"priority": 5000}, "spec.priority"),
        ("priority too low", {"priority": -1001}, "spec.priority"),
        ("priority as a string", {"priority": "high"}, "spec.priority"),
        ("XID code 0", {"rules": {"xid": {"overrides": [{"code": 0, "action": "drain"}]}}}, f"{o}[0].code"),
        ("XID code 1024", {"rules": {"xid": {"overrides": [{"code": 1024, "action": "drain"}]}}}, f"{o}[0].code"),
        (
            "XID code as a string",
            {"rules": {"xid": {"overrides": [{"code": "79", "action": "drain"}]}}},
            f"{o}[0].code",
        ),
        ("unknown action", {"rules": {"xid": {"overrides": [{"code": 79, "action": "nuke"}]}}}, f"{o}[0].action"),
        # An override may set the action, the scope or both (per-device quarantine): one with neither is refused whole.
        ("override without action or scope", {"rules": {"xid": {"overrides": [{"code": 79}]}}}, f"{o}[0]"),
        (
            "duplicate XID overrides",
            {"rules": {"xid": {"overrides": [{"code": 79, "action": "drain"}, {"code": 79, "action": "ignore"}]}}},
            f"{o}[1]",
        ),
        (
            "257 overrides (maxItems 256)",
            {"rules": {"xid": {"overrides": [{"code": c, "action": "drain"} for c in range(1, 258)]}}},
            o,
        ),
        ("repeat count 1", {"rules": {"xid": {"applicationRepeat": {"count": 1}}}}, f"{r}.count"),
        ("repeat count 100000", {"rules": {"xid": {"applicationRepeat": {"count": 100000}}}}, f"{r}.count"),
        ("repeat window in words", {"rules": {"xid": {"applicationRepeat": {"window": "ten min"}}}}, f"{r}.window"),
        ("repeat window 100 chars", {"rules": {"xid": {"applicationRepeat": {"window": _long(100)}}}}, f"{r}.window"),
        ("ECC threshold 0", {"rules": {"ecc": {"uncorrectedThreshold": 0}}}, "spec.rules.ecc.uncorrectedThreshold"),
        ("ECC threshold -5", {"rules": {"ecc": {"uncorrectedThreshold": -5}}}, "spec.rules.ecc.uncorrectedThreshold"),
        (
            "ECC threshold 2e6",
            {"rules": {"ecc": {"uncorrectedThreshold": 2000000}}},
            "spec.rules.ecc.uncorrectedThreshold",
        ),
        ("ECC action unknown", {"rules": {"ecc": {"action": "panic"}}}, "spec.rules.ecc.action"),
        ("temperature 10C", {"rules": {"thermal": {"temperatureThresholdC": 10}}}, f"{th}.temperatureThresholdC"),
        ("temperature 500C", {"rules": {"thermal": {"temperatureThresholdC": 500}}}, f"{th}.temperatureThresholdC"),
        ("slowdown as a string", {"rules": {"thermal": {"slowdown": "yes"}}}, "spec.rules.thermal.slowdown"),
        ("negative duration", {"rules": {"thermal": {"sustainedFor": "-5m"}}}, "spec.rules.thermal.sustainedFor"),
        ("expected GPUs 0", {"rules": {"gpuCount": {"expected": 0}}}, "spec.rules.gpuCount.expected"),
        ("expected GPUs 65", {"rules": {"gpuCount": {"expected": 65}}}, "spec.rules.gpuCount.expected"),
        ("silence after 1s (< 5s)", {"rules": {"agentSilence": {"after": "1s"}}}, "spec.rules.agentSilence.after"),
        ("silence after 100ms", {"rules": {"agentSilence": {"after": "100ms"}}}, "spec.rules.agentSilence.after"),
        ("silence action drain", {"rules": {"agentSilence": {"action": "drain"}}}, "spec.rules.agentSilence.action"),
        ("taint effect PreferNoSchedule", {"actions": {"taintEffect": "PreferNoSchedule"}}, "spec.actions.taintEffect"),
        ("cordon as a string", {"actions": {"cordon": "sure"}}, "spec.actions.cordon"),
        ("checkpoint mode unknown", {"actions": {"drain": {"checkpointMode": "magic"}}}, f"{d}.checkpointMode"),
        (
            "timeout behaviour unknown",
            {"actions": {"drain": {"onCheckpointTimeout": "Panic"}}},
            f"{d}.onCheckpointTimeout",
        ),
        (
            "force delete before maxWait (contradictory)",
            {"actions": {"drain": {"allowForceDelete": True, "forceDeleteAfter": "1m", "maxWait": "1h"}}},
            f"{d}.forceDeleteAfter",
        ),
        (
            "65 system namespaces",
            {"actions": {"drain": {"systemNamespaces": [f"ns{i}" for i in range(65)]}}},
            f"{d}.systemNamespaces",
        ),
        (
            "system namespace 64 chars",
            {"actions": {"drain": {"systemNamespaces": [_long(64)]}}},
            f"{d}.systemNamespaces[0]",
        ),
        ("maxUnhealthy 150%", {"safety": {"maxUnhealthy": "150%"}}, "spec.safety.maxUnhealthy"),
        ("maxUnhealthy -1", {"safety": {"maxUnhealthy": -1}}, "spec.safety.maxUnhealthy"),
        ("maxUnhealthy in words", {"safety": {"maxUnhealthy": "lots"}}, "spec.safety.maxUnhealthy"),
        ("maxUnhealthy 1.5", {"safety": {"maxUnhealthy": 1.5}}, "spec.safety.maxUnhealthy"),
        ("maxConcurrentDrains 0", {"safety": {"maxConcurrentDrains": 0}}, "spec.safety.maxConcurrentDrains"),
        ("probation forever", {"safety": {"probation": "forever"}}, "spec.safety.probation"),
        (
            "flapping window shorter than probation (contradictory)",
            {"safety": {"probation": "10m", "flapping": {"window": "5m"}}},
            "spec.safety.flapping.window",
        ),
        ("maxQuarantines 0", {"safety": {"flapping": {"maxQuarantines": 0}}}, "spec.safety.flapping.maxQuarantines"),
        ("restart loop minWorkloads 1", {"restartLoop": {"minWorkloads": 1}}, "spec.restartLoop.minWorkloads"),
        ("restart loop minRestarts 0", {"restartLoop": {"minRestarts": 0}}, "spec.restartLoop.minRestarts"),
        ("restart loop action repair", {"restartLoop": {"action": "repair"}}, "spec.restartLoop.action"),
        ("negative GPU price", {"cost": {"gpuHourly": -3}}, "spec.cost.gpuHourly"),
        ("currency 20 chars", {"cost": {"currency": _long(20)}}, "spec.cost.currency"),
        (
            "In without values",
            {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "spec.nodeSelector.matchExpressions[0].values",
        ),
        (
            "selector operator Like",
            {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Like", "values": ["b"]}]}},
            "spec.nodeSelector.matchExpressions[0].operator",
        ),
        (
            "65 matchLabels (maxProperties 64)",
            {"nodeSelector": {"matchLabels": {f"k{i}": "v" for i in range(65)}}},
            "spec.nodeSelector.matchLabels",
        ),
        (
            "label value 100 chars",
            {"nodeSelector": {"matchLabels": {"k": _long(100)}}},
            "spec.nodeSelector.matchLabels.k",
        ),
        ("spec as a string", "not an object", "spec"),
        ("rules.xid as a list", {"rules": {"xid": []}}, "spec.rules.xid"),
    ]
    return cases


def bad_reports(node: str) -> list[tuple[str, dict[str, Any], str]]:
    """(what, report spec (nodeName added unless present), field path)."""
    ok = healthy_spec(gpus=2)
    dev = ok["devices"][0]

    def with_dev(**kw: Any) -> dict[str, Any]:
        return {**ok, "devices": [{**dev, **kw}]}

    x = {"xid": 79, "gpu": 0, "time": utcnow(), "source": "simulated"}
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("nodeName of another node", {**ok, "nodeName": "someone-else"}, "spec.nodeName"),
        ("GPU index 64", with_dev(index=64), "spec.devices[0].index"),
        ("GPU index -1", with_dev(index=-1), "spec.devices[0].index"),
        ("65 devices (maxItems 64)", {**ok, "devices": [{**dev, "index": i % 64} for i in range(65)]}, "spec.devices"),
        ("duplicate GPU index", {**ok, "devices": [dev, dict(dev)]}, "spec.devices[1]"),
        ("XID 0", {**ok, "xidEvents": [{**x, "xid": 0}]}, "spec.xidEvents[0].xid"),
        ("XID 5000", {**ok, "xidEvents": [{**x, "xid": 5000}]}, "spec.xidEvents[0].xid"),
        ("XID on GPU 64", {**ok, "xidEvents": [{**x, "gpu": 64}]}, "spec.xidEvents[0].gpu"),
        ("129 XID events (maxItems 128)", {**ok, "xidEvents": [x] * 129}, "spec.xidEvents"),
        ("XID without time", {**ok, "xidEvents": [{"xid": 79, "gpu": 0}]}, "spec.xidEvents[0].time"),
        ("XID time in words", {**ok, "xidEvents": [{**x, "time": "yesterday"}]}, "spec.xidEvents[0].time"),
        ("XID detail 300 chars", {**ok, "xidEvents": [{**x, "detail": _long(300)}]}, "spec.xidEvents[0].detail"),
        ("XID source unknown", {**ok, "xidEvents": [{**x, "source": "rumour"}]}, "spec.xidEvents[0].source"),
        ("negative ECC count", with_dev(ecc={"volatileUncorrected": -1}), "spec.devices[0].ecc.volatileUncorrected"),
        (
            "ECC count as a string",
            with_dev(ecc={"volatileUncorrected": "many"}),
            "spec.devices[0].ecc.volatileUncorrected",
        ),
        ("temperature 1000C", with_dev(temperature={"currentC": 1000}), "spec.devices[0].temperature.currentC"),
        ("recovery action unknown", with_dev(recoveryAction="Explode"), "spec.devices[0].recoveryAction"),
        ("MIG mode unknown", with_dev(migMode="Maybe"), "spec.devices[0].migMode"),
        ("UUID 200 chars", with_dev(uuid=_long(200)), "spec.devices[0].uuid"),
        ("lost as a string", with_dev(lost="very"), "spec.devices[0].lost"),
        ("heartbeat in words", {**ok, "heartbeatTime": "now"}, "spec.heartbeatTime"),
        ("nvml without available", {**ok, "nvml": {"driverVersion": "1"}}, "spec.nvml.available"),
        ("nvml error 2000 chars", {**ok, "nvml": {"available": False, "error": _long(2000)}}, "spec.nvml.error"),
        ("agent source unknown", {**ok, "agent": {"sources": ["magic"]}}, "spec.agent.sources[0]"),
        ("devices as an object", {**ok, "devices": {"0": dev}}, "spec.devices"),
    ]
    out = []
    for what, spec, path in cases:
        out.append((what, {"nodeName": node, **spec} if "nodeName" not in spec else spec, path))
    out.append(("report without nodeName", {k: v for k, v in ok.items()}, "spec.nodeName"))
    return out
