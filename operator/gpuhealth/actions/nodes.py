"""Pure builders for what gpuhealth writes on a Node: taint, cordon, state label, ownership, condition.

Ownership is recorded on the Node itself, in the same patch as the action, so it is atomic with it:
the annotation says which taint and which cordon gpuhealth placed. gpuhealth lifts only those. A
cordon that was already there belongs to someone else and is never lifted. If someone lifts ours,
that is recorded (the annotation says so) and not fought. Under ``spec.actions.cordon: false``
(``Marks.cordon`` false) the node is held by the taint alone: the annotation records the episode as
``taintOnly``, no pass cordons it, and a cordon gpuhealth placed before the setting changed is lifted
by the next pass; set back to true, the next pass cordons a node held by the taint alone.

Taints have no merge key, so the whole list is rewritten; every patch carries the resourceVersion it
was computed from, and the API server refuses it (409) if anyone changed the Node in between.

On a device-plugin node a GPU held out alone may want gpuhealth's second taint, ``gpuhealth.dev/gpu-out``
(NoSchedule, ``actions/plugin_hold.py``): ``Marks.gpu_out`` places it and lifts it, in the same patch.
Both keys are gpuhealth's own: a taint of either key is gpuhealth's; every other taint is left as it is.

The condition lives in the Node's status, written through ``nodes/status``. That subresource resets
only the spec, so a plan that changes no spec (a state label, an ownership record) rides on the
condition's write: a node's first verdict is one Node write, not two (``node_writes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.api.names import (
    CONDITION_TYPE,
    GPU_OUT_TAINT_KEY,
    QUARANTINE_ANNOTATION,
    STATE_LABEL,
    TAINT_KEY,
    State,
)
from gpuhealth.api.ownership import Ownership

__all__ = ["Marks", "NodePlan", "Ownership", "condition_message", "node_writes", "plan_condition", "plan_node"]

# What the Node's condition adds while a node is held under spec.actions.cordon: false.
TAINT_ONLY_NOTE = "held by gpuhealth's taint alone, not cordoned (spec.actions.cordon: false)"


@dataclass(frozen=True)
class Marks:
    """What gpuhealth wants on the Node."""

    state: State
    quarantine: bool
    reason: str = ""
    effect: str = "NoSchedule"
    cordon: bool = True
    since: str = ""
    # gpuhealth's gpu-out taint (a GPU held out on a device-plugin node that the plugin does not
    # withhold), with the GPUs it is for, in words (its value, up to 63 characters)
    gpu_out: bool = False
    gpu_out_value: str = ""


@dataclass(frozen=True)
class NodePlan:
    """A merge patch for the Node (None if nothing to change) and what it means."""

    patch: dict[str, Any] | None
    # "taint", "cordon", "untaint", "uncordon", "retaint", "gpu-out-taint", "gpu-out-retaint",
    # "gpu-out-untaint"
    actions: tuple[str, ...] = ()
    lifted_by_others: tuple[str, ...] = ()  # "taint" / "cordon" that someone else removed
    foreign_cordon: bool = False  # the node was already cordoned by someone else


def _our_taint(marks: Marks) -> dict[str, str]:
    return {"key": TAINT_KEY, "value": marks.reason[:63], "effect": marks.effect}


def plan_node(node: Mapping[str, Any], marks: Marks) -> NodePlan:
    """Everything needed to make ``node`` carry ``marks``, preserving every foreign taint and cordon."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    taints: list[dict[str, Any]] = list(spec.get("taints") or [])
    ours = [t for t in taints if t.get("key") == TAINT_KEY]
    foreign = [t for t in taints if t.get("key") != TAINT_KEY]
    unschedulable = bool(spec.get("unschedulable"))
    owned = Ownership.parse(annotations.get(QUARANTINE_ANNOTATION))

    new_taints = taints
    new_unschedulable = unschedulable
    new_owned: Ownership | None = owned
    actions: list[str] = []
    lifted: list[str] = []
    foreign_cordon = False

    if marks.quarantine:
        if owned is None:
            # A new quarantine episode: place our taint, and cordon unless someone already did.
            foreign_cordon = unschedulable
            want_cordon = marks.cordon and not unschedulable
            new_taints = [*foreign, _our_taint(marks)]
            actions.append("taint")
            if want_cordon:
                new_unschedulable = True
                actions.append("cordon")
            new_owned = Ownership(
                marks.reason, taint=True, cordon=want_cordon, since=marks.since, taint_only=not marks.cordon
            )
        else:
            taint_on, cordon_on = owned.taint, owned.cordon
            if owned.taint and not ours:
                lifted.append("taint")
                taint_on = False
            if owned.cordon and not unschedulable:
                lifted.append("cordon")
                cordon_on = False
            # The policy's cordon setting changed while the node is held: the next pass converges. Turned
            # off, the cordon gpuhealth recorded is lifted (the taint holds the node alone); turned back
            # on, a node held by the taint alone is cordoned as a new episode would be, unless someone
            # else's cordon is already there or someone lifted gpuhealth's earlier in the episode.
            if not marks.cordon and cordon_on:
                new_unschedulable = False
                actions.append("uncordon")
                cordon_on = False
            elif marks.cordon and owned.taint_only:
                if unschedulable:
                    foreign_cordon = True
                elif "cordon" not in owned.lifted_by_others:
                    new_unschedulable = True
                    actions.append("cordon")
                    cordon_on = True
            if taint_on:
                want = _our_taint(marks)
                if len(ours) != 1 or {k: ours[0].get(k) for k in ("key", "value", "effect")} != want:
                    new_taints = [*foreign, want]
                    actions.append("retaint")
            elif ours and not owned.taint:
                pass  # someone else put our key back: leave it alone
            new_owned = Ownership(
                marks.reason,
                taint=taint_on,
                cordon=cordon_on,
                since=owned.since or marks.since,
                lifted_by_others=tuple(sorted(set(owned.lifted_by_others) | set(lifted))),
                taint_only=not marks.cordon,
            )
    else:
        if ours:
            new_taints = foreign
            actions.append("untaint")
        if owned is not None and owned.cordon and unschedulable:
            new_unschedulable = False
            actions.append("uncordon")
        new_owned = None

    gpu_out = [t for t in new_taints if t.get("key") == GPU_OUT_TAINT_KEY]
    want_gpu_out = {"key": GPU_OUT_TAINT_KEY, "value": marks.gpu_out_value[:63], "effect": "NoSchedule"}
    if marks.gpu_out and [{k: t.get(k) for k in want_gpu_out} for t in gpu_out] != [want_gpu_out]:
        new_taints = [*(t for t in new_taints if t.get("key") != GPU_OUT_TAINT_KEY), want_gpu_out]
        actions.append("gpu-out-taint" if not gpu_out else "gpu-out-retaint")
    elif not marks.gpu_out and gpu_out:
        new_taints = [t for t in new_taints if t.get("key") != GPU_OUT_TAINT_KEY]
        actions.append("gpu-out-untaint")

    patch_meta: dict[str, Any] = {}
    if labels.get(STATE_LABEL) != str(marks.state):
        patch_meta["labels"] = {STATE_LABEL: str(marks.state)}
    new_ann = new_owned.to_json() if new_owned else None
    if annotations.get(QUARANTINE_ANNOTATION) != new_ann:
        patch_meta["annotations"] = {QUARANTINE_ANNOTATION: new_ann}
    patch_spec: dict[str, Any] = {}
    if new_taints is not taints:
        patch_spec["taints"] = new_taints or None
    if new_unschedulable != unschedulable:
        patch_spec["unschedulable"] = new_unschedulable or None
    if not patch_meta and not patch_spec:
        return NodePlan(None, tuple(actions), tuple(lifted), foreign_cordon)
    patch_meta["resourceVersion"] = meta.get("resourceVersion")
    patch: dict[str, Any] = {"metadata": patch_meta}
    if patch_spec:
        patch["spec"] = patch_spec
    return NodePlan(patch, tuple(actions), tuple(lifted), foreign_cordon)


