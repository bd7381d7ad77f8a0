"""The report contract bound to its one declaration, ``crds/gpunodehealths.yaml``: a field added on one
side and missing on the other fails here, with a message naming both.

- The chart ships the same CRDs as ``crds/`` (links, never a second copy).
- What the agent writes (its own report builder, every fact set) is declared by the report CRD.
- Every field the report CRD declares is in the report contract's field table,
  ``api/report_fields.py``: READ (``api/report.py`` reads it) or DROPPED (with the reason nobody
  does); the parser reads exactly the READ ones, and the operator's slim cache keeps exactly those
  (the fullest report the CRD allows parses the same slimmed and whole).
- The report's enums are the agent model's vocabularies.

What the operator writes into a report's status is bound in test_contracts_status.py, the policy
CRD in test_contracts_policy.py.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from devkit import crdschema
from devkit.crdschema import CHART_CRDS, CRDS, at, declared_paths, fullest, violations
from gpuhealth.agent import model as agent_model
from gpuhealth.agent.model import (
    DeviceFacts,
    EccCounts,
    NvmlStatus,
    PodHold,
    PodResources,
    RemappedRows,
    RetiredPages,
    Snapshot,
    Temperature,
    XidEvent,
)
from gpuhealth.agent.report import AgentInfo, ReportBuilder, xid_spec
from gpuhealth.api import fabric
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.report import MigDevice, ReportError, parse_report
from gpuhealth.api.report_fabric import Clocks, Fabric, NicPort, NvLink, Pcie
from gpuhealth.api.report_fields import DROPPED, READ
from gpuhealth.api.wire import fields_of
from gpuhealth.controller.state.slim import slim_report
from tests.unit._contracts_support import REPORT_CRD, T, crd_enum, unset_fields

# -- the chart's copy ------------------------------------------------------------------------------


def test_the_chart_ships_exactly_the_crds_of_crds() -> None:
    """The chart's crds/ are links to crds/ (helm packages what they point at): never a second copy."""
    ours = sorted(p.name for p in CRDS.glob("*.yaml"))
    assert ours, "crds/ holds no CRD"
    for name in ours:
        chart = CHART_CRDS / name
        assert chart.is_symlink(), (
            f"charts/gpuhealth/crds/{name} is not a link to crds/{name} (ln -sf ../../../crds/{name} {chart})"
        )
        assert chart.resolve() == (CRDS / name).resolve(), f"charts/gpuhealth/crds/{name} points elsewhere"


# -- what the agent writes -------------------------------------------------------------------------


def _every_fact(index: int) -> DeviceFacts:
    return DeviceFacts(
        index=index,
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        pci_bus_id=f"00000000:{index:02X}:00.0",
        model="NVIDIA H100 80GB HBM3",
        mig_mode=agent_model.MIG_ENABLED,
        ecc_mode=agent_model.MIG_ENABLED,
        lost=True,
        ecc=EccCounts(1, 2, 3, 4),
        retired_pages=RetiredPages(1, 2, True),
        remapped_rows=RemappedRows(1, 2, True, True),
        temperature=Temperature(80, 87, 92),
        clock_event_reasons=0x48,
        power_w=301.5,
        recovery_action=RecoveryAction("Reset"),
        mig_devices=(
            MigDevice(0, f"MIG-{index:08d}-0000-0000-0000-000000000000", 1, 0, "3g.40gb", (_hold("mig-3g.40gb"),)),
            MigDevice(1, f"MIG-{index:08d}-0000-0000-0000-000000000001", 2, 0, "3g.40gb"),
        ),
        pods=(_hold("gpu"), dataclasses.replace(_hold("gpu"), name="train-1")),
        nvlink=NvLink(18, 17, (3,), 26562, 6, (1, 2, 3), 4, 1, 2, 5, 1, 6, ("Switch",)),
        fabric=Fabric.decoded(3, 0, "1b9e1a6c-3e57-4f2a-9d0e-6b3f2a1c4d5e", 7, 0x11A9, 3),
        pcie=Pcie(8, 16, 4, 5, 12),
        clocks=Clocks(300, 10, 20, 40),
        unsupported=("nvmlDeviceGetPowerUsage",),
        inforom_corrupt=True,
    )


def _hold(resource: str) -> PodHold:
    return PodHold("ml", "train-0", "main", f"nvidia.com/{resource}")


def _every_nic() -> NicPort:
    return NicPort(
        "mlx5_1", 1, "DOWN", "Disabled", "Ethernet", "ens1f0", "down", 1, 2, 3, 4, 1.5, 2.5, 3.5, ("symbol_error",)
    )


def test_the_fullest_nic_facts_set_every_field() -> None:
    missing = unset_fields(_every_nic())
    assert not missing, (
        f"api/report_fabric.py NicPort fields {missing} are not set by tests/unit/test_contracts.py _every_nic"
    )


