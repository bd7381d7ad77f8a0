"""The chaos and soak figures in docs/development.md and docs/chaos.md, generated from committed reports.

`make chaos` writes build/chaos/report.json and `make soak` build/chaos/soak.json. Filing a report
copies it to results/chaos/ under a name that carries its date and commit; the marked blocks in the
docs/development.md and docs/chaos.md are then rendered from the newest filed full run (and the newest filed
soak), never typed. A unit test (tests/unit/test_chaos_docs.py) fails when a block differs from its
rendering. A run from a dirty tree or with --quick counts is refused: it is not a run at a commit.

    python -m hack.chaos.docs --add build/chaos/report.json     # file a full chaos run, re-render
    python -m hack.chaos.docs --add build/chaos/soak.json       # file a soak, re-render
    python -m hack.chaos.docs                                   # re-render the blocks
    python -m hack.chaos.docs --check                           # exit 1 if a block is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from devkit.docblocks import check, stale_docs, write_docs

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "chaos"
DEV_DOC, CHAOS_DOC = REPO / "docs" / "development.md", REPO / "docs" / "chaos.md"
BEGIN = "<!-- chaos:begin (python -m hack.chaos.docs) -->"
END = "<!-- chaos:end -->"
SOAK_BEGIN = "<!-- soak:begin (python -m hack.chaos.docs) -->"
SOAK_END = "<!-- soak:end -->"
FAULT_CLASSES = ("process", "foreign_writes", "hostile_objects", "agent_faults", "gpu_faults")


def _load(directory: Path, pattern: str) -> list[tuple[Path, dict[str, Any]]]:
    runs = [(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(directory.glob(pattern))]
    return sorted(runs, key=lambda r: str(r[1].get("date", "")))


def filed_runs(directory: Path = RESULTS) -> list[tuple[Path, dict[str, Any]]]:
    """Filed full chaos runs, oldest first by their date."""
    return _load(directory, "chaos-*.json")


def filed_soaks(directory: Path = RESULTS) -> list[tuple[Path, dict[str, Any]]]:
    return _load(directory, "soak-*.json")


def _rel(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def _faults(faults: dict[str, int]) -> str:
    parts = [f"{faults[c]} {c.replace('_', ' ')}" for c in FAULT_CLASSES if faults.get(c)]
    parts += [f"{n} {c.replace('_', ' ')}" for c, n in sorted(faults.items()) if c not in FAULT_CLASSES and n]
    return ", ".join(parts) or "none"


def render(path: Path, rep: dict[str, Any]) -> str:
    """What ran, at which commit, what was injected by class, and every violation, per scenario."""
    violations = rep["invariant_violations"]
    lines = [
        BEGIN,
        f"Latest filed full run: {rep['scenarios']} scenarios, {rep['runs']} runs ({rep['cycles']} cycles inside "
        f"them), seed {rep['seed']}; commit `{rep['commit'][:7]}`, {rep['date']}, {round(rep['seconds'] / 60)} "
        f"minutes. Injected: {_faults(rep['faults'])}. **{violations} invariant violation"
        f"{'' if violations == 1 else 's'}**"
        + (f", {rep['known_violations']} from known, reported bugs" if rep.get("known_violations") else "")
        + f" (`{_rel(path)}`).",
        "",
        "| scenario | runs | cycles | process faults | foreign writes | hostile objects | GPU faults | violations |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, results in rep["by_scenario"].items():
        f: dict[str, int] = {}
        for r in results:
            for cls, n in r.get("faults", {}).items():
                f[cls] = f.get(cls, 0) + n
        v = sum(len(r.get("violations", [])) for r in results)
        lines.append(
            f"| {name} | {sum(r.get('runs', 1) for r in results)} | {sum(r.get('cycles', 0) for r in results)} "
            f"| {f.get('process', 0)} | {f.get('foreign_writes', 0)} | {f.get('hostile_objects', 0)} "
            f"| {f.get('gpu_faults', 0)} | {v if not v else f'**{v}**'} |"
        )
    shown = [f"- {name}: {msg}" for name, rs in rep["by_scenario"].items() for r in rs for msg in r["violations"]]
    if shown:
        lines += ["", "Violations:", "", *shown[:20]]
        if len(shown) > 20:
            lines.append(f"- ... and {len(shown) - 20} more in the report")
    lines.append(END)
    return "\n".join(lines)


def render_soak(path: Path, rep: dict[str, Any]) -> str:
    """The soak's resource slopes (least-squares, after the warm-up) and what it left behind."""
    lines = [
        SOAK_BEGIN,
        f"Latest filed soak: {rep['minutes']:g} minutes, seed {rep['seed']}; commit `{rep['commit'][:7]}`, "
        f"{rep['date']}; operator heap profile "
        + ("on" if rep.get("heap_profile", True) else "off (RSS as in production)")
        + ". Events: "
        + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(rep["events"].items()))
        + f"; {rep['nodes_deleted']} Nodes deleted, {len(rep.get('leftovers', []))} left anything behind; "
        f"**{len(rep['violations'])} invariant violations** (`{_rel(path)}`).",
        "",
        "| series | mean | slope per hour | slope, % of the mean per hour | slope per hour, each quarter of the run |",
        "| --- | --- | --- | --- | --- |",
    ]
    series = rep.get("series") or {}
    for name, tr in rep["trends"].items():
        lines.append(
            f"| {name} | {tr['mean']} | {tr['per_hour']} | {tr['per_hour_pct_of_mean']} "
            f"| {_quarters(series.get('t') or [], series.get(name) or [])} |"
        )
    heap = rep.get("heap") or {}
    for name, tr in (heap.get("trends") or {}).items():
        lines.append(
            f"| {name} (heap profile) | {tr['mean']} | {tr['per_hour']} | {tr['per_hour_pct_of_mean']} "
            f"| {_quarters(heap.get('t') or [], heap.get(name) or [])} |"
        )
    if heap.get("growth"):
        lines += [
            "",
            "Python heap growth from the profile's baseline to its last sample, by allocating line:",
            "",
            "| line | bytes gained | objects gained |",
            "| --- | --- | --- |",
        ]
        for g in heap["growth"][:8]:
            lines.append(f"| `{_site(g['site'])}` | {g['size_diff']} | {g['count_diff']} |")
    lines.append(SOAK_END)
    return "\n".join(lines)


