"""Verdicts from the fabric facts: NVLink, PCIe, the GPU fabric's health and the node's NICs. Pure.

The agent reports facts (``api/report_fabric.py``); the rules of ``api/fabric_policy.py`` turn them into
findings here, which ``assess`` adds to the node's:

- ``NVLinkDegraded`` (GPU, slow): fewer active NVLinks than the GPU has (its own count of links, or
  more where its peers of the same model on the node have more: learned from peers, as the design notes
  say the expected count is; ``api/nvlink_expectation.py``, the one expectation ``describe`` shows too)
  on a node that uses NVLink (some GPU of the model has an active link: a PCIe card without a bridge
  reports links and none active, by design), or its failed link recoveries (Blackwell's field 214) rose
  since the last pass. The NVLink error counters and BER are telemetry and
  never a verdict (DCGM 4.7 dropped its BER checks because they failed healthy GPUs).
- ``PCIeDowntrained`` (GPU, slow): the link narrower than its maximum (judged always), or a lower
  generation than its maximum while the GPU is busy (clock reason GpuIdle 0x1 clear: an idle GPU drops
  its link generation to save power). The replay counter stays telemetry.
- ``FabricDegraded`` (GPU, slow): a health sub-field DEGRADED_BW, ROUTE_RECOVERY or
  ACCESS_TIMEOUT_RECOVERY equal to 1 (true). A sub-field equal to 2 is "false" and a non-zero mask is not
  a fault; ROUTE_UNHEALTHY is the NVLink domain's (``evaluation/domains.py``), not this rule's.
- ``FabricFault`` (node, broken): the fabric probe COMPLETED with an error status, or
  INCORRECT_CONFIGURATION >= 2. Node scope: the NVSwitch fabric and its fabric manager are shared by
  every GPU of the node, and NVIDIA's remedy for a failed training is the fabric manager's or the
  node's, not one GPU's reset. State NOT_STARTED is normal (GB200's rack-level NVSwitch) and no fault.
- ``NICDown`` (node, broken): an InfiniBand / RoCE port down, a counter fatal on any increase rose
  (``link_downed``, ``local_link_integrity_errors``, ``excessive_buffer_overrun_errors``,
  ``rnr_nak_retry_err``), or ``symbol_error`` above its hourly threshold. A NIC serves every GPU's
  collective traffic: the node is out.
- ``NICDegraded`` (node, slow): ``symbol_error``, ``link_error_recovery`` or ``port_rcv_errors`` above
  its rate threshold. A counter named ``saturated`` has no rate (pinned at its maximum, its rate is
  unknown, not zero) and decides nothing.

Counters are judged by their increase, remembered in ``status.pending`` under ``count/...`` keys (memory,
not a wait: ``evaluation/rules.py`` re-passes no node for them). The NVLink failed recoveries are the raw
count, remembered whenever the GPU reports it (0 included): a rise since the last pass (0 -> 1 as well)
is one finding, in the pass that sees it, and the GPU's probation brings
it back once the count stays still (a GPU whose recoveries keep failing relapses, and flaps out). The
NIC counters fatal on any increase are the agent's increase since it started watching: an increase is
evidence, like an XID: it holds the node out (its drain runs to the end) until a human releases the node,
which acknowledges the increase so far (``cleared_before``); a restarted agent starts from 0 again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from gpuhealth.api import fabric as fabric_facts
from gpuhealth.api.fabric_policy import NicRule
from gpuhealth.api.names import Action, Signal
from gpuhealth.api.nvlink_expectation import LinkExpectation, expected_nvlinks
from gpuhealth.api.policy import Policy
from gpuhealth.api.report import Device, Report
from gpuhealth.api.report_fabric import FATAL_NIC_COUNTERS, NicPort
from gpuhealth.api.timeutil import format_time, parse_time
from gpuhealth.evaluation.findings import Finding

COUNTER_PREFIX = "count/"  # status.pending keys that remember a counter's last judged value
_DEGRADED_FABRIC = (
    ("degraded_bandwidth", "DEGRADED_BW"),
    ("route_recovery", "ROUTE_RECOVERY"),
    ("access_timeout_recovery", "ACCESS_TIMEOUT_RECOVERY"),
)


def is_counter_key(key: str) -> bool:
    return key.startswith(COUNTER_PREFIX)


@dataclass
class _Counters:
    """Counter values remembered between passes: read from the prior pass, written for the next (``pending``)."""

    prior: Mapping[str, str]
    pending: dict[str, str]
    now: dt.datetime
    cleared_before: dt.datetime | None = None

    def rose(self, key: str, value: int | None, first: int | None) -> int:
        """By how much ``value`` rose since the last pass (``first``: the baseline when none was kept; None:
        no baseline, the first sight decides nothing). A lower value (a reboot, a restarted agent) is a new
        baseline, never a finding. Every value read is remembered, 0 too: a count seen at 0 that then
        rises has risen since the last look (remembering only counts above 0 made 0 -> 1 a first sight)."""
        if value is None:
            return 0
        key = COUNTER_PREFIX + key
        raw = self.prior.get(key)
        last = int(raw) if raw is not None and raw.isdigit() else first
        self.pending[key] = str(value)
        return 0 if last is None or value <= last else value - last

    def above_acknowledged(self, key: str, value: int | None) -> int:
        """By how much ``value`` (an increase the agent counts from 0) is above the value a human last
        acknowledged by releasing the node: evidence, like an XID, that holds the node out until then.
        Remembered as ``<value>@<time acknowledged>``; a lower value (a restarted agent) starts again."""
        if value is None:
            return 0
        key = COUNTER_PREFIX + key
        base, since = _acknowledged(self.prior.get(key))
        if since is None or value < base:
            base, since = 0, self.now  # first seen now (or the agent restarted): nothing acknowledged yet
        if self.cleared_before is not None and self.cleared_before > since and value > base:
            base, since = value, self.cleared_before  # released since: this much is acknowledged
        if base > 0 or value > 0:
            self.pending[key] = f"{base}@{format_time(since)}"
        return max(0, value - base)


def _acknowledged(raw: str | None) -> tuple[int, dt.datetime | None]:
    """``<value>@<since>``: the value acknowledged and since when it is (or the counter was first seen)."""
    value, _, at = (raw or "").partition("@")
    return (int(value) if value.isdigit() else 0), parse_time(at)


def _gpu(d: Device, signal: Signal, action: Action, detail: str, since: dt.datetime | None) -> Finding:
    return Finding(signal, action, detail, d.index, d.uuid, None, since)


def _nvlink(
    policy: Policy, d: Device, report: Report, counters: _Counters, expected: Mapping[int, LinkExpectation]
) -> list[Finding]:
    rule = policy.fabric.nvlink
    n = d.nvlink
    if n is None:
        return []
    failed = counters.rose(f"nvlinkRecoveryFailed/{d.index}", n.recovery_failed, None)
    if not rule.enabled:
        return []
    why = []
    held_to = expected.get(d.index)  # api/nvlink_expectation.py: what describe shows as expected too
    if held_to is not None and (missing := held_to.missing(n.active)):
        learned = "" if held_to.links == n.links else " (as many as the node's other GPUs of its model have)"
        why.append(f"{missing} of {held_to.links} NVLinks inactive{learned}")
    if failed:
        why.append(f"{failed} failed NVLink recoveries since the last look ({n.recovery_failed} in all)")
    if not why:
        return []
    detail = "; ".join(why) + ": slow, not broken"
    return [_gpu(d, Signal.NVLINK_DEGRADED, rule.degraded.finding_action, detail, report.observed)]


def _pcie(policy: Policy, d: Device, report: Report) -> list[Finding]:
    rule = policy.fabric.pcie
    p = d.pcie
    if not rule.enabled or p is None:
        return []
    why = []
    if p.width is not None and p.max_width is not None and p.width < p.max_width:
        why.append(f"PCIe link x{p.width} of x{p.max_width}")
    busy = not d.clock_event_reasons & fabric_facts.GPU_IDLE
    if (
        rule.generation
        and busy
        and p.generation is not None
        and p.max_generation is not None
        and p.generation < p.max_generation
    ):
        why.append(f"PCIe Gen{p.generation} of Gen{p.max_generation} while busy")
    if not why:
        return []
    detail = "; ".join(why) + ": slow, not broken"
    return [_gpu(d, Signal.PCIE_DOWNTRAINED, rule.degraded.finding_action, detail, report.observed)]


def _fabric_degraded(policy: Policy, d: Device, report: Report) -> list[Finding]:
    rule = policy.fabric.fabric
    f = d.fabric
    if not rule.enabled or f is None:
        return []
    degraded = [name for attr, name in _DEGRADED_FABRIC if getattr(f, attr) is True]
    if not degraded:
        return []
    detail = f"fabric health {', '.join(degraded)}: slow, not broken"
    return [_gpu(d, Signal.FABRIC_DEGRADED, rule.degraded.finding_action, detail, report.observed)]


def _fabric_broken(policy: Policy, report: Report) -> list[Finding]:
    """One node finding for every GPU whose fabric probe failed or whose configuration is wrong."""
    rule = policy.fabric.fabric
    if not rule.enabled:
        return []
    broken = []
    for d in report.devices:
        f = d.fabric
        if f is None:
            continue
        if f.probe_failed:
            broken.append(f"GPU {d.index} fabric probe completed with status {f.status}")
        if f.incorrect_configuration not in (None, "None"):
            broken.append(f"GPU {d.index} fabric configuration incorrect ({f.incorrect_configuration})")
    if not broken:
        return []
    detail = "; ".join(broken) + ": the node's NVLink fabric is not usable"
    return [Finding(Signal.FABRIC_FAULT, rule.broken_action, detail, since=report.observed)]


def _nic(policy: Policy, report: Report, counters: _Counters) -> list[Finding]:
    rule = policy.fabric.nic
    fatal: list[str] = []
    slow: list[str] = []
    for port in report.nics:
        rises = [
            (c.name, counters.above_acknowledged(f"nic/{port.label}/{c.name}", getattr(port, c.attr)))
            for c in FATAL_NIC_COUNTERS  # api/report_fabric.py's table; saturated names them as sysfs does
            if c.name not in port.saturated
        ]
        if not rule.enabled:
            continue
        if port.down:
            fatal.append(f"{port.label} port {_state(port)}")
        fatal.extend(f"{port.label} {name} +{n}" for name, n in rises if n > 0)
        f, s = _rates(rule, port)
        fatal.extend(f)
        slow.extend(s)
    out = []
    if fatal:
        detail = "NIC " + "; ".join(fatal) + ": every GPU's collectives on the node go through its NICs"
        out.append(Finding(Signal.NIC_DOWN, rule.action, detail, since=report.observed))
    if slow:
        detail = "NIC " + "; ".join(slow) + ": slow, not broken"
        out.append(Finding(Signal.NIC_DEGRADED, rule.degraded.finding_action, detail, since=report.observed))
    return out


def _state(port: NicPort) -> str:
    words = [w for w in (port.state, port.phys_state) if w]
    if port.oper_state and port.oper_state != "up":
        words.append(f"netdev {port.oper_state}")
    return "/".join(words) or "down"


def _rates(rule: NicRule, port: NicPort) -> tuple[list[str], list[str]]:
    """(fatal, degraded) rate findings of one port; a saturated counter has no rate and decides nothing."""
    fatal: list[str] = []
    slow: list[str] = []
    sym = None if "symbol_error" in port.saturated else port.symbol_errors_per_min
    if sym is not None:
        if sym * 60 > rule.symbol_errors_fatal_per_hour:
            fatal.append(f"{port.label} symbol_error {_per(sym)} (above {rule.symbol_errors_fatal_per_hour}/h)")
        elif sym / 60 > rule.symbol_errors_degraded_per_second:
            slow.append(f"{port.label} symbol_error {_per(sym)} (above {rule.symbol_errors_degraded_per_second}/s)")
    rec = None if "link_error_recovery" in port.saturated else port.link_error_recovery_per_min
    if rec is not None and rec > rule.link_error_recovery_per_minute:
        slow.append(f"{port.label} link_error_recovery {_per(rec)} (above {rule.link_error_recovery_per_minute}/min)")
    rcv = None if "port_rcv_errors" in port.saturated else port.port_rcv_errors_per_min
    if rcv is not None and rcv / 60 > rule.port_rcv_errors_per_second:
        slow.append(f"{port.label} port_rcv_errors {_per(rcv)} (above {rule.port_rcv_errors_per_second}/s)")
    return fatal, slow


def _per(per_min: float) -> str:
    return f"{per_min:g}/min"


def fabric_findings(
    policy: Policy,
    report: Report,
    prior_pending: Mapping[str, str],
    pending: dict[str, str],
    now: dt.datetime,
    cleared_before: dt.datetime | None = None,
) -> list[Finding]:
    """Every finding the fabric rules make of ``report``; ``pending`` receives the counters' values.
    ``cleared_before``: a human released the node then, acknowledging the NIC counters' increases so far."""
    counters = _Counters(prior_pending, pending, now, cleared_before)
    expected = expected_nvlinks(report)
    out: list[Finding] = []
    for d in report.devices:
        if d.lost:
            continue  # a lost GPU is its own finding; its links and fabric say nothing more
        out.extend(_nvlink(policy, d, report, counters, expected))
        out.extend(_pcie(policy, d, report))
        out.extend(_fabric_degraded(policy, d, report))
    out.extend(_fabric_broken(policy, report))
    out.extend(_nic(policy, report, counters))
    return out
