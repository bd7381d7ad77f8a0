"""What each GPU's NVLinks are held to: the one expectation the operator judges ``NVLinkDegraded`` by
(``evaluation/fabric_rules.py``) and ``kubectl gpuhealth describe`` shows as "active/expected"
(``cli/fabricview.py``). Both read the report through ``parse_report`` and call :func:`expected_nvlinks`,
so what describe shows is what the verdict judged. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuhealth.api.report import Report


@dataclass(frozen=True)
class LinkExpectation:
    """One GPU's NVLinks: ``links`` the count it should have active, ``in_use`` whether the node uses
    NVLink for its model (some GPU of the model has an active link)."""

    links: int
    in_use: bool

    def missing(self, active: int | None) -> int:
        """How many of the expected links are not active (0 where the node does not use NVLink, or the
        active count is unknown): what ``NVLinkDegraded`` holds the GPU out for."""
        return 0 if active is None or not self.in_use else max(0, self.links - active)


def expected_nvlinks(report: Report) -> Mapping[int, LinkExpectation]:
    """By GPU index, for each GPU that reports its NVLink count: the links it is held to, the most a GPU of
    its model on the node has (its own count or more).

    The most, not the most common: a link that vanished from a GPU's own count is still missed, so with
    5 GPUs of a model at 12 links and 3 at 18 the twelve-link GPUs are the degraded ones. ``in_use``
    says whether the node uses NVLink at all: a PCIe card without a bridge, or a GPU whose NVLinks are
    off by design, reports links that exist and none active, which is how it is built, not a degraded
    link; only where some GPU of the model has an active link is one missed."""
    most: dict[str, tuple[int, int]] = {}
    for d in report.devices:
        if d.nvlink is not None and d.nvlink.links is not None:
            links, active = most.get(d.model, (0, 0))
            most[d.model] = (max(links, d.nvlink.links), max(active, d.nvlink.active or 0))
    return {
        d.index: LinkExpectation(most[d.model][0], most[d.model][1] > 0)
        for d in report.devices
        if d.nvlink is not None and d.nvlink.links is not None
    }
