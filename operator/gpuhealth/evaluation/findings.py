"""What an evaluation finds: findings (a signal on a GPU or the node, with its action and scope) and
the assessment that lists them. Types only, shared by ``assess`` and ``scope``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuhealth.api.names import Action, Scope, Signal


@dataclass(frozen=True)
class Instance:
    """The MIG instance a finding is confined to: NVML's GPU / compute instance IDs of the XIDs, and
    the MIG device the agent lists for them (its UUID and profile; empty when the agent lists none)."""

    gpu_instance: int
    compute_instance: int | None = None
    uuid: str = ""
    profile: str = ""

    def words(self) -> str:
        """``MIG device GI 1 CI 0 (3g.40gb, MIG-...)``: how details and Events name it."""
        ids = f"GI {self.gpu_instance}" + (f" CI {self.compute_instance}" if self.compute_instance is not None else "")
        extra = ", ".join(x for x in (self.profile, self.uuid) if x)
        return f"MIG device {ids}" + (f" ({extra})" if extra else "")


@dataclass(frozen=True)
class Finding:
    signal: Signal
    action: Action
    detail: str
    gpu: int | None = None
    uuid: str = ""
    code: int | None = None
    since: dt.datetime | None = None
    scope: Scope = Scope.NODE  # set under the policy by evaluation.scope; Node until then
    # Set when the finding is confined to one MIG instance of ``gpu`` (application XIDs repeated on
    # that instance); None: the whole GPU (or the node). Placement may widen it to the GPU.
    instance: Instance | None = None

    @property
    def key(self) -> str:
        key = f"{self.signal}/{'' if self.gpu is None else self.gpu}/{'' if self.code is None else self.code}"
        if self.instance is not None:
            ci = self.instance.compute_instance
            key += f"/{self.instance.gpu_instance}/{'' if ci is None else ci}"
        return key

    @property
    def reason(self) -> str:
        """Short machine reason: taint value and condition reason (a valid label value)."""
        return f"XID{self.code}" if self.signal == Signal.XID else str(self.signal)

    def describe(self) -> str:
        where = f"GPU {self.gpu}" + (f" ({self.uuid})" if self.uuid else "") if self.gpu is not None else "node"
        return f"{where}: {self.detail}"


@dataclass(frozen=True)
class Assessment:
    findings: tuple[Finding, ...] = ()
    unknown: bool = False
    unknown_reason: str = ""
    unknown_signal: Signal = Signal.AGENT_SILENT
    pending: Mapping[str, str] = field(default_factory=dict)
    total_gpus: int = 0
    healthy_gpus: int = 0
    last_xid: str = ""

    @property
    def level(self) -> Action:
        return max((f.action for f in self.findings), key=lambda a: a.severity, default=Action.IGNORE)

    @property
    def top(self) -> Finding | None:
        """The most severe finding; among equals the NVLink domain's (the decision every member of the
        domain shares, and the reason each of them leaves and returns for: ``domains.py``), then the
        earliest, so the reason is stable."""
        if not self.findings:
            return None
        epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
        return min(self.findings, key=lambda f: (-f.action.severity, f.scope != Scope.DOMAIN, f.since or epoch, f.key))

    def actionable(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.action != Action.IGNORE)
