"""The bench figures in docs/development.md and docs/bench.md, generated from committed result files.

A `make bench` run writes build/bench/results.json. Filing it copies it to results/bench/ with the
commit, date and machine load it ran at; the marked blocks in docs/development.md and docs/bench.md are then
rendered from the newest filed full run, never typed. A unit test (tests/unit/bench/test_docs.py)
fails when a block differs from its rendering, so a figure cannot drift from its result file.

    python -m hack.bench.docs --add build/bench/results.json --commit SHA   # file a run, re-render
    python -m hack.bench.docs                                               # re-render the blocks
    python -m hack.bench.docs --add ... --commit SHA --ab "LABEL"          # file it as an A/B table row
    python -m hack.bench.docs --check                                       # exit 1 if a block is stale
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devkit.docblocks import check, stale_docs, write_docs
from devkit.filing import free_name
from hack.bench.details import (
    api_line,
    device_line,
    drain_line,
    e2e_line,
    failover_line,
    heartbeat_line,
    restart_line,
    startup_line,
    traffic_line,
)
from hack.bench.domain_report import no_domain_run, render_domain
from hack.bench.mig_report import no_mig_run, render_mig
from hack.bench.one_commit import render_one_commit
from hack.bench.report import tally
from hack.bench.targets import (
    LARGE_FLEET_NODES,
    RATIO_MISSED,
    TABLE_HEAD,
    Target,
    _fmt,
    measured,
    ratio_of,
    ratio_sentence,
    ratio_tally,
    resilience_targets_for,
    row,
    targets_for,
    verdict,
)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "bench"
DOCS = (REPO / "docs" / "development.md", REPO / "docs" / "bench.md")
SCALING_DOC = REPO / "docs" / "scaling.md"  # its other blocks are hack/bench/scaling_docs.py's
BEGIN = "<!-- bench:begin (python -m hack.bench.docs) -->"
END = "<!-- bench:end -->"
LARGE_BEGIN = "<!-- bench-10k:begin (python -m hack.bench.docs) -->"
LARGE_END = "<!-- bench-10k:end -->"
RES_BEGIN = "<!-- bench-resilience:begin (python -m hack.bench.docs) -->"
SUMMARY_BEGIN = "<!-- bench-resilience-summary:begin (python -m hack.bench.docs) -->"
SUMMARY_END = "<!-- bench-resilience-summary:end -->"
RES_END = "<!-- bench-resilience:end -->"
AB_BEGIN = "<!-- bench-ab:begin (python -m hack.bench.docs) -->"
AB_END = "<!-- bench-ab:end -->"


def core_run(res: Mapping[str, Any]) -> bool:
    """A run with the core phases (detection, storm, ...); a run of only the issue #26 phases or the
    MIG fleet (``--phases`` without ``core``) has no storm and feeds the resilience or MIG block alone."""
    return "storm" in res


def filed_runs(directory: Path = RESULTS) -> list[tuple[Path, dict[str, Any]]]:
    """Full (not --quick) filed runs, oldest first by their date."""
    runs = []
    for path in sorted(directory.glob("bench-*.json")):
        res = json.loads(path.read_text(encoding="utf-8"))
        if not res.get("quick"):
            runs.append((path, res))
    return sorted(runs, key=lambda r: str(r[1].get("date", "")))


def render(path: Path, res: dict[str, Any], begin: str = BEGIN, end: str = END) -> str:
    """The block: what ran, where, and every target with its result; misses stay misses.

    A run filed before a target or figure existed renders it as "not measured" (never as met or missed).
    """
    targets = res["targets"]
    passed, counted, skipped = tally(targets, res["nodes"])
    unmeasured = f", {skipped} not measured in this run" if skipped else ""
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    s, o = res["storm"], res["operator"]
    lines = [
        begin,
        f"Latest filed full run: {res['nodes']:,} nodes, {res.get('pods', 0):,} running pods, "
        f"{res['config']['faults']} faults; commit `{res['commit']}`, {res['date']}, {res['machine']}; "
        f"load average {res['load']} during the run (2 fills both cores). **{passed} of {counted} targets "
        f"met**{unmeasured} (`{rel}`). {ratio_sentence(res, targets_for(res['nodes']))}".rstrip(),
        "",
        *TABLE_HEAD,
        *(row(t, targets.get(t.key), "met", "**missed**", res) for t in targets_for(res["nodes"])),
    ]
    lines += [
        "",
        f"Storm detail: reports published in {s['publish_s']} s, each node's report write to its taint p50 "
        f"{s['report_to_taint_ms_p50']} ms. Operator start-up to every node evaluated: {o.get('startup_s')} s"
        f"{startup_detail(o)}; "
        f"idle: {o['idle_requests_per_min']} requests/min, {o['idle_writes_per_min']} writes/min.",
        "",
        startup_line(res),
        "",
        e2e_line(res),
        "",
        device_line(res),
        "",
        heartbeat_line(res),
        "",
        traffic_line(res),
        "",
        api_line(res),
        end,
    ]
    return "\n".join(lines)


RESILIENCE = ("drain_storm", "failover", "warm_restart")
DRAIN_ALONE_BEGIN = "<!-- bench-drain-alone:begin (python -m hack.bench.docs) -->"
DRAIN_ALONE_END = "<!-- bench-drain-alone:end -->"


def startup_detail(o: Mapping[str, Any]) -> str:
    """What start-up reached where "every node evaluated" is missing or late: most of the fleet (the share
    the run timed), and the states at the timeout (runs filed since the bench records them)."""
    out = ""
    if o.get("startup_most_s") is not None:
        out += f" ({o['startup_most_share']:.0%} of the nodes after {o['startup_most_s']} s)"
    if states := o.get("startup_states"):
        out += " (at the timeout: " + ", ".join(f"{k} {v:,}" for k, v in sorted(states.items())) + ")"
    return out


def alone(res: Mapping[str, Any], phase: str) -> bool:
    """Whether a run measured ``phase`` and neither of the other two of ``RESILIENCE`` (``--phases
    drain`` to see where the storm's time goes, ``--phases restart`` to measure a start-up change at
    10,000 nodes in half the time). Such a run is rendered in a block of its own, never in place of the
    newest run of the three phases, whose other phases it does not measure."""
    return [k for k in RESILIENCE if k in res] == [phase]


RESTART_ALONE_BEGIN = "<!-- bench-restart-alone:begin (python -m hack.bench.docs) -->"
RESTART_ALONE_END = "<!-- bench-restart-alone:end -->"


def resilience_run(res: Mapping[str, Any]) -> bool:
    return any(k in res for k in RESILIENCE) and not any(alone(res, k) for k in ("drain_storm", "warm_restart"))


def _alone_block(
    runs: list[tuple[Path, dict[str, Any]]],
    phase: str,
    begin: str,
    end: str,
    what: str,
    paragraph: Callable[[Path, dict[str, Any]], str],
) -> str:
    """The newest run of ``phase`` alone, between ``begin`` and ``end`` (the runs before it are read in
    the history, at the commit that filed them)."""
    picked = [r for r in runs if alone(r[1], phase)][-1:]
    if not picked:
        return f"{begin}\nNo run of {what} alone is filed yet.\n{end}"
    return "\n".join([begin, *(paragraph(path, r) for path, r in picked), end])


def _where(name: str, path: Path, r: Mapping[str, Any]) -> str:
    """Where and when; "alone" is among the resilience phases: a run with others (the MIG sample)
    names them."""
    phases = [str(x) for x in dig(dict(r), "config", "phases") or []]
    others = [x for x in phases if x not in ("restart", "drain")]
    besides = f" (the run's phases: {', '.join(phases)})" if others else ""
    return (
        f"{name} alone at {r['nodes']:,} nodes{besides}: commit `{r['commit']}`, {r['date']}, {r['machine']}; "
        f"load average {r['load']} during the run (`{_rel(path)}`"
    )


def _drain_paragraph(path: Path, r: dict[str, Any]) -> str:
    """Where and when, and the storm's detail (with the CPU per process and the operator's stack profile
    where the run measured them)."""
    profiled = ", operators stack-profiled" if dig(r, "config", "stack_profile") else ""
    return f"{_where('Drain storm', path, r)}{profiled}).\n\n{drain_line(r)}"


def _restart_paragraph(path: Path, r: dict[str, Any]) -> str:
    """Where and when, the two restart targets, and the restart's detail."""
    verdicts = []
    for t in resilience_targets_for(r["nodes"]):
        e = r["targets"].get(t.key)
        if e and measured(e):
            verdicts.append(f"{t.label[len('Warm restart: ') :]} {_judged(t, e)}")
    return f"{_where('Warm restart', path, r)}): {'; '.join(verdicts)}.\n\n{restart_line(r)}{_first_startup(r)}"


