"""What each GPU node costs the operator in memory: ``python -m hack.memprobe --sizes 1000,5000,10000``.

In process, no control plane. For each size N it builds the operator's real ``Runtime`` (the store
with its caches, indexes, records and per-policy tallies; the pod and Lease feeders; the breaker,
the device reconciler) and feeds it, through the same ``on_*`` feeders the watches call, N Nodes
shaped like KWOK's (labels, 8 GPUs, allocatable, conditions, images, managed fields), N
GPUNodeHealth reports as the agent renders them (its real ``ReportBuilder``: 8 GPUs with ECC,
temperatures and an XID history) with the status the operator writes, N agent Leases and 8 pods
per node. It measures, with tracemalloc after a full collection, the bytes still held per node, fits
the per-node slope by least squares across the sizes and names the allocation sites that cost the
most per node. Kopf's own per-object bookkeeping and the interpreter's baseline are outside it (the
bench measures the whole process's RSS): the figures are a lower bound of the operator's RSS slope.

``--mig``: every node's GPUs in static MIG mode, 7 MIG devices each, and each node's ResourceSlice
fed through the slice watch as well (hack/memprobe/mig.py): the slice cache's cost per node.

Writes ``build/memprobe/memprobe.json`` (``memprobe-mig.json`` with ``--mig``; commit, date, machine)
and prints a table; ``--render`` rewrites the generated block of docs/bench.md from a result file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import linecache
import os
import platform
import re
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuhealth.controller.process.runtime import Runtime
from hack.memprobe import mig as memprobe_mig
from hack.memprobe.fleet import GPUS, PODS_PER_NODE, T0, lease_body, node_body, pod_body, policy_body, report_body

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "build" / "memprobe" / "memprobe.json"
DOC = REPO / "docs" / "bench.md"
BEGIN, END = "<!-- memprobe:begin (python -m hack.memprobe --render FILE) -->", "<!-- memprobe:end -->"
MIG_BEGIN = "<!-- memprobe-mig:begin (python -m hack.memprobe --render FILE) -->"
MIG_END = "<!-- memprobe-mig:end -->"
TOP = 8
FRAMES = 12


class _NoKube:
    """The probe makes no API call; any attempt is a bug in the probe."""

    def __getattr__(self, name: str) -> Any:
        def refuse(*_: Any, **__: Any) -> Any:
            raise RuntimeError(f"memprobe called the API: {name}")

        return refuse


def wire(body: dict[str, Any]) -> Any:
    """The body as a watch delivers it: decoded from JSON, so no key or value is shared between
    objects unless the operator shares it (the probe's own literals would be)."""
    return json.loads(json.dumps(body))


def feed_slice(rt: Runtime, body: dict[str, Any]) -> None:
    """A ResourceSlice through the slice watch: its ``follow`` slims the watch event, its cache keeps it."""
    for kind, item in rt.slice_watch.follow([{"type": "ADDED", "object": body}]):
        rt.slice_watch.cache.apply(kind, item)


def feed(rt: Runtime, n: int, mig: bool = False) -> None:
    """The fleet through the same feeders the watches call, one object at a time (no body kept); with
    ``mig``, each node's ResourceSlice through the slice watch's (``follow`` slims it, the cache keeps it)."""
    rt.on_policy("ADDED", wire(policy_body()), enqueue=False)
    for i in range(n):
        name = f"gpu-node-{i:05d}"
        rt.on_node("ADDED", wire(node_body(i)), enqueue=False)
        rt.on_report("ADDED", wire(report_body(i, name, mig)), enqueue=False)
        if mig:
            feed_slice(rt, wire(memprobe_mig.slice_body(i, name)))
        rt.on_lease("ADDED", wire(lease_body(i, name)), live=False)
        for k in range(PODS_PER_NODE):
            rt.on_pod("ADDED", wire(pod_body(i, k, name)), enqueue=False)


def probe(n: int, frames: int = 1, mig: bool = False) -> tuple[int, list[tuple[str, int]]]:
    """Bytes held after feeding ``n`` nodes, and the top allocation sites by bytes held (named well
    only with ``frames`` > 1, which makes tracemalloc several times slower)."""
    gc.collect()
    tracemalloc.start(frames)
    base = tracemalloc.take_snapshot()
    rt = Runtime(_NoKube(), clock=lambda: T0, workers=1)
    feed(rt, n, mig)
    gc.collect()
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    sites: dict[str, int] = {}
    for s in snap.compare_to(base, "traceback"):
        where = _site(s.traceback)
        sites[where] = sites.get(where, 0) + s.size_diff
    total = sum(sites.values())
    top = sorted(sites.items(), key=lambda kv: -kv[1])[:TOP]
    rt.pool.shutdown(wait=False)
    rt.events.close()
    del rt
    gc.collect()
    return total, top


def probe_alone(n: int, mig: bool = False) -> int:
    """``probe(n, mig=mig)``'s bytes, in a fresh interpreter: tracemalloc counts every thread's
    allocations, so a process with other threads at work (a test run's leftovers) counts theirs too."""
    code = f"from hack import memprobe; print(memprobe.probe({int(n)}, mig={bool(mig)})[0])"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def _site(tb: tracemalloc.Traceback) -> str:
    """The innermost line of the project that allocated it; for what the JSON decoder allocated
    (strings and numbers of the watched body that the cache kept), which feeder kept it."""
    for f in reversed(tb):  # innermost first
        path = Path(f.filename).resolve()
        if path == Path(__file__).resolve():
            line = linecache.getline(f.filename, f.lineno)
            feeder = re.search(r"rt\.(on_\w+)|(feed_slice)", line)
            if feeder:
                return f"values of the watched body kept by {feeder.group(1) or 'the slice watch'}"
            continue
        if REPO in path.parents and "json" not in path.parts:
            return f"{path.relative_to(REPO)}:{f.lineno}"
    return f"{tb[-1].filename}:{tb[-1].lineno}"


def fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least-squares line through (nodes, bytes): (bytes per node, intercept)."""
    k = len(points)
    if k < 2:
        n, b = points[0]
        return b / n, 0.0
    mx = sum(p[0] for p in points) / k
    my = sum(p[1] for p in points) / k
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    return slope, my - slope * mx


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


# -- what every probe's result file shares (this one's and the fleet probe's, hack/fleetprobe) --------


def header() -> dict[str, Any]:
    """The head of a probe's result file: the commit measured, when, and the machine with its load
    average as the run ended (a shared machine: the figures are under that load)."""
    return {
        "commit": commit(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "python": platform.python_version(),
            "nproc": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
    }


def save(data: dict[str, Any], out: Path) -> None:
    """Write a result file (to be filed under results/bench/ by hand, with its commit in the name)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")


def render_file(result: Path, render: Callable[[dict[str, Any], str], str], doc: Path) -> None:
    """Regenerate ``doc``'s block from a filed result: ``render(data, the file's path in the repo)``."""
    data = json.loads(result.read_text())
    write_doc(render(data, str(result.resolve().relative_to(REPO))), doc)


def run(sizes: list[int], mig: bool = False) -> dict[str, Any]:
    results = []
    for n in sizes:
        total, _ = probe(n, mig=mig)
        results.append({"nodes": n, "bytes": total, "bytes_per_node": round(total / n)})
        print(f"  {n:>6} nodes: {total / n / 1024:8.1f} KiB per node", file=sys.stderr)
    slope, intercept = fit([(r["nodes"], r["bytes"]) for r in results])
    # Where the bytes go, from a run at the smallest size with deep tracebacks (the slow part).
    n = min(sizes)
    _, top = probe(n, FRAMES, mig)
    return {
        **header(),
        "fleet": {
            "gpus_per_node": GPUS,
            "pods_per_node": PODS_PER_NODE,
            "leases": True,
            **(memprobe_mig.fleet() if mig else {}),
        },
        "results": results,
        "sites": {"nodes": n, "top": [{"site": s, "bytes_per_node": round(b / n)} for s, b in top]},
        "slope_bytes_per_node": round(slope),
        "intercept_bytes": round(intercept),
    }


def table(data: dict[str, Any]) -> Iterator[str]:
    yield "| nodes | held (MiB) | per node (KiB) |"
    yield "| ---: | ---: | ---: |"
    for r in data["results"]:
        yield f"| {r['nodes']:,} | {r['bytes'] / 2**20:,.1f} | {r['bytes_per_node'] / 1024:,.1f} |"


def render(data: dict[str, Any], source: str) -> str:
    """The docs block, generated from a result file."""
    m, f = data["machine"], data["fleet"]
    sites = data["sites"]
    mig = "mig_devices_per_node" in f
    shape = (
        f"{f['gpus_per_node']} GPUs in MIG mode x {f['mig_devices_per_gpu']} {f['mig_profile']} MIG devices "
        f"({f['mig_devices_per_node']} DRA devices in each node's ResourceSlice)"
        if mig
        else f"{f['gpus_per_node']} GPUs"
    )
    lines = [
        MIG_BEGIN if mig else BEGIN,
        f"{shape} and {f['pods_per_node']} pods per node; commit "
        f"`{data['commit']}`, {data['date']}, Python {m['python']} (`{source}`).",
        "",
        *table(data),
        "",
        f"Least-squares slope: **{data['slope_bytes_per_node'] / 1024:,.1f} KiB per node**. "
        + (f"{memprobe_mig.verdict(data)} " if mig else "")
        + f"Top allocation sites at {sites['nodes']:,} nodes (bytes per node):",
        "",
        "| site | per node (bytes) |",
        "| --- | ---: |",
        *[f"| `{t['site']}` | {t['bytes_per_node']:,} |" for t in sites["top"]],
        MIG_END if mig else END,
    ]
    return "\n".join(lines)


def write_doc(block: str, doc: Path = DOC) -> None:
    """Replace the block between the markers ``block`` starts and ends with (the MIG probe's has its own)."""
    begin, end = block.split("\n", 1)[0], block.rsplit("\n", 1)[-1]
    text = doc.read_text()
    if begin not in text:
        raise SystemExit(f"{doc}: no {begin!r} marker")
    head, rest = text.split(begin, 1)
    doc.write_text(head + block + rest.split(end, 1)[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000,10000", help="comma-separated node counts")
    ap.add_argument("--out", type=Path, default=None, help=f"result file (default {RESULT.relative_to(REPO)})")
    ap.add_argument(
        "--mig", action="store_true", help="every GPU in MIG mode (7 devices) and each node's ResourceSlice"
    )
    ap.add_argument("--render", type=Path, help="only regenerate docs/bench.md's block from this result file")
    a = ap.parse_args(argv)
    if a.render:
        render_file(a.render, render, DOC)
        return 0
    data = run([int(s) for s in a.sizes.split(",") if s], a.mig)
    save(data, a.out or (RESULT.with_name("memprobe-mig.json") if a.mig else RESULT))
    print("\n".join(table(data)))
    print(f"slope: {data['slope_bytes_per_node'] / 1024:.1f} KiB per node; top sites at {data['sites']['nodes']}:")
    for t in data["sites"]["top"]:
        print(f"  {t['bytes_per_node']:>8,} B/node  {t['site']}")
    return 0
