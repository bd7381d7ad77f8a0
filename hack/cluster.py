#!/usr/bin/env python3
"""`make cluster-up` / `make cluster-down`: a local control plane with fake GPU nodes for humans."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.support.cluster import LocalCluster, stop_from_pidfile

REPO = Path(__file__).resolve().parents[1]

WORKDIR = REPO / "build" / "cluster"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start etcd, apiserver, controllers, scheduler, kwok and N GPU nodes")
    up.add_argument("--nodes", type=int, default=8)
    sub.add_parser("down", help="stop what `up` started (by pid)")
    args = ap.parse_args()
    if args.cmd == "down":
        pids = stop_from_pidfile(WORKDIR)
        print(f"stopped {len(pids)} processes" if pids else "no local cluster running")
        return 0
    if (WORKDIR / "pids.json").exists():
        print(f"a local cluster is already running; `make cluster-down` first (state in {WORKDIR})")
        return 1
    cluster = LocalCluster(WORKDIR, nodes=args.nodes)
    cluster.start()
    # Leave the processes running; `down` stops them by the pids recorded in build/cluster/pids.json.
    for p in cluster.procs.values():
        p.popen = None
    print(f"local control plane is up with {args.nodes} fake GPU nodes; logs in {WORKDIR}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