def _first_startup(r: dict[str, Any]) -> str:
    """The run's first start-up, on a fleet the operator had never evaluated, where the run read it from
    the audit log: its target and what it waited on (``startup_line``)."""
    if not (r.get("operator") or {}).get("startup_profile"):
        return ""
    head = "\n\nIts first start-up, on a fleet never evaluated: operator start-up to every node evaluated"
    t = next((t for t in targets_for(r["nodes"]) if t.key == "startup"), None)  # a large fleet's target
    e = r["targets"].get("startup")
    if t is None or not t.absolute or not (e and measured(e)):
        return f"{head} {r['operator'].get('startup_s')} s. {startup_line(r)}"
    return f"{head} {_judged(t, e)}. {startup_line(r)}"


def _judged(t: Target, e: dict[str, Any]) -> str:
    """A measured figure in prose: its value, then its target and whether it was met."""
    return f"{_fmt(e['value'], t.unit)} ({t.target}: {verdict(e, 'met', '**missed**')})"


def render_drain_alone(runs: list[tuple[Path, dict[str, Any]]]) -> str:
    return _alone_block(runs, "drain_storm", DRAIN_ALONE_BEGIN, DRAIN_ALONE_END, "the drain storm", _drain_paragraph)


def render_restart_alone(runs: list[tuple[Path, dict[str, Any]]]) -> str:
    return _alone_block(
        runs, "warm_restart", RESTART_ALONE_BEGIN, RESTART_ALONE_END, "the warm restart", _restart_paragraph
    )


