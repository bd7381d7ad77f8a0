"""The memory probe's pure parts: the least-squares slope, the docs block rendered from a result
file, and one small probe in a process of its own (the operator's caches hold something per node)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack import memprobe

RESULT = {
    "commit": "abc1234",
    "date": "2026-12-01T00:00:00Z",
    "machine": {"python": "3.11.7", "nproc": 2, "load_average": [1.0, 1.0, 1.0]},
    "fleet": {"gpus_per_node": 8, "pods_per_node": 8, "leases": True},
    "results": [
        {"nodes": 1000, "bytes": 20_480_000, "bytes_per_node": 20480},
        {"nodes": 2000, "bytes": 40_960_000, "bytes_per_node": 20480},
    ],
    "sites": {"nodes": 1000, "top": [{"site": "operator/gpuhealth/controller/slim.py:1", "bytes_per_node": 900}]},
    "slope_bytes_per_node": 20480,
    "intercept_bytes": 0,
}


def test_fit_finds_the_slope_and_intercept() -> None:
    slope, intercept = memprobe.fit(
        [(1000, 5_000_000 + 20_000_000), (5000, 5_000_000 + 100_000_000), (10000, 5_000_000 + 200_000_000)]
    )
    assert slope == pytest.approx(20_000)
    assert intercept == pytest.approx(5_000_000)


def test_render_states_the_figures_of_the_file_between_the_markers(tmp_path: Path) -> None:
    block = memprobe.render(RESULT, "results/bench/memprobe-x.json")
    assert block.startswith(memprobe.BEGIN) and block.endswith(memprobe.END)
    assert "| 1,000 | 19.5 | 20.0 |" in block
    assert "**20.0 KiB per node**" in block and "`abc1234`" in block and "results/bench/memprobe-x.json" in block
    doc = tmp_path / "bench.md"
    doc.write_text(f"before\n{memprobe.BEGIN}\nold figures\n{memprobe.END}\nafter\n")
    memprobe.write_doc(block, doc)
    text = doc.read_text()
    assert "old figures" not in text and text.startswith("before\n") and text.endswith("\nafter\n")
    assert block in text


def test_a_small_probe_counts_bytes_held_per_node() -> None:
    # In a process of its own: after the integration tests in this one, their leftover threads'
    # allocations counted too (4.3 MB over a 20-node probe in a full `make test`).
    assert 2_000 < memprobe.probe_alone(20) / 20 < 200_000
