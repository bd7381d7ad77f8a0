"""Issue #52's files: every phase at one commit, at both sizes, side by side (hack/bench/one_commit.py),
read from real filed runs relabelled to one commit."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hack.bench import docs
from hack.bench.one_commit import complete_commit, render_one_commit

# Four runs filed on 2026-12-07: every phase at 1,000 nodes and at 10,000, over two files each.
FILES = (
    "bench-1000-2026-12-07-d7c3c24.json",
    "bench-1000-2026-12-07-606bbd7-mig-domain.json",
    "bench-10000-2026-12-07-4b2d930.json",
    "bench-10000-2026-12-07-6c3f19b-mig-domain.json",
)


def runs(commit: str = "abc1234", files: tuple[str, ...] = FILES) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for name in files:
        path = docs.RESULTS / name
        res = json.loads(path.read_text(encoding="utf-8"))
        res["commit"] = commit
        out.append((path, res))
    return out


def test_a_commit_counts_only_with_every_phase_at_both_sizes() -> None:
    found = complete_commit(runs())
    assert found is not None and found[0] == "abc1234"
    assert [p.name for p, _ in found[1]["small"]] == list(FILES[:2])
    assert [p.name for p, _ in found[1]["large"]] == list(FILES[2:])
    # Without the 10,000-node MIG and domain run the commit lacks two phases at that size: its 1,000-node
    # runs are rendered alone, and the block says what it lacks.
    assert complete_commit(runs(files=FILES[:3])) is None
    alone = render_one_commit(runs(files=FILES[:3]))
    assert "**14 of 16 met** at 1,000 nodes." in alone and "this one has none at 10,000" in alone
    assert "| figure | 1,000 nodes | floor | ratio |" in alone and "10,000 nodes |" not in alone
    # Neither size whole (no MIG or domain run at either): nothing to render.
    assert "No commit has every phase" in render_one_commit(runs(files=(FILES[0], FILES[2])))
    # A --quick run is no run of the phase.
    quick = runs()
    quick[3][1]["quick"] = True
    assert complete_commit(quick) is None


def test_the_newest_complete_commit_is_the_one_rendered() -> None:
    newer = runs("def5678")
    for _, res in newer:
        res["date"] = "2026-12-08" + res["date"][10:]
    incomplete_newer = runs("0ld0ld0", FILES[:1])
    for _, res in incomplete_newer:
        res["date"] = "2026-12-09" + res["date"][10:]
    found = complete_commit(runs() + newer + incomplete_newer)
    assert found is not None and found[0] == "def5678"


def test_every_ratio_renders_beside_its_floor_misses_as_misses() -> None:
    block = render_one_commit(runs())
    assert "**14 of 16 met** at 1,000 nodes, **12 of 16 met** at 10,000 nodes." in block
    row = next(line for line in block.splitlines() if line.startswith("| MIG storm"))
    assert row.endswith("| 5.70 GPUs/s | 17.8 GPUs/s | 3.12x **missed** |")
    # A floor that timed out judges the ratio neither way: unmeasured, out of the count.
    timed_out = runs()
    entry = timed_out[3][1]["targets"]["mig_storm_rate"]
    entry["ratio"] = {"floor": None, "ratio": None, "status": "unmeasured", "why": "floor timed out"}
    block = render_one_commit(copy.deepcopy(timed_out))
    assert "**12 of 15 met** at 10,000 nodes" in block
    row = next(line for line in block.splitlines() if line.startswith("| MIG storm"))
    assert row.endswith("| 5.70 GPUs/s | - | floor timed out unmeasured |")
