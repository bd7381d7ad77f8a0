"""What a pass may write before the start-up pod list is in (``evaluation/startup.py``): it takes out
what holds nothing out yet, and never writes where a missing restart-loop finding could release."""

from __future__ import annotations

import pytest

from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.names import State
from gpuhealth.api.status import Record
from gpuhealth.evaluation.startup import acts_before_pods

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