def condition_message(message: str, marks: Marks) -> str:
    """The GPUHealthy condition's message for a node carrying ``marks``: the verdict's, and, while the
    node is held by the taint alone, that it is not cordoned (someone reading the Node sees why)."""
    if not (marks.quarantine and not marks.cordon):
        return message
    return f"{message} [{TAINT_ONLY_NOTE}]" if message else TAINT_ONLY_NOTE


CONDITION_STATUS = {
    State.HEALTHY: "True",
    State.DEGRADED: "True",
    State.RECOVERING: "True",
    State.QUARANTINED: "False",
    State.DRAINING: "False",
    State.AWAITING_REPAIR: "False",
    State.UNKNOWN: "Unknown",
}


def plan_condition(node: Mapping[str, Any], state: State, reason: str, message: str, now: str) -> dict[str, Any] | None:
    """Strategic-merge patch for the Node's GPUHealthy condition, or None if it already says this."""
    status = CONDITION_STATUS[state]
    reason = reason or str(state)
    message = message[:1024]
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == CONDITION_TYPE:
            # The API server drops empty strings: compare missing and "" as equal, or we rewrite forever.
            same = (c.get("reason") or "") == reason and (c.get("message") or "") == message
            if c.get("status") == status and same:
                return None
            transition = now if c.get("status") != status else c.get("lastTransitionTime", now)
            break
    else:
        transition = now
    return {
        "status": {
            "conditions": [
                {
                    "type": CONDITION_TYPE,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": transition,
                }
            ]
        }
    }


def node_writes(
    patch: Mapping[str, Any] | None, condition: Mapping[str, Any] | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The Node's writes for a plan's ``patch`` and a ``condition`` patch: (for the Node, for its status).

    Where both are due and the plan changes no spec, its metadata (labels, annotations and the
    resourceVersion they were computed from) goes in the status write and the Node's own write is
    none; the API server's status strategy keeps metadata from a status patch and resets only spec.
    A taint or a cordon is spec: that plan is its own write, ahead of the condition, as before."""
    if patch is None or condition is None or "spec" in patch:
        return (dict(patch) if patch is not None else None), (dict(condition) if condition is not None else None)
    return None, {"metadata": dict(patch["metadata"]), **condition}
