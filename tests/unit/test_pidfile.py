"""`make cluster-down`'s record of what a local run left running: stop exactly that, never a reused pid."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from devkit import pidfile


def test_stops_recorded_processes_and_spares_reused_pids(tmp_path: Path) -> None:
    recorded = subprocess.Popen(["sleep", "600"])
    reused = subprocess.Popen(["sleep", "600"])
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        pidfile.record(tmp_path, {"etcd": recorded.pid})
        data = json.loads((tmp_path / "pids.json").read_text())
        data["operator"] = {"pid": reused.pid, "start": (pidfile.start_time(reused.pid) or 0) + 1}
        (tmp_path / "pids.json").write_text(json.dumps(data))

        stopped = pidfile.stop_recorded(tmp_path)

        assert stopped == [("etcd", recorded.pid)]
        assert recorded.wait(5) is not None
        assert reused.poll() is None and bystander.poll() is None
        assert not (tmp_path / "pids.json").exists()
        assert pidfile.stop_recorded(tmp_path) == []
    finally:
        for p in (recorded, reused, bystander):
            p.kill()
            p.wait()


def test_clients_stop_before_the_control_plane(tmp_path: Path) -> None:
    procs = {name: subprocess.Popen(["sleep", "600"]) for name in ("etcd", "kube-apiserver", "agent/n1", "operator")}
    try:
        pidfile.record(tmp_path, {n: p.pid for n, p in procs.items()})
        order = [name for name, _ in pidfile.stop_recorded(tmp_path)]
        assert order == ["agent/n1", "operator", "kube-apiserver", "etcd"]
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_hand_over_adds_the_demo_processes_to_the_control_plane(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        pidfile.record(tmp_path / "demo", {"etcd": proc.pid})
        path = pidfile.hand_over(tmp_path / "demo", tmp_path / "cluster", {"operator": proc.pid})
        assert set(json.loads(path.read_text())) == {"etcd", "operator"}
    finally:
        proc.kill()
        proc.wait()
