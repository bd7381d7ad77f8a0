#!/usr/bin/env python3
"""`make cluster-up` / `make cluster-down`: a local control plane with fake GPU nodes for humans.

`down` also stops what `make demo DEMO_ARGS=--keep` left running (its operator and agents): both
record every process they leave behind in build/cluster/pids.json, with its start time, and `down`
stops exactly those, never anything by name. It also undoes what a real node
(devkit/realnode.py) recorded and could not undo itself (a killed test run): its processes, the
bridge, the nft table, sysctls and cgroups.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from devkit import pidfile
from devkit.cluster import LocalCluster
from devkit.realnode_host import teardown as real_node_teardown

REPO = Path(__file__).resolve().parents[1]

WORKDIR = REPO / "build" / "cluster"


def describe(stopped: Sequence[tuple[str, int]]) -> list[str]:
    """One line per stopped process, agents folded into one line (the demo leaves one per node)."""
    agents = [(n, p) for n, p in stopped if n.startswith("agent/")]
    lines = [f"  {name} (pid {pid})" for name, pid in stopped if not name.startswith("agent/")]
    if agents:
        listing = ", ".join(f"{n.removeprefix('agent/')}={p}" for n, p in agents)
        lines.insert(0, f"  {len(agents)} agents (pids {listing})")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=WORKDIR, help="where pids.json and the logs live")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start etcd, apiserver, controllers, scheduler, kwok and N GPU nodes")
    up.add_argument("--nodes", type=int, default=8)
    sub.add_parser("down", help="stop what `up` or `make demo DEMO_ARGS=--keep` started (by recorded pid)")
    args = ap.parse_args(argv)
    workdir: Path = args.workdir
    if args.cmd == "down":
        # A real node (tests/integration/test_real_node.py) killed before it cleaned up: its own
        # record says what it changed on the host, and this undoes exactly that.
        undone = real_node_teardown()
        if undone:
            print("undid what a real node left on the host:")
            print("\n".join(f"  {line}" for line in undone))
        stopped = pidfile.stop_recorded(workdir)
        if not stopped and undone:
            return 0
        if not stopped:
            print("nothing to stop: no local cluster or kept demo is running")
            return 0
        print(f"stopped {len(stopped)} processes:")
        print("\n".join(describe(stopped)))
        return 0
    if (workdir / pidfile.PIDFILE).exists():
        print(f"a local cluster is already running; `make cluster-down` first (state in {workdir})")
        return 1
    cluster = LocalCluster(workdir, nodes=args.nodes)
    cluster.start()
    # Leave the processes running; `down` stops them by the pids recorded in pids.json.
    for p in cluster.procs.values():
        p.popen = None
    print(f"local control plane is up with {args.nodes} fake GPU nodes; logs in {workdir}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
