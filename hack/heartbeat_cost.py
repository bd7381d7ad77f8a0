#!/usr/bin/env python3
"""What one agent heartbeat costs: the old way (a merge patch of the report) against the new one (a
node Lease renewal), on a real local control plane with the real operator watching.

    python -m hack.heartbeat_cost            # 20 nodes x 5 heartbeats each way (about 2 minutes)
    python -m hack.heartbeat_cost --render   # only regenerate the docs/bench.md table from the JSON

For a report of 8 GPUs as the agent renders it (fake NVML, ``collect_once``), it measures per
heartbeat:

- bytes written: the size of the object as stored, i.e. the API server's response body to the
  write (what etcd keeps and what every watcher is sent);
- watch bytes: what an independent watcher of each kind receives (all GPUNodeHealth objects, the
  agents' Leases in their namespace with the operator's label selector), read off the raw stream;
- the operator's reconciles (``gpuhealth_reconciles_total``), API writes (its requests in the API
  server's audit log, under its own identity) and CPU time (``/proc/<pid>/stat``).

Results go to docs/bench/heartbeat-cost.json (with commit, date, nproc and load average), and the
table between the heartbeat-cost markers in docs/bench.md is generated from that file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from devkit.audit import WRITE_VERBS, audit_events
from devkit.cluster import LocalCluster
from devkit.fakenvml.build import build_fake_nvml
from devkit.k8s import GPUHEALTH_NAMESPACE, OperatorProcess, ensure_namespace, wait_for
from devkit.k8s import Kube as TestKube
from gpuhealth.agent.lease import NodeLease
from gpuhealth.agent.runner import AgentConfig, collect_once
from gpuhealth.api.names import AGENT_LEASE_SELECTOR
from hack.bench.support import api_client

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "docs" / "bench" / "heartbeat-cost.json"
DOC = REPO / "docs" / "bench.md"
BEGIN, END = "<!-- heartbeat-cost:begin (python -m hack.heartbeat_cost) -->", "<!-- heartbeat-cost:end -->"
OP_USER, OP_TOKEN = "gpuhealth-operator-heartbeat-cost", "heartbeat-cost-operator-token"
MERGE = "application/merge-patch+json"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class ByteWatch:
    """Counts the raw bytes a watch stream delivers (events after ``resource_version``)."""

    def __init__(self, start: Callable[[str], Any], resource_version: str) -> None:
        self.bytes = 0
        self.events = 0
        self._resp = start(resource_version)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Line by line as the events arrive (a fixed-size read would hold the last partial block back).
        try:
            for line in iter_resp_lines(self._resp):
                self.bytes += len(line.encode() if isinstance(line, str) else line) + 1  # + the newline
                self.events += 1
        except Exception:  # closed at the end of the run
            return

    def close(self) -> None:
        # urllib3's close() blocks while the reader thread is inside a read; shutdown() (urllib3 2.3+)
        # wakes it. Without it, the daemon thread ends when the API server stops.
        shutdown = getattr(self._resp, "shutdown", None)
        if shutdown is not None:
            shutdown()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(read: Callable[[], tuple[float, ...]], quiet_s: float = 2.0, timeout: float = 60.0) -> None:
    """Wait until ``read()`` has not changed for ``quiet_s`` (the operator and watches caught up)."""
    last, since, deadline = read(), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.25)
        cur = read()
        if cur != last:
            last, since = cur, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


def agent_spec(workdir: Path, node: str) -> dict[str, Any]:
    """The spec the real agent renders for 8 healthy H100s (fake NVML's default scenario)."""
    os.environ["FAKE_NVML_SCENARIO"] = str(workdir / "empty.scenario")
    lib = build_fake_nvml(workdir / "fakenvml")
    spec = collect_once(AgentConfig(node_name=node, nvml_library=str(lib), metrics_port=0))
    assert len(spec["devices"]) == 8
    return spec


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "operator"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cluster = LocalCluster(
        workdir / "cluster",
        nodes=args.nodes,
        extra_tokens={OP_TOKEN: (OP_USER, "system:masters")},
        audit_users=[OP_USER],
    )
    operator: OperatorProcess | None = None
    watches: list[ByteWatch] = []
    try:
        log(f"control plane with {args.nodes} fake GPU nodes")
        cluster.start()
        kube = TestKube(cluster.kubeconfig)
        api = api_client(cluster.kubeconfig, pool=8)
        custom, leases = client.CustomObjectsApi(api), client.CoordinationV1Api(api)
        ensure_namespace(kube, GPUHEALTH_NAMESPACE)
        nodes = sorted(
            n["metadata"]["name"]
            for n in json.loads(client.CoreV1Api(api).list_node(_preload_content=False).data)["items"]
            if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.present") == "true"
        )
        template = agent_spec(workdir, nodes[0])
        kube.apply_policy("heartbeat-cost", {"rules": {"agentSilence": {"after": "1h"}}})
        for n in nodes:
            custom.create_cluster_custom_object(
                "gpuhealth.dev",
                "v1alpha1",
                "gpunodehealths",
                {
                    "apiVersion": "gpuhealth.dev/v1alpha1",
                    "kind": "GPUNodeHealth",
                    "metadata": {"name": n, "labels": {"app.kubernetes.io/managed-by": "gpuhealth-agent"}},
                    "spec": {**template, "nodeName": n},
                },
            )
        renewers = {n: NodeLease(_LeaseWriter(leases), GPUHEALTH_NAMESPACE, n, 30.0) for n in nodes}
        for r in renewers.values():
            r.renew(dt.datetime.now(dt.UTC))  # the Leases exist, as in a running fleet

        log("operator (its own audited identity, watching the Leases)")
        op_kc = cluster.kubeconfig_with_token(OP_TOKEN, workdir / "operator.kubeconfig", OP_USER)
        operator = OperatorProcess(
            cluster, workdir / "operator.log", extra_args=[f"--kubeconfig={op_kc}"], kubeconfig_flag=False
        ).start()
        wait_for(
            lambda: all(kube.state(n) == "Healthy" for n in nodes), timeout=120, what="every node evaluated Healthy"
        )
        assert operator.popen is not None
        pid = operator.popen.pid

        def report_rv() -> str:
            return str(
                json.loads(
                    custom.list_cluster_custom_object(
                        "gpuhealth.dev", "v1alpha1", "gpunodehealths", limit=1, _preload_content=False
                    ).data
                )["metadata"]["resourceVersion"]
            )

        rv = report_rv()
        reports_watch = ByteWatch(
            lambda v: custom.list_cluster_custom_object(
                "gpuhealth.dev",
                "v1alpha1",
                "gpunodehealths",
                watch=True,
                resource_version=v,
                allow_watch_bookmarks=False,
                _preload_content=False,
            ),
            rv,
        )
        leases_watch = ByteWatch(
            lambda v: leases.list_namespaced_lease(
                GPUHEALTH_NAMESPACE,
                label_selector=AGENT_LEASE_SELECTOR,
                watch=True,
                resource_version=v,
                allow_watch_bookmarks=False,
                _preload_content=False,
            ),
            rv,
        )
        watches = [reports_watch, leases_watch]

        def state() -> tuple[float, ...]:
            return (
                reports_watch.bytes,
                leases_watch.bytes,
                operator.metric("gpuhealth_reconciles_total") or 0.0,
                operator.metric("gpuhealth_lease_renewals_total") or 0.0,
            )

        settle(state, quiet_s=3.0)

        def report_beat(n: str) -> int:
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            resp = custom.patch_cluster_custom_object(
                "gpuhealth.dev",
                "v1alpha1",
                "gpunodehealths",
                n,
                {"spec": {"heartbeatTime": now}},
                _content_type=MERGE,
                _preload_content=False,
            )
            return len(resp.data)

        def lease_beat(n: str) -> int:
            resp = leases.patch_namespaced_lease(
                n,
                GPUHEALTH_NAMESPACE,
                renewers[n].renewal(dt.datetime.now(dt.UTC)),
                _content_type=MERGE,
                _preload_content=False,
            )
            return len(resp.data)

        results: dict[str, Any] = {}
        for way, beat in (("report", report_beat), ("lease", lease_beat)):
            log(f"{args.beats} heartbeats x {len(nodes)} nodes the {way} way")
            before = state()
            cpu0 = cpu_seconds(pid)
            since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=0.5)
            written = 0
            for _ in range(args.beats):
                for n in nodes:
                    written += beat(n)
                time.sleep(args.pause)
            settle(state, quiet_s=3.0)
            after = state()
            cpu = cpu_seconds(pid) - cpu0
            writes = [e for e in audit_events(cluster.audit_log, [OP_USER], since) if e.get("verb") in WRITE_VERBS]
            beats = args.beats * len(nodes)
            results[way] = {
                "heartbeats": beats,
                "bytes_written_per_heartbeat": round(written / beats),
                "report_watch_bytes_per_heartbeat": round((after[0] - before[0]) / beats),
                "lease_watch_bytes_per_heartbeat": round((after[1] - before[1]) / beats),
                "operator_reconciles_per_heartbeat": round((after[2] - before[2]) / beats, 3),
                "operator_writes_per_heartbeat": round(len(writes) / beats, 3),
                "operator_cpu_ms_per_heartbeat": round(1000 * cpu / beats, 2),
                "lease_renewals_seen": int(after[3] - before[3]),
            }
            log(f"  {results[way]}")
        return {
            "commit": commit(),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": {"nproc": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]},
            "nodes": len(nodes),
            "gpus_per_report": len(template["devices"]),
            "beats_per_node": args.beats,
            "results": results,
        }
    finally:
        log("stopping the operator and the control plane")
        if operator is not None:
            operator.stop()
        for w in watches:
            w.close()
        cluster.stop()


