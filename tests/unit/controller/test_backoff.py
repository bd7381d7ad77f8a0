"""The controller's one retry-delay formula."""

from __future__ import annotations

from gpuhealth.controller.backoff import growing_delay


def test_doubles_from_base_and_stops_at_cap() -> None:
    assert [growing_delay(n, 0.5, 5.0) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert [growing_delay(n, 2.0, 60.0) for n in (1, 2, 5, 6)] == [2.0, 4.0, 32.0, 60.0]
