"""Another controller writing the same Nodes (taints, labels, cordon), keeping its own log.

It changes only its own taints (``example.com/chaos-*``), a label and its own cordon, with
read-modify-PUT under the resourceVersion (a well-behaved writer: a lost update would be
gpuhealth's). What it wants on each Node comes from its own log (hack/chaos/foreign.py), never from
the live Node, so a taint gpuhealth dropped is reported rather than forgotten: before each write it
checks the Node it just read against that log, and the sampler checks every read too.
"""

from __future__ import annotations

import json
import random
import threading

from kubernetes import client

from hack.chaos.foreign import resource_version
from hack.chaos.scenarios.context import Ctx


class ForeignWriter:
    KEYS = ("example.com/chaos-a", "example.com/chaos-b", "example.com/chaos-c")

    def __init__(self, ctx: Ctx, nodes: list[str]) -> None:
        self.ctx, self.nodes = ctx, nodes
        self.writes = 0
        self.conflicts = 0
        self.checks = 0
        self.stop = ctx.background(self._loop, "foreign-writer")

    def _loop(self, stop: threading.Event) -> None:
        rng = random.Random(self.ctx.rng.random())
        while not stop.wait(rng.uniform(0.02, 0.15)):
            name = rng.choice(self.nodes)
            for _ in range(20):
                try:
                    if self._once(rng, name):
                        break
                except client.ApiException as e:
                    self.ctx.foreign.abort(name)
                    if e.status != 409:
                        raise
                    self.conflicts += 1

    def _once(self, rng: random.Random, name: str) -> bool:
        ctx, log = self.ctx, self.ctx.foreign
        node = json.loads(ctx.kube.core.read_node(name, _preload_content=False).data)
        # Our last write is answered and logged: this read must hold what it left.
        self.checks += 1
        for problem in ctx.foreign_check(name, node):
            ctx.violate(f"[foreign writer {ctx.clock()}] {problem}")
        last = log.latest(name)
        mine = set(last.taints) if last else set()
        cordon = bool(last and last.cordon)
        spec = node.setdefault("spec", {})
        others = [t for t in spec.get("taints") or [] if t["key"] not in self.KEYS]
        op = rng.choice(["add", "remove", "label", "cordon", "uncordon"])
        if op == "add" and len(mine) < len(self.KEYS):
            mine.add(rng.choice([k for k in self.KEYS if k not in mine]))
        elif op == "remove" and mine:
            mine.discard(rng.choice(sorted(mine)))
        elif op == "cordon" and not cordon and not spec.get("unschedulable"):
            spec["unschedulable"], cordon = True, True  # only a Node nobody has cordoned: then it is ours
        elif op == "uncordon" and cordon:
            spec["unschedulable"], cordon = False, False
        else:
            node["metadata"].setdefault("labels", {})["example.com/chaos-label"] = str(rng.randrange(1000))
        if cordon:
            spec["unschedulable"] = True  # ours, whatever the read says (it was checked above)
        spec["taints"] = others + [{"key": k, "value": "chaos", "effect": "NoSchedule"} for k in sorted(mine)] or None
        log.begin(name, frozenset(mine), cordon)
        # A PUT with the resourceVersion just read: refused (409) if anyone wrote in between.
        resp = ctx.kube.core.replace_node(name, node, _preload_content=False)
        log.record(name, resource_version(json.loads(resp.data)), frozenset(mine), cordon)
        self.writes += 1
        ctx.fault(kind="foreign_write")
        return True
