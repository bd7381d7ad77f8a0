"""The stack profile: busy stacks told from waiting ones, grouped by thread role, folded, summed."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from gpuhealth.controller.process import stackprofile as S


def _spin(stop: threading.Event, running: threading.Event) -> None:
    x = 0
    running.set()
    while not stop.is_set():
        x += 1


def _sleep(stop: threading.Event, running: threading.Event) -> None:
    running.set()
    stop.wait(30)


def test_a_busy_thread_is_busy_and_a_waiting_one_waits() -> None:
    stop, spinning, sleeping = threading.Event(), threading.Event(), threading.Event()
    # Idle pool threads other tests of this process left behind are sampled too (they wait as ours does).
    idle_drains = sum(1 for t in threading.enumerate() if t.name.startswith("drain_"))
    busy = threading.Thread(target=_spin, args=(stop, spinning), name="kube_0", daemon=True)
    idle = threading.Thread(target=_sleep, args=(stop, sleeping), name="drain_3", daemon=True)
    busy.start()
    idle.start()
    # Sampled only once both are in their loop and their wait (not still starting up).
    assert spinning.wait(10) and sleeping.wait(10)
    time.sleep(0.05)
    try:
        window = S.Window()
        prof = S.StackProfiler(Path("unused"))
        for _ in range(20):
            prof.sample(window)
            time.sleep(0.001)
    finally:
        stop.set()
    assert window.samples == 20
    assert window.busy["kube-pool"] >= 15 and window.waiting["drain-pool"] == 20 * (1 + idle_drains)
    spin = [k for k in window.stacks if k.startswith("kube-pool;")]
    assert spin and all(
        k.split(";")[1:4] == ["threading.py:_bootstrap", "threading.py:_bootstrap_inner", "threading.py:run"]
        for k in spin
    )
    assert all(any(f.endswith("test_stackprofile.py:_spin") for f in k.split(";")) for k in spin)
    assert not any(k.startswith("drain-pool;") for k in window.stacks)


def test_self_and_inclusive_time_sum_the_folded_stacks() -> None:
    stacks = {
        "event-loop;a.py:run;gpuhealth/controller/act/drainer.py:run;json/encoder.py:encode": 5,
        "event-loop;a.py:run;gpuhealth/controller/act/drainer.py:run": 2,
        "kube-pool;b.py:call;gpuhealth/kube/client.py:evict_pod;json/encoder.py:encode": 3,
    }
    assert S.self_time(stacks)[:2] == [("json/encoder.py:encode", 8), ("gpuhealth/controller/act/drainer.py:run", 2)]
    assert dict(S.inclusive_time(stacks)) == {
        "gpuhealth/controller/act/drainer.py:run": 7,
        "gpuhealth/kube/client.py:evict_pod": 3,
    }


def test_thread_groups() -> None:
    assert S.group_of("MainThread") == "event-loop"
    assert S.group_of("kube_12") == "kube-pool" and S.group_of("drain_0") == "drain-pool"
    assert S.group_of("nodes-watch") == "other"


def test_the_profiler_writes_a_line_per_window(tmp_path: Path) -> None:
    out = tmp_path / "stacks.jsonl"
    prof = S.StackProfiler(out, sample_hz=200, interval_s=1.0).start()
    deadline = time.monotonic() + 10
    # The file appears when the first window is opened for appending; wait for the whole line.
    while not (out.exists() and "\n" in out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    prof.stop()
    line = json.loads(out.read_text().splitlines()[0])
    assert line["samples"] > 10 and line["hz"] == 200 and "event-loop" in line["groups"]
    assert line["sampler_s"] >= 0 and isinstance(line["stacks"], dict)


def test_summary_of_a_window_range(tmp_path: Path) -> None:
    lines = [
        {
            "at": 10.0,
            "samples": 100,
            "sampler_s": 0.1,
            "groups": {"event-loop": {"busy": 50, "waiting": 50}},
            "stacks": {"event-loop;gpuhealth/x.py:f;json/encoder.py:encode": 50},
        },
        {
            "at": 20.0,
            "samples": 100,
            "sampler_s": 0.1,
            "groups": {"event-loop": {"busy": 90, "waiting": 10}, "kube-pool": {"busy": 20, "waiting": 300}},
            "stacks": {"event-loop;gpuhealth/x.py:g": 90},
        },
    ]
    s = S.summarize(lines, since=15.0)
    assert s["windows"] == 1 and s["busy_threads"] == {"event-loop": 0.9, "kube-pool": 0.2}
    assert s["self"] == [("gpuhealth/x.py:g", 90)] and s["gpuhealth"] == [("gpuhealth/x.py:g", 90)]
    both = S.summarize(lines)
    assert both["samples"] == 200 and both["busy_threads"]["event-loop"] == 0.7
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert S.main([str(path), "--until", "15"]) == 0
