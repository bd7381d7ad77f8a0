"""Per-GPU quarantine inside the per-node pipeline: place, decide per GPU, then converge the rules.

The node reconciler calls :meth:`DeviceReconciler.plan` right after ``assess``: device-scoped
findings are placed on DRA devices (the ResourceSlice cache), GPUs no slice publishes fall back to
node scope (the reason is written into the finding, so the node's message and Event say it in
words), the breaker's GPU budget is asked once, and ``decide_devices`` gives each GPU its next
record. What the *node* state machine then decides on (:func:`node_view`) depends on that verdict:

- the verdict escalates (too many bad GPUs, a flapping GPU under ``onFlapping: Node``, a GPU that
  cannot be told apart): every finding, device ones included, goes to the node, as before;
- otherwise the placed device findings leave the node's assessment, and GPUs held out become one
  observe-level ``DeviceQuarantined`` finding: the node stays in service (state ``Degraded``,
  condition ``GPUHealthy=True`` with that reason), neither tainted nor cordoned.

After the node reconciler has written the status (the write-ahead record, ``status.devices[]``
with each GPU's device and rule name), :meth:`converge_rules` makes gpuhealth's DeviceTaintRules of
that node exactly those the records want: idempotent by name (409 on create is done, 404 on delete
is gone). A rule without gpuhealth's label is never read for change. :meth:`sweep` deletes
gpuhealth's rules whose node is gone or no longer governed, or whose GPU no record holds out.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuhealth.actions.devicetaints import build_rule, plan_rules, rule_name
from gpuhealth.actions.placement import place
from gpuhealth.api.devices import DeviceRecord, DeviceRef, devices_from_status, devices_to_status
from gpuhealth.api.names import (
    DEVICE_NODE_LABEL,
    RELEASE_GPU_ANNOTATION,
    Action,
    Mode,
    Scope,
    Signal,
)
from gpuhealth.api.policy import Policy
from gpuhealth.api.remediation import Phase, StepKind, ladders_from_status
from gpuhealth.api.report import Report
from gpuhealth.api.status import DrainRecord
from gpuhealth.api.timeutil import parse_time
from gpuhealth.controller import metrics
from gpuhealth.controller.breaker import Breaker
from gpuhealth.controller.events import EventSink
from gpuhealth.controller.slicewatch import SliceCache
from gpuhealth.controller.store import Store
from gpuhealth.evaluation.devices import DeviceInputs, DeviceVerdict, decide_devices
from gpuhealth.evaluation.findings import Assessment, Finding
from gpuhealth.kube.client import KubePort, status_of

log = logging.getLogger(__name__)
# Our rules are re-listed this often for changes someone else made; our own are tracked in memory.
RELIST_S = 300.0
Call = Callable[..., Awaitable[Any]]


def released_gpus(annotations: Mapping[str, str]) -> frozenset[int]:
    """GPU indices named by the ``gpuhealth.dev/release-gpu`` annotation (``"3"`` or ``"3,5"``)."""
    raw = str(annotations.get(RELEASE_GPU_ANNOTATION) or "")
    return frozenset(int(p) for p in raw.replace(" ", "").split(",") if p.isdigit())


def device_drains(status: Mapping[str, Any]) -> dict[int, DrainRecord]:
    """``status.deviceDrains`` by GPU index: each device drain's progress."""
    raw = status.get("deviceDrains") or {}
    out: dict[int, DrainRecord] = {}
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            if str(k).isdigit() and isinstance(v, Mapping):
                out[int(k)] = DrainRecord(**v)  # type: ignore[typeddict-item]
    return out


def drain_current(record: Mapping[str, Any], rec: DeviceRecord) -> bool:
    """The drain belongs to the GPU's current Draining episode."""
    started = parse_time(record.get("startedAt"))
    return started is None or rec.since is None or started >= rec.since - dt.timedelta(seconds=1)


@dataclass(frozen=True)
class DevicePlan:
    verdict: DeviceVerdict
    records: tuple[DeviceRecord, ...]  # the verdict's records with their device and rule name
    node_view: Assessment  # what the node state machine decides on
    fallbacks: Mapping[int, str]  # GPU index -> why it falls back to node scope, in words

    @property
    def out(self) -> tuple[DeviceRecord, ...]:
        return tuple(r for r in self.records if r.out_of_service)

    def status(self) -> list[dict[str, Any]]:
        return devices_to_status(self.records)

    def in_service(self, node_out: bool, total: int) -> int:
        """GPUs the scheduler may allocate: none while the node is out, else all but those held out."""
        return 0 if node_out else max(0, total - len(self.out))