def _site(path: str) -> str:
    """A source line as a path inside the repository or the installed library it belongs to."""
    for mark in ("/operator/", "/site-packages/", "/lib/python3"):
        if mark in path:
            return path.split(mark, 1)[1]
    return path


def quarter_slopes(t: list[float], ys: list[float]) -> list[float] | None:
    """Least-squares slope per hour over each quarter of the samples. A leak grows at the same rate
    in every quarter; a warm-up that settles (allocator arenas, bounded histories filling) grows
    ever slower, towards 0 in the last quarter."""
    if len(t) != len(ys) or len(t) < 12:
        return None
    n = len(t)
    out: list[float] = []
    for q in range(4):
        xs, vs = t[q * n // 4 : (q + 1) * n // 4], ys[q * n // 4 : (q + 1) * n // 4]
        mx, mv = sum(xs) / len(xs), sum(vs) / len(vs)
        den = sum((x - mx) ** 2 for x in xs)
        if den == 0:
            return None
        out.append(round(sum((x - mx) * (v - mv) for x, v in zip(xs, vs, strict=True)) / den * 3600, 2))
    return out


def _quarters(t: list[float], ys: list[float]) -> str:
    slopes = quarter_slopes(t, ys)
    return "n/a" if slopes is None else " → ".join(f"{s:g}" for s in slopes)


def blocks(directory: Path = RESULTS) -> dict[Path, list[str]]:
    runs, soaks = filed_runs(directory), filed_soaks(directory)
    latest = render(*runs[-1]) if runs else ""
    soak = render_soak(*soaks[-1]) if soaks else ""
    return {DEV_DOC: [latest], CHAOS_DOC: [latest, soak]}


def stale(directory: Path = RESULTS) -> list[Path]:
    """The documents whose blocks differ from their rendering (or with nothing filed to render)."""
    return stale_docs(blocks(directory))


def file_report(report: Path, directory: Path = RESULTS) -> Path:
    """Copy a full chaos report or a soak report into results/chaos/, named by date and commit."""
    rep = json.loads(report.read_text(encoding="utf-8"))
    if rep.get("dirty"):
        raise ValueError(f"{report} ran on a dirty tree: not a run at a commit")
    if rep.get("quick"):
        raise ValueError(f"{report} ran with --quick counts: file a full run")
    kind = f"soak-{rep['minutes']:g}m" if "trends" in rep else "chaos"
    out = directory / f"{kind}-{rep['date'][:10]}-{rep['commit'][:7]}.json"
    directory.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--add", type=Path, action="append", default=[], help="a report.json or soak.json to file")
    ap.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = ap.parse_args(argv)
    if args.check:
        return check(stale(), "hack.chaos.docs")
    for report in args.add:
        try:
            print(f"filed {file_report(report)}")
        except ValueError as e:
            ap.error(str(e))
    write_docs(blocks())
    return 0


if __name__ == "__main__":
    sys.exit(main())
