"""What must hold of the repair ladder under chaos (pure).

The ladder_kills scenario SIGKILLs the operator at each step of GPU resets (the write-ahead record,
the Job created, the Job succeeded before the facts are clean, probation); these functions judge
what it saw:

- never two reset Jobs for one (GPU, attempt): the operator's successful Job creates in the audit
  log, and the Job objects left at the end, grouped by node, GPU index and attempt (the scenario
  faults each GPU once, so one episode per GPU);
- the ladder's position never goes backwards: in the sampled ``status.remediation`` of one
  episode (its ``since``) the step, attempt and phase only climb, the history only grows, and an
  episode is not started again while its GPU never returned to service;
- no reset Job is created while a pod holds the GPU: a pod seen holding the device by a LIST sent
  after the Job's create was received held it when the Job was created.

Spelled out here rather than imported from the operator (names, phases), so a broken product cannot
also bend the judgement of it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from devkit.timeparse import parse_time

JOB_PREFIX = "gpuhealth-reset-"
_TAIL = re.compile(r"-(\d+)-(\d+)-([0-9a-f]{8})$")
STEP_RANK = {"GPUReset": 0, "NodeReboot": 1, "Replace": 2}
# Within one attempt of a step: Ready -> Pending -> Running -> Verifying -> Succeeded; a NodeReboot is
# HandedOff where a reset runs; Replace's AwaitingRepair is the end.
PHASE_RANK = {
    "Ready": 0,
    "Pending": 1,
    "Running": 2,
    "HandedOff": 2,
    "Verifying": 3,
    "Succeeded": 4,
    "AwaitingRepair": 5,
}
BACK_IN_SERVICE = "InService"


def parse_job_name(name: str) -> tuple[str, int, int] | None:
    """``gpuhealth-reset-<node>-<index>-<attempt>-<hash>`` -> (node as the name holds it, index, attempt)."""
    m = _TAIL.search(name)
    if not name.startswith(JOB_PREFIX) or m is None:
        return None
    return name[len(JOB_PREFIX) : m.start()], int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class JobCreate:
    name: str
    at: dt.datetime | None  # requestReceivedTimestamp
    code: int


def job_creates(audit: Iterable[Mapping[str, Any]], namespace: str) -> list[JobCreate]:
    """The operator's Job creates in ``namespace`` (audit entries, Metadata level)."""
    out = []
    for e in audit:
        ref = e.get("objectRef") or {}
        if ref.get("resource") != "jobs" or e.get("verb") != "create" or ref.get("namespace") != namespace:
            continue
        code = int((e.get("responseStatus") or {}).get("code") or 0)
        out.append(JobCreate(str(ref.get("name") or ""), parse_time(e.get("requestReceivedTimestamp")), code))
    return out


def duplicate_reset_jobs(creates: Iterable[JobCreate], live: Iterable[Mapping[str, Any]] = ()) -> list[str]:
    """Two reset Jobs for one (node, GPU, attempt): two successful creates (of one name: it was deleted
    and made again; of two names: a second reset), or two such Job objects (``live``, as dicts)."""
    made: dict[tuple[str, int, int], list[str]] = {}
    out = []
    for c in creates:
        key = parse_job_name(c.name)
        if key is None or not 200 <= c.code < 300:
            continue
        made.setdefault(key, []).append(c.name)
    for (node, index, attempt), names in sorted(made.items()):
        if len(names) > 1:
            out.append(
                f"{len(names)} reset Jobs created for {node} GPU {index} attempt {attempt} (audit log): {sorted(names)}"
            )
    objs: dict[tuple[str, int, int], list[str]] = {}
    for j in live:
        meta = j.get("metadata") or {}
        key = parse_job_name(str(meta.get("name") or ""))
        if key is not None:
            objs.setdefault(key, []).append(f"{meta.get('name')} (uid {meta.get('uid')})")
    for (node, index, attempt), names in sorted(objs.items()):
        if len(names) > 1:
            out.append(f"{len(names)} reset Jobs exist for {node} GPU {index} attempt {attempt}: {sorted(names)}")
    return out


@dataclass(frozen=True)
class LadderSample:
    at: dt.datetime
    node: str
    index: int
    record: Mapping[str, Any] | None  # status.remediation["<index>"], None: no entry
    device_state: str  # the GPU's state in status.devices[] ("" if not listed)


def _position(rec: Mapping[str, Any]) -> tuple[int, int, int, int]:
    return (
        STEP_RANK.get(str(rec.get("step")), -1),
        int(rec.get("attempt") or 1),
        PHASE_RANK.get(str(rec.get("phase")), -1),
        len(rec.get("history") or []),
    )


def _say(rec: Mapping[str, Any]) -> str:
    return f"{rec.get('step')} attempt {rec.get('attempt')} {rec.get('phase')} ({len(rec.get('history') or [])} tried)"


def ladder_regressions(samples: Iterable[LadderSample]) -> list[str]:
    """The ladder's position went backwards within an episode, or the episode began again although
    its GPU never returned to service (samples in time order, per GPU)."""
    by_gpu: dict[tuple[str, int], list[LadderSample]] = {}
    for s in sorted(samples, key=lambda s: s.at):
        by_gpu.setdefault((s.node, s.index), []).append(s)
    out = []
    for (node, index), seq in sorted(by_gpu.items()):
        last: Mapping[str, Any] | None = None  # the last record of the running episode
        returned = True  # the GPU was seen back in service since that record
        for s in seq:
            if s.record is None:
                returned = returned or s.device_state == BACK_IN_SERVICE
                continue
            rec = s.record
            if last is not None and rec.get("since") != last.get("since"):
                if not returned:
                    out.append(
                        f"{node} GPU {index}: its ladder began again at {_say(rec)} (since {rec.get('since')}) at "
                        f"{s.at:%H:%M:%S.%f}, after {_say(last)} (since {last.get('since')}), never back in service"
                    )
                last = None
            if last is not None and _position(rec) < _position(last):
                out.append(
                    f"{node} GPU {index}: its ladder went back from {_say(last)} to {_say(rec)} at {s.at:%H:%M:%S.%f}"
                )
            last, returned = rec, s.device_state == BACK_IN_SERVICE
    return out


@dataclass(frozen=True)
class Holding:
    at: dt.datetime  # when the LIST that saw it was sent
    node: str
    index: int  # the GPU the pod's claim was allocated
    pod: str


def resets_while_held(creates: Iterable[JobCreate], holds: Iterable[Holding]) -> list[str]:
    """A reset Job created (successfully) while a pod still held its GPU: a LIST sent at or after the
    create was received still saw a pod holding that device."""
    by_gpu: dict[tuple[str, int], list[Holding]] = {}
    for h in holds:
        by_gpu.setdefault((h.node, h.index), []).append(h)
    out = []
    for c in creates:
        key = parse_job_name(c.name)
        if key is None or c.at is None or not 200 <= c.code < 300:
            continue
        node, index, attempt = key
        later = [h for h in by_gpu.get((node, index), []) if h.at >= c.at]
        if later:
            first = min(later, key=lambda h: h.at)
            out.append(
                f"reset Job {c.name} ({node} GPU {index} attempt {attempt}) created at {c.at:%H:%M:%S.%f} while pod "
                f"{first.pod} held the GPU (seen at {first.at:%H:%M:%S.%f})"
            )
    return out
