"""A GPU's scalar facts are declared once (api/device_facts.py): each declaration is bound to the types
that carry it (the agent's DeviceFacts, the operator's Device), and the CRD's schema of them, the
parser and the writer take it by type. (The field table, the CRD and the slim cache are held to each
other in tests/unit/test_contracts.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from gpuhealth.agent.model import DeviceFacts
from gpuhealth.agent.report import device_spec
from gpuhealth.api.device_facts import DEVICE_FACTS, FAULT_FACTS, Fact, GpuFacts
from gpuhealth.api.report import Device, ReportError, parse_report
from gpuhealth.api.report_fields import DROPPED, READ
from hack import gen_crds


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_keys_are_unique_and_name_their_attributes() -> None:
    keys = [f.key for f in DEVICE_FACTS]
    assert len(keys) == len(set(keys))
    assert {f.key: f.attr for f in DEVICE_FACTS}["pciBusId"] == "pci_bus_id"


def test_each_read_fact_is_an_attribute_of_the_operators_device() -> None:
    missing = [f.key for f in DEVICE_FACTS if f.read and f.attr not in _fields(Device)]
    assert not missing, f"api/report.py Device has no attribute for the READ facts {missing}"


def test_each_sampled_fact_is_an_attribute_of_the_agents_device_facts() -> None:
    missing = [f.key for f in DEVICE_FACTS if f.sampled and f.attr not in _fields(DeviceFacts)]
    assert not missing, f"agent/model.py DeviceFacts has no attribute for {missing}"


def test_every_gpu_facts_field_is_declared_and_unknown_by_default() -> None:
    for f in dataclasses.fields(GpuFacts):
        declared = f.metadata.get("fact")
        assert isinstance(declared, Fact), f"GpuFacts.{f.name} is not declared with fact(Fact(...))"
        assert declared.attr == f.name and f.default is None
        assert declared in DEVICE_FACTS


def test_a_fact_is_listed_read_or_dropped_from_its_declaration() -> None:
    for f in DEVICE_FACTS:
        path = f"spec.devices[].{f.key}"
        assert (path in READ) == f.read and (path in DROPPED) == (not f.read)
        if not f.read:
            assert DROPPED[path] == f.dropped


def test_a_fault_is_a_boolean_the_operator_reads() -> None:
    for f in FAULT_FACTS:
        assert f.read and f.schema["type"] == "boolean", f.key


def test_the_crd_block_declares_each_fact_as_its_schema() -> None:
    lines = gen_crds.device_facts()
    schema = yaml.safe_load("\n".join(lines))
    assert list(schema) == [f.key for f in DEVICE_FACTS]
    for f in DEVICE_FACTS:
        got = schema[f.key]
        want: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in f.schema.items()}
        assert {k: v for k, v in got.items() if k != "description"} == want
        if f.description or f.unit:
            assert f.description in got["description"] and f.unit in got["description"]


def test_a_block_expression_inline_is_refused() -> None:
    with pytest.raises(SystemExit, match="line of its own"):
        gen_crds.render("x: {{ device_facts() }}\n")


def _report(device: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "n"}, "spec": {"nodeName": "n", "devices": [{"index": 0, **device}]}}


@pytest.mark.parametrize(
    ("key", "value"),
    [("uuid", 7), ("lost", "yes"), ("clockEventReasons", True), ("clockEventReasons", "8"), ("recoveryAction", 1)],
)
def test_a_read_fact_of_the_wrong_type_refuses_the_report(key: str, value: Any) -> None:
    with pytest.raises(ReportError, match=rf"spec\.devices\[0\]\.{key}: expected"):
        parse_report(_report({key: value}))


def test_absent_facts_keep_the_devices_defaults_and_unknown_decodes_to_none() -> None:
    d = parse_report(_report({"recoveryAction": "SomethingNewer"})).devices[0]
    assert d == Device(index=0)


def test_the_writer_omits_unknown_and_empty_cuts_long_strings_and_rounds_numbers() -> None:
    spec = device_spec(DeviceFacts(index=1, uuid="", model="M" * 200, power_w=301.46), None)
    assert "uuid" not in spec and "clockEventsSince" not in spec
    assert spec["model"] == "M" * 127 + "…" and spec["powerW"] == 301.5 and spec["lost"] is False
