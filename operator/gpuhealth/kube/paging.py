"""List in pages (``limit`` and ``continue``), never in one response held whole in memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

PAGE = 500


def pages(fetch: Callable[[str | None], Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Each page of a list; ``fetch(continue_token)`` requests one (``None`` for the first)."""
    cont: str | None = None
    while True:
        page = fetch(cont)
        yield page
        cont = (page.get("metadata") or {}).get("continue")
        if not cont:
            return


def list_all(fetch: Callable[[str | None], Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every item of a paged list."""
    return [item for page in pages(fetch) for item in page.get("items") or []]
