"""docs/install.md's metrics reference is rendered from the registries (hack/gen_metrics_docs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from hack import gen_metrics_docs as gen


def test_the_metrics_reference_is_fresh() -> None:
    assert gen.main(["--check"]) == 0, "run: python -m hack.gen_metrics_docs"


def test_every_served_metric_has_one_row_and_a_stale_block_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = gen.block()
    for name in (
        "gpuhealth_actions_total",
        "gpuhealth_detection_to_action_seconds",
        "gpuhealth_agent_xid_events_total",
    ):
        assert block.count(f"| `{name}` |") == 1
    assert block.count("| `gpuhealth_watch_relists_total` |") == 1  # held under two names, one row
    stale = tmp_path / "install.md"
    stale.write_text(gen.DOC.read_text(encoding="utf-8").replace("| `gpuhealth_nodes` |", "| `gpuhealth_node` |"))
    monkeypatch.setattr(gen, "DOC", stale)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0


def test_a_metric_served_but_not_held_is_refused() -> None:
    registry = CollectorRegistry()
    held = Gauge("gpuhealth_held", "h", registry=registry)
    Gauge("gpuhealth_stray", "s", registry=registry)
    with pytest.raises(SystemExit, match="gpuhealth_stray"):
        gen.rows([held], registry)
