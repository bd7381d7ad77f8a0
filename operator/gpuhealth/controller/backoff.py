"""Growing retry delays, one formula for every retry loop in the controller."""

from __future__ import annotations


def growing_delay(failures: int, base: float, cap: float) -> float:
    """``base`` after the first failure, doubling with each further one, never above ``cap``."""
    return min(cap, base * 2.0 ** (max(1, failures) - 1))
