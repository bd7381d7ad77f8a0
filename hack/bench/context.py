"""What the phases of one `make bench` run share: the identities it runs under, everything it started
(stopped however far the run got), and the fleet, watches and operator start-up leaves to the phases
that measure.

The phases were one 480-line function whose locals were this state; each phase is now a function of
``Bench``, so what it reads and writes is named.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit.agents import Agent, AgentFleet
from devkit.k8s import OperatorProcess
from hack.bench.cluster import BenchCluster
from hack.bench.fleet import HeartbeatDriver, HeartbeatStats, SimNode
from hack.bench.support import PhaseClock, ProcSampler
from hack.bench.watch import NodeWatch, ReportWatch, RuleWatch

OPERATOR_USER, AGENT_USER, SIM_USER = "gpuhealth-operator", "gpuhealth-agent-bench", "gpuhealth-fleet-sim"
OPERATOR_WORKERS = 16  # the operator's concurrent passes (its default), given to it and to the start-up profile
E2E_USER = (
    "gpuhealth-agent-e2e"  # the faulted real agents: their own user, so the footprint agent's writes stay its own
)
TOKENS = {
    "bench-operator-token": (OPERATOR_USER, "system:masters"),
    "bench-agent-token": (AGENT_USER, "system:masters"),
    "bench-e2e-token": (E2E_USER, "system:masters"),
    "bench-sim-token": (SIM_USER, "system:masters"),
}
POLICY = "bench"
AGENT_POLICY = "bench-agents"  # governs the real agents' nodes only, so the fleet's breaker figures stay its own
AGENT_NODE = "agent-node-0000"


@dataclass
class Started:
    """Everything a run starts, recorded as it starts, so that ``stop`` (the run's ``finally``) stops
    what is running wherever a phase failed."""

    cluster: BenchCluster
    pool: ThreadPoolExecutor
    operator: OperatorProcess | None = None  # the operator start-up starts
    operators: list[OperatorProcess] = field(default_factory=list)  # those the restart and failover phases start
    fleets: list[AgentFleet] = field(default_factory=list)
    watches: list[NodeWatch | ReportWatch | RuleWatch] = field(default_factory=list)
    heartbeats: HeartbeatDriver | None = None
    samplers: list[ProcSampler] = field(default_factory=list)

    def stop(self) -> None:
        """Stop everything, each step whatever the one before it raised: a stuck agent once left the
        whole control plane running after a run stopped on a machine out of memory. The first error
        is raised at the end."""
        steps: list[Callable[[], Any]] = []
        if self.heartbeats is not None:
            steps.append(self.heartbeats.close)
        steps += [w.stop.set for w in self.watches]
        steps += [s.stop.set for s in self.samplers]
        steps.append(lambda: self.pool.shutdown(wait=False, cancel_futures=True))
        steps += [f.stop for f in self.fleets]
        if self.operator is not None:
            steps.append(self.operator.stop)
        steps += [op.kill for op in self.operators]
        steps.append(self.cluster.stop)
        first: BaseException | None = None
        for step in steps:
            try:
                step()
            except Exception as e:
                first = first or e
        if first is not None:
            raise first


@dataclass
class Bench:
    """The run once start-up is done: its settings and figures, the cluster and its clients, the
    simulated fleet and the real agents, the independent watches and the operator."""

    args: argparse.Namespace
    out: Path
    res: dict[str, Any]  # results.json, each phase adding its block
    series: dict[str, Any]  # series.json: the samples the plots draw
    phase: PhaseClock
    started: Started
    kc: dict[str, Path]  # each identity's kubeconfig, by user
    admin: client.ApiClient
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    governed: list[str]  # the nodes the fleet policy governs, sorted
    floor_names: list[str]  # the no-logic floor chain's nodes, outside every policy
    agent: Agent  # the footprint agent (AGENT_NODE)
    agent_sampler: ProcSampler
    e2e_fleet: AgentFleet  # the real agents the end-to-end phase faults
    mem_samplers: dict[str, ProcSampler]  # the control plane's processes and the bench's own
    sims: dict[str, SimNode]  # the simulated agents: governed and floor nodes
    hb_stats: HeartbeatStats
    hb_from: tuple[float, int]  # the heartbeats' mark once every node was Healthy
    mig_fleet: set[str]  # the MIG nodes (--phases mig: the first --mig-nodes governed ones)
    dra_nodes: list[str]  # the core phases' DRA nodes: the last governed ones
    used: set[str]  # nodes a phase has taken for its faults; later phases pick among the rest
    rule_watch: RuleWatch
    node_watch: NodeWatch
    report_watch: ReportWatch
    operator: OperatorProcess
    op_sampler: ProcSampler
    op_t0: float  # when the operator process started

    @property
    def cluster(self) -> BenchCluster:
        return self.started.cluster

    @property
    def pool(self) -> ThreadPoolExecutor:
        return self.started.pool
