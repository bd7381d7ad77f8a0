"""Per-GPU quarantine inside the per-node pipeline: place, decide per GPU, then converge the rules.

Scope's steps 4-6, which ``scoping.py`` runs in order right after ``assess``: :meth:`DeviceReconciler.place`
holds a GPU's NVLink peers out with it where its reset needs them idle, and places device-scoped
findings on DRA devices (the ResourceSlice cache); GPUs no slice publishes fall back to node scope (the
reason is written into the finding, so the node's message and Event say it in words). The breaker's GPU
budget is then asked for the GPUs that newly want holding out (the one side effect, an explicit step
of its own), and :meth:`DeviceReconciler.decide` gives
each GPU its next record with ``decide_devices``. What the *node* state machine then decides on
(``evaluation/device_view.py``'s ``node_view``) depends on that verdict:

- the verdict escalates (too many bad GPUs, a flapping GPU under ``onFlapping: Node``, a GPU that
  cannot be told apart): every finding, device ones included, goes to the node;
- otherwise the placed device findings leave the node's assessment, and GPUs held out become one
  observe-level ``DeviceQuarantined`` finding: the node stays in service (state ``Degraded``,
  condition ``GPUHealthy=True`` with that reason), neither tainted nor cordoned.

A GPU is all of its DRA devices (``actions/gpudevices.py``): its full device and each MIG device or
placement. While it is held out its devices are mapped again on every pass, so a GPU re-partitioned
while out (new MIG devices in a new pool generation) gets its new devices held out too, and the
rules of devices that vanished go; if the slices vanish or contradict themselves meanwhile, the
recorded devices are kept (protection is never dropped on a gap).

After the node reconciler has written the status (the write-ahead record, ``status.devices[]``
with each GPU's devices and rule names), ``converge_rules`` (``device_rules.py``) makes
gpuhealth's DeviceTaintRules of that node exactly those the records want.

On a device-plugin node (no slice publishes its GPUs, the Node has ``nvidia.com/gpu`` capacity and
the agent reads the kubelet's pod-resources API) a GPU is held out without a device: its record says
how new work is kept off it (``keptOffBy``: the plugin withholds it, or gpuhealth's ``gpu-out``
taint on the Node, ``actions/plugin_hold.py``), the node reconciler converges that taint with the
Node, and the device drainer moves the pods the report names as holding it. A repaired GPU there
stays Recovering past its probation while the device plugin still withholds it (``evaluation/ladder.py``
``awaits_plugin``): the remediator restarts the plugin, and the GPU returns once allocatable shows it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuhealth.actions.devicetaints import rule_name
from gpuhealth.actions.gpudevices import GpuDevices
from gpuhealth.actions.placement import Placement, PluginNode, place
from gpuhealth.actions.plugin_hold import awaiting_kubelet, kept_off_by, kept_off_words, still_withheld
from gpuhealth.actions.slices import SlimSlice
from gpuhealth.api.devices import DeviceRecord, DeviceRef, devices_to_status
from gpuhealth.api.names import (
    RELEASE_GPU_ANNOTATION,
    Action,
    Mode,
    Scope,
    Signal,
)
from gpuhealth.api.nodes import device_plugin_mig, plugin_gpus
from gpuhealth.api.policy import Policy
from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import Phase
from gpuhealth.api.report import Report
from gpuhealth.api.status import drain_is_current
from gpuhealth.controller import metrics
from gpuhealth.controller.act.device_rules import DeviceRules
from gpuhealth.controller.act.passes import NodePass
from gpuhealth.controller.intake.slicewatch import SliceCache
from gpuhealth.controller.state.store import Store
from gpuhealth.evaluation.device_view import node_view
from gpuhealth.evaluation.devices import DeviceInputs, DeviceVerdict, decide_devices, slow_gpu
from gpuhealth.evaluation.findings import Assessment, Finding
from gpuhealth.evaluation.ladder import awaits_plugin, holds, repaired
from gpuhealth.evaluation.peers import Group, groups, with_peers
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.events import EventSink

log = logging.getLogger(__name__)
SLICES_GRACE_S = 30.0  # how long a restarted operator waits for its first ResourceSlice list


def released_gpus(annotations: Mapping[str, str]) -> frozenset[int]:
    """GPU indices named by the ``gpuhealth.dev/release-gpu`` annotation (``"3"`` or ``"3,5"``)."""
    raw = str(annotations.get(RELEASE_GPU_ANNOTATION) or "")
    return frozenset(int(p) for p in raw.replace(" ", "").split(",") if p.isdigit())


@dataclass(frozen=True)
class Placed:
    """A pass's device findings placed on DRA devices: what the GPU budget is asked for, then decided on."""

    assessment: Assessment
    findings: tuple[Finding, ...]  # the assessment's findings, a fallback's reason in its detail
    placement: Placement
    new: frozenset[int]  # GPUs that newly want holding out: what the breaker's GPU budget is asked for
    uuids: Mapping[int, str]  # GPU index -> UUID, as reported
    prior: Mapping[int, DeviceRecord]  # each GPU's record as the status holds it (read once per pass)
    new_slow: frozenset[int] = frozenset()  # of ``new``: those only slow signals take out (maxSlow's budget)
    groups: tuple[Group, ...] = ()  # faulted GPUs with the NVLink peers held out with them (evaluation/peers.py)


