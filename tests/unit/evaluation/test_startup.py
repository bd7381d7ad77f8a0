"""What a pass may write before the start-up pod list is in (``evaluation/startup.py``): it takes out
what holds nothing out yet, and never writes where a missing restart-loop finding could release."""

from __future__ import annotations

import pytest

from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.names import State
from gpuhealth.api.status import Record, StoredStatus
from gpuhealth.evaluation.startup import acts_before_pods, never_evaluated

IN = (DeviceRecord(0), DeviceRecord(1))
ONE_OUT = (DeviceRecord(0), DeviceRecord(1, state=DeviceState.QUARANTINED))


@pytest.mark.parametrize(
    ("prior", "devices", "node_out", "gpus_out", "commands", "acts"),
    [
        (Record(), IN, True, (), False, True),  # a healthy node now quarantined
        (Record(), IN, False, (1,), False, True),  # a healthy node's GPU now held out
        (Record(State.DEGRADED), (), True, (), False, True),  # degraded is still in service
        (Record(), IN, False, (), False, False),  # nothing new: wait for the pods
        (Record(State.QUARANTINED), IN, True, (), False, False),  # holds the node out already
        (Record(State.RECOVERING), IN, False, (0,), False, False),  # on probation: still out
        (Record(), ONE_OUT, False, (0,), False, False),  # a GPU held out already (maybe for a loop)
        (Record(), ONE_OUT, True, (), False, False),
        (Record(), IN, True, (), True, False),  # a release asked for: the pods' pass acknowledges it
    ],
)
def test_only_a_pass_that_takes_out_from_nothing_held_writes(
    prior: Record,
    devices: tuple[DeviceRecord, ...],
    node_out: bool,
    gpus_out: tuple[int, ...],
    commands: bool,
    acts: bool,
) -> None:
    assert acts_before_pods(prior, devices, node_out, gpus_out, commands) is acts


@pytest.mark.parametrize(
    ("prior", "devices", "commands", "acts"),
    [
        (Record(), IN, False, True),  # never evaluated, healthy: its first verdict is written now
        (Record(), IN, True, False),  # a release asked for still waits for the pods
        (Record(State.QUARANTINED), IN, False, False),  # (never_evaluated is False for it anyway)
        (Record(), ONE_OUT, False, False),
    ],
)
def test_a_first_verdict_is_written_before_the_pods(
    prior: Record, devices: tuple[DeviceRecord, ...], commands: bool, acts: bool
) -> None:
    assert acts_before_pods(prior, devices, False, (), commands, first=True) is acts


NODE = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.present": "true"}}, "spec": {}}


@pytest.mark.parametrize(
    ("status", "node", "rules", "never"),
    [
        ({}, NODE, 0, True),
        ({"state": "Healthy"}, NODE, 0, False),  # evaluated before
        ({}, NODE, 1, False),  # a DeviceTaintRule of its GPUs: a first verdict could delete it
        ({}, {**NODE, "spec": {"taints": [{"key": "gpuhealth.dev/unhealthy", "effect": "NoSchedule"}]}}, 0, False),
        ({}, {**NODE, "spec": {"taints": [{"key": "gpuhealth.dev/burn-in", "effect": "NoSchedule"}]}}, 0, False),
        ({}, {"metadata": {"name": "n1", "annotations": {"gpuhealth.dev/quarantine": "{}"}}, "spec": {}}, 0, False),
        # Someone else's taint and cordon are not gpuhealth's to lift, and a first verdict never does.
        (
            {},
            {**NODE, "spec": {"unschedulable": True, "taints": [{"key": "other/maint", "effect": "NoSchedule"}]}},
            0,
            True,
        ),
    ],
)
def test_never_evaluated_means_nothing_of_gpuhealths_is_on_the_node(
    status: dict[str, str], node: dict[str, object], rules: int, never: bool
) -> None:
    assert never_evaluated(StoredStatus.read(status), node, rules) is never
