"""Real gpuhealth agents, one process per fake node, each reading its own fake NVML scenario."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from devkit.cluster import free_port
from devkit.fakenvml.build import build_fake_nvml


@dataclass
class Agent:
    node: str
    scenario: Path
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    lines: list[str] = field(default_factory=list)
    xid_seq: int = 0
    metrics_port: int = 0  # 0: no metrics server
    # Where the fake library logs each XID it hands to the agent (FAKE_NVML_EMIT_LOG).
    emit_log: Path | None = None
    # The agent's --state-dir (its XID journal). Kept across kill and launch, as the DaemonSet's
    # emptyDir survives a container restart.
    state_dir: Path | None = None
    # The agent's --sysfs-root: a fake sysfs tree of NIC ports (devkit/fakesysfs.py); None: NICs unwatched.
    sysfs: Path | None = None

    def write(self) -> None:
        tmp = self.scenario.with_suffix(".tmp")
        tmp.write_text("\n".join(self.lines) + "\n")
        os.replace(tmp, self.scenario)  # atomic: the library never sees half a file

    def set(self, line: str) -> None:
        self.lines.append(line)
        self.write()

    def unset(self, line: str) -> None:
        """Remove a directive (e.g. ``block <symbol>``: the blocked NVML call returns)."""
        self.lines = [ln for ln in self.lines if ln != line]
        self.write()

    def inject_xid(self, gpu: int, code: int, gi: int | None = None, ci: int | None = None) -> None:
        """An XID on ``gpu``; ``gi``/``ci`` attribute it to a MIG GPU/compute instance."""
        self.xid_seq += 1
        where = "".join(f" {k} {v}" for k, v in (("gi", gi), ("ci", ci)) if v is not None)
        self.set(f"xid {self.xid_seq} gpu {gpu} code {code}{where}")

    def inject_event(self, gpu: int, kind: str) -> None:
        """An NVML 13 event on ``gpu``: ``recovery_action`` (set the value first with
        ``set(f"gpu {gpu} recovery_action N")``) or ``unavailable``. Shares the XIDs' sequence."""
        self.xid_seq += 1
        self.set(f"event {self.xid_seq} gpu {gpu} type {kind}")

    def emitted(self) -> dict[int, float]:
        """XID seq -> the wall-clock instant (Unix seconds) the fake library delivered it to the agent."""
        if self.emit_log is None or not self.emit_log.exists():
            return {}
        out = {}
        for line in self.emit_log.read_text().splitlines():
            words = line.split()  # xid <seq> gpu <i> code <n> at <unix-ns>
            if len(words) == 8 and words[0] == "xid":
                out[int(words[1])] = int(words[7]) / 1e9
        return out

    def journal(self) -> list[dict[str, object]]:
        """The whole entries of the agent's XID journal (a torn last line is left out)."""
        path = self.state_dir / "xid-journal.jsonl" if self.state_dir else None
        if path is None or not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the agent with ``sig``; one that has not exited 15 s later is killed outright (a machine
        out of memory can leave a SIGTERMed process waiting that long, and a teardown must go on)."""
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(sig)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(15)


@dataclass
class AgentFleet:
    kubeconfig: Path
    workdir: Path
    interval: float = 1.0
    heartbeat: float = 5.0
    # Seconds one NVML event wait may block; tests use a short one, None keeps the agent's default.
    event_timeout: float | None = 0.2
    agents: dict[str, Agent] = field(default_factory=dict)
    library: Path | None = None
    # Serve each agent's /metrics on its own free port (Agent.metrics_port); off by default.
    metrics: bool = False
    # Renew a node Lease in this (existing) namespace as the heartbeat; None: heartbeat the report.
    lease_namespace: str | None = None
    # Seconds after which an NVML call that has not returned is a hang (--nvml-hang-after); None: the default.
    nvml_hang_after: float | None = None
    # Give each agent a fake sysfs tree (Agent.sysfs) for its NICs; off: the agents watch no NICs (never
    # the host's /sys).
    nics: bool = False

    def start(self, nodes: list[str]) -> AgentFleet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.library = self.library or build_fake_nvml(self.workdir / "lib")
        for node in nodes:
            agent = Agent(node, self.workdir / f"{node}.scenario", self.workdir / f"{node}.agent.log")
            agent.emit_log = self.workdir / f"{node}.emitted"
            agent.state_dir = self.workdir / "state" / node
            if self.nics:
                agent.sysfs = self.workdir / "sysfs" / node
                agent.sysfs.mkdir(parents=True, exist_ok=True)
            if self.metrics:
                agent.metrics_port = free_port()
            agent.write()
            self.agents[node] = agent
            self.launch(agent)
        return self

    def launch(self, agent: Agent, kubeconfig: Path | None = None) -> None:
        """(Re)start the agent's process; ``kubeconfig`` overrides the fleet's for this run."""
        exe = Path(sys.executable).parent / "gpuhealth-agent"
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("GPUHEALTH_LEASE_NAMESPACE", "POD_NAMESPACE")},
            "NODE_NAME": agent.node,
            "FAKE_NVML_SCENARIO": str(agent.scenario),
            **({"FAKE_NVML_EMIT_LOG": str(agent.emit_log)} if agent.emit_log else {}),
            "GPUHEALTH_NVML_LIBRARY": str(self.library),
        }
        with open(agent.log, "ab") as out:
            agent.popen = subprocess.Popen(
                [
                    str(exe),
                    f"--kubeconfig={kubeconfig or self.kubeconfig}",
                    f"--interval={self.interval}",
                    f"--heartbeat-interval={self.heartbeat}",
                    *([f"--event-timeout={self.event_timeout}"] if self.event_timeout is not None else []),
                    f"--metrics-port={agent.metrics_port}",  # 0 unless asked: several agents share this host
                    "--metrics-bind=127.0.0.1",
                    *([f"--lease-namespace={self.lease_namespace}"] if self.lease_namespace else []),
                    *([f"--state-dir={agent.state_dir}"] if agent.state_dir else []),
                    *([f"--nvml-hang-after={self.nvml_hang_after}"] if self.nvml_hang_after else []),
                    f"--sysfs-root={agent.sysfs or ''}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def __getitem__(self, node: str) -> Agent:
        return self.agents[node]

    def stop(self) -> None:
        for a in self.agents.values():
            a.kill(signal.SIGTERM)