@dataclass(frozen=True)
class DevicePlan:
    verdict: DeviceVerdict
    records: tuple[DeviceRecord, ...]  # the verdict's records with their device and rule name
    node_view: Assessment  # what the node state machine decides on
    fallbacks: Mapping[int, str]  # GPU index -> why it falls back to node scope, in words
    # GPU index -> (devices now held out too, devices no longer published): re-partitioned while out
    changed: Mapping[int, tuple[list[str], list[str]]] = field(default_factory=dict)

    @property
    def out(self) -> tuple[DeviceRecord, ...]:
        return tuple(r for r in self.records if r.out_of_service)

    def status(self) -> list[dict[str, Any]]:
        return devices_to_status(self.records)

    def in_service(self, node_out: bool, total: int) -> int:
        """GPUs the scheduler may allocate: none while the node is out, else all but those held out
        as a whole (a GPU with only some of its MIG devices held out still serves with the others)."""
        return 0 if node_out else max(0, total - sum(1 for r in self.out if r.whole_gpu_out))


def _with_fallback(f: Finding, fallbacks: Mapping[int, str], placed: Finding) -> Finding:
    if placed.scope == f.scope or placed.gpu is None or placed.gpu not in fallbacks:
        return placed
    return replace(placed, detail=f"{placed.detail} ({fallbacks[placed.gpu]})")


