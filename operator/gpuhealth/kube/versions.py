"""Ordering two copies of one object by resourceVersion.

resourceVersions are opaque to clients, but etcd's (the only store the API server has) are increasing
integers. The operator compares them in one case: a write's answer reaches the task that wrote only
after the event loop has run what was queued before it, and the watch's newer copy of the same object
can be among that. Caching the answer over it would hide the newer facts (an agent's new XID, an SRE's
release, Kueue's admission) until the object changed again. A form that is not an integer is not
ordered: ``newer`` says yes and ``older`` says no, so the copy in hand is used.
"""

from __future__ import annotations


def newer(rv: object, than: str | None) -> bool:
    """Whether ``rv`` is newer than ``than`` (``None``: nothing to compare with, so yes)."""
    if than is None:
        return True
    try:
        return int(str(rv)) > int(than)
    except ValueError:
        return True


def older(rv: object, than: object) -> bool:
    """Whether ``rv`` is known to be older than ``than``."""
    try:
        return int(str(rv)) < int(str(than))
    except ValueError:
        return False
