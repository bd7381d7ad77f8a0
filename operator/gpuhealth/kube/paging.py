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


def list_all(
    fetch: Callable[[str | None], Mapping[str, Any]],
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every item of a paged list, each through ``transform`` (a slimmer) while only its page is
    held: the full bodies of a 10,000-node fleet are never all in memory at once."""
    if transform is None:
        return [item for page in pages(fetch) for item in page.get("items") or []]
    return [transform(item) for page in pages(fetch) for item in page.get("items") or []]
