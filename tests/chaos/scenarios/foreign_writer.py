"""Another controller writing the same Nodes (taints, labels, cordon)."""

from __future__ import annotations

import json
import random
import threading

from kubernetes import client

from tests.chaos.scenarios.context import Ctx


class ForeignWriter:
    """Another controller changing the same Nodes: its own taints, labels and cordon, with read-modify-
    update under the resourceVersion (a well-behaved writer: a lost update would be gpuhealth's)."""

    KEYS = ("example.com/chaos-a", "example.com/chaos-b", "example.com/chaos-c")

    def __init__(self, ctx: Ctx, nodes: list[str]) -> None:
        self.ctx, self.nodes = ctx, nodes
        self.writes = 0
        self.conflicts = 0
        for n in nodes:
            ctx.foreign_taints[n] = set()
            ctx.foreign_cordon[n] = False
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
                    if e.status != 409:
                        raise
                    self.conflicts += 1

    def _once(self, rng: random.Random, name: str) -> bool:
        ctx = self.ctx
        node = json.loads(ctx.kube.core.read_node(name, _preload_content=False).data)
        spec = node.setdefault("spec", {})
        taints = list(spec.get("taints") or [])
        mine = {t["key"] for t in taints if t["key"] in self.KEYS}
        op = rng.choice(["add", "remove", "label", "cordon", "uncordon"])
        cordon = ctx.foreign_cordon[name]
        if op == "add" and len(mine) < len(self.KEYS):
            key = rng.choice([k for k in self.KEYS if k not in mine])
            taints.append({"key": key, "value": "chaos", "effect": "NoSchedule"})
            mine = mine | {key}
        elif op == "remove" and mine:
            key = rng.choice(sorted(mine))
            taints = [t for t in taints if t["key"] != key]
            mine = mine - {key}
        elif op == "cordon" and not spec.get("unschedulable"):
            spec["unschedulable"] = True
            cordon = True
        elif op == "uncordon" and cordon:
            spec["unschedulable"] = False
            cordon = False
        else:
            node["metadata"].setdefault("labels", {})["example.com/chaos-label"] = str(rng.randrange(1000))
        spec["taints"] = taints or None
        # A PUT with the resourceVersion just read: refused (409) if anyone wrote in between.
        ctx.kube.core.replace_node(name, node, _preload_content=False)
        with ctx._lock:
            ctx.foreign_taints[name] = set(mine)
            ctx.foreign_cordon[name] = cordon
        self.writes += 1
        ctx.fault(kind="conflicting_write")
        return True
