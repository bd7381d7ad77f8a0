"""The bad-input check accepts a refusal only if it names the exact field path."""

from __future__ import annotations

import json

from hack.chaos.fieldpath import names_field, refused_fields

STATUS = json.dumps(
    {
        "kind": "Status",
        "code": 422,
        "message": 'GPUHealthPolicy.gpuhealth.dev "x" is invalid: spec.rules.xid.applicationRepeat.count: '
        "Invalid value: 1: spec.rules.xid.applicationRepeat.count in body should be greater than or equal to 2",
        "details": {"causes": [{"reason": "FieldValueInvalid", "field": "spec.rules.xid.applicationRepeat.count"}]},
    }
)


def test_the_exact_path_is_named() -> None:
    assert names_field(STATUS, "spec.rules.xid.applicationRepeat.count")


def test_substrings_and_parents_are_not() -> None:
    for loose in ("count", "spec", "applicationRepeat.count", "spec.rules.xid", "spec.rules.xid.applicationRepeat"):
        assert not names_field(STATUS, loose), loose


def test_a_message_without_causes_is_parsed_by_path() -> None:
    body = json.dumps(
        {
            "message": 'x "y" is invalid: [spec.devices[0].index: Invalid value: 64: must be <= 63, '
            "spec.nodeName: Required value]"
        }
    )
    assert refused_fields(body) == {"spec.devices[0].index", "spec.nodeName"}
    assert not names_field("not json: spec.mode is wrong", "spec.mode")
