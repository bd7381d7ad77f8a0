"""GPUs held out of service, per policy and state: the gauge behind the dashboard's capacity panel.

The policy-status pass calls :func:`export_counts` with each policy's counts as the store's tallies
keep them (``controller/state/tally.py``: updated as nodes and records change, so exporting never walks
the fleet), zeros included, so the panel has a series for every state as soon as a policy exists.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuhealth.controller import metrics


def export_counts(counts: Mapping[tuple[str, str], int]) -> None:
    """Set ``gpuhealth_gpus_out_of_service{policy,state}`` from (policy, state) -> GPUs."""
    for (policy, state), gpus in counts.items():
        metrics.GPUS_OUT_OF_SERVICE.labels(policy, state).set(gpus)
