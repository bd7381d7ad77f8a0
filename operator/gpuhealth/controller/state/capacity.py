"""GPUs held out of service, per policy and state: the gauges behind the dashboard's capacity panel.

The policy-status pass calls :func:`export_counts` with each policy's counts as the store's tallies
keep them (``controller/state/tally.py``: updated as nodes and records change, so exporting never walks
the fleet), zeros included, so the panel has a series for every state as soon as a policy exists;
and :func:`export_devices` with the same tallies' GPUs by their own state and peer holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuhealth.controller import metrics
from gpuhealth.controller.state.tally import Tally


def export_counts(counts: Mapping[tuple[str, str], int]) -> None:
    """Set ``gpuhealth_gpus_out_of_service{policy,state}`` from (policy, state) -> GPUs."""
    for (policy, state), gpus in counts.items():
        metrics.GPUS_OUT_OF_SERVICE.labels(policy, state).set(gpus)


def export_slow(policy: str, nodes: int, gpus: int, broken: int = 0) -> None:
    """Degraded capacity apart from broken: ``gpuhealth_slow_nodes`` / ``gpuhealth_slow_gpus{policy}``,
    the nodes (and their GPUs) held out for a slow, not broken, signal (api/names.py SLOW_SIGNALS);
    they are also in ``gpuhealth_gpus_out_of_service``, which counts every GPU held out. ``broken``: the
    GPUs held out for anything else (``gpuhealth_broken_gpus``)."""
    metrics.SLOW_NODES.labels(policy).set(nodes)
    metrics.SLOW_GPUS.labels(policy).set(gpus)
    metrics.BROKEN_GPUS.labels(policy).set(broken)


def export_devices(tallies: Mapping[str, Tally]) -> None:
    """``gpuhealth_devices{policy,state}`` (the GPUs with a record, by their own state) and
    ``gpuhealth_peer_holds{policy}`` (at zero when no peer is held) from each policy's tally; a policy
    gone, or a state no GPU is in any more, loses its series."""
    metrics.DEVICES.clear()
    metrics.PEER_HOLDS.clear()
    for policy, tally in tallies.items():
        for state, n in tally.devices.items():
            metrics.DEVICES.labels(policy, state).set(n)
        metrics.PEER_HOLDS.labels(policy).set(tally.peer_holds)
