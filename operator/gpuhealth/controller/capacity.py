"""GPUs held out of service, per policy and state: the gauge behind the dashboard's capacity panel.

The sweep that writes policy statuses calls :func:`export_gpus_out_of_service` once per pass; the
count itself is a pure function of the cached Nodes, their records and the governing policy, so a
restarted operator exports the same numbers as soon as its caches are full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from gpuhealth.api.names import OUT_OF_SERVICE, State
from gpuhealth.api.nodes import node_gpus
from gpuhealth.controller import metrics


class _HasState(Protocol):
    @property
    def state(self) -> State: ...


class _Named(Protocol):
    @property
    def name(self) -> str: ...


def gpus_out_of_service(
    policies: Iterable[str],
    nodes: Mapping[str, Mapping[str, Any]],
    records: Mapping[str, _HasState],
    governing: Callable[[str], tuple[_Named | None, Any]],
) -> dict[tuple[str, str], int]:
    """(policy, state) -> GPUs on that policy's nodes in that out-of-service state, zeros included.

    A node counts with its ``nvidia.com/gpu.count`` label, else its ``nvidia.com/gpu`` capacity;
    a node that states neither counts as zero GPUs rather than as a guess.
    """
    counts = {(p, str(s)): 0 for p in policies for s in OUT_OF_SERVICE}
    for name, node in nodes.items():
        rec = records.get(name)
        if rec is None or rec.state not in OUT_OF_SERVICE:
            continue
        winner, _ = governing(name)
        if winner is None:
            continue
        key = (winner.name, str(rec.state))
        counts[key] = counts.get(key, 0) + (node_gpus(node) or 0)
    return counts


def export_gpus_out_of_service(
    policies: Iterable[str],
    nodes: Mapping[str, Mapping[str, Any]],
    records: Mapping[str, _HasState],
    governing: Callable[[str], tuple[_Named | None, Any]],
) -> None:
    """Set ``gpuhealth_gpus_out_of_service{policy,state}`` from the current caches."""
    export_counts(gpus_out_of_service(policies, nodes, records, governing))


def export_counts(counts: Mapping[tuple[str, str], int]) -> None:
    """Set ``gpuhealth_gpus_out_of_service{policy,state}`` from (policy, state) -> GPUs, as
    :func:`gpus_out_of_service` counts them (the operator keeps the same count per policy as it goes)."""
    for (policy, state), gpus in counts.items():
        metrics.GPUS_OUT_OF_SERVICE.labels(policy, state).set(gpus)
