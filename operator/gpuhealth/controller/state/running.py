"""What runs across the fleet: repair steps, validations and burn-ins, read off each cached report's
status (``api/status.py`` ``Running``, from the store's typed status) once per resourceVersion of the report.

The Job admission (``job_slots.py``, the remediator's and the node validator's) counts them against a
policy's limits on every admission (``spec.remediation.maxConcurrent``, ``spec.validation.maxConcurrent``,
``newNodes.batchSize``);
between two admissions most reports have not changed, and are not parsed again. A report without a
resourceVersion (never one the API server gave) is parsed every time.
"""

from __future__ import annotations

from gpuhealth.api.status import Running
from gpuhealth.controller.state.store import Store


class RunningIndex:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._cache: dict[str, tuple[str, Running]] = {}  # node -> (its report's resourceVersion, what runs)
        self.parsed = 0  # statuses parsed so far (what the cache saves shows in tests)

    def under(self, policy: str) -> list[Running]:
        """What each report governed by ``policy`` (as its status names it) says runs now."""
        reports = self.store.reports
        out = []
        for name, report in reports.items():
            rv = str((report.get("metadata") or {}).get("resourceVersion") or "")
            hit = self._cache.get(name)
            if hit is None or not rv or hit[0] != rv:
                self.parsed += 1
                hit = (rv, Running.of(self.store.status(name)))
                if rv:
                    self._cache[name] = hit
            if hit[1].policy == policy:
                out.append(hit[1])
        if len(self._cache) > len(reports):  # reports deleted since: their entries go
            self._cache = {k: v for k, v in self._cache.items() if k in reports}
        return out
