"""The DCGM diagnostic's verdict as a validation pod leaves it (api/diag.py).

The shapes follow ``dcgmi diag -r 2 -i <gpu> --json`` of DCGM 4.x: key names as in NVIDIA/DCGM's
``nvvs/include/NvvsJsonStrings.h`` (``DCGM Diagnostic`` -> ``test_categories`` -> ``tests`` ->
``results`` with ``entity_group``/``entity_id``, ``status``, ``warnings[{warning, error_id}]``, and
``Overall Result``)."""

from __future__ import annotations

import json
from typing import Any

from gpuhealth.api.diag import SUMMARY_FORMAT, parse_termination_message


def _result(gpu: int, status: str, warning: str = "", error_id: int | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": status}
    if warning:
        r["warnings"] = [{"warning": warning, "error_id": error_id, "error_category": 4, "error_severity": 2}]
    return r


def diag(gpus: list[int], fail: dict[int, tuple[str, str, int]] | None = None) -> dict[str, Any]:
    """A level-2 run on ``gpus``; ``fail`` maps a GPU to (test, warning, error id)."""
    fail = fail or {}

    def results(test: str) -> list[dict[str, Any]]:
        out = []
        for g in gpus:
            t, w, e = fail.get(g, ("", "", 0))
            out.append(_result(g, "Fail", w, e) if t == test else _result(g, "Pass"))
        return out

    overall = "Fail" if fail else "Pass"
    return {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Deployment",
                    "tests": [
                        {"name": "software", "results": results("software")},
                    ],
                },
                {
                    "category": "Integration",
                    "tests": [{"name": "pcie", "results": results("pcie")}],
                },
                {
                    "category": "Hardware",
                    "tests": [
                        {"name": "memory", "results": results("memory")},
                        {"name": "diagnostic", "results": [_result(g, "Skip") for g in gpus]},
                    ],
                },
            ],
            "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1, "entities": []}],
        },
        "Driver Version Detected": "570.124.06",
        "GPU Device IDs": ["2330"] * len(gpus),
        "version": "4.6.0",
        "Overall Result": overall,
    }


def test_a_clean_run_passes() -> None:
    r = parse_termination_message(json.dumps(diag([3])))
    assert r.passed and r.reason == "Passed"
    assert r.findings() == ""


def test_one_gpu_failing_names_the_gpu_the_test_and_the_code() -> None:
    doc = diag([0, 1], {1: ("pcie", "GPU 1 PCIe link width x8, expected x16", 46)})
    r = parse_termination_message(json.dumps(doc))
    assert not r.passed and r.reason == "Failed"
    assert r.failed_gpus() == frozenset({1})
    assert "GPU 1 pcie Fail (DCGM error 46)" in r.findings()
    assert "x8" in r.findings()


def test_overall_pass_with_a_failing_test_is_not_a_pass() -> None:
    doc = diag([0], {0: ("memory", "DBE", 12)})
    doc["Overall Result"] = "Pass"
    assert not parse_termination_message(json.dumps(doc)).passed


def test_overall_fail_without_details_still_fails() -> None:
    doc = diag([0])
    doc["Overall Result"] = "Fail"
    r = parse_termination_message(json.dumps(doc))
    assert not r.passed and "without a failing test" in r.findings()


def test_older_shapes_gpu_id_and_entities() -> None:
    doc = diag([0])
    doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"] = [
        {"gpu_id": "5", "status": "Fail", "warnings": ["no CUDA"]},
        {"entities": [{"entity_group": "GPU", "entity_id": 6}], "status": "Fail", "error_id": 25},
    ]
    doc["Overall Result"] = "Fail"
    r = parse_termination_message(json.dumps(doc))
    assert r.failed_gpus() == frozenset({5, 6})
    assert "DCGM error 25" in r.findings()


def test_truncated_garbage_and_empty_are_failures_with_a_reason() -> None:
    whole = json.dumps(diag(list(range(8)))) * 3
    cut = whole[:4096]
    r = parse_termination_message(cut)
    assert not r.passed and r.reason == "Unreadable" and "4 KiB" in r.findings()
    for junk, reason in (("", "NoResult"), ("   ", "NoResult"), ("Error: unable to connect", "Unreadable")):
        got = parse_termination_message(junk)
        assert not got.passed and got.reason == reason and got.findings()
    assert not parse_termination_message("[1, 2]").passed
    assert parse_termination_message('{"Overall Result": "Pass"}').reason == "Unreadable"
    no_overall = diag([0])
    del no_overall["Overall Result"]
    assert parse_termination_message(json.dumps(no_overall)).reason == "Unreadable"


def test_the_wrappers_compact_summary() -> None:
    ok = {"format": SUMMARY_FORMAT, "overall": "Pass", "exitCode": 0, "warnings": [], "errorIds": []}
    assert parse_termination_message(json.dumps(ok)).passed
    bad = {"format": SUMMARY_FORMAT, "overall": "Fail", "exitCode": 226, "warnings": ["DBE"], "errorIds": [12]}
    r = parse_termination_message(json.dumps(bad))
    assert not r.passed and "DCGM error 12" in r.findings() and "DBE" in r.findings()
    liar = {**ok, "exitCode": 1}
    assert not parse_termination_message(json.dumps(liar)).passed
    assert not parse_termination_message(json.dumps({**ok, "overall": None})).passed


def test_findings_are_bounded() -> None:
    doc = diag([0], {0: ("memory", "x" * 5000, 12)})
    assert len(parse_termination_message(json.dumps(doc)).findings()) <= 1024