class _LeaseWriter:
    """Creates the Leases through the agent's own NodeLease (patch, 404 -> create)."""

    def __init__(self, api: client.CoordinationV1Api) -> None:
        self.api = api

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        from gpuhealth.agent.transport import NotFoundError

        try:
            self.api.patch_namespaced_lease(name, namespace, patch, _content_type=MERGE, _preload_content=False)
        except client.ApiException as e:
            if e.status == 404:
                raise NotFoundError(name) from e
            raise

    def create(self, body: dict[str, Any]) -> None:
        self.api.create_namespaced_lease(body["metadata"]["namespace"], body, _preload_content=False)


def render(data: dict[str, Any]) -> str:
    """The docs table, generated from the result file."""
    rows = [
        ("bytes written per heartbeat (object as stored)", "bytes_written_per_heartbeat"),
        ("watch bytes to a watcher of all GPUNodeHealth", "report_watch_bytes_per_heartbeat"),
        ("watch bytes to a watcher of the agents' Leases", "lease_watch_bytes_per_heartbeat"),
        ("operator reconciles per heartbeat", "operator_reconciles_per_heartbeat"),
        ("operator API writes per heartbeat", "operator_writes_per_heartbeat"),
        ("operator CPU per heartbeat (ms)", "operator_cpu_ms_per_heartbeat"),
    ]
    r, m = data["results"], data["machine"]
    lines = [
        BEGIN,
        f"{data['nodes']} nodes x {data['beats_per_node']} heartbeats each way, reports of "
        f"{data['gpus_per_report']} GPUs as the agent renders them; commit `{data['commit']}`, {data['date']}, "
        f"{m['nproc']} CPUs, load average {m['load_average'][0]} (`docs/bench/heartbeat-cost.json`).",
        "",
        "| per heartbeat | report patch (old) | Lease renewal (new) |",
        "| --- | ---: | ---: |",
        *[f"| {label} | {r['report'][key]:,} | {r['lease'][key]:,} |" for label, key in rows],
        *[
            f"| at {fleet:,} nodes, one heartbeat per {FLEET_INTERVAL_S} s: KB/s written | "
            f"{_rate(r['report'], fleet):,.0f} | {_rate(r['lease'], fleet):,.0f} |"
            for fleet in (1_000, 10_000)
        ],
        END,
    ]
    return "\n".join(lines)


FLEET_INTERVAL_S = 30


def _rate(way: dict[str, Any], nodes: int) -> float:
    """KB per second a fleet of ``nodes`` writes at one heartbeat per node per FLEET_INTERVAL_S."""
    return float(way["bytes_written_per_heartbeat"]) * nodes / FLEET_INTERVAL_S / 1000


def write_doc(data: dict[str, Any]) -> None:
    text = DOC.read_text()
    table = render(data)
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + table + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Heartbeat cost: report patch vs node Lease\n\n" + table + "\n"
    DOC.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--beats", type=int, default=5, help="heartbeats per node, each way")
    # More than a second: the report's heartbeatTime has whole seconds, and a patch that sets the same
    # value again is a no-op the API server neither stores nor sends to watchers.
    ap.add_argument("--pause", type=float, default=1.1, help="seconds between rounds of heartbeats (>1)")
    ap.add_argument("--render", action="store_true", help="only regenerate the docs table from the JSON")
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    if not args.render:
        with tempfile.TemporaryDirectory(prefix="heartbeat-cost-") as tmp:
            data = measure(args, Path(tmp))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=2) + "\n")
        log(f"wrote {args.out}")
    data = json.loads(args.out.read_text())
    write_doc(data)
    log(f"table in {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
