"""Marked blocks in Markdown documents, rendered from filed result files.

The bench (hack/bench/docs.py, hack/bench/scaling_docs.py) and chaos (hack/chaos/docs.py) figures
in README.md and docs/ sit between an HTML comment that opens a block and one that closes it; each
tool renders its blocks from the committed result files and these helpers put them in place, or
tell which documents are stale (each tool has a unit test that fails on a stale block).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def rewrite(text: str, block: str) -> str:
    """Replace the block that starts and ends like ``block`` (its first and last lines)."""
    first, last = block.split("\n", 1)[0], block.rsplit("\n", 1)[-1]
    pattern = re.compile(re.escape(first) + r".*?" + re.escape(last), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {first} ... {last} block")
    return pattern.sub(lambda _: block, text, count=1)


def stale_docs(rendered: dict[Path, list[str]]) -> list[Path]:
    """The documents whose blocks differ from their rendering (or with nothing filed to render)."""
    out = []
    for doc, doc_blocks in rendered.items():
        text = doc.read_text(encoding="utf-8")
        new = text
        for block in doc_blocks:
            new = rewrite(new, block) if block else ""
        if new != text:
            out.append(doc)
    return out


def check(bad: list[Path], tool: str) -> int:
    """``--check``: name each stale document and the command that re-renders it; 1 if any."""
    for d in bad:
        print(f"{d} is stale: run python -m {tool}", file=sys.stderr)
    return 1 if bad else 0


def write_docs(rendered: dict[Path, list[str]]) -> None:
    """Replace each document's marked blocks with their rendering (a block with nothing filed stays)."""
    for doc, doc_blocks in rendered.items():
        text = doc.read_text(encoding="utf-8")
        for block in doc_blocks:
            if block:
                text = rewrite(text, block)
        doc.write_text(text, encoding="utf-8")
