"""A structured fact's fields are declared once (api/wire.py, on the types of api/report_fabric.py and
api/report.py): each declaration is the CRD's schema of the field, every field of those types is one,
and the agent's significant-change filter leaves telemetry out and compares rates and duty cycles by
bucket. (The field table, the parser, the writer and the slim cache are held to the CRD in
tests/unit/test_contracts.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from devkit import crdschema
from devkit.crdschema import at
from gpuhealth.api.report import DEVICE_OBJECTS
from gpuhealth.api.report_fabric import DEVICE_PARTS, Clocks, NicPort, NvLink, Pcie
from gpuhealth.api.wire import dump, fields_of, significant
from tests.unit._contracts_support import REPORT_CRD

TYPES: list[tuple[str, type]] = [
    *((f"spec.devices[].{key}", cls) for key, cls in DEVICE_PARTS),
    *((f"spec.devices[].{key}", cls) for key, _, cls in DEVICE_OBJECTS),
    ("spec.nics[]", NicPort),
]


def _plain(v: Any) -> Any:
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


@pytest.mark.parametrize(("path", "cls"), TYPES, ids=[p for p, _ in TYPES])
def test_every_field_is_declared_and_is_the_crds_schema(path: str, cls: type) -> None:
    undeclared = [f.name for f in dataclasses.fields(cls) if "wire" not in f.metadata]
    assert not undeclared, f"{cls.__name__} fields {undeclared} are not declared with api/wire.py wire(...)"
    properties = at(crdschema.schema(REPORT_CRD), path)["properties"]
    assert list(properties) == [w.key for _, w in fields_of(cls)], f"{path}: the CRD's properties are not the fields"
    for _, w in fields_of(cls):
        got = dict(properties[w.key])
        assert got.pop("description", "") == w.description, f"{path}.{w.key}"
        assert got == _plain(dict(w.schema)), f"{path}.{w.key}"


def test_telemetry_alone_is_no_new_fact() -> None:
    base = NvLink(links=18, active=18, replay_errors=1, crc_errors=0)
    assert significant(base) == significant(dataclasses.replace(base, replay_errors=900, crc_errors=12))
    assert significant(base) != significant(dataclasses.replace(base, active=17))
    assert significant(Pcie(16, 16, 5, 5, 0)) == significant(Pcie(16, 16, 5, 5, 40))


def test_rates_and_duty_cycles_count_when_they_change_bucket() -> None:
    port = NicPort("mlx5_0", 1, symbol_errors_per_min=0.05)
    assert significant(port) == significant(dataclasses.replace(port, symbol_errors_per_min=0.08))
    assert significant(port) != significant(dataclasses.replace(port, symbol_errors_per_min=3.0))
    assert significant(Clocks(300, 0, 0, 12)) == significant(Clocks(290, None, 0, 19))
    assert significant(Clocks(300, 0, 0, 12)) != significant(Clocks(300, 0, 0, 20))


def test_the_writer_leaves_unknown_out_sorts_lists_and_rounds_rates() -> None:
    port = NicPort(
        "mlx5_0", 1, state="ACTIVE", symbol_errors_per_min=1.23456, saturated=("symbol_error", "link_downed")
    )
    assert dump(port) == {
        "device": "mlx5_0",
        "port": 1,
        "state": "ACTIVE",
        "symbolErrorsPerMin": 1.23,
        "saturated": ["link_downed", "symbol_error"],
    }
    assert dump(NvLink(links=4, active=4, peers=())) == {"links": 4, "active": 4}
