"""What must hold of DeviceTaintRules and device drains under chaos (pure).

The device_kills scenario samples every DeviceTaintRule of its nodes while the operator is
SIGKILLed mid-drain and a foreign writer keeps rules of its own beside gpuhealth's; these functions
judge what it saw:

- at any instant at most one gpuhealth rule per device, and its name is the deterministic one
  (`gpuhealth-<pool>-<device>`), so a create repeated after a crash can only answer 409;
- a foreign rule (without gpuhealth's label) is never modified or deleted by gpuhealth: the live rule
  keeps the generation and spec of the writer's last logged write (not its resourceVersion, which
  kube-controller-manager bumps when it writes the rule's status), and the audit log holds no update,
  patch or delete of the operator on it;
- pods that hold only healthy GPUs are never evicted by a device drain;
- at the end every bad GPU has exactly one gpuhealth rule and every healthy one none;
- partition_kills: every device a GPU is published as (its full device, its MIG devices, every
  partitionable placement) has gpuhealth's rule while the GPU is recorded out of service, judged
  against the devices the scenario published, not the operator's own mapping of them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Device = tuple[str, str, str]  # (driver, pool, device), as a rule's deviceSelector names it
# Spelled out here rather than imported from the operator, so a broken ownership check or naming in
# the product cannot also bend the judgement of it (docs/devices.md, "The rule").
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpuhealth")
NVIDIA = "gpu.nvidia.com"


def is_ours(rule: Mapping[str, Any]) -> bool:
    """gpuhealth's rules carry its managed-by label; everyone else's are foreign."""
    labels = (rule.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY[0]) == MANAGED_BY[1])


def expected_name(dev: Device) -> str | None:
    """``gpuhealth-<pool>-<device>`` for NVIDIA's driver and plain names (the scenario's); others get
    a hash appended, which this does not recompute (None: not judged)."""
    driver, pool, device = dev
    name = f"gpuhealth-{pool}-{device}"
    plain = driver == NVIDIA and len(name) <= 253 and name == name.lower()
    return name if plain and all(c.isalnum() or c in ".-" for c in name) else None


def selector(rule: Mapping[str, Any]) -> Device:
    sel = (rule.get("spec") or {}).get("deviceSelector") or {}
    return (str(sel.get("driver") or ""), str(sel.get("pool") or ""), str(sel.get("device") or ""))


def _name(rule: Mapping[str, Any]) -> str:
    return str((rule.get("metadata") or {}).get("name") or "")


def generation(rule: Mapping[str, Any]) -> int:
    return int((rule.get("metadata") or {}).get("generation") or 0)


def sample_problems(rules: Iterable[Mapping[str, Any]]) -> list[str]:
    """One LIST of DeviceTaintRules: gpuhealth's are one per device, each under its deterministic name."""
    by_device: dict[Device, list[str]] = {}
    out = []
    for r in rules:
        if not is_ours(r):
            continue
        dev = selector(r)
        by_device.setdefault(dev, []).append(_name(r))
        want = expected_name(dev)
        if want is not None and _name(r) != want:
            out.append(f"gpuhealth DeviceTaintRule {_name(r)} for {'/'.join(dev)} is not named {want}")
    for dev, names in sorted(by_device.items()):
        if len(names) > 1:
            out.append(f"{len(names)} gpuhealth DeviceTaintRules for {'/'.join(dev)}: {sorted(names)}")
    return out


@dataclass(frozen=True)
class ForeignRuleWrite:
    name: str
    generation: int  # the metadata.generation the writer's own request produced (0 for a delete)
    spec: Mapping[str, Any] | None  # what it wrote; None: it deleted the rule


@dataclass
class ForeignRuleLog:
    """The foreign writer's own record of its DeviceTaintRules (thread-safe): never rebuilt from the
    live objects, so a rule gpuhealth touched stays expected as written and is reported."""

    writes: list[ForeignRuleWrite] = field(default_factory=list)
    pending: set[str] = field(default_factory=set)  # a write sent, not yet answered
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def begin(self, name: str) -> None:
        with self._lock:
            self.pending.add(name)

    def record(self, name: str, generation: int, spec: Mapping[str, Any] | None) -> None:
        with self._lock:
            self.pending.discard(name)
            self.writes.append(ForeignRuleWrite(name, generation, spec))

    def abort(self, name: str) -> None:
        with self._lock:
            self.pending.discard(name)

    def latest(self) -> dict[str, ForeignRuleWrite]:
        with self._lock:
            return {w.name: w for w in self.writes}

    def names(self) -> set[str]:
        with self._lock:
            return {w.name for w in self.writes}

    def in_flight(self) -> set[str]:
        with self._lock:
            return set(self.pending)


