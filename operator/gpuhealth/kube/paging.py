"""List in pages (``limit`` and ``continue``), never in one response held whole in memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

PAGE = 500
# A ResourceSlice of a MIG node holds 56 devices of about a kilobyte each: 500 of them were one page
# of tens of MB, parsed whole before the first was slimmed (the MIG fleet's peak RSS in `make bench`).
SLICE_PAGE = 25


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


def page_args(cont: str | None, limit: int = PAGE) -> dict[str, Any]:
    """A list request's paging arguments (unparsed response: the caller decodes plain dicts)."""
    kw: dict[str, Any] = {"limit": limit, "_preload_content": False}
    if cont:
        kw["_continue"] = cont
    return kw


def list_rv(
    fetch: Callable[[str | None], Mapping[str, Any]], transform: Callable[[dict[str, Any]], Any]
) -> tuple[list[Any], str]:
    """Every item of a paged list through ``transform`` (a slimmer cuts each before the next page is
    read), and the resourceVersion of the list to watch from."""
    items: list[Any] = []
    rv = ""
    for page in pages(fetch):
        items.extend(transform(o) for o in page.get("items") or [])
        rv = str((page.get("metadata") or {}).get("resourceVersion") or "")
    return items, rv