def _with_fallback(f: Finding, fallbacks: Mapping[int, str], placed: Finding) -> Finding:
    if placed.scope == f.scope or placed.gpu is None or placed.gpu not in fallbacks:
        return placed
    return replace(placed, detail=f"{placed.detail} ({fallbacks[placed.gpu]})")


def node_view(
    a: Assessment, findings: Sequence[Finding], verdict: DeviceVerdict, out: Iterable[DeviceRecord]
) -> Assessment:
    """The assessment the node state machine decides on (see the module docstring). Pure."""
    if verdict.escalate:
        return replace(a, findings=tuple(findings))
    mine = [f for f in findings if not (f.scope == Scope.DEVICE and f.action.quarantines)]
    held = [r for r in out] + [r for r in verdict.records if r.held_by_breaker and not r.out_of_service]
    if held:
        parts = [
            f"GPU {r.index}"
            + (f" ({r.uuid})" if r.uuid else "")
            + f" {r.state}: {r.reason}"
            + (f", DeviceTaintRule {r.taint_rule}" if r.taint_rule else "")
            + (" (held back by the GPU budget)" if r.held_by_breaker and not r.out_of_service else "")
            for r in sorted(held, key=lambda r: r.index)
        ]
        detail = "; ".join(parts) + ". The node serves on with its other GPUs"
        mine.append(Finding(Signal.DEVICE_QUARANTINED, Action.OBSERVE, detail))
    return replace(a, findings=tuple(sorted(mine, key=lambda f: f.key)))