class DeviceReconciler(DeviceRules):
    def __init__(
        self,
        *,
        kube: AsyncKube,
        store: Store,
        slices: SliceCache,
        events: EventSink,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.kube = kube
        self.store = store
        self.slices = slices
        self.events = events
        self.clock = clock
        self._born = time.monotonic()
        self._init_rules()

    def slices_pending(self, a: Assessment) -> bool:
        """Whether ``a`` has a device-scoped finding the slice cache cannot place yet: the first list
        of ResourceSlices since the operator started is not in yet, and it has had less than
        SLICES_GRACE_S to come (a relist after 410 Gone keeps the slices it replaces until it is
        in). Placed now, the GPU would find no DRA device and take its node out; the node is decided
        again once the slices are in (the watch requeues it). Past the grace (slices that cannot be
        listed at all) the GPU falls back to node scope, the safe side. A cluster that serves no
        ResourceSlices counts as listed, empty."""
        if self.slices.synced.is_set() or time.monotonic() - self._born >= SLICES_GRACE_S:
            return False
        return any(f.scope == Scope.DEVICE for f in a.findings)

    # -- deciding ----------------------------------------------------------------------------------

    def place(self, p: NodePass) -> Placed:
        """Place the device-scoped findings on the GPUs' DRA devices (the slice cache), with the reason
        of each GPU that falls back to node scope; which GPUs newly want holding out (the breaker's
        GPU budget is asked for them by the caller, before :meth:`decide`). No side effect."""
        name, policy, report, a = p.name, p.policy, p.report, p.assessment
        uuids = {d.index: d.uuid for d in report.devices} if report is not None else {}
        prior = p.found.devices
        # P2P-aware repair: the NVLink peers of a GPU about to be reset are held out with it, for the
        # reset gpuhealth runs (without spec.remediation nobody resets it: the GPU is held alone).
        if policy.remediation.enabled:
            gs = groups(report, a.findings, p.found.ladders, prior)
            a = with_peers(a, report, gs)
        else:
            gs = ()
        # Most reconciles have no device-scoped finding: skip reading the slice cache for them.
        wanted = any(f.scope == Scope.DEVICE for f in a.findings)
        placement = place(
            a.findings,
            name,
            self._slices_for(name, a, uuids) if wanted else (),
            policy.devices.drivers,
            uuids,
            self.taken,
            device_plugin_mig(p.node),
            plugin_node(p.node, report),
        )
        findings = tuple(
            _with_fallback(f, placement.fallbacks, p) for f, p in zip(a.findings, placement.findings, strict=True)
        )
        new = frozenset(
            f.gpu
            for f in findings
            if f.scope == Scope.DEVICE
            and f.action.quarantines
            and f.gpu is not None
            and not (prior.get(f.gpu) and prior[f.gpu].out_of_service)
        )
        taking: dict[int, list[Finding]] = {}
        for f in findings:
            if f.gpu in new and f.scope == Scope.DEVICE:
                taking.setdefault(f.gpu, []).append(f)
        new_slow = frozenset(g for g, fs in taking.items() if slow_gpu(fs))
        return Placed(a, findings, placement, new, uuids, prior, new_slow=new_slow, groups=gs)

    def _slices_for(self, name: str, a: Assessment, uuids: Mapping[int, str]) -> list[SlimSlice]:
        """The slices the placement of ``name``'s findings reads: the node's pools and those publishing
        its GPUs' UUIDs (``SliceCache.for_node``); every slice when a GPU has no UUID to look for."""
        found = [f for f in a.findings if f.scope == Scope.DEVICE]
        if any(not (f.uuid or (f.gpu is not None and uuids.get(f.gpu))) for f in found):
            return self.slices.slices()
        return self.slices.for_node(name, [*uuids.values(), *(f.uuid for f in found)])

    def decide(self, p: NodePass, placed: Placed, gpu_budget: int, slow_budget: int = 0) -> DevicePlan:
        """Each GPU's next record (``decide_devices``, with the GPU budget the breaker gave), its
        devices and rule names, and the assessment the node state machine decides on. No side effect."""
        a, findings, placement, uuids = placed.assessment, list(placed.findings), placed.placement, placed.uuids
        name, policy, now, released, node_cleared = p.name, p.policy, p.now, p.gpus, p.cleared
        prior = placed.prior
        drains = p.found.device_drains
        drained = frozenset(
            i
            for i, d in drains.items()
            if d.get("phase") == "Completed" and i in prior and drain_is_current(d, prior[i])
        )
        ladders = p.found.ladders if policy.remediation.enabled else {}
        # A repaired GPU on the device-plugin route returns only once the device plugin offers it again.
        withheld = still_withheld(p.node, sum(1 for r in prior.values() if r.via_plugin and r.out_of_service))
        plugin_held = frozenset(
            i for i, r in ladders.items() if i in prior and prior[i].via_plugin and awaits_plugin(r, withheld)
        )
        inputs = DeviceInputs(
            fresh=not a.unknown,
            gpu_budget=gpu_budget,
            slow_budget=slow_budget,
            drained=drained,
            released=released,
            uuids=uuids,
            replace=frozenset(i for i, r in ladders.items() if r.step == StepKind.REPLACE) - released,
            acknowledged={i: r.finished for i, r in ladders.items() if repaired(r) and r.finished},
            validating=frozenset(
                i for i, r in ladders.items() if holds(r, policy.validation) and r.phase != Phase.READY
            )
            | plugin_held,
            validation_failed={
                i: (r.validation.findings if r.validation else "") or "no result"
                for i, r in ladders.items()
                if holds(r, policy.validation) and r.phase == Phase.READY
            },
            groups=tuple(g.members for g in placed.groups),
        )
        verdict = decide_devices(prior, findings, policy, now, inputs)
        reported = frozenset(u for u in uuids.values() if u)
        # Held out on the device-plugin route: placed there this pass, or held out there before (a GPU
        # on probation has no finding left to place) and not published by a slice since.
        plugin = [
            r.index
            for r in verdict.records
            if r.out_of_service and r.index not in placement.refs and (r.index in placement.plugin or r.via_plugin)
        ]
        awaiting = awaiting_kubelet((r for r in verdict.records if r.index in plugin), now)
        how = kept_off_by(p.node, len(plugin), mig=bool(device_plugin_mig(p.node)), awaiting=awaiting)
        records = tuple(
            replace(r, kept_off_by=how, devices=(), partitions=(), taint_rules=(), instances=())
            if r.index in plugin
            else self._locate(name, policy, r, placement.refs, reported, placement.instances)
            for r in verdict.records
        )
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
        changed = {
            r.index: (sorted(set(r.devices) - set(was.devices)), sorted(set(was.devices) - set(r.devices)))
            for r in out
            if (was := prior.get(r.index)) is not None
            and was.out_of_service
            and was.devices
            and set(was.devices) != set(r.devices)
        }
        return DevicePlan(verdict, records, view, placement.fallbacks, changed)

    def _locate(
        self,
        node: str,
        policy: Policy,
        rec: DeviceRecord,
        placed: Mapping[int, GpuDevices],
        reported: frozenset[str],
        instances: Mapping[str, DeviceRef] | None = None,
    ) -> DeviceRecord:
        """Record the devices (and rule names) of a GPU held out; a GPU in service keeps none.

        The devices are mapped again on every pass (a GPU re-partitioned while out gets its new
        devices held out, vanished ones let go); where the slices now give none, or contradict
        themselves, the recorded devices are kept, and while a pool is being republished (fewer
        slices of its newest generation than its ``resourceSliceCount``) they are kept beside the new.
        A GPU held out by some MIG instances alone (``rec.instances``) records just their devices."""
        if not rec.out_of_service:
            return replace(rec, devices=(), partitions=(), taint_rules=(), kept_off_by="")
        if rec.instances:
            match = self._instance_devices(node, policy, rec, instances or {})
        else:
            match = placed.get(rec.index) or self.slices.find(
                node, policy.devices.drivers, rec.index, rec.uuid, reported
            )
        if match.refs and not match.conflict:
            devices = tuple(str(r) for r in match.refs)
            partitions = tuple(str(r) for r in match.partitions)
            if not match.complete:  # a pool being republished: keep what is recorded until it is whole
                devices += tuple(d for d in rec.devices if d not in devices)
                partitions += tuple(d for d in rec.partitions if d not in partitions)
        elif rec.devices:
            devices, partitions = rec.devices, rec.partitions
        else:
            return rec
        refs = replace(rec, devices=devices).refs()
        rules = tuple(n for n in (rule_name(r) for r in refs) if n not in self.taken)
        return replace(rec, devices=devices, partitions=partitions, taint_rules=rules)

    def _instance_devices(
        self, node: str, policy: Policy, rec: DeviceRecord, placed: Mapping[str, DeviceRef]
    ) -> GpuDevices:
        """The MIG devices of the instances a record holds out alone (placed this pass, or by UUID);
        none when one of them cannot be found (the recorded devices are then kept)."""
        refs: list[DeviceRef] = []
        for uuid in rec.instances:
            ref = placed.get(uuid) or self.slices.by_uuid(node, policy.devices.drivers, uuid).ref
            if ref is None:
                return GpuDevices()
            refs.append(ref)
        return GpuDevices(tuple(sorted(refs)), tuple(sorted(refs)))

    # -- announcing --------------------------------------------------------------------------------

    def announce(self, p: NodePass, plan: DevicePlan, escalated: bool, fallback_new: bool) -> None:
        name, policy = p.name, p.policy
        dry = policy.mode == Mode.DRY_RUN
        by_index = {r.index: r for r in plan.records}
        for _, seconds in plan.verdict.intervals:
            metrics.GPU_TIME_BETWEEN_FAILURES.observe(seconds)
        for ev in plan.verdict.events:
            rec = by_index.get(ev.index)
            msg = ev.message
            if rec is not None and rec.taint_rules:
                msg += " " + held_out_words(rec, "None" if dry else "NoSchedule")
            if rec is not None and rec.via_plugin and rec.out_of_service:
                msg += " " + plugin_words(rec, p)
            if dry and rec is not None and rec.via_plugin:
                msg = f"DryRun (policy {policy.name}): no Node is tainted, no pod is moved. {msg}"
            elif dry:
                msg = f"DryRun (policy {policy.name}): the DeviceTaintRule has effect None, no pod is moved. {msg}"
            self.events("Node", name, name, ev.type, ev.reason, msg)
        for index, (added, removed) in sorted(plan.changed.items()):
            rec = by_index[index]
            self.events(
                "Node",
                name,
                name,
                "Normal",
                "DeviceSetChanged",
                f"GPU {index}"
                + (f" ({rec.uuid})" if rec.uuid else "")
                + " changed its DRA devices while held out"
                + (f": now also held out {_names(added)}" if added else "")
                + (f"; no longer published, their rules go: {_names(removed)}" if removed else ""),
            )
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


_LIST_MAX = 8  # device names listed in an Event before "and N more"


def plugin_node(node: Mapping[str, Any] | None, report: Report | None) -> PluginNode | None:
    """The node as ``place`` sees a device-plugin node: served by a device plugin (``nvidia.com/gpu``
    capacity or NVIDIA's MIG resources), with what its agent read of the pod-resources API; None
    where no device plugin serves GPUs on it."""
    mig = device_plugin_mig(node)
    if plugin_gpus(node) is None and not mig:
        return None
    return PluginNode(report.pod_resources if report is not None else None, mig)


def plugin_words(rec: DeviceRecord, p: NodePass) -> str:
    """How a GPU held out on the device-plugin route is held, for its Events: the route, how new work
    is kept off it, the pods the report names as holding it, and that the node's other GPUs keep theirs."""
    holders = sorted({f"{h.namespace}/{h.name}" for h in p.report.holders(rec.index)}) if p.report else []
    more = len(holders) - _LIST_MAX
    listed = ", ".join(holders[:_LIST_MAX]) + (f" and {more} more" if more > 0 else "")
    pods = f"only its pod{'s' if len(holders) != 1 else ''} {listed} drained" if holders else "no pod holds it"
    return (
        f"[device plugin route (no DRA ResourceSlice publishes it): {kept_off_words(p.node, rec.kept_off_by)}; "
        f"{pods}; the node is not cordoned and its other GPUs keep their work]"
    )


def _names(items: Sequence[str]) -> str:
    names = [d.rpartition("/")[2] for d in items]
    more = len(names) - _LIST_MAX
    return ", ".join(names[:_LIST_MAX]) + (f" and {more} more (status.devices[].devices)" if more > 0 else "")


def held_out_words(rec: DeviceRecord, effect: str) -> str:
    """How a GPU is held out, for its Events: its devices and their rules. Pure.

    One device: ``[DeviceTaintRule R, device D, effect E]`` (as for a GPU without partitions).
    More: ``held out with gpu-0 and its 12 MIG placements ... [DeviceTaintRules ...; effect E]``."""
    if len(rec.devices) == 1 and len(rec.taint_rules) == 1:
        return f"[DeviceTaintRule {rec.taint_rule}, device {rec.device}, effect {effect}]"
    full = [d for d in rec.devices if d not in rec.partitions]
    parts = [d for d in rec.devices if d in rec.partitions]
    words = "held out with " + (f"{_names(full)} and " if full else "")
    words += f"its {len(parts)} MIG device{'s' if len(parts) != 1 else ''} {_names(parts)}" if parts else ""
    return f"{words.removesuffix(' and ')} [DeviceTaintRules {_names(rec.taint_rules)}; effect {effect}]"
