"""docs/scaling.md's curve, generated from the filed bench runs of every fleet size.

One replica's limits are read off full `make bench` runs filed under results/bench/ (bench-N-*.json,
filed with ``python -m hack.bench.docs --add``). The newest filed run of each node count is one
point of the curve; this renders the marked table in docs/scaling.md from those points (with the
commit and date of each, since the points may come from different commits) and draws
docs/scaling.png (latency, memory, start-up and storm against nodes). A unit test
(tests/unit/bench/test_scaling_docs.py) fails when the table differs from its rendering.

    python -m hack.bench.scaling_docs            # re-render the table and the plot
    python -m hack.bench.scaling_docs --check    # exit 1 if the table is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devkit.docblocks import check, rewrite
from hack.bench.docs import RESULTS, core_run, dig, filed_runs, resilience_table
from hack.bench.targets import RATIO_MAX, RATIO_MISSED, RATIO_UNMEASURED, measured, ratio_of, targets_for

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "scaling.md"
PLOT = REPO / "docs" / "scaling.png"
BEGIN = "<!-- scaling:begin (python -m hack.bench.scaling_docs) -->"
END = "<!-- scaling:end -->"


def points(runs: list[tuple[Path, dict[str, Any]]]) -> list[tuple[Path, dict[str, Any]]]:
    """The newest run with the core phases of each node count (``runs`` oldest first), smallest fleet first."""
    newest: dict[int, tuple[Path, dict[str, Any]]] = {}
    for path, res in runs:
        if core_run(res):
            newest[int(res["nodes"])] = (path, res)
    return [newest[n] for n in sorted(newest)]


def _ms(v: Any) -> str:
    return f"{v:,.0f}" if isinstance(v, int | float) else "n/a"


def slope_kb_per_node(pts: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of peak RSS (MB) against nodes, in KB per node; None below two sizes."""
    if len({n for n, _ in pts}) < 2:
        return None
    mx = sum(n for n, _ in pts) / len(pts)
    my = sum(m for _, m in pts) / len(pts)
    num = sum((n - mx) * (m - my) for n, m in pts)
    den = sum((n - mx) ** 2 for n, _ in pts)
    return num / den * 1000


def missed(res: dict[str, Any]) -> list[str]:
    """The labels of the targets a run of its size missed (only those it measured)."""
    out = []
    for t in targets_for(int(res["nodes"])):
        e = res["targets"].get(t.key)
        if measured(e) and e is not None and not e["pass"]:
            out.append(f"{t.label} ({e['value']}, target {t.target})")
    return out


def ratios(res: dict[str, Any]) -> str:
    """Each figure's ratio to its floor from the same run (issue #52: <= 1.5x), those over it named; the
    figures with a floor path and none measured counted apart."""
    judged, over, unmeasured = [], [], 0
    for t in targets_for(int(res["nodes"])):
        r = ratio_of(t, res["targets"].get(t.key), res)
        if t.floor is None:
            continue
        if r is None or r["status"] == RATIO_UNMEASURED:
            unmeasured += 1
            continue
        judged.append(t)
        if r["status"] == RATIO_MISSED:
            over.append(f"{t.label} ({r['ratio']}x)" if r.get("ratio") is not None else t.label)
    head = f"{len(judged) - len(over)} of {len(judged)} within {RATIO_MAX:g}x" if judged else "no floor measured"
    tail = f"; over it: {'; '.join(over)}" if over else ""
    rest = f" ({unmeasured} without a floor measured)" if judged and unmeasured else ""
    return f"{head}{rest}{tail}."


PHASE = re.compile(r"^\[[0-9:]+\]\s+\((?P<what>.+) took (?P<took>[0-9]+ min [0-9]+ s|[0-9]+ s); [0-9.]+ min in\)$")
STARTUP = re.compile(
    r"'watching \.\.\. GPU nodes' after (?P<watch>[0-9.]+)s; all (?P<n>[0-9]+) nodes Healthy after (?P<all>[0-9.]+)s"
)
SO_FAR = re.compile(r"(?P<done>[0-9]+)/(?P<total>[0-9]+): p50 so far (?P<p50>[0-9]+) ms")
E2E_SO_FAR = re.compile(r"(?P<done>[0-9]+)/(?P<total>[0-9]+): end-to-end p50 so far (?P<p50>[0-9]+) ms")
NOT_BACK = re.compile(r"not back to Healthy and untainted within (?P<s>[0-9]+)s after its release")
DETECT = re.compile(r"detect p50 (?P<p50>[0-9.]+) ms p99 (?P<p99>[0-9.]+) ms; floor p50 (?P<floor>[0-9.]+) ms")


