"""What the node decides on once each GPU has its verdict (evaluation/device_view.py)."""

from __future__ import annotations

from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.evaluation.device_view import node_view
from gpuhealth.evaluation.devices import DeviceVerdict
from gpuhealth.evaluation.findings import Assessment, Finding

ECC = Finding(Signal.ECC, Action.DRAIN, "uncorrected ECC", gpu=2, scope=Scope.DEVICE)
HEAT = Finding(Signal.THERMAL, Action.OBSERVE, "warm", gpu=1, scope=Scope.DEVICE)
LOST = Finding(Signal.XID, Action.DRAIN, "XID 79", gpu=5, code=79)


def test_a_gpu_held_out_leaves_the_node_in_service_with_one_observe_finding() -> None:
    held = DeviceRecord(
        index=2, uuid="GPU-2", state=DeviceState.DRAINING, reason="EccUncorrected", taint_rules=("r-2",)
    )
    a = Assessment(findings=(ECC, HEAT))
    view = node_view(a, [ECC, HEAT], DeviceVerdict(records=(held,)), [held])
    signals = [f.signal for f in view.findings]
    assert Signal.ECC not in signals and Signal.THERMAL in signals  # only quarantining device findings leave
    (q,) = [f for f in view.findings if f.signal == Signal.DEVICE_QUARANTINED]
    assert q.action == Action.OBSERVE
    assert q.detail == (
        "GPU 2 (GPU-2) Draining: EccUncorrected, DeviceTaintRule r-2. The node serves on with its other GPUs"
    )


def test_an_escalated_verdict_gives_the_node_every_finding() -> None:
    a = Assessment(findings=(ECC, LOST))
    view = node_view(a, [ECC, LOST], DeviceVerdict(records=(), escalate=True), [])
    assert view.findings == (ECC, LOST)


def test_a_gpu_held_back_by_the_budget_is_named_as_such() -> None:
    back = DeviceRecord(index=3, uuid="GPU-3", reason="EccUncorrected", held_by_breaker=True)
    view = node_view(Assessment(findings=()), [], DeviceVerdict(records=(back,)), [])
    (q,) = view.findings
    assert q.detail.startswith("GPU 3 (GPU-3) InService: EccUncorrected (held back by the GPU budget)")
