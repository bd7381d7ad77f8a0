"""What runs across the fleet (``controller/state/running.py``): the counts the remediator and the node
validator hold against a policy's limits, read off each cached report's status, and parsed again only
when the report's resourceVersion changes."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import LadderRecord, Phase
from gpuhealth.api.status import Running
from gpuhealth.api.validation import NodeValidation, Outcome, Trigger, Validation
from gpuhealth.controller.state.running import RunningIndex
from gpuhealth.controller.state.store import Store

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _report(name: str, rv: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "gpuhealth.dev/v1alpha1",
        "kind": "GPUNodeHealth",
        "metadata": {"name": name, "resourceVersion": rv},
        "spec": {"nodeName": name},
        "status": status,
    }


def _ladder(index: int, phase: Phase, validation: Validation | None = None) -> dict[str, Any]:
    return LadderRecord(index=index, step=StepKind.GPU_RESET, phase=phase, validation=validation).to_status()


def _node_validation(trigger: Trigger) -> dict[str, Any]:
    return NodeValidation(trigger, T0, Validation(level=2, outcome=Outcome.RUNNING)).to_status()


def test_counts_what_each_status_of_the_policy_says_runs() -> None:
    store = Store()
    running = Validation(level=2, outcome=Outcome.RUNNING)
    store.put_report(
        "a",
        _report(
            "a",
            "1",
            {
                "policy": "p",
                "remediation": {
                    "0": _ladder(0, Phase.RUNNING),
                    "1": _ladder(1, Phase.VALIDATING, running),
                    "2": _ladder(2, Phase.READY),
                },
                "nodeValidation": _node_validation(Trigger.RELEASE),
            },
        ),
    )
    store.put_report("b", _report("b", "1", {"policy": "p", "nodeValidation": _node_validation(Trigger.BURN_IN)}))
    store.put_report("c", _report("c", "1", {"policy": "other", "remediation": {"0": _ladder(0, Phase.RUNNING)}}))
    found = RunningIndex(store).under("p")
    assert sorted(found, key=lambda r: r.steps) == [
        Running("p", steps=0, validations=0, burn_ins=1),
        Running("p", steps=2, validations=2, burn_ins=0),  # a validating ladder is in flight too
    ]


def test_an_unchanged_report_is_not_parsed_again_and_a_new_version_is() -> None:
    store = Store()
    store.put_report("a", _report("a", "1", {"policy": "p", "remediation": {"0": _ladder(0, Phase.RUNNING)}}))
    store.put_report("b", _report("b", "7", {"policy": "p"}))
    index = RunningIndex(store)
    assert sum(r.steps for r in index.under("p")) == 1
    assert index.parsed == 2
    assert sum(r.steps for r in index.under("p")) == 1
    assert index.parsed == 2  # both unchanged: read from the cache
    store.put_report("a", _report("a", "2", {"policy": "p", "remediation": {"0": _ladder(0, Phase.READY)}}))
    assert sum(r.steps for r in index.under("p")) == 0  # the new version is read
    assert index.parsed == 3
    store.drop_report("b")
    assert index.under("p") == [Running("p")]
    assert index.parsed == 3


def test_a_report_without_a_resource_version_is_read_every_time() -> None:
    store = Store()
    store.put_report("a", _report("a", "", {"policy": "p", "remediation": {"0": _ladder(0, Phase.PENDING)}}))
    index = RunningIndex(store)
    assert [r.steps for r in index.under("p")] == [1]
    assert [r.steps for r in index.under("p")] == [1]
    assert index.parsed == 2
