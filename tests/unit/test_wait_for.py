"""devkit/k8s.py wait_for polls through a briefly absent API, never through a bug."""

from __future__ import annotations

import time

import pytest
from kubernetes.client.exceptions import ApiException

from devkit.k8s import wait_for


def test_a_bug_in_the_predicate_is_raised_at_once_not_waited_out() -> None:
    status: dict[str, str] = {}
    start = time.monotonic()
    with pytest.raises(KeyError, match="state"):
        wait_for(lambda: status["state"], timeout=5, interval=0.01)
    assert time.monotonic() - start < 1


def test_an_api_error_is_polled_through_until_the_condition_holds() -> None:
    errors: list[BaseException] = [ApiException(status=503), ConnectionRefusedError()]

    def poll() -> str:
        if errors:
            raise errors.pop(0)
        return "ready"

    assert wait_for(poll, timeout=5, interval=0.01) == "ready"


def test_a_timeout_names_what_it_waited_for_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the node.*ApiException"):
        wait_for(lambda: (_ for _ in ()).throw(ApiException(status=404)), timeout=0.05, interval=0.01, what="the node")


def test_holds_fails_the_moment_the_condition_breaks_and_counts_its_samples() -> None:
    from devkit.k8s import holds

    assert holds(lambda: True, seconds=0.1, interval=0.01) >= 5
    states = iter(["Unknown", "Unknown", "Healthy"])
    with pytest.raises(AssertionError, match="stopped holding after 2 samples"):
        holds(lambda: next(states) == "Unknown", seconds=5, interval=0.01)


def test_a_refusal_is_a_403_or_forbidden_in_a_message_never_a_timestamp() -> None:
    from devkit.k8s import refusals

    log = "\n".join(
        [
            "2026-12-01 22:09:29,403 INFO gpuhealth.controller.process.leadership: paused: not acting until resumed",
            "2026-12-01 22:09:30,001 WARNING gpuhealth.controller.process.runtime: reconcile of n1 failed (403)",
            "2026-12-01 22:09:31,002 ERROR kopf: patching failed: forbidden",
            "2026-12-01 22:09:32,403 INFO x: 4031 objects",
        ]
    )
    assert refusals(log) == log.splitlines()[1:3]