def render_resilience(path: Path, res: dict[str, Any], *more: tuple[Path, dict[str, Any]]) -> str:
    """The issue #26 block (drain storm, failover, warm restart) of filed runs, one section each (the
    newest of each fleet size); misses stay misses."""
    sections = [_resilience_section(p, r) for p, r in ((path, res), *more)]
    return "\n".join([RES_BEGIN, "\n\n".join(sections), RES_END])


def _resilience_section(path: Path, res: dict[str, Any]) -> str:
    passed, counted, skipped = tally(res["targets"], res["nodes"], resilience_targets_for)
    unmeasured = f", {skipped} not measured in this run" if skipped else ""
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    lines = [
        f"Latest filed run of the drain storm, failover and warm restart phases at {res['nodes']:,} nodes: commit "
        f"`{res['commit']}`, {res['date']}, {res['machine']}; load average {res['load']} during the run. "
        f"**{passed} of {counted} targets met**{unmeasured} (`{rel}`). "
        f"{ratio_sentence(res, resilience_targets_for(res['nodes']))}".rstrip(),
        "",
        *TABLE_HEAD,
        *(row(t, res["targets"].get(t.key), "met", "**missed**", res) for t in resilience_targets_for(res["nodes"])),
    ]
    lines += ["", drain_line(res), "", failover_line(res), "", restart_line(res)]
    if (res.get("operator") or {}).get("startup_profile"):
        lines += ["", startup_line(res)]
    return "\n".join(lines)


def resilience_points(runs: list[tuple[Path, dict[str, Any]]]) -> list[tuple[Path, dict[str, Any]]]:
    """The newest run with the drain storm, failover or warm restart phase of each node count."""
    newest: dict[int, tuple[Path, dict[str, Any]]] = {}
    for path, res in runs:
        if resilience_run(res):
            newest[int(res["nodes"])] = (path, res)
    return [newest[n] for n in sorted(newest)]


