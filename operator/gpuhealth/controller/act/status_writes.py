"""The one status write outside a pass's decision patch (issue #51).

A pass writes the node's GPUNodeHealth status once, in the node reconciler's decision patch
(``node_reconciler.py`` ``_persist``), and other rooms hand it their keys to write there (``fold``:
``node_validator.py``, ``device_drainer.py``, ``drainer.py``). Everything a room must write after
the Node write (protection first) goes through :func:`record`, so ``patch_report_status`` has
exactly two callers in the operator: ``_persist`` and this. What comes here, and why it cannot wait
for the decision patch:

- write-ahead records, each written before the effect it names, so a restart finds it: a repair
  step's or a validation's Job name before the Job is created (``remediator.py``,
  ``node_validator.py``; ``step_jobs.py``), a ladder move that deletes a Job, the device plugin's pod
  (name and uid) before it is deleted, a drain's start before its first request (``drainer.py``,
  ``device_drainer.py``);
- what an effect left: ``Running`` once a reset Job is created, ``created: true`` once a validation
  Job is, ``deleted: true`` (or ``blocked``) once the plugin's pod is, a drain's progress once its
  requests went out;
- a ladder's move that has no effect (``remediator.py``): the remediator decides after the Node
  write, with API reads of its own, so its record cannot join the decision patch of the same pass.

Each write is a merge patch of ``status`` keys (no resourceVersion: the keys are the room's own), and
its answer is cached at once (``Store.wrote``), so the rest of the pass reads what it left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuhealth.controller.state.store import Store
from gpuhealth.kube.aio import AsyncKube


async def record(kube: AsyncKube, store: Store, name: str, status: Mapping[str, Any]) -> None:
    """Merge ``status`` (keys of GPUNodeHealth ``status``, merge-patch values) into node ``name``'s
    status, and cache the answer."""
    store.wrote(name, await kube.patch_report_status(name, {"status": dict(status)}))
