"""Result files under results/: a second run of one commit on one day is filed beside the first."""

from __future__ import annotations

from pathlib import Path


def free_name(directory: Path, stem: str) -> Path:
    """``stem.json`` under ``directory``, or ``stem-2.json``, ``-3``, ... where that is taken: a second
    run of one commit on one day is filed beside the first, never over it."""
    out, n = directory / f"{stem}.json", 2
    while out.exists():
        out, n = directory / f"{stem}-{n}.json", n + 1
    return out