def _same_spec(live: Mapping[str, Any], wrote: Mapping[str, Any]) -> bool:
    """The writer's fields as it wrote them (the API server may add defaults such as timeAdded)."""
    sel = (live.get("deviceSelector") or {}) == (wrote.get("deviceSelector") or {})
    lt, wt = live.get("taint") or {}, wrote.get("taint") or {}
    return sel and all(lt.get(k) == v for k, v in wt.items())


def foreign_rule_problems(
    log: Mapping[str, ForeignRuleWrite],
    live: Iterable[Mapping[str, Any]],
    operator_writes: Iterable[Mapping[str, Any]] = (),
    in_flight: Iterable[str] = (),
) -> list[str]:
    """Foreign rules against the writer's log: each it still wants is there with the generation and
    spec its last write produced, each it deleted is gone; and no audited write of the operator
    (``operator_writes``: audit entries) touched one of them."""
    live_by = {_name(r): r for r in live}
    skip = set(in_flight)
    out = []
    for name, w in sorted(log.items()):
        if name in skip:
            continue
        r = live_by.get(name)
        if w.spec is None:
            if r is not None:
                out.append(f"foreign DeviceTaintRule {name}: deleted by its writer, but present again")
            continue
        if r is None:
            out.append(
                f"foreign DeviceTaintRule {name} was deleted (its writer's last write left generation {w.generation})"
            )
        elif generation(r) != w.generation:
            out.append(
                f"foreign DeviceTaintRule {name} was modified: generation {generation(r)}, "
                f"its writer's last write left {w.generation}"
            )
        elif not _same_spec(r.get("spec") or {}, w.spec):
            out.append(f"foreign DeviceTaintRule {name}: spec {r.get('spec')} differs from what its writer wrote")
    for e in operator_writes:
        ref = e.get("objectRef") or {}
        if ref.get("resource") != "devicetaintrules" or ref.get("name") not in log:
            continue
        if e.get("verb") in ("update", "patch", "delete"):  # a create of a taken name only answers 409
            code = (e.get("responseStatus") or {}).get("code")
            out.append(f"the operator sent {e.get('verb')} on foreign DeviceTaintRule {ref.get('name')} (code {code})")
    return out


def healthy_gpu_evictions(
    evicted: Iterable[str], held: Mapping[str, Iterable[Device]], bad: Iterable[Device]
) -> list[str]:
    """Pods (``namespace/name``) evicted although every device they held is healthy."""
    bad_set = set(bad)
    out = []
    for pod in sorted(set(evicted)):
        devices = set(held.get(pod) or ())
        if devices and not devices & bad_set:
            out.append(f"pod {pod} was evicted, but it held only healthy GPUs {sorted('/'.join(d) for d in devices)}")
    return out


def final_rule_problems(rules: Iterable[Mapping[str, Any]], pools: Iterable[str], bad: Iterable[Device]) -> list[str]:
    """On ``pools`` (the scenario's nodes): every bad device exactly one gpuhealth rule, others none."""
    wanted = set(pools)
    bad_set = set(bad)
    ours: dict[Device, int] = {}
    for r in rules:
        dev = selector(r)
        if is_ours(r) and dev[1] in wanted:
            ours[dev] = ours.get(dev, 0) + 1
    out = [
        f"bad GPU {'/'.join(d)}: {ours.get(d, 0)} gpuhealth DeviceTaintRules (exactly 1 wanted)"
        for d in sorted(bad_set)
        if ours.get(d, 0) != 1
    ]
    out += [
        f"healthy GPU {'/'.join(d)}: {n} gpuhealth DeviceTaintRule(s) left"
        for d, n in sorted(ours.items())
        if d not in bad_set
    ]
    return out


def node_mark_problems(name: str, node: Mapping[str, Any], taint_key: str) -> list[str]:
    """A node whose only faults are device-scoped is neither cordoned nor tainted by gpuhealth."""
    spec = node.get("spec") or {}
    out = []
    if spec.get("unschedulable"):
        out.append(f"{name}: cordoned although its only fault is device-scoped")
    if any(t.get("key") == taint_key for t in spec.get("taints") or []):
        out.append(f"{name}: gpuhealth's node taint although its only fault is device-scoped")
    return out


def partition_coverage_problems(
    held_out: Mapping[str, Iterable[Device]], rules: Iterable[Mapping[str, Any]]
) -> list[str]:
    """Every device of a GPU recorded out of service has gpuhealth's rule: ``held_out`` maps a GPU
    (``<node> GPU <index>``) to all the devices its node's slices publish for it (its full device,
    its MIG devices, every partitionable placement), as the scenario published them, not as the
    operator mapped them; a device without a rule is still allocatable."""
    covered = {selector(r) for r in rules if is_ours(r)}
    out = []
    for gpu, devices in sorted(held_out.items()):
        missing = sorted(d for d in set(devices) if d not in covered)
        if missing:
            names = ", ".join(d[2] for d in missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            out.append(f"{gpu} is recorded out of service, but {len(missing)} of its devices have no rule: {names}")
    return out
