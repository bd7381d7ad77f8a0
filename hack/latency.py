"""The repair latencies in docs/remediation.md, generated from committed measurements.

``tests/integration/test_repair_latency.py`` plays one GPU's repair on the real control plane (an
ECC fault on a DRA GPU that a pod holds, its drain, reset and validation) and writes when each step
was seen to ``build/latency/latency.json``. Filing a run copies it to ``results/latency/`` under a
name that carries its date and commit; the marked block in docs/remediation.md is then rendered from
every filed run, oldest first, so a change to the repair path shows its effect beside the runs
before it. A unit test (tests/unit/test_latency_docs.py) fails when the block differs from its
rendering. A run from a dirty tree is refused: it is not a run at a commit.

    python -m hack.latency --add build/latency/latency.json   # file a run, re-render
    python -m hack.latency                                    # re-render the block
    python -m hack.latency --check                            # exit 1 if the block is stale
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devkit.docblocks import check, stale_docs, write_docs

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results" / "latency"
RUN = REPO / "build" / "latency" / "latency.json"
DOC = REPO / "docs" / "remediation.md"
BEGIN = "<!-- latency:begin (python -m hack.latency) -->"
END = "<!-- latency:end -->"

# The steps a repair goes through, in order, as the test sees them (its clock, polling the API).
MARKS: tuple[tuple[str, str], ...] = (
    ("fault", "the agent reports the ECC fault"),
    ("rule", "the GPU's DeviceTaintRule exists"),
    ("pod_gone", "the last pod holding the GPU is gone"),
    ("reset_job", "the reset Job exists"),
    ("reset_done", "the reset Job's pod succeeded"),
    ("validation_job", "the validation Job exists"),
    ("validation_done", "the validation Job's pod succeeded"),
    ("back", "the GPU is back in service (its rule deleted)"),
)
# The two delays gpuhealth itself adds between a fact and its next step (the rest is the
# drain's eviction, the reset and the diagnostic, which take as long as they take).
BOUNDED: tuple[tuple[str, str], ...] = (("pod_gone", "reset_job"), ("reset_done", "validation_job"))


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()


def measurement(marks: Mapping[str, float], tick_s: float, events: Mapping[str, float]) -> dict[str, Any]:
    """A run's result: each mark (``MARKS`` and any other the test noted) in seconds since the fault,
    the operator's Events (first of each reason, seconds since the fault), and what it ran at."""
    t0 = marks["fault"]
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "tick_s": tick_s,
        "marks": {k: round(v - t0, 2) for k, v in sorted(marks.items(), key=lambda kv: kv[1])},
        "events": {k: round(v - t0, 2) for k, v in sorted(events.items(), key=lambda kv: kv[1])},
    }


def delay(rep: Mapping[str, Any], start: str, end: str) -> float | None:
    marks = rep.get("marks") or {}
    if start not in marks or end not in marks:
        return None
    return round(float(marks[end]) - float(marks[start]), 2)


def save(rep: Mapping[str, Any], path: Path = RUN) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rep, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def filed(directory: Path = RESULTS) -> list[tuple[Path, dict[str, Any]]]:
    """Filed runs, oldest first by their date."""
    runs = [(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(directory.glob("latency-*.json"))]
    return sorted(runs, key=lambda r: str(r[1].get("date", "")))


def file_report(report: Path, directory: Path = RESULTS) -> Path:
    """Copy a run into results/latency/, named by its date and commit."""
    rep = json.loads(report.read_text(encoding="utf-8"))
    if rep.get("dirty"):
        raise ValueError(f"{report} ran on a dirty tree: not a run at a commit")
    out = directory / f"latency-{rep['date'][:10]}-{rep['commit'][:7]}.json"
    directory.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return out


def _s(v: float | None) -> str:
    return "not reached" if v is None else f"{v:.1f} s"


def _rel(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def render(runs: list[tuple[Path, dict[str, Any]]]) -> str:
    """One column per filed run: the delay between each step and the one before it."""
    head = " | ".join(f"`{r['commit'][:7]}` ({r['date'][:10]}, tick {r['tick_s']:g} s)" for _, r in runs)
    lines = [
        BEGIN,
        "Seconds from each step to the next, as `tests/integration/test_repair_latency.py` saw them "
        "(one GPU of an 8-GPU DRA node under KWOK; each column a filed run: "
        + ", ".join(f"`{_rel(p)}`" for p, _ in runs)
        + ").",
        "",
        f"| step | {head} |",
        "| --- |" + " --- |" * len(runs),
    ]
    bounded = {end for _, end in BOUNDED}
    for (prev, _), (key, text) in itertools.pairwise(MARKS):
        name = f"**{text}**" if key in bounded else text
        lines.append(f"| {name} | " + " | ".join(_s(delay(r, prev, key)) for _, r in runs) + " |")
    lines.append("| fault to back in service | " + " | ".join(_s(delay(r, "fault", "back")) for _, r in runs) + " |")
    lines.append(END)
    return "\n".join(lines)


def blocks(directory: Path = RESULTS) -> dict[Path, list[str]]:
    runs = filed(directory)
    return {DOC: [render(runs) if runs else ""]}


def stale(directory: Path = RESULTS) -> list[Path]:
    """The documents whose block differs from its rendering (or with nothing filed to render)."""
    return stale_docs(blocks(directory))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--add", type=Path, action="append", default=[], help="a latency.json to file")
    ap.add_argument("--check", action="store_true", help="exit 1 if the block is stale")
    args = ap.parse_args(argv)
    if args.check:
        return check(stale(), "hack.latency")
    for report in args.add:
        try:
            print(f"filed {file_report(report)}")
        except ValueError as e:
            ap.error(str(e))
    write_docs(blocks())
    return 0


if __name__ == "__main__":
    sys.exit(main())
