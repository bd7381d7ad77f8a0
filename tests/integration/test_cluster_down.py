"""`make cluster-down` stops everything a kept demo left running, and nothing else.

The processes are started the way ``make demo DEMO_ARGS=--keep`` starts them (a local control
plane, the operator, one agent per node) and handed over the same way (``pidfile.hand_over``);
then the real ``python -m hack.cluster down`` runs. A bystander process that was never recorded, and one
whose pid sits in the pidfile with another start time (a reused pid), must survive it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from devkit import pidfile
from devkit.agents import AgentFleet
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, wait_for

REPO = Path(__file__).resolve().parents[2]


def _down(workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hack.cluster", f"--workdir={workdir}", "down"],  # as `make cluster-down` runs it
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cluster_down_stops_kept_demo_and_only_it(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "demo" / "cluster", nodes=2)
    operator: OperatorProcess | None = None
    agents: AgentFleet | None = None
    bystander = subprocess.Popen(["sleep", "600"])
    reused = subprocess.Popen(["sleep", "600"])
    try:
        cluster.start()
        kube = Kube(cluster.kubeconfig)
        nodes = sorted(n.metadata.name for n in kube.core.list_node().items)
        kube.apply_policy("demo-fleet", {"nodeSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}}})
        operator = OperatorProcess(cluster, tmp_path / "operator.log").start()
        agents = AgentFleet(cluster.kubeconfig, tmp_path / "agents").start(nodes)
        wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), timeout=60, what="agents reporting")

        kept = tmp_path / "kept"
        assert operator.popen is not None
        extra = {"operator": operator.popen.pid}
        extra.update({f"agent/{n}": a.popen.pid for n, a in agents.agents.items() if a.popen})
        pidfile.hand_over(cluster.workdir, kept, extra)
        # A recorded pid the kernel has since given to another process: same pid, other start time.
        recorded = json.loads((kept / pidfile.PIDFILE).read_text())
        recorded["agent/long-gone"] = {"pid": reused.pid, "start": (pidfile.start_time(reused.pid) or 0) - 1}
        (kept / pidfile.PIDFILE).write_text(json.dumps(recorded))

        ours = {name: p.popen for name, p in cluster.procs.items()}
        ours["operator"] = operator.popen
        ours.update({f"agent/{n}": a.popen for n, a in agents.agents.items()})
        assert all(p is not None and p.poll() is None for p in ours.values())

        out = _down(kept)
        assert out.returncode == 0, out.stderr
        assert f"stopped {len(ours)} processes" in out.stdout, out.stdout
        assert f"operator (pid {operator.popen.pid})" in out.stdout
        assert f"{len(nodes)} agents" in out.stdout
        for name in ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            assert f"{name} (pid {cluster.procs[name].pid})" in out.stdout
        assert "long-gone" not in out.stdout
        for name, p in ours.items():
            assert p is not None
            assert p.wait(timeout=10) is not None, f"{name} still running"
        assert bystander.poll() is None, "an unrecorded process was stopped"
        assert reused.poll() is None, "a process with a reused pid was stopped"
        assert not (kept / pidfile.PIDFILE).exists()

        again = _down(kept)
        assert again.returncode == 0 and "nothing to stop" in again.stdout
    finally:
        if agents:
            agents.stop()
        if operator:
            operator.stop()
        cluster.stop()
        for p in (bystander, reused):
            p.kill()
            p.wait()
