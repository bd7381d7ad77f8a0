"""`make chaos`: fault injection against fresh local control planes; writes build/chaos/report.json.

Scenarios (hack/chaos/scenarios/, one module each, named in registry.py) run one after another on
a control plane per group (one with the API server's default limits, one throttled to 5 requests in
flight), each torn down at the end.
After every scenario the invariants in hack/chaos/invariants.py are checked. Exit status 1 if any
invariant was violated (other than a known, reported product bug that still reproduces), or if a
known bug no longer reproduces (remove its mark in KNOWN_VIOLATIONS).

    make chaos                                  # full counts (about 13 minutes on 2 cores)
    make chaos CHAOS_ARGS=--quick               # the short counts `make test` also runs
    make chaos CHAOS_ARGS="--only peering --only bad_input"
    make soak SOAK_MINUTES=30                   # the soak: build/chaos/soak.json
    make soak CHAOS_ARGS=--no-heap-profile      # the soak with the operator as in production
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from hack.chaos.scenarios import SCENARIOS, run_scenario, start_cluster
from hack.chaos.soak import soak

REPO = Path(__file__).resolve().parents[2]

OUT = REPO / "build" / "chaos"


def summarize(
    by: dict[str, list[dict[str, Any]]], quick: bool, seed: int, started: float, at: dict[str, Any]
) -> dict[str, Any]:
    """Totals that count honestly: a run is one independent episode (a scenario on fresh nodes with
    its own policy and operator); its cycles are not runs. Process-level faults (SIGKILLs, crashes),
    writes by another controller, hostile objects and simulated GPU faults are counted apart."""
    results = [r for rs in by.values() for r in rs]
    faults: dict[str, int] = {}
    for r in results:
        for cls, n in r.get("faults", {}).items():
            faults[cls] = faults.get(cls, 0) + n
    return {
        "scenarios": len(by),
        "runs": sum(r.get("runs", 1) for r in results),
        "cycles": sum(r.get("cycles", 0) for r in results),
        "faults": dict(sorted(faults.items())),
        "invariant_violations": sum(len(r["violations"]) for r in results),
        "known_violations": sum(len(r.get("known_violations", [])) for r in results),
        "known_bugs_no_longer_reproducing": sorted(
            {bug for r in results for bug in r.get("known_bugs_not_reproduced", [])}
        ),
        "quick": quick,
        "seed": seed,
        **at,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - started, 1),
        "by_scenario": by,
    }


def run_soak(minutes: float, seed: int, work: Path, path: Path, heap_profile_on: bool = True) -> int:
    """`make soak`: one control plane, one long soak; writes build/chaos/soak.json."""
    started = time.monotonic()
    at = commit()  # what runs is what was checked out when it started, whatever is committed meanwhile
    cluster = start_cluster(work / "soak-cluster")
    try:
        result = soak(cluster, work, minutes, seed, heap_profile_on)
    finally:
        cluster.stop()
    report = {
        **at,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - started, 1),
        **result,
    }
    path.write_text(json.dumps(report, indent=2) + "\n")
    for name, tr in result["trends"].items():
        print(
            f"   {name}: mean {tr['mean']}, slope {tr['per_hour']}/h "
            f"({tr['per_hour_pct_of_mean']}% of the mean per hour)"
        )
    print(f"== soak {minutes} min: events {result['events']}, {len(result['violations'])} violations; report: {path}")
    for v in result["violations"]:
        print(f"     ! {v}")
    return 1 if result["violations"] else 0


def commit() -> dict[str, Any]:
    """The commit a run is of, and whether the tree differed from it (taken when the run starts)."""
    return {"commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}


def _git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hack.chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="short counts (about 1/5), as in make test")
    ap.add_argument("--only", action="append", default=[], help="run only this scenario (repeatable)")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000, help="random seed (recorded)")
    ap.add_argument("--repeat", type=int, default=1, help="independent runs of each scenario (fresh nodes, seeds)")
    ap.add_argument("--soak", type=float, metavar="MINUTES", help="instead: the soak (hack/chaos/soak.py)")
    ap.add_argument(
        "--no-heap-profile",
        action="store_true",
        help="soak: run the operator without its heap profile (RSS as in production, no profiler overhead)",
    )
    ap.add_argument("--out", type=Path, default=OUT, help="report and logs directory")
    args = ap.parse_args()
    names = [s.name for s in SCENARIOS]
    unknown = [n for n in args.only if n not in names]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; choose from {names}")
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only]
    out: Path = args.out
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    if args.soak:
        return run_soak(args.soak, args.seed, work, out / "soak.json", not args.no_heap_profile)
    report_path = out / "report.json"
    started = time.monotonic()
    at = commit()
    by: dict[str, list[dict[str, Any]]] = {}
    for kind in ("main", "throttled"):
        group = [s for s in chosen if s.cluster == kind]
        if not group:
            continue
        print(f"== control plane '{kind}' for {[s.name for s in group]}", flush=True)
        cluster = None
        try:
            cluster = start_cluster(work / kind / "cluster", throttled=kind == "throttled")
            for i, sc in enumerate(group):
                for rep in range(args.repeat):
                    print(f"-- {sc.name} (run {rep + 1} of {args.repeat}) ...", flush=True)
                    seed = args.seed + 100 * rep + i
                    result = run_scenario(sc.name, cluster, work / kind / f"run{rep}", args.quick, seed)
                    by.setdefault(sc.name, []).append(result)
                    known = result.get("known_violations", [])
                    print(
                        f"   {sc.name}: {result['cycles']} cycles, faults {result['faults']}, "
                        f"{len(result['violations'])} violations (+{len(known)} from known bugs) "
                        f"in {result['seconds']}s",
                        flush=True,
                    )
                    for v in result["violations"]:
                        print(f"     ! {v}", flush=True)
                    for v in known:
                        print(f"     (known) {v}", flush=True)
                    report_path.write_text(
                        json.dumps(summarize(by, args.quick, args.seed, started, at), indent=2) + "\n"
                    )
        except Exception as e:
            for sc in [s for s in group if s.name not in by]:
                by.setdefault(sc.name, []).append(
                    {
                        "runs": 0,
                        "cycles": 0,
                        "faults": {},
                        "violations": [f"control plane '{kind}' failed: {e!r}"],
                        "seconds": 0,
                        "notes": [],
                    }
                )
        finally:
            if cluster is not None:
                cluster.stop()
    report = summarize(by, args.quick, args.seed, started, at)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"== {report['scenarios']} scenarios, {report['runs']} runs ({report['cycles']} cycles), "
        f"faults {report['faults']}, "
        f"{report['invariant_violations']} invariant violations ({report['known_violations']} more from known bugs) "
        f"in {report['seconds']}s; report: {report_path}"
    )
    if report["known_bugs_no_longer_reproducing"]:
        print("known bugs that no longer reproduce (remove their marks in hack/chaos/scenarios/registry.py):")
        for bug in report["known_bugs_no_longer_reproducing"]:
            print(f"  - {bug}")
    return 1 if report["invariant_violations"] or report["known_bugs_no_longer_reproducing"] else 0
