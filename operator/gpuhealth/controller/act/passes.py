"""One pass over one node, as one typed value: what the node reconciler reads and parses at the start
of the pass, and hands to each room (``device_reconciler``, ``node_validator``, ``drainer``,
``device_drainer``, ``remediator``) instead of the raw status and a long list of arguments.

The persisted part (``api/status.py`` ``StoredStatus``: the node's record, the GPUs' records, the
drains, the repair ladders, the node's validation) comes two ways. ``found`` is the status as the
pass began: what the state machine decides from and the node's status write is diffed against.
``stored`` is the status as the store holds it at the moment it is read, parsed once per version: a
room that runs after other writes of the same pass (the node's status write holds the GPUs' records
and a validation's verdict; the drainer's record comes before the remediator reads it) resumes from
what those writes left, never from the pass's first read. Reading ``found`` there was the first try
at this type: a GPU's reset Job created twice, an approval lost (fresh-clone test at f1befd1).
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
from gpuhealth.controller.state.store import Store
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
    store: Store  # where ``stored`` reads the status as it is now
    prior: Record  # the node's record: the store's, else the status's
    assessment: Assessment  # the node's findings (before the GPUs' verdicts take theirs out)
    released: bool = False  # the node's release annotation, acted on (Enforce)
    gpus: frozenset[int] = frozenset()  # the GPUs the release-gpu annotation names (Enforce)
    cleared: dt.datetime | None = None  # evidence up to here is acknowledged (a release)
    approvals: Approvals = field(default_factory=Approvals)  # a human's approve or reject of a repair step (Enforce)

    @property
    def stored(self) -> StoredStatus:
        """The node's status as the store holds it now (after this pass's writes): the store's one parse
        of that version, ``found`` itself until the pass writes."""
        return self.store.status(self.name)
