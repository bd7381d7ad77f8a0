"""Timeline rows for the per-GPU stories, polled from the cluster: gpuhealth's DeviceTaintRules, each
GPU's record and repair ladder in GPUNodeHealth status, and the reset Jobs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Sequence

from devkit.k8s import Kube
from hack.demo.common import REMEDIATION_NS, Timeline, gpuhealth_rules

POLL_S = 0.3


class DeviceWatch:
    """Polls the cluster every ``POLL_S`` and adds a timeline row for each change it sees on ``nodes``.

    Also keeps what the summary needs after the fact: when each GPU was first seen back in service.
    """

    def __init__(self, kube: Kube, timeline: Timeline, nodes: Sequence[str]) -> None:
        self.kube = kube
        self.timeline = timeline
        self.nodes = list(nodes)
        self.rules: dict[str, tuple[str, str, str]] = {}  # name -> (node, gpu, device)
        self.states: dict[tuple[str, int], str] = {}
        self.ladders: dict[tuple[str, int], tuple[str, str]] = {}
        self.in_service_at: dict[tuple[str, int], float] = {}
        self.jobs: dict[str, str] = {}
        self.lock = threading.Lock()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a transient API error: the next poll sees the change
                self.poll()
            time.sleep(POLL_S)

    def poll(self) -> None:
        now = time.time()
        self._rules(now)
        for node in self.nodes:
            self._report(node, now)
        self._jobs(now)

    def _rules(self, now: float) -> None:
        current = {}
        for r in gpuhealth_rules(self.kube):
            labels = r["metadata"].get("labels") or {}
            node = labels.get("gpuhealth.dev/node", "")
            if node in self.nodes:
                sel = r["spec"]["deviceSelector"]
                current[r["metadata"]["name"]] = (node, labels.get("gpuhealth.dev/gpu", "?"), sel["device"])
        added: dict[tuple[str, str], list[str]] = defaultdict(list)
        gone: dict[tuple[str, str], list[str]] = defaultdict(list)
        for name, (node, gpu, dev) in current.items():
            if name not in self.rules:
                added[(node, gpu)].append(dev)
        for name, (node, gpu, dev) in self.rules.items():
            if name not in current:
                gone[(node, gpu)].append(dev)
        for (node, gpu), devs in sorted(added.items()):
            self.timeline.taint_seen.setdefault(node, now)
            self.timeline.add(
                f"{node}: {len(devs)} DeviceTaintRule(s) for GPU {gpu} ({', '.join(sorted(devs))}), NoSchedule; "
                "node not tainted",
                now,
            )
        for (node, gpu), devs in sorted(gone.items()):
            self.timeline.add(f"{node}: GPU {gpu}'s DeviceTaintRule(s) deleted ({', '.join(sorted(devs))})", now)
        self.rules = current

    def _report(self, node: str, now: float) -> None:
        status = self.kube.report(node).get("status") or {}
        for d in status.get("devices") or []:
            key = (node, int(d["index"]))
            state = str(d.get("state", ""))
            if self.states.get(key, "InService") != state:
                why = f" ({d['reason']})" if d.get("reason") and state != "InService" else ""
                self.timeline.add(f"{node}: GPU {key[1]} -> {state}{why}", now)
                if state == "InService":
                    with self.lock:
                        self.in_service_at.setdefault(key, now)
            self.states[key] = state
        for index, rec in (status.get("remediation") or {}).items():
            key = (node, int(index))
            step = (str(rec.get("step", "")), str(rec.get("phase", "")))
            if self.ladders.get(key) != step:
                self.timeline.add(
                    f"{node}: GPU {index} repair ladder: {step[0]} attempt {rec.get('attempt')}, {step[1]}", now
                )
                self.ladders[key] = step

    def _jobs(self, now: float) -> None:
        for job in self.kube.batch.list_namespaced_job(REMEDIATION_NS).items:
            name = job.metadata.name
            done = next(
                (
                    c.type
                    for c in job.status.conditions or []
                    if c.type in ("Complete", "Failed") and c.status == "True"
                ),
                "",
            )
            if self.jobs.get(name) == done:
                continue
            labels = job.metadata.labels or {}
            if labels.get("gpuhealth.dev/node") not in self.nodes:
                continue  # another story's (the real node's device-plugin story tells its own Jobs)
            where = f"{labels.get('gpuhealth.dev/node')}: GPU {labels.get('gpuhealth.dev/gpu')}"
            kind = "validation Job" if "gpuhealth.dev/validation-level" in labels else "reset Job"
            if name not in self.jobs:
                cmd = " ".join(job.spec.template.spec.containers[0].command or [])
                if kind == "validation Job":
                    cmd = f"dcgmi diag -r {labels.get('gpuhealth.dev/validation-level')} --json"
                self.timeline.add(f"{where}: {kind} {REMEDIATION_NS}/{name} created ({cmd})", now)
            if done:
                result = "succeeded" if done == "Complete" else "failed"
                self.timeline.add(f"{where}: {kind} {name} {result} (its pod ended by KWOK's stage)", now)
            self.jobs[name] = done
