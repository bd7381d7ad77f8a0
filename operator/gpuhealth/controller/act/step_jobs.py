"""The Jobs a repair step or a validation runs as, reached only by the name their record holds.

The remediator (a GPU's reset and validation) and the node validator (a node's validation and
burn-in) write the Job's name into ``status`` before the Job exists, so a restarted operator finds
it by that name: read (a Job gone is an outcome too), created (409: a run before the restart created
it, which is success), or deleted (gone already is fine). Jobs are read by name on each pass, not
watched: a handful run at once, and a pass polls the one it waits on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuhealth.actions import validation_jobs
from gpuhealth.actions.remediation_jobs import job_outcome
from gpuhealth.api.validation import Outcome
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.client import is_not_found, status_of

log = logging.getLogger(__name__)


class StepJobs:
    def __init__(self, kube: AsyncKube) -> None:
        self.kube = kube

    async def outcome(self, job: str) -> str:
        """A reset Job's outcome (``namespace/name``; absent is an outcome of its own)."""
        ns, _, jname = job.partition("/")
        try:
            return job_outcome(await self.kube.get_job(ns, jname))
        except Exception as e:
            if is_not_found(e):
                return job_outcome(None)
            raise

    async def validation_verdict(self, node: str, job: str) -> tuple[Outcome, str]:
        """A validation Job's verdict, a GPU's or a whole node's: the Job by name, its pod among the
        node's (it is pinned there)."""
        ns, _, jname = job.partition("/")
        try:
            body: dict[str, Any] | None = await self.kube.get_job(ns, jname)
        except Exception as e:
            if not is_not_found(e):
                raise
            body = None
        pods = await self.kube.list_pods_on_node(node) if body is not None else []
        return validation_jobs.verdict(body, validation_jobs.pods_of(job, pods))

    async def create(self, body: Mapping[str, Any], block: Callable[[str], None]) -> None:
        """Create a Job under the name its record holds: a 409 is the Job a run before a restart
        created; any other error is said through ``block`` (the room's RemediationBlocked Event) and
        raised, and the next pass tries again."""
        ns, jname = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            await self.kube.create_job(ns, body)
        except Exception as e:
            if status_of(e) == 409:
                log.info("Job %s/%s exists already (created before a restart)", ns, jname)
                return
            block(f"the Job {jname} could not be created in {ns}: {status_of(e) or e}")
            raise

    async def delete(self, job: str) -> None:
        """Delete a Job (``namespace/name``); gone already is fine."""
        ns, _, jname = job.partition("/")
        try:
            await self.kube.delete_job(ns, jname)
        except Exception as e:
            if not is_not_found(e):
                raise