class DeviceReconciler:
    def __init__(
        self,
        kube: KubePort,
        call: Call,
        store: Store,
        breaker: Breaker,
        slices: SliceCache,
        events: EventSink,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.kube = kube
        self.call = call
        self.store = store
        self.breaker = breaker
        self.slices = slices
        self.events = events
        self.clock = clock
        self.rules: dict[str, dict[str, Any]] = {}  # gpuhealth's DeviceTaintRules by name
        self._listed_at = float("-inf")
        self.wanted: dict[str, set[str]] = {}  # node -> the rule names its last convergence wanted
        # Rules whose delete is on its way: a node's convergence and the sweep may both find the
        # same rule unwanted, and the second would otherwise send a delete that can only get a 404.
        self._deleting: set[str] = set()
        # Names of our rules that someone else's DeviceTaintRule holds (a create answered 409 and the
        # re-list has no rule of ours by that name): those GPUs fall back to node scope from then on,
        # until this process restarts and tries again.
        self.taken: set[str] = set()

    # -- deciding ----------------------------------------------------------------------------------

    async def plan(
        self,
        name: str,
        policy: Policy,
        report: Report | None,
        a: Assessment,
        status: Mapping[str, Any],
        now: dt.datetime,
        released: frozenset[int],
        node_cleared: dt.datetime | None = None,
    ) -> DevicePlan:
        uuids = {d.index: d.uuid for d in report.devices} if report is not None else {}
        prior = devices_from_status(status)
        # Most reconciles have no device-scoped finding: skip reading the slice cache for them.
        wanted = any(f.scope == Scope.DEVICE for f in a.findings)
        placement = place(
            a.findings, name, self.slices.slices() if wanted else (), policy.devices.drivers, uuids, self.taken
        )
        findings = [
            _with_fallback(f, placement.fallbacks, p) for f, p in zip(a.findings, placement.findings, strict=True)
        ]
        new = {
            f.gpu
            for f in findings
            if f.scope == Scope.DEVICE
            and f.action.quarantines
            and f.gpu is not None
            and not (prior.get(f.gpu) and prior[f.gpu].out_of_service)
        }
        budget = await self.breaker.gpu_budget(policy, name, len(new)) if new else 0
        drains = device_drains(status)
        drained = frozenset(
            i for i, d in drains.items() if d.get("phase") == "Completed" and i in prior and drain_current(d, prior[i])
        )
        ladders = ladders_from_status(status) if policy.remediation.enabled else {}
        inputs = DeviceInputs(
            fresh=not a.unknown,
            gpu_budget=budget,
            drained=drained,
            released=released,
            uuids=uuids,
            replace=frozenset(i for i, r in ladders.items() if r.step == StepKind.REPLACE) - released,
            acknowledged={i: r.finished for i, r in ladders.items() if r.phase == Phase.SUCCEEDED and r.finished},
        )
        verdict = decide_devices(prior, findings, policy, now, inputs)
        records = tuple(self._locate(name, policy, r, placement.refs) for r in verdict.records)
        out = [r for r in records if r.out_of_service]
        view = node_view(a, findings, verdict, out)
        # A GPU whose ladder reached NodeReboot takes its node to the node remediator (drain, then
        # AwaitingRepair with reason NodeRebootRequested), until a release of the node after it.
        reboots = [
            Finding(Signal.NODE_REBOOT_REQUESTED, Action.REPAIR, r.message or f"GPU {i}: the node needs a reboot")
            for i, r in sorted(ladders.items())
            if r.phase == Phase.HANDED_OFF
            and r.step == StepKind.NODE_REBOOT
            and not (node_cleared and r.started and node_cleared >= r.started)
        ]
        if reboots:
            view = replace(view, findings=(*view.findings, *reboots))
        return DevicePlan(verdict, records, view, placement.fallbacks)

    def _locate(self, node: str, policy: Policy, rec: DeviceRecord, refs: Mapping[int, DeviceRef]) -> DeviceRecord:
        """Record the device (and rule name) of a GPU held out; a GPU in service keeps none."""
        if not rec.out_of_service:
            return replace(rec, device="", taint_rule="")
        ref = refs.get(rec.index) or DeviceRef.parse(rec.device)
        if ref is None:
            ref = self.slices.find(node, policy.devices.drivers, rec.index, rec.uuid).ref
        if ref is None:
            return rec
        rname = rule_name(ref)
        return replace(rec, device=str(ref), taint_rule="" if rname in self.taken else rname)

    # -- announcing --------------------------------------------------------------------------------

    def announce(self, name: str, policy: Policy, plan: DevicePlan, escalated: bool, fallback_new: bool) -> None:
        dry = policy.mode == Mode.DRY_RUN
        by_index = {r.index: r for r in plan.records}
        for ev in plan.verdict.events:
            rec = by_index.get(ev.index)
            msg = ev.message
            if rec is not None and rec.taint_rule:
                effect = "None" if dry else "NoSchedule"
                msg += f" [DeviceTaintRule {rec.taint_rule}, device {rec.device}, effect {effect}]"
            if dry:
                msg = f"DryRun (policy {policy.name}): the DeviceTaintRule has effect None, no pod is moved. {msg}"
            self.events("Node", name, name, ev.type, ev.reason, msg)
        if escalated:
            self.events(
                "Node",
                name,
                name,
                "Warning",
                "DeviceEscalated",
                f"{plan.verdict.escalate_reason}: the whole node is quarantined",
            )
        if fallback_new:
            for index, why in sorted(plan.fallbacks.items()):
                self.events("Node", name, name, "Warning", "NodeScopeFallback", f"GPU {index}: {why}")

    # -- rules -------------------------------------------------------------------------------------

    async def load_rules(self) -> None:
        """gpuhealth's rules as the API has them (at start, after a pause, and every RELIST_S)."""
        self._listed_at = time.monotonic()
        try:
            rules = await self.call(self.kube.list_device_taint_rules)
        except Exception as e:
            if status_of(e) != 404:
                raise
            rules = []  # this API server serves no resource.k8s.io/v1 DeviceTaintRules
        self.rules = {r["metadata"]["name"]: r for r in rules}

    async def converge_rules(self, name: str, policy: Policy, records: Iterable[DeviceRecord]) -> int:
        """Make gpuhealth's rules of the node what ``records`` hold out; returns the rules created."""
        dry = policy.mode == Mode.DRY_RUN
        desired = []
        for r in records:
            ref = DeviceRef.parse(r.device) if r.out_of_service else None
            if ref is not None and rule_name(ref) not in self.taken:
                desired.append(build_rule(ref, r.reason or "Unhealthy", dry, r.index, r.uuid))
        if desired:
            self.wanted[name] = {d["metadata"]["name"] for d in desired}
        else:  # only nodes holding GPUs out are kept, so the map cannot grow with node churn
            self.wanted.pop(name, None)
        existing = [r for r in self.rules.values() if _rule_node(r) == name]
        plan = plan_rules(desired, existing)
        mode = str(policy.mode)
        created_n = 0
        for rname, uid in plan.delete:
            if await self._delete(rname, uid):
                metrics.DEVICE_ACTIONS.labels("untaint", _reason(existing, rname), mode).inc()
        for body in plan.create:
            try:
                created = await self.call(self.kube.create_device_taint_rule, body)
            except Exception as e:
                if status_of(e) != 409:
                    raise
                rname = body["metadata"]["name"]
                log.info("DeviceTaintRule %s exists already; re-reading gpuhealth's rules", rname)
                await self.load_rules()
                if rname not in self.rules:
                    log.warning("DeviceTaintRule %s is someone else's: its GPU falls back to node scope", rname)
                    self.taken.add(rname)
                continue
            self.rules[created["metadata"]["name"]] = created
            metrics.DEVICE_ACTIONS.labels("taint", body["spec"]["taint"]["value"], mode).inc()
            created_n += 1
        return created_n

    async def _delete(self, rname: str, uid: str) -> bool:
        """Delete one of gpuhealth's rules once; False if it is already gone or being deleted."""
        if rname in self._deleting or rname not in self.rules:
            return False
        self._deleting.add(rname)
        try:
            await self.call(self.kube.delete_device_taint_rule, rname, uid or None)
        except Exception as e:
            if status_of(e) not in (404, 409):  # gone; or replaced since read (the next sweep re-reads)
                raise
        finally:
            self._deleting.discard(rname)
        self.rules.pop(rname, None)
        return True

    async def sweep(self) -> None:
        """Delete gpuhealth's rules that nothing wants: node gone or not governed, GPU not held out.

        Judged every tick from memory (our own creates and deletes keep ``self.rules`` current, and a
        deleted Node or policy shows in the store at once), so an idle fleet costs no request; the
        rules are listed again only every RELIST_S, for changes made by someone else.
        """
        if time.monotonic() - self._listed_at >= RELIST_S:
            await self.load_rules()
        for gone in [n for n in self.wanted if n not in self.store.nodes]:
            del self.wanted[gone]  # the Node was deleted: its wishes go with it
        for rname, rule in list(self.rules.items()):
            node = _rule_node(rule)
            policy = self.store.governing(node)[0] if node in self.store.nodes else None
            if policy is not None and policy.mode == Mode.PAUSED:
                continue
            if policy is not None and (rname in self.wanted.get(node, set()) or rname in _recorded(self.store, node)):
                continue
            if not await self._delete(rname, str(rule["metadata"].get("uid") or "")):
                continue  # deleted meanwhile by the node's own convergence
            log.info("deleted orphaned DeviceTaintRule %s (node %s)", rname, node)
            self.events(
                "Node",
                node,
                node,
                "Normal",
                "DeviceTaintRuleRemoved",
                f"Deleted gpuhealth's DeviceTaintRule {rname}: its GPU is no longer held out "
                "(node gone, no policy governs it, or the GPU is back in service)",
            )
        self._count()

    def _count(self) -> None:
        counts: dict[tuple[str, str], int] = {}
        for report in self.store.reports.values():
            status = report.get("status") or {}
            for d in status.get("devices") or []:
                key = (str(status.get("policy") or ""), str(d.get("state") or "InService"))
                counts[key] = counts.get(key, 0) + 1
        metrics.DEVICES.clear()
        for (p, s), n in counts.items():
            metrics.DEVICES.labels(p, s).set(n)


def _rule_node(rule: Mapping[str, Any]) -> str:
    labels = (rule.get("metadata") or {}).get("labels") or {}
    pool = ((rule.get("spec") or {}).get("deviceSelector") or {}).get("pool") or ""
    return str(labels.get(DEVICE_NODE_LABEL) or pool)


def _reason(rules: Iterable[Mapping[str, Any]], name: str) -> str:
    for r in rules:
        if r["metadata"]["name"] == name:
            return str(((r.get("spec") or {}).get("taint") or {}).get("value") or "")
    return ""


def _recorded(store: Store, node: str) -> set[str]:
    status = (store.reports.get(node) or {}).get("status") or {}
    return {
        str(d.get("taintRule"))
        for d in status.get("devices") or []
        if d.get("taintRule") and d.get("state") not in (None, "InService")
    }
