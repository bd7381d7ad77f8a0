"""Scope as one pipeline: what each finding of a node's pass takes out, one GPU (or MIG device), the
node, its NVLink domain or its rack, decided in one order, here.

The node reconciler (``node_reconciler.py``) asks twice per pass: :meth:`Scoping.assess` before it
builds the pass (steps 1-3: they make the assessment), and :meth:`Scoping.devices` once the pass is
built (steps 4-6: they need the pass's stored records). Each step's rule lives where its facts are;
this module runs them, in this order:

1. **Built-in scope**, per finding (``evaluation/scope.py`` ``scope_of``): a fault whose remedy is a
   reset of that GPU is the GPU's (NVIDIA's XID catalog, ``api/recovery.py`` for XID 154's recovery
   action, ``RULE_SCOPE`` for the other rules); a reboot's remedy, a lost or missing GPU, a silent
   agent, a finding without a GPU is the node's. A restart loop is the node's unless every failing
   pod holds one GPU or MIG device (``evaluation/restarts.py``, with the DRA claims listed only once
   a loop is found).
2. **Policy**, in the same call: ``spec.rules.<rule>.scope``, ``spec.rules.xid.overrides[].scope`` and
   ``spec.devices.scope: Node`` narrow or widen the built-in scope; nothing narrows 3.
3. **Above the node** (``evaluation/domains.py`` through ``controller/state/topology.py``): an NVLink
   domain's fault is every member's one finding (``Domain`` scope), added to the assessment; a power
   brake on enough of a rack is the rack's one finding (``Rack``) in place of each node's own.
4. **NVLink peers** (``evaluation/peers.py``): a GPU whose recovery action needs its NVLink peers idle
   holds them out with it, for the reset gpuhealth runs (``spec.remediation`` on; otherwise nobody
   resets it and it is held alone). Peers are GPUs of the node: this step and step 3 touch disjoint
   findings, so running 3 first changes no outcome.
5. **Placement** (``actions/placement.py``): each GPU-scoped finding is placed on the GPU's DRA devices
   (the ResourceSlice cache) or on the device-plugin route; a GPU that can be neither falls back to
   node scope, its reason written into the finding.
6. **Escalation** (``evaluation/devices.py`` ``decide_devices``, ``evaluation/device_view.py``
   ``node_view``): each GPU's verdict under the GPU budgets the breaker gives (``spec.safety``:
   ``maxBadGPUs`` for dead GPUs, ``maxSlow`` for slow ones); too many bad GPUs on the node
   (``maxBadGPUsPerNode``), a flapping GPU under ``onFlapping: Node`` or a GPU that cannot be told
   apart take the whole node.

What is left at node scope then goes to the breaker (:meth:`Scoping.admit`): a domain's fault takes
every member or none (``Breaker.admit_domain``), anything else the node's own slot.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from gpuhealth.actions.pod_sites import pod_sites
from gpuhealth.api.policy import Policy
from gpuhealth.api.report import Report
from gpuhealth.controller.act.device_drainer import DeviceDrainer
from gpuhealth.controller.act.device_reconciler import DevicePlan, DeviceReconciler
from gpuhealth.controller.act.passes import NodePass
from gpuhealth.controller.state.breaker import Breaker
from gpuhealth.controller.state.store import Store
from gpuhealth.controller.state.topology import DomainView, Topology
from gpuhealth.evaluation.assess import Assessment, Finding, NodeView, assess
from gpuhealth.evaluation.restarts import restart_loop_finding
from gpuhealth.evaluation.scope import slow_only


@dataclass(frozen=True)
class Assessed:
    """Steps 1-3: the node's assessment with every finding scoped, and its NVLink domain's view."""

    assessment: Assessment
    domain: DomainView | None


class Scoping:
    def __init__(
        self,
        *,
        store: Store,
        breaker: Breaker,
        devices: DeviceReconciler,
        device_drainer: DeviceDrainer,
        topology: Topology,
    ) -> None:
        self.store = store
        self.breaker = breaker
        self.devices = devices
        self.device_drainer = device_drainer
        self.topology = topology

    async def assess(
        self,
        name: str,
        policy: Policy,
        report: Report | None,
        view: NodeView,
        now: dt.datetime,
        pending: Mapping[str, str] | None,
        cleared: dt.datetime | None,
    ) -> Assessed:
        """Steps 1-3 (see the module docstring): assess the report with each finding's built-in and
        policy scope, the restart loop narrowed to its GPU, the NVLink domain's finding among them,
        and a rack's finding in place of this node's own power brake."""
        loop = await self._restart_loop(name, policy, report, now)
        domain = self.topology.domain(name, policy, now)
        extra = tuple(f for f in (loop, domain.finding if domain else None) if f is not None)
        a = assess(policy, report, view, now, pending, cleared, extra)
        return Assessed(self.topology.rack(name, policy, a, now), domain)

    async def _restart_loop(self, name: str, policy: Policy, report: Report | None, now: dt.datetime) -> Finding | None:
        """The node's restart-loop finding, narrowed to one GPU or MIG device where every failing pod
        holds it. Claims are listed (cached for a second across nodes) only once a loop is found."""
        pods, workloads = self.store.pods.on(name), self.store.pods.workloads()
        loop = restart_loop_finding(policy, name, pods, workloads, now)
        if loop is None or report is None or not policy.devices.enabled:
            return loop
        slices = self.devices.slices.slices()
        if not slices:
            return loop
        claims = await self.device_drainer.claims()
        sites = pod_sites(name, slices, policy.devices.drivers, report, claims, pods)
        return restart_loop_finding(policy, name, pods, workloads, now, sites)

    async def devices_of(self, p: NodePass) -> DevicePlan:
        """Steps 4-6: NVLink peers and placement (``DeviceReconciler.place``), the breaker's GPU budgets
        for the GPUs that newly want holding out, then each GPU's verdict and what the node decides on
        (``DeviceReconciler.decide``). The budgets stay reserved until the node reconciler's status
        write (``Breaker.release``)."""
        placed = self.devices.place(p)
        # GPUs only slow signals take out spend maxSlow's budget, the others the one meant for dead GPUs.
        broken = len(placed.new - placed.new_slow)
        budget = await self.breaker.gpu_budget(p.policy, p.name, broken) if broken else 0
        slow = len(placed.new_slow)
        slow_budget = await self.breaker.gpu_budget(p.policy, p.name, slow, slow=True) if slow else 0
        return self.devices.decide(p, placed, budget, slow_budget)

    async def admit(self, policy: Policy, name: str, a: Assessment, domain: DomainView | None) -> bool:
        """The breaker's answer for what is left at node scope: one for the whole NVLink domain when its
        fault takes this node out (all members or none), else this node's own slot."""
        if domain is not None and domain.finding is not None and domain.finding.action.quarantines:
            return await self.breaker.admit_domain(policy, name, domain.members, domain.decided)
        return await self.breaker.admit(policy, name, slow=slow_only(a))
