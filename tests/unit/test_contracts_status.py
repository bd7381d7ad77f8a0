"""What the operator writes into a report's status, bound to ``crds/gpunodehealths.yaml``: the node
record, the per-GPU records and the remediation ladders are declared there (a preserve-unknown-fields
status would otherwise keep an undeclared field silently), round-trip through it, and their
vocabularies are the CRDs' enums.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from devkit import crdschema
from devkit.crdschema import at, violations
from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.names import Mode, State
from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import Approver, Attempt, LadderRecord, Phase, PluginRestart, Repair, Result
from gpuhealth.api.status import Record, node_status
from gpuhealth.api.validation import Outcome, Validation
from tests.unit._contracts_support import POLICY_CRD, REPORT_CRD, T, crd_enum, unset_fields


def _every_device_record() -> DeviceRecord:
    rec = DeviceRecord(
        index=2,
        uuid="GPU-2",
        state=DeviceState.DRAINING,
        reason="EccUncorrected",
        message="m",
        since=T,
        rule="ecc",
        quarantines=(T,),
        healthy_since=T,
        cleared_before=T,
        held_by_breaker=True,
        drain_action="drain",
        drained=True,
        devices=("gpu.nvidia.com/node-a/gpu-2-mig-3g40gb-9-0", "gpu.nvidia.com/node-a/gpu-2-mig-3g40gb-9-4"),
        partitions=("gpu.nvidia.com/node-a/gpu-2-mig-3g40gb-9-0", "gpu.nvidia.com/node-a/gpu-2-mig-3g40gb-9-4"),
        taint_rules=("gpuhealth-node-a-gpu-2-mig-3g40gb-9-0", "gpuhealth-node-a-gpu-2-mig-3g40gb-9-4"),
        last_failures=(T, T),
        instances=("MIG-a", "MIG-b"),
        kept_off_by="NodeTaint",
    )
    missing = unset_fields(rec, skip=("index",))
    assert not missing, (
        f"api/devices.py DeviceRecord fields {missing} are not set by "
        "tests/unit/test_contracts_status.py _every_device_record"
    )
    return rec


def _node_status() -> dict[str, Any]:
    record = Record(
        state=State.DRAINING,
        reason="XID79",
        message="m",
        since=T,
        quarantines=(T,),
        healthy_since=T,
        cleared_before=T,
        held_by_breaker=True,
        drain_action="drain",
        drained=True,
    )
    body = node_status(
        record,
        policy="p",
        overridden=["q"],
        dry_run=True,
        total_gpus=8,
        healthy_gpus=7,
        last_xid="79",
        evidence=[{"signal": "xid", "gpu": 0, "code": 79, "since": "2026-01-01T00:00:00Z", "detail": "d"}],
        pending={"signal": "thermal", "since": "2026-01-01T00:00:00Z"},
        devices=[_every_device_record().to_status()],
        in_service_gpus=7,
    )
    body["drain"] = {"phase": "Running", "startedAt": "2026-01-01T00:00:00Z", "pods": {}}
    body["deviceDrains"] = {"2": {"phase": "Completed"}}
    body["remediation"] = {"2": _every_ladder_record().to_status()}
    body["repairs"] = {
        "GPU-2": [Repair(Attempt(StepKind.GPU_RESET, 1, T, T, Result.SUCCEEDED), "EccUncorrected", 2).to_status()]
    }
    return {k: v for k, v in body.items() if v is not None}


def _every_ladder_record() -> LadderRecord:
    """A ladder record with every field set (so every field the remediator writes is checked)."""
    rec = LadderRecord(
        index=2,
        step=StepKind.NODE_REBOOT,
        attempt=2,
        phase=Phase.HANDED_OFF,
        reason="EccUncorrected",
        uuid="GPU-2",
        since=T,
        fault_since=T,
        started=T,
        finished=T,
        job="gpuhealth-remediation/gpuhealth-reset-node-a-2-1-abcdef12",
        message="m",
        history=(Attempt(StepKind.GPU_RESET, 1, T, T, Result.FAILED),),
        validation=Validation(
            2, Outcome.FAILED, "gpuhealth-remediation/gpuhealth-validate-node-a-2-1-ab", True, T, T, "f"
        ),
        approved=True,
        plugin=PluginRestart(T, "gpu-operator/nvidia-device-plugin-daemonset-x1", "u1", True, "b", True),
        approvers=(Approver("alice@example.com", T), Approver("system:serviceaccount:ops:bob", T)),
    )
    missing = unset_fields(rec, skip=("index",))
    assert not missing, (
        f"api/remediation_status.py LadderRecord fields {missing} are not set by "
        "tests/unit/test_contracts_status.py _every_ladder_record"
    )
    return rec


def test_ladder_records_round_trip_through_their_declared_fields() -> None:
    rec = _every_ladder_record()
    assert LadderRecord.from_status(2, rec.to_status()) == rec


def test_ladder_vocabularies_are_the_api_types() -> None:
    entry = "status.remediation.*"
    schema = at(crdschema.schema(REPORT_CRD), "status.remediation")["additionalProperties"]
    props = schema["properties"]
    assert set(props["step"]["enum"]) == {str(s) for s in StepKind}, f"{entry}.step vs api/remediation.py StepKind"
    assert set(props["phase"]["enum"]) == {str(p) for p in Phase}, f"{entry}.phase vs api/remediation_status.py Phase"
    result = props["history"]["items"]["properties"]["result"]["enum"]
    assert set(result) == {str(r) for r in Result}, f"{entry}.history[].result vs api/remediation_status.py Result"
    steps = at(crdschema.schema(POLICY_CRD), "spec.remediation.ladders[].steps[].type")["enum"]
    assert set(steps) == {str(s) for s in StepKind}, "spec.remediation.ladders[].steps[].type vs StepKind"


def _undeclared(s: Mapping[str, Any], value: Any, path: str) -> Iterator[str]:
    """Keys present in ``value`` that ``s`` does not declare (a preserve-unknown-fields status keeps
    them silently, which is exactly how a contract drifts)."""
    if isinstance(value, Mapping):
        props = s.get("properties") or {}
        if not props:
            return  # a free-form object (drain progress, evidence details): nothing declared inside
        for k, v in value.items():
            if k not in props:
                yield f"{path}.{k}"
            else:
                yield from _undeclared(props[k], v, f"{path}.{k}")
    elif isinstance(value, list):
        for v in value:
            yield from _undeclared(s.get("items") or {}, v, f"{path}[]")


def test_the_status_the_operator_writes_is_declared() -> None:
    status_schema = at(crdschema.schema(REPORT_CRD), "status")
    body = _node_status()
    undeclared = sorted(set(_undeclared(status_schema, body, "status")))
    assert not undeclared, (
        f"api/status.py / api/devices.py write status fields crds/gpunodehealths.yaml does not declare: {undeclared}"
    )
    problems = list(violations(status_schema, body, "status"))
    assert not problems, "\n".join(problems)


def test_device_records_round_trip_through_their_declared_fields() -> None:
    rec = _every_device_record()
    assert DeviceRecord.from_status(rec.to_status()) == rec
    assert Record.from_status(_node_status()).reason == "XID79"


# -- the states' vocabularies ----------------------------------------------------------------------


def test_state_vocabularies_are_the_api_types() -> None:
    assert crd_enum(REPORT_CRD, "status.state") == {str(s) for s in State}, "status.state vs api/names.py State"
    assert crd_enum(REPORT_CRD, "status.devices[].state") == {str(s) for s in DeviceState}, (
        "status.devices[].state vs api/devices.py DeviceState"
    )
    assert crd_enum(POLICY_CRD, "spec.mode") == {str(m) for m in Mode}, "spec.mode vs api/names.py Mode"