def stopped_runs(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Runs stopped before their end (results/bench/stopped-*.json): the cluster's state when stopped."""
    return [(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(directory.glob("stopped-*.json"))]


def render_stopped(path: Path, s: dict[str, Any]) -> list[str]:
    """What a stopped run got through (from its own log) and the state it was stopped in."""
    log = (path.parent / s["log"]).read_text(encoding="utf-8").splitlines()
    phases = [m.group("what", "took") for line in log if (m := PHASE.match(line))]
    start = next((m for line in log if (m := STARTUP.search(line))), None)
    so_far = [m for line in log if (m := SO_FAR.search(line))]
    ages, procs = s["lease_age_s"], s["processes"]
    lines = [
        f"**Stopped: {s['nodes']:,} nodes, {s['pods']:,} pods** (commit `{s['commit']}`, {s['date'][:10]}, "
        f"{s['cpus']} cores, {s['memory_gb']} GiB; `{path.name}` and its log `{s['log']}`): {s['what']}. "
        "Phases it completed:",
        "",
        "| phase | took |",
        "| --- | --- |",
        *[f"| {what} | {took} |" for what, took in phases],
        "",
    ]
    if start:
        lines.append(
            f"Operator start-up: watching after {start['watch']} s, all {int(start['n']):,} nodes evaluated after "
            f"{start['all']} s."
        )
    detect = next((m for line in log if (m := DETECT.search(line))), None)
    if detect:
        lines.append(
            f"Detection to taint ({so_far[-1]['total'] if so_far else 'all'} faults): p50 {detect['p50']} ms, "
            f"p99 {detect['p99']} ms; the no-logic floor p50 {detect['floor']} ms."
        )
    elif so_far:
        m = so_far[-1]
        lines.append(f"Detection to taint when stopped: p50 {m['p50']} ms after {m['done']} of {m['total']} faults.")
    e2e = [m for line in log if (m := E2E_SO_FAR.search(line))]
    if e2e:
        lines.append(
            f"End to end when stopped: p50 {e2e[-1]['p50']} ms after {e2e[-1]['done']} of {e2e[-1]['total']} XIDs."
        )
    late = [m for line in log if (m := NOT_BACK.search(line))]
    if late:
        lines.append(
            f"Released nodes not back to Healthy and untainted within {late[0]['s']} s: {len(late)} "
            "(the end-to-end phase waits that long for each)."
        )
    lines += [
        "",
        f"When stopped (load average {' / '.join(str(x) for x in s['load_average'])}): node verdicts "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(s["node_states"].items()))
        + f"; age of the {s['leases']:,} agent Leases' last renewal p10 {ages['p10']} s, p50 {ages['p50']} s, "
        f"p90 {ages['p90']} s (renewed every 30 s when keeping up); processes: "
        + ", ".join(
            f"{name} {p['rss_mb']:,} MB RSS, {p['cpu_s']:,} CPU s over {p['age_s']:,} s"
            for name, p in sorted(procs.items())
        )
        + ".",
    ]
    return lines


def render(runs: list[tuple[Path, dict[str, Any]]], stopped: Sequence[tuple[Path, dict[str, Any]]] = ()) -> str:
    pts = points(runs)
    lines = [
        BEGIN,
        "| nodes | pods | commit, date | detection to taint p50 / p99 (ms) | XID to taint end to end p50 / p99 (ms) "
        "| storm (nodes/s) | operator peak RSS (MB) | start-up to every node evaluated (s) "
        "| idle operator CPU (% of a core) | targets met |",
        "| ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    rss: list[tuple[int, float]] = []
    for path, r in pts:
        held = [t for t in targets_for(int(r["nodes"])) if t.absolute]
        met = sum(1 for t in held if measured(e := r["targets"].get(t.key)) and e and e["pass"])
        counted = sum(1 for t in held if measured(r["targets"].get(t.key)))
        peak = dig(r, "operator", "peak_rss_mb")
        if isinstance(peak, int | float):
            rss.append((int(r["nodes"]), float(peak)))
        lines.append(
            f"| {r['nodes']:,} | {r.get('pods', 0):,} | `{r['commit']}`, {str(r['date'])[:10]} (`{path.name}`) "
            f"| {_ms(dig(r, 'detect_to_taint_ms', 'p50'))} / {_ms(dig(r, 'detect_to_taint_ms', 'p99'))} "
            f"| {_ms(dig(r, 'e2e', 'emit_to_taint_ms', 'p50'))} / {_ms(dig(r, 'e2e', 'emit_to_taint_ms', 'p99'))} "
            f"| {dig(r, 'storm', 'nodes_per_s')} | {peak} | {dig(r, 'operator', 'startup_s')} "
            f"| {dig(r, 'operator', 'idle_cpu_percent')} | {met} of {counted} |"
        )
    slope = slope_kb_per_node(rss)
    lines.append("")
    if slope is None:
        lines.append("Peak RSS per node: one fleet size filed so far, no slope to fit.")
    else:
        lines.append(
            f"Operator peak RSS, least-squares slope across the {len(rss)} sizes: **{slope:,.1f} KB per node** "
            "(peak RSS includes the transient peaks of the storm and start-up, not only what is held)."
        )
    for _, r in pts:
        miss = missed(r)
        lines.append("")
        lines.append(f"Missed at {r['nodes']:,} nodes: " + ("; ".join(miss) + "." if miss else "nothing it measured."))
        lines.append("")
        lines.append(f"Against the no-logic floor at {r['nodes']:,} nodes: {ratios(r)}")
    for path, stop in stopped:
        lines += ["", *render_stopped(path, stop)]
    if table := resilience_table(runs):
        lines += ["", *table]
    lines.append(END)
    return "\n".join(lines)


def stopped_figures(path: Path, s: dict[str, Any]) -> dict[str, float]:
    """What a stopped run measured before it was stopped: start-up, detection, RSS when stopped."""
    log = (path.parent / s["log"]).read_text(encoding="utf-8")
    out: dict[str, float] = {"nodes": float(s["nodes"])}
    if m := STARTUP.search(log):
        out["startup_s"] = float(m["all"])
    if m := DETECT.search(log):
        out["detect_p50"], out["detect_p99"] = float(m["p50"]), float(m["p99"])
    elif so_far := SO_FAR.findall(log):
        out["detect_p50"] = float(so_far[-1][2])
    if op := s["processes"].get("gpuhealth-operator"):
        out["rss_mb"] = float(op["rss_mb"])
    return out


def plot(
    runs: list[tuple[Path, dict[str, Any]]],
    stopped: Sequence[tuple[Path, dict[str, Any]]] = (),
    out: Path = PLOT,
) -> None:
    """Latency, memory, start-up and storm rate against the fleet size, one marker per filed size;
    what stopped runs measured before they were stopped as hollow grey markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for _, r in points(runs)]
    n = [r["nodes"] for r in pts]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    for label, keys in (
        ("detection p50", ("detect_to_taint_ms", "p50")),
        ("detection p99", ("detect_to_taint_ms", "p99")),
        ("end to end p50", ("e2e", "emit_to_taint_ms", "p50")),
        ("end to end p99", ("e2e", "emit_to_taint_ms", "p99")),
        ("no-logic floor p50 (same API server)", ("floor_ms", "p50")),
    ):
        ys = [dig(r, *keys) for r in pts]
        ax.plot(n, ys, marker="o", label=label, **({"linestyle": "--", "color": "grey"} if "floor" in label else {}))
    ax.set(title="XID to taint (ms)", xscale="log", yscale="log", xlabel="nodes")
    ax.legend()
    for ax, title, keys in (
        (axes[0][1], "operator peak RSS (MB)", ("operator", "peak_rss_mb")),
        (axes[1][0], "start-up to every node evaluated (s)", ("operator", "startup_s")),
        (axes[1][1], "storm at 100% breaker (nodes/s)", ("storm", "nodes_per_s")),
    ):
        ax.plot(n, [dig(r, *keys) for r in pts], marker="o")
        ax.set(title=title, xscale="log", xlabel="nodes")
    cut = [stopped_figures(p, st) for p, st in stopped]
    grey = {"linestyle": "none", "markerfacecolor": "none", "color": "grey"}
    for ax, key, label, marker in (
        (axes[0][0], "detect_p50", "stopped runs: detection p50", "o"),
        (axes[0][0], "detect_p99", "stopped runs: detection p99", "s"),
        (axes[0][1], "rss_mb", "stopped runs: RSS when stopped", "o"),
        (axes[1][0], "startup_s", "stopped runs", "o"),
    ):
        xs = [c["nodes"] for c in cut if key in c]
        if xs:
            ax.plot(xs, [c[key] for c in cut if key in c], label=label, marker=marker, **grey)
            ax.legend()
    fig.suptitle("One gpuhealth operator replica against fleet size (filed runs under results/bench/)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def stale() -> list[Path]:
    text = DOC.read_text(encoding="utf-8")
    return [DOC] if rewrite(text, render(filed_runs(), stopped_runs(RESULTS))) != text else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/scaling.md's table is stale")
    args = ap.parse_args(argv)
    if args.check:
        return check(stale(), "hack.bench.scaling_docs")
    runs = filed_runs()
    if not runs:
        ap.error("no filed full run under results/bench/")
    DOC.write_text(rewrite(DOC.read_text(encoding="utf-8"), render(runs, stopped_runs(RESULTS))), encoding="utf-8")
    plot(runs, stopped_runs(RESULTS))
    print(f"rendered {DOC} and {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