def test_each_nic_fact_reaches_its_report() -> None:
    full = _every_nic()
    builder = ReportBuilder("node-a", agent_model_info())
    whole = builder.render(Snapshot(T, NvmlStatus(True), (), nics=(full,)), T)["nics"][0]
    for f in dataclasses.fields(NicPort):
        if f.name in ("device", "port"):
            continue
        default: Any = f.default if f.default is not dataclasses.MISSING else None
        less = builder.render(
            Snapshot(T, NvmlStatus(True), (), nics=(dataclasses.replace(full, **{f.name: default}),)), T
        )
        assert less["nics"][0] != whole, f"api/report_fabric.py NicPort.{f.name} never reaches spec.nics[]"


def test_the_fullest_agent_facts_set_every_field() -> None:
    """Adding a field to the agent's DeviceFacts makes this fail until the report tests set it too."""
    facts = _every_fact(0)
    missing = unset_fields(facts)
    assert not missing, (
        f"agent/model.py DeviceFacts fields {missing} are not set by tests/unit/test_contracts.py _every_fact: "
        "set them there, so the report CRD is checked to declare what the agent writes of them"
    )


def _rendered_spec() -> dict[str, Any]:
    builder = ReportBuilder("node-a", agent_model_info())
    builder.add_xid(XidEvent(79, T, "nvml", gpu=0, uuid=_every_fact(0).uuid or "", detail="fallen off the bus"))
    builder.add_xid(XidEvent(13, T, "nvml", gpu=1, detail="graphics engine", gpu_instance=1, compute_instance=0))
    snap = Snapshot(
        T,
        NvmlStatus(True, "none", "580.65.06", "13.0"),
        (_every_fact(0), _every_fact(1)),
        nics=(_every_nic(),),
        pod_resources=PodResources(False, "connection refused"),
    )
    return builder.render(snap, T)


def agent_model_info() -> AgentInfo:
    return AgentInfo(version="0.1.0", sources=("nvml", "dcgm"), boot_time=T)


def test_what_the_agent_writes_is_declared_by_the_report_crd() -> None:
    spec_schema = at(crdschema.schema(REPORT_CRD), "spec")
    problems = list(violations(spec_schema, _rendered_spec(), "spec"))
    assert not problems, "agent/report.py writes what crds/gpunodehealths.yaml does not declare:\n" + "\n".join(
        problems
    )


def test_each_fact_the_agent_observes_reaches_its_report() -> None:
    """A fact the agent samples but never writes is a contract gap (a dropped signal)."""
    full = _every_fact(0)
    builder = ReportBuilder("node-a", agent_model_info())
    snap = Snapshot(T, NvmlStatus(True), (full,))
    whole = builder.render(snap, T)["devices"][0]
    for f in dataclasses.fields(DeviceFacts):
        if f.name == "index":
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        less = builder.render(Snapshot(T, NvmlStatus(True), (full.replace(**{f.name: default}),)), T)
        assert less["devices"][0] != whole, (
            f"agent/model.py DeviceFacts.{f.name} never reaches spec.devices[] (agent/report.py device_spec)"
        )


def test_xid_events_the_agent_writes_are_declared() -> None:
    item = at(crdschema.schema(REPORT_CRD), "spec.xidEvents[]")
    events = (
        XidEvent(48, T, "dcgm", gpu=3, uuid="GPU-x", detail="d"),
        XidEvent(13, T, "simulated"),
        XidEvent(31, T, "nvml", gpu=2, gpu_instance=7, compute_instance=0),
    )
    for ev in events:
        for f in dataclasses.fields(XidEvent):
            assert f.name in ("xid", "time", "source") or any(getattr(e, f.name) is not None for e in events), (
                f"agent/model.py XidEvent.{f.name} is set by none of tests/unit/test_contracts.py's events"
            )
        problems = list(violations(item, xid_spec(ev), "spec.xidEvents[]"))
        assert not problems, "\n".join(problems)


def test_the_unit_tests_hand_built_reports_are_what_the_crd_allows() -> None:
    """tests/unit/builders.py builds reports by hand for speed; they may not drift from the CRD."""
    from tests.unit import builders
    from tests.unit.controller.state.test_slim import full_device

    spec_schema = at(crdschema.schema(REPORT_CRD), "spec")
    body = builders.report_obj(devices=[full_device(i) for i in range(8)], xids=[builders.xid_event(79, 1)])
    problems = list(violations(spec_schema, body["spec"], "spec"))
    assert not problems, "tests/unit/builders.py builds reports the CRD refuses:\n" + "\n".join(problems)


# -- what the operator reads of a report -----------------------------------------------------------


