"""The freshness invariant: judged by when the sampler saw the heartbeat change, not by the agent's clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from hack.chaos.freshness import Freshness

WALL = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def report(hb: dt.datetime | None, state: str = "Healthy") -> dict[str, Any]:
    spec = {} if hb is None else {"heartbeatTime": hb.isoformat().replace("+00:00", "Z")}
    return {"spec": spec, "status": {"state": state}}


def node(label: str | None) -> dict[str, Any]:
    return {"metadata": {"labels": {"gpuhealth.dev/state": label} if label else {}}}


def run(f: Freshness, samples: Sequence[tuple[float, dict[str, Any] | None, dict[str, Any] | None]]) -> list[str]:
    out = []
    for at, rep, nd in samples:
        out += [kind for kind, _ in f.observe(at, WALL + dt.timedelta(seconds=at), "n", rep, nd, after=20)]
    return out


def test_heartbeats_changing_keep_a_healthy_node_clean() -> None:
    f = Freshness(slack=5)
    samples = [(float(t), report(WALL + dt.timedelta(seconds=t - t % 4)), node("Healthy")) for t in range(0, 120)]
    assert run(f, samples) == []


def test_healthy_on_a_silent_report_fires() -> None:
    f = Freshness(slack=5)
    hb = WALL
    assert run(f, [(0.0, report(hb), None), (24.0, report(hb), None)]) == []
    assert "fresh" in run(f, [(26.0, report(hb), None)])


def test_a_heartbeat_from_the_future_does_not_hide_silence() -> None:
    f = Freshness(slack=5)
    ahead = WALL + dt.timedelta(hours=1)
    kinds = run(f, [(0.0, report(ahead), None), (30.0, report(ahead), None)])
    assert kinds == ["fresh"]  # the agent's clock says fresh; the sampler's says 30 s unchanged


def test_unknown_after_silence_is_clean() -> None:
    f = Freshness(slack=5)
    assert run(f, [(0.0, report(WALL), None), (30.0, report(WALL, "Unknown"), None)]) == []


def test_an_outage_gives_the_operator_slack_after_the_api_returns() -> None:
    f = Freshness(slack=5)
    assert run(f, [(0.0, report(WALL), None)]) == []
    f.unreadable()  # the API server is down from 1 s to 40 s
    assert run(f, [(40.0, report(WALL), None), (44.0, report(WALL), None)]) == []
    assert "fresh" in run(f, [(46.0, report(WALL), None)])


def test_healthy_verdict_after_the_report_went_away_fires() -> None:
    f = Freshness(slack=5)
    assert run(f, [(0.0, report(WALL), node("Healthy")), (1.0, None, node("Healthy"))]) == []
    assert run(f, [(7.0, None, node("Healthy"))]) == ["missing"]
    assert run(f, [(8.0, None, node("Unknown"))]) == []


def test_healthy_without_any_heartbeat_fires() -> None:
    assert run(Freshness(), [(0.0, report(None), None)]) == ["fresh"]
