"""The fabric's verdicts (evaluation/fabric_rules.py through assess): NVLink, PCIe, fabric health and NICs,
each rule's thresholds, the idle GPU's PCIe generation, the mask of false sub-fields, saturated counters
and counters judged by their increase between passes."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.api.names import SLOW_SIGNALS, Action, Scope, Signal
from gpuhealth.evaluation.fabric_rules import COUNTER_PREFIX
from tests.unit.builders import make_policy, make_report
from tests.unit.evaluation._assess_support import assess_at, eight_gpus, signals

NV, PC, FD, FF, ND, NG = (
    Signal.NVLINK_DEGRADED,
    Signal.PCIE_DOWNTRAINED,
    Signal.FABRIC_DEGRADED,
    Signal.FABRIC_FAULT,
    Signal.NIC_DOWN,
    Signal.NIC_DEGRADED,
)
COR, DRN, OBS = Action.CORDON, Action.DRAIN, Action.OBSERVE
ACTIVE_PORT = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "physState": "LinkUp", "linkLayer": "InfiniBand"}


def _devices(**g3: Any) -> list[dict[str, Any]]:
    return eight_gpus(g3=g3)


def _nic(**fields: Any) -> list[dict[str, Any]]:
    return [{**ACTIVE_PORT, **fields}]


CASES: list[tuple[str, dict[str, Any], list[tuple[Signal, Action, int | None, int | None]]]] = [
    ("all-links-active", {"devices": _devices(nvlink={"links": 18, "active": 18})}, []),
    ("an-inactive-nvlink", {"devices": _devices(nvlink={"links": 18, "active": 17})}, [(NV, COR, 3, None)]),
    ("no-nvlink-at-all", {"devices": _devices(nvlink={"links": 0, "active": 0})}, []),
    # A PCIe card without a bridge (or NVLink off by design): links exist, none is active on any GPU.
    ("links-but-none-active-anywhere", {"devices": _devices(nvlink={"links": 18, "active": 0})}, []),
    # On a node that uses NVLink (its other GPUs' links are up), a GPU with every link down is degraded.
    (
        "every-link-down-where-the-peers-are-up",
        {
            "devices": eight_gpus(
                **{f"g{i}": {"nvlink": {"links": 18, "active": 0 if i == 3 else 18}} for i in range(8)}
            )
        },
        [(NV, COR, 3, None)],
    ),
    ("pcie-full", {"devices": _devices(pcie={"width": 16, "maxWidth": 16, "generation": 5, "maxGeneration": 5})}, []),
    (
        "pcie-narrow-even-idle",
        {
            "devices": _devices(
                clockEventReasons=0x1, pcie={"width": 8, "maxWidth": 16, "generation": 5, "maxGeneration": 5}
            )
        },
        [(PC, COR, 3, None)],
    ),
    (
        "pcie-gen-low-while-idle-is-nothing",
        {
            "devices": _devices(
                clockEventReasons=0x1, pcie={"width": 16, "maxWidth": 16, "generation": 1, "maxGeneration": 5}
            )
        },
        [],
    ),
    (
        "pcie-gen-low-while-busy",
        {"devices": _devices(pcie={"width": 16, "maxWidth": 16, "generation": 3, "maxGeneration": 5})},
        [(PC, COR, 3, None)],
    ),
    (
        "fabric-mask-of-false-sub-fields-is-nothing",
        {
            "devices": _devices(
                fabric={
                    "state": "Completed",
                    "status": 0,
                    "healthSummary": "Healthy",
                    "degradedBandwidth": False,
                    "routeRecovery": False,
                    "routeUnhealthy": False,
                    "accessTimeoutRecovery": False,
                    "incorrectConfiguration": "None",
                }
            )
        },
        [],
    ),
    ("fabric-not-started-is-normal", {"devices": _devices(fabric={"state": "NotStarted"})}, []),
    ("fabric-degraded-bw", {"devices": _devices(fabric={"degradedBandwidth": True})}, [(FD, COR, 3, None)]),
    ("fabric-route-recovery", {"devices": _devices(fabric={"routeRecovery": True})}, [(FD, COR, 3, None)]),
    (
        "fabric-access-timeout-recovery",
        {"devices": _devices(fabric={"accessTimeoutRecovery": True})},
        [(FD, COR, 3, None)],
    ),
    ("fabric-route-unhealthy-is-the-domains", {"devices": _devices(fabric={"routeUnhealthy": True})}, []),
    (
        "fabric-incorrect-configuration",
        {"devices": _devices(fabric={"incorrectConfiguration": "InsufficientNvlinks"})},
        [(FF, DRN, None, None)],
    ),
    (
        "fabric-probe-failed",
        {"devices": _devices(fabric={"state": "Completed", "status": 3})},
        [(FF, DRN, None, None)],
    ),
    ("fabric-probe-in-progress-status-unread", {"devices": _devices(fabric={"state": "InProgress", "status": 3})}, []),
    ("nic-active-quiet", {"nics": _nic(linkDowned=0, symbolErrorsPerMin=0.0)}, []),
    ("nic-port-down", {"nics": _nic(state="DOWN", physState="Disabled")}, [(ND, DRN, None, None)]),
    ("roce-netdev-down", {"nics": _nic(linkLayer="Ethernet", operState="down")}, [(ND, DRN, None, None)]),
    ("nic-link-downed-rose", {"nics": _nic(linkDowned=1)}, [(ND, DRN, None, None)]),
    ("nic-rnr-nak-rose", {"nics": _nic(rnrNakRetryErrors=2)}, [(ND, DRN, None, None)]),
    # 120 an hour is 2 a minute: at it is nothing, above it is fatal.
    ("symbol-errors-below-threshold", {"nics": _nic(symbolErrorsPerMin=2.0)}, []),
    ("symbol-errors-above-hourly", {"nics": _nic(symbolErrorsPerMin=2.5)}, [(ND, DRN, None, None)]),
    ("link-error-recovery-at-5-per-min", {"nics": _nic(linkErrorRecoveryPerMin=5.0)}, []),
    ("link-error-recovery-above", {"nics": _nic(linkErrorRecoveryPerMin=6.0)}, [(NG, COR, None, None)]),
    ("port-rcv-errors-at-10-per-s", {"nics": _nic(portRcvErrorsPerMin=600.0)}, []),
    ("port-rcv-errors-above", {"nics": _nic(portRcvErrorsPerMin=601.0)}, [(NG, COR, None, None)]),
    (
        "saturated-counters-decide-nothing",
        {
            "nics": _nic(
                symbolErrorsPerMin=0.0,
                linkErrorRecoveryPerMin=0.0,
                linkDowned=3,
                saturated=["symbol_error", "link_error_recovery", "link_downed"],
            )
        },
        [],
    ),
]


@pytest.mark.parametrize(("report", "expect"), [(r, e) for _, r, e in CASES], ids=[c[0] for c in CASES])
def test_fabric_rules(report: dict[str, Any], expect: list[tuple[Signal, Action, int | None, int | None]]) -> None:
    assert signals(assess_at(make_report(**report))) == expect


def test_symbol_errors_above_the_degraded_rate_but_not_the_fatal_one_are_degraded() -> None:
    policy = make_policy({"rules": {"nic": {"symbolErrorsFatalPerHour": 10**6, "symbolErrorsDegradedPerSecond": 10}}})
    quiet = assess_at(make_report(nics=_nic(symbolErrorsPerMin=600.0)), policy)
    loud = assess_at(make_report(nics=_nic(symbolErrorsPerMin=601.0)), policy)
    assert signals(quiet) == [] and signals(loud) == [(NG, COR, None, None)]


def test_scopes_slow_fabric_findings_are_the_gpus_broken_ones_the_nodes() -> None:
    report = make_report(
        devices=_devices(nvlink={"links": 18, "active": 16}, fabric={"state": "Completed", "status": 1}),
        nics=_nic(state="DOWN"),
    )
    by_signal = {f.signal: f for f in assess_at(report).findings}
    assert by_signal[NV].scope == Scope.DEVICE and "2 of 18 NVLinks inactive" in by_signal[NV].detail
    assert by_signal[FF].scope == Scope.NODE and by_signal[ND].scope == Scope.NODE
    assert {NV, PC, FD, NG} <= SLOW_SIGNALS and not {FF, ND} & SLOW_SIGNALS


def test_failed_nvlink_recoveries_count_when_they_rise_not_at_first_sight() -> None:
    def report(failed: int) -> Any:
        return make_report(devices=_devices(nvlink={"links": 18, "active": 18, "recoveryFailed": failed}))

    first = assess_at(report(4))
    assert signals(first) == [] and first.pending == {f"{COUNTER_PREFIX}nvlinkRecoveryFailed/3": "4"}
    rose = assess_at(report(6), prior_pending=dict(first.pending))
    assert signals(rose) == [(NV, COR, 3, None)] and "2 failed NVLink recoveries" in rose.findings[0].detail
    still = assess_at(report(6), prior_pending=dict(rose.pending))
    assert signals(still) == []


def test_failed_nvlink_recoveries_that_rise_from_zero_count() -> None:
    """A count the operator has seen at 0 is remembered as 0: its first rise (0 -> 1) is a rise since the
    last look, like one from 4 to 6; a first sight, at whatever count, still decides nothing."""

    def report(failed: int) -> Any:
        return make_report(devices=_devices(nvlink={"links": 18, "active": 18, "recoveryFailed": failed}))

    key = f"{COUNTER_PREFIX}nvlinkRecoveryFailed/3"
    first = assess_at(report(0))
    assert signals(first) == [] and first.pending.get(key) == "0"
    rose = assess_at(report(1), prior_pending=dict(first.pending))
    assert signals(rose) == [(NV, COR, 3, None)] and "1 failed NVLink recoveries" in rose.findings[0].detail
    assert signals(assess_at(report(1))) == []  # first sight at 1: no baseline, nothing


def test_a_nic_counter_increase_holds_the_node_out_until_a_release_acknowledges_it() -> None:
    report = make_report(nics=_nic(linkDowned=1))
    first = assess_at(report, now_s=60)
    assert signals(first) == [(ND, DRN, None, None)]
    # Evidence, like an XID: it holds on every later pass, whatever the time.
    later = assess_at(report, now_s=600, prior_pending=dict(first.pending))
    assert signals(later) == [(ND, DRN, None, None)]
    # A release acknowledges the increase so far; an older release does not.
    old = assess_at(report, now_s=700, prior_pending=dict(later.pending), cleared_s=30)
    assert signals(old) == [(ND, DRN, None, None)]
    released = assess_at(report, now_s=800, prior_pending=dict(old.pending), cleared_s=800)
    assert signals(released) == []
    after = assess_at(report, now_s=900, prior_pending=dict(released.pending), cleared_s=800)
    assert signals(after) == []
    more = assess_at(make_report(nics=_nic(linkDowned=2)), now_s=960, prior_pending=dict(after.pending), cleared_s=800)
    assert signals(more) == [(ND, DRN, None, None)] and "link_downed +1" in more.findings[0].detail
    # A restarted agent counts from 0 again: nothing to hold.
    restarted = assess_at(make_report(nics=_nic(linkDowned=0)), now_s=990, prior_pending=dict(more.pending))
    assert signals(restarted) == []


def test_rules_follow_the_policy() -> None:
    report = make_report(
        devices=_devices(
            nvlink={"links": 18, "active": 17}, pcie={"width": 16, "maxWidth": 16, "generation": 3, "maxGeneration": 5}
        ),
        nics=_nic(state="DOWN"),
    )
    policy = make_policy(
        {
            "rules": {
                "nvlink": {"moveRunningWork": "AtNextCheckpoint"},
                "pcie": {"judgeGeneration": False},
                "nic": {"action": "cordon"},
            }
        }
    )
    assert signals(assess_at(report, policy)) == [(ND, COR, None, None), (NV, DRN, 3, None)]
    off = make_policy({"rules": {"nvlink": {"enabled": False}, "nic": {"enabled": False}}})
    assert signals(assess_at(report, off)) == [(PC, COR, 3, None)]
    observe = make_policy({"rules": {"nvlink": {"action": "observe"}}})
    assert (NV, OBS, 3, None) in signals(assess_at(report, observe))


def test_the_links_a_gpu_should_have_are_learned_from_its_peers_of_the_same_model() -> None:
    devices = eight_gpus(g3={"nvlink": {"links": 16, "active": 16}})
    for i, d in enumerate(devices):
        if i != 3:
            d["nvlink"] = {"links": 18, "active": 18}
    a = assess_at(make_report(devices=devices))
    assert signals(a) == [(NV, COR, 3, None)] and "2 of 18 NVLinks inactive" in a.findings[0].detail
    other_model = [{**d, "model": "NVIDIA B200"} if d["index"] == 3 else d for d in devices]
    assert signals(assess_at(make_report(devices=other_model))) == []