def _fullest_report(flags: bool = True) -> dict[str, Any]:
    s = crdschema.schema(REPORT_CRD)
    body: dict[str, Any] = {
        "apiVersion": "gpuhealth.dev/v1alpha1",
        "kind": "GPUNodeHealth",
        "metadata": {"name": "node-a", "uid": "u1", "generation": 3, "resourceVersion": "7"},
        "spec": fullest(at(s, "spec"), "spec", {"spec.nodeName": "node-a"}),
    }

    def flip(v: Any) -> Any:
        if isinstance(v, bool):
            return flags
        if isinstance(v, Mapping):
            return {k: flip(x) for k, x in v.items()}
        if isinstance(v, list):
            return [flip(x) for x in v]
        return v

    body["spec"] = flip(body["spec"])
    return body


def _drop(body: Mapping[str, Any], path: str) -> dict[str, Any]:
    """A copy of ``body`` without the leaf at ``path`` (items as ``[]``: dropped from every item)."""
    out = copy.deepcopy(dict(body))

    def walk(node: Any, steps: list[str]) -> None:
        step, rest = steps[0], steps[1:]
        name = step.removesuffix("[]")
        if not isinstance(node, dict) or name not in node:
            return
        if not rest:
            if step.endswith("[]"):
                node[name] = []
            else:
                del node[name]
            return
        child = node[name]
        for c in child if step.endswith("[]") else [child]:
            walk(c, rest)

    walk(out, path.split("."))
    return out


def _report_fields() -> list[str]:
    """The report's declared leaves that may be absent (a required one is refused when missing)."""
    s = crdschema.schema(REPORT_CRD)
    out = []
    for path in declared_paths(at(s, "spec"), "spec"):
        parent, _, name = path.rpartition(".")
        if name not in (at(s, parent).get("required") or []) and path != "spec.nodeName":
            out.append(path)
    return out


TABLE = "operator/gpuhealth/api/report_fields.py"


def test_every_declared_report_field_is_in_the_field_table() -> None:
    declared = list(declared_paths(at(crdschema.schema(REPORT_CRD), "spec"), "spec"))
    neither = [p for p in declared if p not in READ and p not in DROPPED]
    assert not neither, (
        f"crds/gpunodehealths.yaml declares {neither}, which {TABLE} lists neither in READ (api/report.py "
        "parse_report reads it, so controller/intake/slim.py keeps it) nor in DROPPED (with why nobody reads it)"
    )
    both = sorted(set(READ) & set(DROPPED))
    assert not both, f"{TABLE} lists {both} both in READ and in DROPPED"
    stale = [p for p in (*READ, *DROPPED) if p not in declared]
    assert not stale, f"{TABLE} lists {stale}, which crds/gpunodehealths.yaml does not declare: take them off"


def _parsed(body: Mapping[str, Any]) -> Any:
    try:
        return parse_report(body)
    except ReportError as e:
        return f"refused: {e}"


def _read_by_parse_report(path: str, fullest: Mapping[bool, Mapping[str, Any]], parsed: Mapping[bool, Any]) -> bool:
    """Whether dropping the field changes what parse_report makes of the fullest report (with every
    flag set, or every flag False: a dropped flag that defaults to True shows only then), or makes
    it refuse the report. ``fullest`` and ``parsed``: both reports and what parse_report made of them."""
    return any(_parsed(_drop(fullest[flags], path)) != parsed[flags] for flags in (True, False))


def test_the_field_table_says_what_parse_report_reads() -> None:
    declared = [p for p in declared_paths(at(crdschema.schema(REPORT_CRD), "spec"), "spec") if p != "spec.nodeName"]
    fullest = {flags: _fullest_report(flags) for flags in (True, False)}
    parsed = {flags: _parsed(body) for flags, body in fullest.items()}
    read = [p for p in declared if _read_by_parse_report(p, fullest, parsed)]
    said_read = [p for p in READ if p in declared and p not in read]
    said_dropped = [p for p in DROPPED if p in read]
    assert not said_read, (
        f"{TABLE} READ lists {said_read}, which api/report.py parse_report does not read: "
        "read them there, or move them to DROPPED with the reason"
    )
    assert not said_dropped, (
        f"{TABLE} DROPPED lists {said_dropped}, which api/report.py parse_report reads: move them to READ "
        "(controller/intake/slim.py drops what is not READ)"
    )
    # The node name is read as a check: a report about another node is refused.
    assert "spec.nodeName" in READ
    elsewhere = _fullest_report()
    elsewhere["spec"]["nodeName"] = "node-b"
    assert str(_parsed(elsewhere)).startswith("refused: spec.nodeName")


