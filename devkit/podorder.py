"""Eviction and checkpoint-request order, from the API server's audit log (pure).

A pod whose checkpoint mode needs a request (``gpuhealth.dev/checkpoint: annotation``) must be asked
to checkpoint before it is evicted, and no pod may be asked or evicted more than once. Pods of a
drain are gone once evicted, so per pod is per drain. The audit log says what the operator really
sent and in which order (``requestReceivedTimestamp``, the API server's clock); the workload's own
record of when it first saw the request is a second witness, for the rare audit line a SIGKILLed
API server never wrote.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from devkit.timeparse import parse_time


@dataclass(frozen=True)
class PodWrite:
    pod: str  # namespace/name
    kind: str  # "request" or "evict"
    at: dt.datetime


def pod_writes(entries: Iterable[Mapping[str, Any]], namespaces: Iterable[str]) -> list[PodWrite]:
    """The operator's successful checkpoint requests (pod patches: the operator patches pods only to
    set ``gpuhealth.dev/checkpoint-requested``) and evictions in ``namespaces``, oldest first."""
    wanted = set(namespaces)
    out = []
    for e in entries:
        ref = e.get("objectRef") or {}
        if ref.get("resource") != "pods" or ref.get("namespace") not in wanted:
            continue
        if int((e.get("responseStatus") or {}).get("code") or 0) >= 300:
            continue
        at = parse_time(e.get("requestReceivedTimestamp"))
        if at is None:
            continue
        key = f"{ref.get('namespace')}/{ref.get('name')}"
        if e.get("verb") == "create" and ref.get("subresource") == "eviction":
            out.append(PodWrite(key, "evict", at))
        elif e.get("verb") == "patch" and not ref.get("subresource"):
            out.append(PodWrite(key, "request", at))
    return sorted(out, key=lambda w: w.at)


def order_problems(
    writes: Iterable[PodWrite],
    needs_request: Callable[[str], bool],
    workload_saw: Mapping[str, dt.datetime] | None = None,
) -> list[str]:
    """Every pod evicted at most once, asked at most once, and (if its mode needs it) asked before
    its eviction: by an audited request, or by the workload having seen the request earlier."""
    saw = workload_saw or {}
    requests: dict[str, list[dt.datetime]] = {}
    evictions: dict[str, list[dt.datetime]] = {}
    for w in writes:
        (requests if w.kind == "request" else evictions).setdefault(w.pod, []).append(w.at)
    out = []
    for pod, ts in sorted(requests.items()):
        if len(ts) > 1:
            out.append(f"pod {pod}: asked to checkpoint {len(ts)} times (at most 1 per drain): {_fmt(ts)}")
    for pod, ts in sorted(evictions.items()):
        if len(ts) > 1:
            out.append(f"pod {pod}: evicted {len(ts)} times (at most 1 per drain): {_fmt(ts)}")
        if not needs_request(pod):
            continue
        evicted = min(ts)
        asked = [t for t in requests.get(pod, []) if t < evicted]
        seen = saw.get(pod)
        if asked or (seen is not None and seen < evicted):
            continue
        later = requests.get(pod)
        out.append(
            f"pod {pod}: evicted at {evicted:%H:%M:%S.%f} without being asked to checkpoint first"
            + (f" (asked only at {_fmt(later)})" if later else " (never asked)")
        )
    return out


def _fmt(ts: Iterable[dt.datetime]) -> str:
    return ", ".join(f"{t:%H:%M:%S.%f}" for t in ts)
