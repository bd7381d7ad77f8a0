"""An Event retried after a lost response is not posted twice (its name comes from the Event itself)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuhealth.kube.client import Kube

AT = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


class LossyEvents:
    """Stores Events by name like the API server; the first response is lost after the write landed."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.calls = 0

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.calls += 1
        name = body["metadata"]["name"]
        if name in self.stored:
            raise ApiException(status=409, reason="AlreadyExists")
        self.stored[name] = body
        if self.calls == 1:
            raise ApiException(status=0, reason="read timed out")


@pytest.fixture
def kube() -> Kube:
    k = Kube(client.ApiClient())
    k.core = LossyEvents()
    return k


def test_a_retry_after_a_lost_response_posts_nothing_new(kube: Kube) -> None:
    args = ("Node", "n1", "n1", "Normal", "EvictedCrashLooping", "Evicted ns/p")
    with pytest.raises(ApiException):
        kube.post_event(*args, at=AT)
    kube.post_event(*args, at=AT)  # the retry: 409 means it is already there
    assert len(kube.core.stored) == 1


def test_distinct_events_get_distinct_names(kube: Kube) -> None:
    kube.core.calls = 1  # no lost response here
    kube.post_event("Node", "n1", "n1", "Normal", "EvictedCrashLooping", "Evicted ns/a", at=AT)
    kube.post_event("Node", "n1", "n1", "Normal", "EvictedCrashLooping", "Evicted ns/b", at=AT)
    kube.post_event("Node", "n1", "n1", "Normal", "EvictedCrashLooping", "Evicted ns/a", at=AT + dt.timedelta(1))
    assert len(kube.core.stored) == 3
