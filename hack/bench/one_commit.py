"""Every path at one commit (issue #52): the newest commit whose filed runs hold every phase both at a
fleet below 10,000 nodes and at 10,000 or more, each figure beside its floor, the two sizes side by side.

The phases cannot all share one run (the MIG fleet publishes every governed node as a MIG node, which the
core phases' DRA nodes do not expect: hack/bench/cli.py), so a size's figures come from the runs of that
commit and size together, each target from the newest of them that measured it. Pure: the filed results
in, a docs block out (docs/bench.md and docs/scaling.md, through hack/bench/docs.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hack.bench.domain_report import domain_targets_for
from hack.bench.mig_report import mig_targets_for
from hack.bench.targets import (
    LARGE_FLEET_NODES,
    RATIO_MAX,
    RATIO_MET,
    RATIO_MISSED,
    Target,
    _fmt,
    measured,
    ratio_cells,
    ratio_of,
    resilience_targets_for,
    targets_for,
)

BEGIN = "<!-- bench-one-commit:begin (python -m hack.bench.docs) -->"
END = "<!-- bench-one-commit:end -->"
# Every phase `--phases` can select (hack/bench/cli.py PHASES); a run filed before the list was recorded
# ran the core phases alone.
EVERY_PHASE = ("core", "restart", "failover", "drain", "mig", "domain")
SIZES = ("small", "large")

Run = tuple[Path, Mapping[str, Any]]


def phases_of(res: Mapping[str, Any]) -> set[str]:
    return set((res.get("config") or {}).get("phases") or ["core"])


def size_of(res: Mapping[str, Any]) -> str:
    return "large" if int(res["nodes"]) >= LARGE_FLEET_NODES else "small"


def complete_commit(runs: Sequence[Run], sizes: Sequence[str] = SIZES) -> tuple[str, dict[str, list[Run]]] | None:
    """The newest commit (by its newest run's date) whose runs cover every phase at each of ``sizes``, and
    its runs by size, oldest first; None where no commit does."""
    by_commit: dict[str, dict[str, list[Run]]] = {}
    for run in runs:
        if run[1].get("quick"):
            continue
        by_commit.setdefault(str(run[1]["commit"]), {s: [] for s in SIZES})[size_of(run[1])].append(run)
    done = []
    for commit, by_size in by_commit.items():
        if all(set(EVERY_PHASE) <= set().union(*(phases_of(r[1]) for r in by_size[s])) for s in sizes):
            newest = max(str(r[1].get("date", "")) for s in sizes for r in by_size[s])
            ordered = {s: sorted(by_size[s], key=lambda r: str(r[1].get("date", ""))) for s in sizes}
            done.append((newest, commit, ordered))
    if not done:
        return None
    _, commit, ordered = max(done, key=lambda d: d[0])
    return commit, ordered


def floored_targets(nodes: int) -> list[Target]:
    """Every target of every phase that has a floor (issue #52's ratios), in the order the docs list them."""
    every = targets_for(nodes) + resilience_targets_for(nodes) + mig_targets_for(nodes) + domain_targets_for(nodes)
    return [t for t in every if t.floor is not None]


def entry_of(t: Target, runs: Sequence[Run]) -> tuple[dict[str, Any] | None, Mapping[str, Any] | None]:
    """The target's entry from the newest of ``runs`` that measured it, and that run."""
    for _, res in reversed(runs):
        e = res["targets"].get(t.key)
        if measured(e):
            return e, res
    return None, None


def cells(t: Target, runs: Sequence[Run]) -> list[str]:
    """Result, floor and ratio with its verdict, for one size; "not measured" where no run measured it."""
    e, res = entry_of(t, runs)
    if e is None or res is None:
        return ["not measured", "-", "-"]
    floor, ratio, verdict = ratio_cells(t, e, RATIO_MET, f"**{RATIO_MISSED}**", dict(res))
    return [_fmt(e["value"], t.unit), floor, f"{ratio} {verdict}" if verdict != "-" else ratio]


def tally(targets: Sequence[Target], runs: Sequence[Run]) -> tuple[int, int]:
    """(ratios met, ratios judged) of one size: a floor that timed out is judged neither way."""
    statuses = []
    for t in targets:
        e, res = entry_of(t, runs)
        r = ratio_of(t, e, dict(res)) if e is not None and res is not None else None
        if r and r["status"] in (RATIO_MET, RATIO_MISSED):
            statuses.append(r["status"])
    return statuses.count(RATIO_MET), len(statuses)


def _files(runs: Sequence[Run], rel: Any) -> str:
    return ", ".join(f"`{rel(p)}` ({', '.join(sorted(phases_of(r)))})" for p, r in runs)


def render_one_commit(runs: Sequence[Run], rel: Any = str) -> str:
    """The block: the commit, its files, and every floored target at both sizes (misses stay misses).
    Where no commit has every phase at both sizes yet, the newest commit with every phase at one size is
    rendered alone, and the block says which size it lacks."""
    found = complete_commit(runs)
    lacking = ""
    if found is None:
        one = [f for f in (complete_commit(runs, (s,)) for s in SIZES) if f is not None]
        if not one:
            return "\n".join(
                [
                    BEGIN,
                    f"No commit has every phase ({', '.join(EVERY_PHASE)}) filed below {LARGE_FLEET_NODES:,} "
                    f"nodes or at {LARGE_FLEET_NODES:,} or more yet.",
                    END,
                ]
            )
        found = max(one, key=lambda f: max(str(r[1].get("date", "")) for rs in f[1].values() for r in rs))
        missing = "below" if "small" not in found[1] else "at"
        lacking = (
            f" No commit has every phase filed both below {LARGE_FLEET_NODES:,} nodes and at {LARGE_FLEET_NODES:,}"
            f" or more yet; this one has none {missing} {LARGE_FLEET_NODES:,}."
        )
    commit, sizes = found
    present = [s for s in SIZES if s in sizes]
    nodes = {s: int(sizes[s][-1][1]["nodes"]) for s in present}
    floored = {s: {t.key: t for t in floored_targets(nodes[s])} for s in present}
    targets: dict[str, Target] = {}
    for s in present:
        for key, t in floored[s].items():
            targets.setdefault(key, t)
    judged = [(s, *tally(list(floored[s].values()), sizes[s])) for s in present]
    lines = [
        BEGIN,
        f"Every phase at one commit, `{commit}`: "
        + "; ".join(f"{nodes[s]:,} nodes from {_files(sizes[s], rel)} on {sizes[s][-1][1]['machine']}" for s in present)
        + f". Ratios to the no-logic floor (<= {RATIO_MAX:g}x): "
        + ", ".join(f"**{met} of {n} met** at {nodes[s]:,} nodes" for s, met, n in judged)
        + f".{lacking}",
        "",
        "| figure | " + " | ".join(f"{nodes[s]:,} nodes | floor | ratio" for s in present) + " |",
        "| --- |" + " --- | --- | --- |" * len(present),
    ]
    for key, t in targets.items():
        row = [cells(floored[s][key], sizes[s]) if key in floored[s] else ["-", "-", "-"] for s in present]
        lines.append(f"| {t.label} | " + " | ".join(c for cs in row for c in cs) + " |")
    lines.append(END)
    return "\n".join(lines)
