"""The end-to-end figure of `make bench`: from the GPU event itself to the taint, through real agents.

Real ``gpuhealth-agent`` processes run on the fake NVML library, each on its own governed node. One
fault at a time, an XID 79 (node scope) is injected into one agent's scenario; the fake library logs
the instant it hands the event to the agent (FAKE_NVML_EMIT_LOG). Three instants per fault:

- ``emitted``: the library hands the XID to the agent's event wait;
- ``report``: the independent report watch first sees a report write carrying that XID;
- ``taint``: the independent Node watch first sees the gpuhealth taint.

emitted -> taint is the end-to-end figure; report -> taint the operator's share (API server, watch,
operator, Node patch, watch); emitted -> report the agent's share (event hand-off, publisher, report
write, watch). Each fault is cleared as a repaired node is returned: the release annotation
(`kubectl gpuhealth release --force`), which acknowledges the evidence up to then; the node goes
through probation back to Healthy and untainted, and the next fault can land on it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit.agents import Agent, AgentFleet
from hack.bench.support import FAULT_TIMEOUT_S, MERGE, TAINT, latency_summary, log, percentile
from hack.bench.watch import NodeWatch, ReportWatch

RELEASE_ANNOTATION = "gpuhealth.dev/release"
E2E_XID = 79  # node scope: the whole node is tainted
RECOVERY_TIMEOUT_S = 60.0  # release -> probation -> Healthy, untainted (probation 2 s, sweep every --tick)
GPUS = 8


def real_agents(kubeconfig: Path, workdir: Path, lease_namespace: str, library: Path | None = None) -> AgentFleet:
    """Real agents as a node runs them: interval 10 s, Lease heartbeat 30 s, the production event wait
    (1 s, not the tests' short one); metrics server off (they share this host)."""
    return AgentFleet(
        kubeconfig,
        workdir,
        interval=10.0,
        heartbeat=30.0,
        event_timeout=None,
        library=library,
        lease_namespace=lease_namespace,
    )


@dataclass(frozen=True)
class Sample:
    """One fault's instants (Unix seconds); None where it was not seen in time."""

    emitted: float | None
    report: float | None
    taint: float | None


@dataclass(frozen=True)
class Split:
    """One fault's latencies in milliseconds: end to end, the operator's share and the agent's."""

    e2e_ms: float | None
    operator_ms: float | None
    agent_ms: float | None


def split(s: Sample) -> Split:
    """The three latencies of one fault; a part is None when one of its instants is missing."""

    def ms(a: float | None, b: float | None) -> float | None:
        return (b - a) * 1000 if a is not None and b is not None else None

    return Split(ms(s.emitted, s.taint), ms(s.report, s.taint), ms(s.emitted, s.report))


def plan(faults: int, agents: int) -> list[tuple[int, int]]:
    """(agent index, GPU) of each fault: round robin over the agents, a new GPU on each round."""
    return [(i % agents, (i // agents) % GPUS) for i in range(faults)] if agents > 0 else []


def next_agent(planned: int, agents: int, stuck: set[int]) -> int | None:
    """The planned agent, or the next one round the ring whose node came back; None when none did."""
    return next((j % agents for j in range(planned, planned + agents) if j % agents not in stuck), None)


def emitted_at(emitted: Mapping[int, float], seq: int) -> float | None:
    """When the fake library handed XID ``seq`` to the agent, if it did."""
    return emitted.get(seq)


def summarize(samples: list[Sample], timeout_ms: float) -> dict[str, Any]:
    """The ``e2e`` block: p50/p90/p99/max of each latency, with counts and timeouts.

    A fault whose taint never came counts as the timeout in the end-to-end and operator figures (a lower
    bound), as the other one-at-a-time figures do; one whose report write was never seen counts in the
    agent's share the same way. A fault the library never handed over is a timeout of all three.
    """
    parts = [split(s) for s in samples]
    e2e = [p.e2e_ms for p in parts if p.e2e_ms is not None]
    op = [p.operator_ms for p in parts if p.operator_ms is not None]
    agent = [p.agent_ms for p in parts if p.agent_ms is not None]
    return {
        "faults": len(samples),
        "not_emitted": sum(1 for s in samples if s.emitted is None),
        "emit_to_taint_ms": latency_summary(e2e, len(samples) - len(e2e), timeout_ms),
        "report_to_taint_ms": latency_summary(op, len(samples) - len(op), timeout_ms),
        "emit_to_report_ms": latency_summary(agent, len(samples) - len(agent), timeout_ms),
    }


def _wait_emitted(agent: Agent, seq: int, timeout: float) -> float | None:
    """The library's emit instant of ``seq``; the log line is written before the agent even sees the event."""
    deadline = time.monotonic() + timeout
    while True:
        at = emitted_at(agent.emitted(), seq)
        if at is not None or time.monotonic() >= deadline:
            return at
        time.sleep(0.05)


def release(core: client.CoreV1Api, node: str) -> None:
    """What `kubectl gpuhealth release --force` does: the operator clears the evidence up to now."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_node(node, {"metadata": {"annotations": {RELEASE_ANNOTATION: stamp}}}, _content_type=MERGE)


def measure_e2e(
    agents: list[Agent],
    faults: int,
    node_watch: NodeWatch,
    report_watch: ReportWatch,
    core: client.CoreV1Api,
    series: dict[str, Any],
) -> dict[str, Any]:
    """Inject ``faults`` XIDs one at a time into the agents' fake libraries; the ``e2e`` result block."""
    nodes = [a.node for a in agents]
    report_watch.track_xids.update(nodes)
    if not report_watch.wait_states(nodes, "Healthy", timeout=120):
        log(f"  not every real agent's node is Healthy: {[(n, report_watch.states.get(n)) for n in nodes]}")
    samples: list[Sample] = []
    not_recovered = 0
    stuck: set[int] = set()  # agents whose node did not come back: later faults go to the others
    for i, (planned, gpu) in enumerate(plan(faults, len(agents))):
        ai = next_agent(planned, len(agents), stuck)
        if ai is None:
            log(f"  no real agent's node came back after its release: {faults - i} faults not injected")
            break
        agent = agents[ai]
        node = agent.node
        before = report_watch.xids_of(node)
        agent.inject_xid(gpu, E2E_XID)
        seq = agent.xid_seq
        taint = node_watch.wait_taint(node, TAINT, timeout=FAULT_TIMEOUT_S)
        report = report_watch.wait_new_xid(node, before, E2E_XID, gpu, timeout=1.0)
        emitted = _wait_emitted(agent, seq, timeout=1.0)
        samples.append(Sample(emitted, report, taint))
        release(core, node)
        back = node_watch.wait_all([node], TAINT, timeout=RECOVERY_TIMEOUT_S, present=False)
        healthy = report_watch.wait_states([node], "Healthy", timeout=RECOVERY_TIMEOUT_S)
        if not (back and healthy):
            not_recovered += 1
            stuck.add(ai)
            log(
                f"  {node} not back to Healthy and untainted within {RECOVERY_TIMEOUT_S:.0f}s after its release;"
                " the rest of the faults go to the other agents"
            )
        if (i + 1) % 10 == 0:
            done = [p.e2e_ms for p in map(split, samples) if p.e2e_ms is not None]
            log(f"  {i + 1}/{faults}: end-to-end p50 so far {percentile(done, 50):.0f} ms")
    out = summarize(samples, FAULT_TIMEOUT_S * 1000)
    out.update(
        {"agents": len(agents), "xid": E2E_XID, "not_recovered": not_recovered, "not_injected": faults - len(samples)}
    )
    series["e2e_ms"] = [p.e2e_ms for p in map(split, samples) if p.e2e_ms is not None]
    return out
