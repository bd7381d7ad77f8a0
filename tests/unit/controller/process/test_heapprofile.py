"""The opt-in heap profile finds the line that keeps memory, and never breaks the operator."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

from gpuhealth.controller.process.heapprofile import HeapProfiler

KEPT: list[bytes] = []


def hold(n: int) -> None:
    for _ in range(n):
        KEPT.append(bytes(1024))  # the growth the profile must name


def test_growth_names_the_allocating_line(tmp_path: Path) -> None:
    prof = HeapProfiler(tmp_path / "heap.jsonl", interval_s=3600, warmup_s=0)
    was_tracing = tracemalloc.is_tracing()
    tracemalloc.start(1)
    try:
        first = prof.sample(0.0)
        assert first["baseline"] is True and "growth" not in first
        hold(2000)
        second = prof.sample(10.0)
    finally:
        KEPT.clear()
        if not was_tracing:
            tracemalloc.stop()
    top = second["growth"][0]
    assert top["site"].endswith("test_heapprofile.py:17"), top
    assert top["size_diff"] >= 2000 * 1024
    assert second["traced_bytes"] > 0 and second["overhead_bytes"] > 0


def test_no_baseline_before_warmup(tmp_path: Path) -> None:
    prof = HeapProfiler(tmp_path / "heap.jsonl", interval_s=3600, warmup_s=60)
    was_tracing = tracemalloc.is_tracing()
    tracemalloc.start(1)
    try:
        early = prof.sample(5.0)
        later = prof.sample(61.0)
    finally:
        if not was_tracing:
            tracemalloc.stop()
    assert "baseline" not in early and "growth" not in early
    assert later.get("baseline") is True


def test_thread_writes_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "heap.jsonl"
    prof = HeapProfiler(path, interval_s=1, warmup_s=0).start()
    try:
        deadline = time.monotonic() + 10
        while not (path.exists() and path.read_text().count("\n") >= 2) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        prof.stop()
        tracemalloc.stop()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["baseline"] is True
    assert "growth" in lines[1]
