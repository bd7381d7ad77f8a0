"""One pass over one node, as one typed value: what the node reconciler reads and parses once, at the
start of the pass, and hands to each room (``device_reconciler``, ``node_validator``, ``drainer``,
``device_drainer``, ``remediator``) instead of the raw status and a long list of arguments.

The persisted part (``api/status.py`` ``StoredStatus``: the node's record, the GPUs' records, the
drains, the repair ladders, the node's validation) is the status as it was when the pass began. Each
part of it is written by one room only (``status.drain`` by the drainer, ``status.deviceDrains`` by
the device drainer, ``status.remediation`` and ``status.repairs`` by the remediator,
``status.nodeValidation`` by the node validator, the rest by the node reconciler's write), and one
worker passes a node at a time, so what a room reads here is what it last wrote.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.policy import Policy
from gpuhealth.api.remediation import Approvals
from gpuhealth.api.report import Report
from gpuhealth.api.status import Record, StoredStatus
from gpuhealth.evaluation.findings import Assessment


@dataclass(frozen=True)
class NodePass:
    """A node's pass: its inputs (policy, clock, facts, the humans' annotations) and its persisted state."""

    name: str
    policy: Policy
    now: dt.datetime
    node: Mapping[str, Any]  # the Node as cached
    report: Report | None  # the agent's facts (None: no report yet, or an unusable one)
    stored: StoredStatus  # the GPUNodeHealth status as the pass found it
    prior: Record  # the node's record: the store's, else the status's
    assessment: Assessment  # the node's findings (before the GPUs' verdicts take theirs out)
    released: bool = False  # the node's release annotation, acted on (Enforce)
    gpus: frozenset[int] = frozenset()  # the GPUs the release-gpu annotation names (Enforce)
    cleared: dt.datetime | None = None  # evidence up to here is acknowledged (a release)
    approvals: Approvals = field(default_factory=Approvals)  # a human's approve or reject of a repair step (Enforce)
