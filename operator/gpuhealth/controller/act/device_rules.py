"""gpuhealth's DeviceTaintRules: converge a node's rules to its per-GPU records, sweep orphans.

A GPU held out is all of its DRA devices (its full device, each MIG device or placement), so its
record (``status.devices[]``: ``devices``, ``taintRules``) names one rule per device, each named
after its device alone (``actions.devicetaints.rule_name``). After the node reconciler has written
that record (write-ahead), :meth:`DeviceRules.converge_rules` makes gpuhealth's rules of the node
exactly those the records want: idempotent by name (409 on create is done, 404 on delete is gone),
deletes with a uid precondition. A kill between two rule writes leaves the record naming every
rule; the restarted operator creates the missing ones once. A rule without gpuhealth's label is
never changed or deleted. :meth:`DeviceRules.sweep` deletes gpuhealth's rules whose node is gone or
no longer governed, or whose device no record holds out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpuhealth.actions.devicetaints import build_rule, plan_rules, rule_name
from gpuhealth.api.devices import DeviceRecord
from gpuhealth.api.names import DEVICE_KIND_LABEL, DEVICE_NODE_LABEL, Mode
from gpuhealth.api.policy import Policy
from gpuhealth.controller import metrics
from gpuhealth.controller.state.store import Store
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.client import status_of
from gpuhealth.kube.events import EventSink

log = logging.getLogger(__name__)
# Our rules are re-listed this often for changes someone else made; our own are tracked in memory.
RELIST_S = 300.0


def desired_rules(records: Iterable[DeviceRecord], dry_run: bool, taken: Iterable[str] = ()) -> list[dict[str, Any]]:
    """One rule per device of every GPU the records hold out, except names someone else holds. Pure."""
    skip = set(taken)
    out = []
    for r in records:
        if not r.out_of_service:
            continue
        for ref in r.refs():
            if rule_name(ref) not in skip:
                kind = "mig" if str(ref) in r.partitions else "gpu"
                out.append(build_rule(ref, r.reason or "Unhealthy", dry_run, r.index, r.uuid, kind))
    return out


class DeviceRules:
    """The rule half of the device reconciler (mixed into ``DeviceReconciler``)."""

    kube: AsyncKube
    store: Store
    events: EventSink

    def _init_rules(self) -> None:
        self.rules: dict[str, dict[str, Any]] = {}  # gpuhealth's DeviceTaintRules by name
        # The same rules' names by node: a node's convergence reads only its own, not every rule of the
        # fleet (a MIG fleet holds seven per GPU out, and each pass of a node used to walk them all).
        self._by_node: dict[str, set[str]] = {}
        self._listed_at = float("-inf")
        self.wanted: dict[str, set[str]] = {}  # node -> the rule names its last convergence wanted
        # Rules whose delete is on its way: a node's convergence and the sweep may both find the
        # same rule unwanted, and the second would otherwise send a delete that can only get a 404.
        self._deleting: set[str] = set()
        # Names of our rules that someone else's DeviceTaintRule holds (a create answered 409 and the
        # re-list has no rule of ours by that name): those GPUs fall back to node scope from then on,
        # until this process restarts and tries again.
        self.taken: set[str] = set()

    async def load_rules(self) -> None:
        """gpuhealth's rules as the API has them (at start, after a pause, and every RELIST_S)."""
        self._listed_at = time.monotonic()
        try:
            rules = await self.kube.list_device_taint_rules()
        except Exception as e:
            if status_of(e) != 404:
                raise
            rules = []  # this API server serves no resource.k8s.io/v1 DeviceTaintRules
        self.rules = {r["metadata"]["name"]: r for r in rules}
        self._by_node = {}
        for rname, rule in self.rules.items():
            self._by_node.setdefault(_rule_node(rule), set()).add(rname)

    def _keep(self, rule: dict[str, Any]) -> None:
        rname = rule["metadata"]["name"]
        self.rules[rname] = rule
        self._by_node.setdefault(_rule_node(rule), set()).add(rname)

    def _forget(self, rname: str) -> None:
        rule = self.rules.pop(rname, None)
        if rule is None:
            return
        names = self._by_node.get(_rule_node(rule))
        if names is not None:
            names.discard(rname)
            if not names:
                del self._by_node[_rule_node(rule)]

    def rules_of(self, node: str) -> list[dict[str, Any]]:
        """gpuhealth's rules of one node, as this process knows them."""
        return [self.rules[n] for n in sorted(self._by_node.get(node, ()))]

    async def converge_rules(self, name: str, policy: Policy, records: Iterable[DeviceRecord]) -> int:
        """Make gpuhealth's rules of the node what ``records`` hold out; returns the rules created."""
        desired = desired_rules(records, policy.mode == Mode.DRY_RUN, self.taken)
        if desired:
            self.wanted[name] = {d["metadata"]["name"] for d in desired}
        else:  # only nodes holding GPUs out are kept, so the map cannot grow with node churn
            self.wanted.pop(name, None)
        existing = self.rules_of(name)
        plan = plan_rules(desired, existing)
        mode = str(policy.mode)
        for rname, uid in plan.delete:
            if await self._delete(rname, uid):
                metrics.DEVICE_ACTIONS.labels("untaint", _reason(existing, rname), mode).inc()
        # A GPU's rules (seven on a 7-way MIG GPU) go out side by side: its last device is out of the
        # scheduler's reach one round trip after the fault, not seven.
        results = await asyncio.gather(*(self._create(body, mode) for body in plan.create), return_exceptions=True)
        conflicts = [body["metadata"]["name"] for body, r in zip(plan.create, results, strict=True) if r is False]
        if conflicts:
            log.info("DeviceTaintRules %s exist already; re-reading gpuhealth's rules", ", ".join(conflicts))
            await self.load_rules()
            for rname in conflicts:
                if rname not in self.rules:
                    log.warning("DeviceTaintRule %s is someone else's: its GPU falls back to node scope", rname)
                    self.taken.add(rname)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        created_n = sum(1 for r in results if r is True)
        return created_n

    async def _create(self, body: dict[str, Any], mode: str) -> bool:
        """Create one rule; False when one of its name exists already (409)."""
        try:
            created = await self.kube.create_device_taint_rule(body)
        except Exception as e:
            if status_of(e) != 409:
                raise
            return False
        self._keep(created)
        metrics.DEVICE_ACTIONS.labels("taint", body["spec"]["taint"]["value"], mode).inc()
        return True

    async def _delete(self, rname: str, uid: str) -> bool:
        """Delete one of gpuhealth's rules once; False if it is already gone or being deleted."""
        if rname in self._deleting or rname not in self.rules:
            return False
        self._deleting.add(rname)
        try:
            await self.kube.delete_device_taint_rule(rname, uid or None)
        except Exception as e:
            if status_of(e) not in (404, 409):  # gone; or replaced since read (the next sweep re-reads)
                raise
        finally:
            self._deleting.discard(rname)
        self._forget(rname)
        return True

    async def sweep(self) -> None:
        """Delete gpuhealth's rules that nothing wants: node gone or not governed, device not held out.

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
                f"Deleted gpuhealth's DeviceTaintRule {rname}: its device is no longer held out "
                "(node gone, no policy governs it, the GPU is back in service, or the device vanished)",
            )
        self._count()

    def _count(self) -> None:
        """``gpuhealth_device_rules``, from the rules in memory: a tick costs the rules, not the fleet.
        The GPUs' own gauges come from the policies' tallies with the other per-policy counts
        (``policy_status.py``, ``state/capacity.py``)."""
        rules: dict[tuple[str, str], int] = {}
        for rule in self.rules.values():
            node = _rule_node(rule)
            governing = self.store.governing(node)[0] if node in self.store.nodes else None
            labels = (rule.get("metadata") or {}).get("labels") or {}
            key = (governing.name if governing else "", str(labels.get(DEVICE_KIND_LABEL) or "gpu"))
            rules[key] = rules.get(key, 0) + 1
        metrics.DEVICE_RULES.clear()
        for (p, k), n in rules.items():
            metrics.DEVICE_RULES.labels(p, k).set(n)


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
    """The rule names the node's records hold out (both the list and the previous version's field)."""
    return {n for r in store.status(node).devices.values() if r.out_of_service for n in r.taint_rules}