def _leaf_paths(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaf_paths(v, f"{path}.{k}")
    elif isinstance(value, list) and value and isinstance(value[0], Mapping):
        for v in value:
            yield from _leaf_paths(v, f"{path}[]")
    elif isinstance(value, (list, tuple)):
        yield f"{path}[]"  # a list of scalars is one leaf (the slim cache keeps it as a tuple)
    else:
        yield path


def test_the_slim_cache_keeps_exactly_the_read_fields() -> None:
    """What the cache keeps is the table's READ list: no more (memory), no less (a field read)."""
    kept = set(_leaf_paths(slim_report(_fullest_report())["spec"], "spec"))
    extra = sorted(kept - set(READ))
    missing = [p for p in READ if p not in kept]
    assert not extra, f"controller/intake/slim.py keeps {extra}, which {TABLE} lists as DROPPED"
    assert not missing, f"controller/intake/slim.py drops {missing}, which {TABLE} lists as READ"


def _dropped(cls: type) -> tuple[str, ...]:
    """The attributes of a structured fact the agent writes and the operator does not read (api/wire.py)."""
    return tuple(attr for attr, w in fields_of(cls) if not w.read)


def test_every_report_attribute_is_filled_from_a_declared_field() -> None:
    """An attribute of api/report.py's Device that no CRD field can fill is dead or reads a field the
    CRD does not declare (which the API server would then prune)."""
    report = parse_report(_fullest_report())
    device = report.devices[0]
    missing = unset_fields(device, skip=("index",))
    assert not missing, (
        f"api/report.py Device fields {missing} stay at their defaults for the fullest report "
        "crds/gpunodehealths.yaml allows: the fields they read are not declared there"
    )
    assert report.xids and report.xids[0].gpu is not None
    for name in ("nvlink", "fabric", "pcie", "clocks"):
        part = getattr(device, name)
        missing = unset_fields(part, skip=_dropped(type(part)))
        assert not missing, (
            f"api/report_fabric.py {type(part).__name__} fields {missing} are filled by no declared field"
        )
    mig = device.mig_devices[0]
    missing = unset_fields(mig, skip=("index",))
    assert not missing, f"api/report.py MigDevice fields {missing} are filled by no declared field"
    assert device.pods and mig.pods and unset_fields(device.pods[0]) == [], "spec.devices[].pods[] is not read"
    assert report.pod_resources is not None and not unset_fields(report.pod_resources), "spec.podResources"
    assert report.nics, "spec.nics[] is not read"
    missing = unset_fields(report.nics[0], skip=("device", "port", *_dropped(NicPort)))
    assert not missing, f"api/report_fabric.py NicPort fields {missing} are filled by no declared field"


@pytest.mark.parametrize("flags", [True, False])
def test_the_slim_cache_keeps_every_field_the_operator_reads(flags: bool) -> None:
    body = _fullest_report(flags)
    assert parse_report(slim_report(body)) == parse_report(body)
    for path in _report_fields():
        less = _drop(body, path)
        assert parse_report(slim_report(less)) == parse_report(less), (
            f"controller/intake/slim.py changes what api/report.py reads of {path} (crds/gpunodehealths.yaml)"
        )


# -- the report's vocabularies ---------------------------------------------------------------------


def test_report_vocabularies_are_the_agent_model() -> None:
    modes = {agent_model.MIG_ENABLED, agent_model.MIG_DISABLED, agent_model.MODE_UNSUPPORTED}
    assert crd_enum(REPORT_CRD, "spec.devices[].migMode") == modes, "migMode vs agent/model.py"
    assert crd_enum(REPORT_CRD, "spec.devices[].eccMode") == modes, "eccMode vs agent/model.py"
    assert crd_enum(REPORT_CRD, "spec.devices[].recoveryAction") == set(RecoveryAction), (
        "spec.devices[].recoveryAction vs api/recovery.py RecoveryAction"
    )
    assert crd_enum(REPORT_CRD, "spec.devices[].fabric.state") == set(fabric.FABRIC_STATES.values())
    assert crd_enum(REPORT_CRD, "spec.devices[].fabric.healthSummary") == set(fabric.HEALTH_SUMMARIES.values())
    assert crd_enum(REPORT_CRD, "spec.devices[].fabric.incorrectConfiguration") == set(
        typing.get_args(fabric.IncorrectConfiguration)
    ), "spec.devices[].fabric.incorrectConfiguration vs api/fabric.py"
    sources = set(typing.get_args(agent_model.SourceName))
    assert crd_enum(REPORT_CRD, "spec.xidEvents[].source") == sources, "xidEvents[].source vs agent/model.py SourceName"
    assert crd_enum(REPORT_CRD, "spec.agent.sources[]") == sources, "agent.sources vs agent/model.py SourceName"


def test_the_unset_field_finder_names_what_a_fixture_left_at_its_default() -> None:
    @dataclasses.dataclass
    class Record:
        index: int
        count: int = 0
        names: tuple[str, ...] = ()
        note: str | None = None

    assert unset_fields(Record(1, count=2)) == ["names", "note"]
    assert unset_fields(Record(0, count=2, names=("x",), note="y"), skip=("index",)) == []
