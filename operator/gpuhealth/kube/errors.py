"""One taxonomy of API failures, for the operator, the agent and the plugin.

``retryable``: worth trying again unchanged later, because the API throttled (429), failed (5xx)
or could not be reached at all. A conflict (409) is not retryable as such: the caller re-reads and
decides again; a not-found (404) is an answer.
"""

from __future__ import annotations

import urllib3


def status_of(e: BaseException) -> int:
    """The HTTP status an API error carries; 0 when there was no HTTP answer."""
    status = getattr(e, "status", 0)
    return status if isinstance(status, int) else 0


def is_conflict(e: BaseException) -> bool:
    return status_of(e) == 409


def is_not_found(e: BaseException) -> bool:
    return status_of(e) == 404


def retryable(e: BaseException) -> bool:
    """Throttled, a server error, or no answer (the network, a timeout, an API server away)."""
    code = status_of(e)
    if code:
        return code == 429 or code >= 500
    return isinstance(e, urllib3.exceptions.HTTPError | OSError)