def resilience_table(runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """The issue #26 phases at each fleet size, a row each, held to its size's targets (docs/development.md and
    docs/scaling.md; docs/bench.md has the whole of each run)."""
    pts = resilience_points(runs)
    if not pts:
        return []
    lines = [
        "The drain storm, failover and warm restart phases (`--phases restart,failover,drain`), the newest run "
        "of each size:",
        "",
        "| nodes | commit, date | drain storm evictions/s | pods evicted twice | failover p50 (s) "
        "| warm restart to a new fault's taint (s) | start-up writes | targets met |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for path, r in pts:
        passed, counted, _ = tally(r["targets"], int(r["nodes"]), resilience_targets_for)
        lines.append(
            f"| {r['nodes']:,} | `{r['commit']}`, {str(r['date'])[:10]} (`{path.name}`) "
            f"| {dig(r, 'drain_storm', 'evictions_per_s')} | {dig(r, 'drain_storm', 'double_actions')} "
            f"| {dig(r, 'failover', 'p50_s')} | {dig(r, 'warm_restart', 'restart_to_first_taint_s')} "
            f"| {dig(r, 'warm_restart', 'startup_writes')} | {passed} of {counted} |"
        )
    return lines


def dig(res: dict[str, Any], *keys: str) -> Any:
    """``res[k1][k2]...``, or None where a level is missing."""
    for k in keys:
        if not isinstance(res, dict) or k not in res:
            return None
        res = res[k]
    return res


def render_ab(directory: Path = RESULTS) -> str:
    """Side-by-side runs of the same smaller bench at two commits (results/bench/ab-*.json)."""
    lines = [
        AB_BEGIN,
        "| run | commit | load | storm nodes/s | reports published in | report to taint p50 | operator CPU "
        "| targets met (missed) | ratios to the floor met (missed) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(directory.glob("ab-*.json")):
        r = json.loads(path.read_text(encoding="utf-8"))
        s, o = r["storm"], r["operator"]
        lines.append(
            f"| {r['label']} (`{path.name}`) | `{r['commit']}` | {r['load']} | {s['nodes_per_s']} | {s['publish_s']} s "
            f"| {s['report_to_taint_ms_p50']} ms | {o['cpu_s']} s over {o['wall_s']} s | {ab_targets(r)} "
            f"| {ab_ratios(r)} |"
        )
    lines.append(AB_END)
    return "\n".join(lines)


def ab_targets(r: Mapping[str, Any]) -> str:
    """'met of measured (the missed targets' keys)': two runs side by side meet and miss the same ones or not."""
    targets = r["targets"]
    passed, counted, _ = tally(targets, int(r["nodes"]))
    missed = [
        t.key for t in targets_for(int(r["nodes"])) if measured(targets.get(t.key)) and not targets[t.key]["pass"]
    ]
    return f"{passed} of {counted}" + (f" ({', '.join(missed)})" if missed else "")


def ab_ratios(r: Mapping[str, Any]) -> str:
    """'met of judged (the missed ratios' keys)', or '-' for a run filed before ratios were judged: the
    floor of each path moves with the host and load as the figure does, so two runs side by side are
    compared by their ratios as much as by their absolute figures."""
    run = dict(r)
    targets = targets_for(int(run["nodes"]))
    met, judged, _ = ratio_tally(run, targets)
    if not judged:
        return "-"
    missed = [
        t.key
        for t in targets
        if t.floor is not None and (ratio_of(t, run["targets"].get(t.key), run) or {}).get("status") == RATIO_MISSED
    ]
    return f"{met} of {judged}" + (f" ({', '.join(missed)})" if missed else "")


def blocks(directory: Path = RESULTS) -> dict[Path, list[str]]:
    """Each document and the blocks it carries, rendered from the filed results.

    docs/development.md and the first block of docs/bench.md show the newest run below 10,000 nodes (what
    `make bench` runs); docs/bench.md's 10k block the newest run of 10,000 nodes or more; its resilience
    block the newest run below 10,000 nodes and the newest of 10,000 or more with the drain storm, failover
    or warm restart phase; its MIG block the newest run with the mig phase of each fleet size; its domain
    block the newest with the domain storm of each fleet size; docs/bench.md's and docs/scaling.md's
    one-commit block every phase at the newest commit filed with all of them at both sizes
    (``one_commit.py``).
    """
    runs = filed_runs(directory)
    # A run of only the issue #26 phases (no storm: `--phases` without core) feeds the resilience block only.
    core = [r for r in runs if core_run(r[1])]
    small = [r for r in core if r[1]["nodes"] < LARGE_FLEET_NODES]
    large = [r for r in core if r[1]["nodes"] >= LARGE_FLEET_NODES]
    resilient = [r for r in runs if resilience_run(r[1])]
    # The newest run below 10,000 nodes and the newest of 10,000 or more, each held to its own targets.
    by_size = [r for r in resilient if r[1]["nodes"] < LARGE_FLEET_NODES][-1:]
    by_size += [r for r in resilient if r[1]["nodes"] >= LARGE_FLEET_NODES][-1:]
    res_block = (
        render_resilience(*by_size[0], *by_size[1:])
        if resilient
        else f"{RES_BEGIN}\nNo run with the drain storm, failover and warm restart phases is filed yet.\n{RES_END}"
    )
    migs = {int(r[1]["nodes"]): r for r in runs if "mig" in r[1]}  # the newest of each size
    mig_block = render_mig(*((_rel(migs[n][0]), migs[n][1]) for n in sorted(migs))) if migs else no_mig_run()
    domains = {int(r[1]["nodes"]): r for r in runs if "domain_storm" in r[1]}  # the newest of each size
    domain_block = (
        render_domain(*((_rel(domains[n][0]), domains[n][1]) for n in sorted(domains))) if domains else no_domain_run()
    )
    latest = render(*small[-1]) if small else ""
    big = (
        render(*large[-1], begin=LARGE_BEGIN, end=LARGE_END)
        if large
        else f"{LARGE_BEGIN}\nNo run of {LARGE_FLEET_NODES:,} nodes or more is filed yet.\n{LARGE_END}"
    )
    table = resilience_table(runs) or ["No run with the drain storm, failover and warm restart phases is filed yet."]
    summary = "\n".join([SUMMARY_BEGIN, *table, SUMMARY_END])
    alone = render_drain_alone(runs)
    restarts = render_restart_alone(runs)
    one = render_one_commit(runs, _rel)
    return {
        DOCS[0]: [latest, summary],
        DOCS[1]: [latest, big, res_block, alone, mig_block, render_ab(directory), restarts, domain_block, one],
        SCALING_DOC: [one],
    }


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


def stale(directory: Path = RESULTS) -> list[Path]:
    return stale_docs(blocks(directory))


def phase_tag(res: Mapping[str, Any]) -> str:
    """A filed name's tag for a run without the core phases (``-domain``, ``-mig-restart``): one commit's
    runs of every phase (issue #52) are filed side by side, each its own file."""
    phases = [str(p) for p in (res.get("config") or {}).get("phases") or []]
    return "" if not phases or "core" in phases else "-" + "-".join(phases)


def file_run(results: Path, commit: str, date: str | None = None, label: str | None = None) -> Path:
    """Copy a run's results.json into results/bench/ with the commit, date and load it ran at; with a
    ``label``, as a row of the A/B table (``ab-NODES-N-COMMIT.json``) instead of a filed full run."""
    res = json.loads(results.read_text(encoding="utf-8"))
    loads = [p[2] for p in res.get("phases", []) if len(p) > 2]
    res["commit"] = commit[:7]
    res["date"] = date or res.get("date") or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ")
    res["load"] = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "unknown"
    out = free_name(RESULTS, f"bench-{res['nodes']}-{res['date'][:10]}-{res['commit']}{phase_tag(res)}")
    if label:  # one of a side-by-side pair (the A/B table), numbered in the order filed
        res["label"] = label
        n = len(list(RESULTS.glob(f"ab-{res['nodes']}-*.json"))) + 1
        out = RESULTS / f"ab-{res['nodes']}-{n}-{res['commit']}.json"
    out.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--add", type=Path, help="a results.json to file under results/bench/")
    ap.add_argument("--commit", help="the commit the filed run measured (with --add)")
    ap.add_argument("--date", help="when it ran, e.g. 2026-11-30T17:04Z (with --add; default now)")
    ap.add_argument("--ab", metavar="LABEL", help="file it as a row of the A/B table, so labelled (with --add)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = ap.parse_args(argv)
    if args.check:
        return check(stale(), "hack.bench.docs")
    if args.add:
        if not args.commit:
            ap.error("--add needs --commit")
        print(f"filed {file_run(args.add, args.commit, args.date, args.ab)}")
    if not filed_runs():
        ap.error("no filed full run under results/bench/")
    write_docs(blocks())
    return 0


if __name__ == "__main__":
    sys.exit(main())
