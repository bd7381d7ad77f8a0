"""One pass over one node, as one typed value: what the node reconciler reads and parses at the start
of the pass, and hands to each room (``device_reconciler``, ``node_validator``, ``drainer``,
``device_drainer``, ``remediator``) instead of the raw status and a long list of arguments.

The persisted part (``api/status.py`` ``StoredStatus``: the node's record, the GPUs' records, the
drains, the repair ladders, the node's validation) is held once, ``found``: the status as the pass
began, what the state machine decides from and the node's status write is diffed against. A pass
writes the status once (the node reconciler's decision patch, with the keys the rooms ``fold`` into
it); the records a room writes after the Node write (``status_writes.py``) are its own keys, which
it keeps as it writes them (the remediator: each GPU's ladder as the pass left it, so a second GPU
waits for the first one's reset; the drainers: their records less what their ``fold`` dropped). A
second view (``stored``, the store's copy re-read after each write) once stood for that: the first
typed pass gave the remediator only the status as the pass began, and a GPU's reset Job was created
twice (fresh-clone test at f1befd1); ``tests/unit/controller/act/test_status_writes.py`` holds that
case.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.policy import Policy
from gpuhealth.api.remediation_status import Approvals
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
    found: StoredStatus  # the GPUNodeHealth status as the pass found it (the store's, ``Store.status``)
    prior: Record  # the node's record: the store's, else the status's
    assessment: Assessment  # the node's findings (before the GPUs' verdicts take theirs out)
    released: bool = False  # the node's release annotation, acted on (Enforce)
    gpus: frozenset[int] = frozenset()  # the GPUs the release-gpu annotation names (Enforce)
    cleared: dt.datetime | None = None  # evidence up to here is acknowledged (a release)
    approvals: Approvals = field(default_factory=Approvals)  # a human's approve or reject of a repair step (Enforce)
