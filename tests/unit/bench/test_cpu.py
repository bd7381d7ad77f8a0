"""CPU per process over a window, the stack profile summed over it, and the drain line that says so."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hack.bench import cpu
from hack.bench.details import storm_cpu


def test_a_window_counts_the_cpu_a_process_spent_in_it() -> None:
    window = cpu.CpuWindow({"bench": os.getpid(), "gone": 2**22 + 7}).start()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    used = window.stop()
    assert 0.2 <= used["cpu_s"]["bench"] <= 5.0 and "gone" not in used["cpu_s"]
    assert used["cores"] >= 1 and 0.0 <= used["machine_busy"] <= 1.0


def test_stack_summaries_read_each_operators_file_over_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cpu.STACK_PROFILE_ENV, str(tmp_path / "stacks-{pid}.jsonl"))
    line = {
        "at": 100.0,
        "samples": 10,
        "groups": {"event-loop": {"busy": 9, "waiting": 1}},
        "stacks": {"event-loop;gpuhealth/a.py:f": 9},
    }
    (tmp_path / "stacks-41.jsonl").write_text(json.dumps(line) + "\n" + json.dumps({**line, "at": 500.0}) + "\n")
    got = cpu.stack_summaries({"operator-peer-1": 41, "kube-apiserver": 42, "operator-peer-2": 43}, 90.0, 110.0)
    assert list(got) == ["operator-peer-1"] and got["operator-peer-1"]["samples"] == 10
    monkeypatch.delenv(cpu.STACK_PROFILE_ENV)
    assert cpu.stack_summaries({"operator-peer-1": 41}, 0, 1e9) == {}


def test_the_drain_line_says_where_the_time_went_only_when_measured() -> None:
    assert storm_cpu({}) == ""
    d = {
        "cpu": {
            "wall_s": 40.0,
            "cores": 2,
            "machine_busy": 0.97,
            "cpu_s": {"kube-apiserver": 41.2, "operator-peer-1": 22.0, "etcd": 6.1},
        },
        "operator_stacks": {
            "operator-peer-1": {
                "samples": 2000,
                "busy_threads": {"event-loop": 0.61, "drain-pool": 0.2},
                "gpuhealth": [["gpuhealth/controller/act/drainer.py:run", 700]],
            },
            "operator-peer-2": {"samples": 2000, "busy_threads": {"event-loop": 0.01}, "gpuhealth": []},
        },
    }
    text = storm_cpu(d)
    assert "kube-apiserver 41.2 s, operator-peer-1 22.0 s, etcd 6.1 s, the machine 97% busy" in text
    assert "(operator-peer-1, 2000 samples)" in text and "event-loop 0.61" in text
    assert "`gpuhealth/controller/act/drainer.py:run` 700" in text


def test_every_operator_the_bench_started_is_counted(tmp_path: Path) -> None:
    """The run's first operator is not one of the phases' own: it is found among the bench's children."""
    import subprocess
    import sys
    from types import SimpleNamespace

    script = tmp_path / "gpuhealth-operator"
    script.write_text("import time\ntime.sleep(30)\n")
    child = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 10
        pids: dict[str, int] = {}
        while time.monotonic() < deadline and f"operator-{child.pid}" not in pids:
            pids = cpu.run_processes(SimpleNamespace(procs={}), [])  # type: ignore[arg-type]
            time.sleep(0.05)
        assert pids[f"operator-{child.pid}"] == child.pid and pids["bench"] == os.getpid()
    finally:
        child.kill()
        child.wait()
