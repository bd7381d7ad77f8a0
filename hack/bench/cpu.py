"""Where a phase's time went: CPU seconds of each process of the run over a window, and the
machine's busy share (issue #26: is the drain storm's rate the operator's, or what two shared cores
leave the API server?).

The control plane's processes, every operator still running and the bench itself are read through
``psutil`` at the window's start and end; a process that exits inside the window is counted up to
its last reading. With ``--stack-profile`` the operators also sample their own stacks
(``gpuhealth.controller.process.stackprofile``), summed here over the same window.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from devkit.cluster import LocalCluster
from devkit.k8s import OperatorProcess
from gpuhealth.controller.process.stackprofile import summarize

STACK_PROFILE_ENV = "GPUHEALTH_STACK_PROFILE"


def run_processes(cluster: LocalCluster, operators: Sequence[OperatorProcess]) -> dict[str, int]:
    """name -> pid of the control plane's processes, each live operator (by its log's name) and the bench."""
    pids = {name: p.popen.pid for name, p in cluster.procs.items() if p.popen is not None and p.popen.poll() is None}
    for op in operators:
        if op.popen is not None and op.popen.poll() is None:
            pids[op.log.stem] = op.popen.pid
    # The run's first operator is not among the phases' own: every operator the bench started counts.
    known = set(pids.values())
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in known and any(a.endswith("gpuhealth-operator") for a in child.cmdline()[:2]):
                pids[f"operator-{child.pid}"] = child.pid
        except psutil.Error:
            continue
    pids["bench"] = os.getpid()
    return pids


def _cpu(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(t.user + t.system)


class CpuWindow:
    """CPU seconds per process between :meth:`start` and :meth:`stop`."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self._at = 0.0
        self._start: dict[str, float] = {}
        self._machine: Any = None

    def start(self) -> CpuWindow:
        self._at = time.time()
        self._machine = psutil.cpu_times()
        self._start = {n: c for n, pid in self.pids.items() if (c := _cpu(pid)) is not None}
        return self

    def stop(self) -> dict[str, Any]:
        wall = time.time() - self._at
        end = psutil.cpu_times()
        total = sum(end) - sum(self._machine)
        idle = (end.idle + getattr(end, "iowait", 0.0)) - (self._machine.idle + getattr(self._machine, "iowait", 0.0))
        used = {
            n: round(c - self._start[n], 1)
            for n, pid in self.pids.items()
            if n in self._start and (c := _cpu(pid)) is not None
        }
        return {
            "wall_s": round(wall, 1),
            "cores": psutil.cpu_count(),
            "machine_busy": round(1 - idle / total, 3) if total > 0 else None,
            "cpu_s": dict(sorted(used.items(), key=lambda kv: -kv[1])),
        }


def stack_summaries(pids: Mapping[str, int], since: float, until: float, top: int = 12) -> dict[str, Any]:
    """Each operator's stack profile over [since, until], where the run set ``--stack-profile``."""
    template = os.environ.get(STACK_PROFILE_ENV, "")
    if not template:
        return {}
    out: dict[str, Any] = {}
    for name, pid in pids.items():
        path = Path(template.replace("{pid}", str(pid)))
        if not name.startswith("operator") or not path.exists():
            continue
        lines = [json.loads(raw) for raw in path.read_text().splitlines() if raw.strip()]
        s = summarize(lines, since, until)
        out[name] = {**s, "self": s["self"][:top], "gpuhealth": s["gpuhealth"][:top]}
    return out
