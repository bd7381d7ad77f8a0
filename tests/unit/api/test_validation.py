"""spec.validation (api/validation.py): defaults, refusals naming the field, the record's codec."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpuhealth.api.policy import PolicyError, parse_policy
from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import LadderRecord, Phase, ladders_from_status
from gpuhealth.api.validation import Outcome, Validation, parse_validation


def _policy(validation: Any) -> Any:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"validation": validation}})


def test_defaults_are_off_level_2() -> None:
    v = parse_validation({})
    assert not v.enabled and v.level == 2 and v.max_concurrent == 1 and v.timeout_s == 900
    assert "dcgm" in v.image and v.hostengine.endswith(":5555")
    on = _policy({"enabled": True, "level": 3, "timeout": "30m", "maxConcurrent": 4}).validation
    assert on.enabled and on.level == 3 and on.timeout_s == 1800 and on.max_concurrent == 4
    assert not v.new_nodes.enabled and v.new_nodes.batch_size == 4
    burn = _policy({"enabled": True, "newNodes": {"enabled": True, "batchSize": 10}}).validation.new_nodes
    assert burn.enabled and burn.batch_size == 10


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"level": 5}, "spec.validation.level"),
        ({"level": "2"}, "spec.validation.level"),
        ({"maxConcurrent": 0}, "spec.validation.maxConcurrent"),
        ({"timeout": "soon"}, "spec.validation.timeout"),
        ({"timeout": "5s"}, "spec.validation.timeout"),
        ({"newNodes": {"batchSize": 0}}, "spec.validation.newNodes.batchSize"),
        ({"newNodes": "yes"}, "spec.validation.newNodes"),
        ({"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "x"}]}}}}}, "jobTemplate.spec"),
        (
            {
                "jobTemplate": {
                    "spec": {"template": {"spec": {"nodeName": "${NODE_NAME}", "containers": [{"name": "x"}]}}}
                }
            },
            "jobTemplate.spec.template.spec.containers",
        ),
    ],
)
def test_refusals_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        _policy(raw)


def test_a_template_pinned_and_naming_the_gpu_index_is_accepted() -> None:
    pod = {"nodeName": "${NODE_NAME}", "containers": [{"name": "nccl", "args": ["--gpu", "${GPU_INDEX}"]}]}
    assert _policy({"jobTemplate": {"spec": {"template": {"spec": pod}}}}).validation.job_template is not None


def test_the_record_round_trips_inside_the_ladder_record() -> None:
    t = dt.datetime(2026, 12, 3, 14, 0, tzinfo=dt.UTC)
    v = Validation(2, Outcome.FAILED, "ns/j", True, t, t, "GPU 1 pcie Fail (DCGM error 46)")
    rec = LadderRecord(index=1, step=StepKind.GPU_RESET, phase=Phase.VALIDATING, since=t, validation=v)
    back = ladders_from_status({"remediation": {"1": rec.to_status()}})[1]
    assert back == rec
    assert Validation.from_status({"level": 2, "result": "Bogus"}) is None
