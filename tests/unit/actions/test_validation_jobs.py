"""The validation Job (actions/validation_jobs.py): one GPU, pinned, no GPU requested, a verdict from evidence."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.actions.validation_jobs import (
    LEVEL_LABEL,
    SCOPE_LABEL,
    WRAPPER,
    build_node_validation_job,
    build_validation_job,
    job_name,
    node_job_name,
    pods_of,
    verdict,
)
from gpuhealth.api.diag import parse_termination_message
from gpuhealth.api.names import BURN_IN_TAINT_KEY, DEVICE_GPU_LABEL, TAINT_KEY
from gpuhealth.api.remediation import RemediationSettings
from gpuhealth.api.validation import Outcome, ValidationSettings

UUID = "GPU-3c1c2f1e-0000-4000-8000-000000000003"
PASS = json.dumps(
    {
        "DCGM Diagnostic": {
            "test_categories": [
                {"category": "Hardware", "tests": [{"name": "memory", "results": [{"entity_id": 3, "status": "Pass"}]}]}
            ]
        },
        "Overall Result": "Pass",
    }
)
FAIL = json.dumps(
    {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Integration",
                    "tests": [
                        {
                            "name": "pcie",
                            "results": [
                                {
                                    "entity_group": "GPU",
                                    "entity_id": 3,
                                    "status": "Fail",
                                    "warnings": [{"warning": "PCIe width x8", "error_id": 46}],
                                }
                            ],
                        }
                    ],
                }
            ]
        },
        "Overall Result": "Fail",
    }
)


def _job(cond: str = "", reason: str = "") -> dict[str, Any]:
    status = {"conditions": [{"type": cond, "status": "True", "reason": reason}]} if cond else {}
    return {"metadata": {"name": "j", "namespace": "ns"}, "status": status}


def _pod(message: str | None, code: int = 0) -> dict[str, Any]:
    term: dict[str, Any] = {"exitCode": code}
    if message is not None:
        term["message"] = message
    return {
        "metadata": {"name": "j-x", "namespace": "ns", "labels": {"batch.kubernetes.io/job-name": "j"}},
        "status": {"containerStatuses": [{"name": "dcgm-diag", "state": {"terminated": term}}]},
    }


def test_the_default_job_tests_exactly_one_gpu_on_its_node_without_requesting_one() -> None:
    name = job_name("node-a", 3, UUID, "2026-12-03T14:00:00Z", 1)
    assert name == job_name("node-a", 3, UUID, "2026-12-03T14:00:00Z", 1) and len(name) <= 63
    assert name != job_name("node-a", 3, UUID, "2026-12-03T14:00:00Z", 2)
    body, why = build_validation_job(RemediationSettings(), ValidationSettings(level=2), "node-a", 3, UUID, name)
    assert body is not None, why
    pod = body["spec"]["template"]["spec"]
    assert pod["nodeName"] == "node-a" and pod["restartPolicy"] == "Never"
    c = pod["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["LEVEL"] == "2" and env["GPU"] == "3" and env["DCGM_HOSTENGINE"].startswith("nvidia-dcgm.")
    assert "resources" not in c and "privileged" not in json.dumps(c)
    assert body["spec"]["template"]["metadata"]["labels"][LEVEL_LABEL] == "2"
    assert body["spec"]["backoffLimit"] == 0 and body["spec"]["activeDeadlineSeconds"] == 900
    assert {"key": TAINT_KEY, "operator": "Exists"} in pod["tolerations"]


def test_a_template_that_is_not_pinned_gets_no_job() -> None:
    tmpl = {"spec": {"template": {"spec": {"nodeName": "other", "containers": [{"name": "x", "args": [UUID]}]}}}}
    body, why = build_validation_job(
        RemediationSettings(), ValidationSettings(job_template=tmpl), "node-a", 3, UUID, "n"
    )
    assert body is None and "not pinned" in why
    assert build_validation_job(RemediationSettings(), ValidationSettings(), "node-a", 3, "", "n")[0] is None


def test_verdicts() -> None:
    assert verdict(_job(), [])[0] == Outcome.RUNNING
    assert verdict(None, [])[0] == Outcome.LOST
    assert verdict(_job("Complete"), [_pod(PASS)]) == (Outcome.PASSED, "")
    out, findings = verdict(_job("Failed", "BackoffLimitExceeded"), [_pod(FAIL, 226)])
    assert out == Outcome.FAILED and "GPU 3 pcie Fail (DCGM error 46)" in findings and "exit 226" in findings
    assert verdict(_job("Failed", "DeadlineExceeded"), [])[0] == Outcome.TIMED_OUT
    assert verdict(_job("Failed", "BackoffLimitExceeded"), [])[0] == Outcome.LOST  # the pod went with its node
    # Exit 0 but no result, or garbage: never a pass.
    assert verdict(_job("Complete"), [_pod(None)])[0] == Outcome.FAILED
    assert verdict(_job("Complete"), [_pod("Error: connection refused")])[0] == Outcome.FAILED
    # A pass in the message but a non-zero exit: failed.
    assert verdict(_job("Failed", "BackoffLimitExceeded"), [_pod(PASS, 1)])[0] == Outcome.FAILED


def test_pods_of_the_job_by_its_label() -> None:
    other = _pod(PASS)
    other["metadata"]["labels"] = {"job-name": "k"}
    assert pods_of("ns/j", [_pod(PASS), other]) == [_pod(PASS)]


@pytest.mark.parametrize("doc", ["small", "large"])
def test_the_wrapper_leaves_a_result_the_parser_reads(tmp_path: Path, doc: str) -> None:
    """The wrapper run by sh against a fake dcgmi: whole JSON when it fits, else the summary (< 4 KiB)."""
    body = FAIL if doc == "small" else json.dumps({**json.loads(FAIL), "padding": ["x" * 100] * 60})
    (tmp_path / "out.json").write_text(body)
    fake = tmp_path / "dcgmi"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.json'}\nexit 226\n")
    fake.chmod(0o755)
    script = WRAPPER.replace("/dev/termination-log", str(tmp_path / "msg"))
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "LEVEL": "2", "GPU": "3", "DCGM_HOSTENGINE": "h:5555"}
    rc = subprocess.run(["sh", "-c", script], env=env, check=False).returncode
    msg = (tmp_path / "msg").read_text()
    assert rc == 226 and len(msg.encode()) <= 4096
    r = parse_termination_message(msg)
    assert not r.passed and "DCGM error 46" in r.findings()


# --- a node's validation: all its GPUs in one Job ----------------------------------------------

GPUS = [(1, "GPU-b"), (0, "GPU-a"), (2, "GPU-c")]


def test_a_node_validation_tests_all_the_reports_gpus_in_one_job() -> None:
    name = node_job_name("node-a", "Release", "2026-01-01T00:00:00Z")
    assert name == node_job_name("node-a", "Release", "2026-01-01T00:00:00Z") and len(name) <= 63
    assert name != node_job_name("node-a", "Release", "2026-01-01T00:05:00Z"), "one Job per episode"
    assert len(node_job_name("n" * 200, "BurnIn", "x")) <= 63
    body, why = build_node_validation_job(RemediationSettings(), ValidationSettings(level=1), "node-a", GPUS, name)
    assert body is not None and not why
    pod = body["spec"]["template"]["spec"]
    assert pod["nodeName"] == "node-a"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["GPU"] == "0,1,2" and env["GPU_UUID"] == "GPU-a,GPU-b,GPU-c" and env["LEVEL"] == "1"
    labels = body["spec"]["template"]["metadata"]["labels"]
    assert labels[SCOPE_LABEL] == "node" and labels[LEVEL_LABEL] == "1" and DEVICE_GPU_LABEL not in labels
    keys = {t["key"] for t in pod["tolerations"]}
    assert {TAINT_KEY, BURN_IN_TAINT_KEY} <= keys, "it runs while the node is held by either taint"
    assert not (pod["containers"][0].get("resources") or {}).get("limits"), "it requests no GPU"


def test_a_node_validation_template_gets_the_lists() -> None:
    template = {
        "spec": {
            "template": {
                "spec": {
                    "nodeName": "${NODE_NAME}",
                    "containers": [{"name": "d", "image": "i", "command": ["dcgmi", "diag", "-i", "${GPU_INDEX}"]}],
                }
            }
        }
    }
    settings = ValidationSettings(job_template=template)
    body, _ = build_node_validation_job(RemediationSettings(), settings, "node-a", GPUS, "j")
    assert body is not None
    assert body["spec"]["template"]["spec"]["containers"][0]["command"] == ["dcgmi", "diag", "-i", "0,1,2"]


def test_no_gpus_or_a_gpu_without_uuid_runs_nothing() -> None:
    body, why = build_node_validation_job(RemediationSettings(), ValidationSettings(), "node-a", [], "j")
    assert body is None and "lists no GPU" in why
    body, why = build_node_validation_job(RemediationSettings(), ValidationSettings(), "node-a", [(0, "")], "j")
    assert body is None and "UUID" in why


def test_a_node_mixing_mig_modes_gets_no_job_and_says_which_gpus_are_which() -> None:
    """DCGM refuses a mix of MIG-enabled and disabled GPUs in one run: no Job that would fail for that."""
    r, s = RemediationSettings(), ValidationSettings()
    body, why = build_node_validation_job(r, s, "node-a", GPUS, "j", mig_enabled={1})
    assert body is None
    assert "MIG is enabled on GPU 1 and not on GPU 0, 2" in why and "mix of MIG modes" in why
    for same in ({0, 1, 2}, set()):  # one mode on all of them: one Job for all
        body, why = build_node_validation_job(r, s, "node-a", GPUS, "j", mig_enabled=same)
        assert body is not None and not why
