"""The record of what a local run left running, so `make cluster-down` stops exactly that.

``make cluster-up`` and ``make demo DEMO_ARGS=--keep`` leave processes behind on purpose: the
control plane, and for the demo also the operator and one agent per node. Each is recorded in
``pids.json`` by name with its pid *and* its start time (``/proc/<pid>/stat`` field 22), so a later
``down`` signals only a process that is still the very one recorded: a pid the kernel has since
handed to something else has another start time and is left alone. Nothing is ever stopped by name.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

PIDFILE = "pids.json"
# Stop order: the clients first (they would otherwise retry against a dying API server), then the
# control plane from the outside in.
_CONTROL_PLANE_ORDER = ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command (field 2) may contain spaces and parentheses; the fields after its last ')' are fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 overall


def entry(pid: int) -> dict[str, int | None]:
    return {"pid": pid, "start": start_time(pid)}


def record(workdir: Path, pids: Mapping[str, int]) -> None:
    """Add (or replace) named processes in ``workdir/pids.json``."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / PIDFILE
    current: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
    current.update({name: entry(pid) for name, pid in pids.items()})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(current, indent=1))
    os.replace(tmp, path)


def _order(name: str) -> tuple[int, str]:
    if name in _CONTROL_PLANE_ORDER:
        return (1 + _CONTROL_PLANE_ORDER.index(name), name)
    return (0, name)  # operator, agents and anything else recorded: before the control plane


def _still_ours(name: str, rec: object) -> int | None:
    """The pid to signal if the recorded process is still running, else None."""
    if isinstance(rec, int):  # an older pidfile: pid only; trust it only if the binary's name matches
        return rec if _alive(rec) and _argv0(rec).endswith("/" + name) else None
    if not isinstance(rec, dict) or not isinstance(rec.get("pid"), int):
        return None
    pid = int(rec["pid"])
    started = start_time(pid)
    return pid if started is not None and started == rec.get("start") and _alive(pid) else None


def stop_recorded(workdir: Path, timeout: float = 10.0) -> list[tuple[str, int]]:
    """Stop every process recorded in ``workdir/pids.json`` that is still the one recorded.

    SIGTERM first, SIGKILL after ``timeout``; returns (name, pid) of what was stopped, in order,
    and removes the pidfile.
    """
    path = workdir / PIDFILE
    if not path.exists():
        return []
    recorded: dict[str, object] = json.loads(path.read_text())
    stopped: list[tuple[str, int]] = []
    for name in sorted(recorded, key=_order):
        pid = _still_ours(name, recorded[name])
        if pid is None:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)
        stopped.append((name, pid))
    path.unlink()
    return stopped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False
    return "zombie" not in status


def _argv0(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def hand_over(source: Path, dest: Path, extra: Mapping[str, int]) -> Path:
    """Leave a run's processes for a later ``down`` in ``dest``: the control plane recorded in
    ``source/pids.json`` plus ``extra`` (the demo's operator and agents). Returns the pidfile."""
    dest.mkdir(parents=True, exist_ok=True)
    recorded: dict[str, object] = json.loads((source / PIDFILE).read_text())
    path = dest / PIDFILE
    path.write_text(json.dumps(recorded, indent=1))
    record(dest, extra)
    return path
