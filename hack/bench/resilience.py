"""The fleet is never blind (issue #26): three phases of `make bench` that take the operator out of its
steady state, each selectable on its own (``--phases``, see hack/bench/cli.py and docs/bench.md).

- **warm restart** (``restart``): restart the operator with every node evaluated; its writes during
  start-up (the audit log, the operator's user; target 0), the time to "watching", and from a restart
  to the first taint of a fault injected right after it;
- **failover** (``failover``): two replicas under Kopf peering; SIGKILL the acting one with the standby
  running, inject a fault right after, time the kill to its taint; the killed one comes back as the new
  standby;
- **drain storm** (``drain``, its workload in ``drain_workload``): many nodes, each with a mix of
  workload pods (checkpointing pods whose handshake the bench plays, pods that finish on SIGTERM, gangs
  across node pairs, a small Deployment under a PDB of maxUnavailable 1), faulted at once with drains
  that may all run at once; evictions per second, time to every drain Completed, the handshake's
  requests and acknowledgements, no pod evicted or asked twice (the audit log), and the PDB honoured
  (its Ready pods never below replicas - 1).

This module holds what the three share: the nodes left to fault, the operator processes they start.
The pure parts (the pod mix, the audit-log figures) are unit-tested in tests/unit/bench/test_resilience.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit.audit import read_audit
from devkit.k8s import OperatorProcess
from gpuhealth.controller.process.firstpass import LINE as FIRST_PASS_LINE
from hack.bench.cluster import BenchCluster
from hack.bench.fleet import SimNode
from hack.bench.support import find_log_line
from hack.bench.watch import NodeWatch, ReportWatch

WATCHING = r"watching \d+ GPU nodes"
PODS_LISTED = r"listed \d+ pods in"  # after "watching": the start-up's pod list is in
EVALUATED = re.escape(FIRST_PASS_LINE)  # then every node passed with its pods (controller/process/firstpass.py)
ACTING = r"acting \(this replica leads\)"


@dataclass
class ResilienceContext:
    """What the three phases share with the rest of the run."""

    cluster: BenchCluster
    out: Path
    admin: client.ApiClient
    operator_kubeconfig: Path
    operator_user: str
    sims: Mapping[str, SimNode]
    node_watch: NodeWatch
    report_watch: ReportWatch
    pool: ThreadPoolExecutor
    tick: float
    policy: str
    phase: Callable[[str], None]
    # Every operator process started here (the run's finally stops them all).
    operators: list[OperatorProcess] = field(default_factory=list)
    spare: list[str] = field(default_factory=list)  # governed nodes free of faults, taken in turn

    def take(self, n: int) -> list[str]:
        if len(self.spare) < n:
            raise RuntimeError(f"not enough fault-free nodes left: {n} wanted, {len(self.spare)} left")
        out, self.spare = self.spare[:n], self.spare[n:]
        return out

    def start_operator(self, name: str, extra: Sequence[str] = ()) -> tuple[OperatorProcess, Path, float]:
        """An operator process with its own log; (process, log, start time)."""
        path = self.out / f"operator-{name}.log"
        op = OperatorProcess(
            self.cluster,
            path,
            extra_args=[f"--kubeconfig={self.operator_kubeconfig}", f"--tick={self.tick}", *extra],
        )
        t0 = time.time()
        op.start(wait=False)
        self.operators.append(op)
        return op, path, t0

    def requests_between(self, start: float, end: float) -> list[Any]:
        """The operator's requests in [start, end), from one read of the audit log."""
        return [e for e in read_audit(self.cluster.audit_log, self.operator_user) if start <= e.at < end]


def wait_ready(op: OperatorProcess, path: Path) -> None:
    if find_log_line(path, WATCHING, timeout=600) is None:
        raise RuntimeError(f"operator did not start watching; see {path}")
