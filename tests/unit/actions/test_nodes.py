"""plan_node / plan_condition / node_writes: what gpuhealth writes on a Node, and what it must never touch."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from gpuhealth.actions.nodes import (
    Marks,
    NodePlan,
    Ownership,
    condition_message,
    node_writes,
    plan_condition,
    plan_node,
)
from gpuhealth.api.names import CONDITION_TYPE, QUARANTINE_ANNOTATION, STATE_LABEL, TAINT_KEY, State
from tests.unit.builders import merge_patch

FOREIGN = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2025-01-01T00:00:00Z"},
]
Q = Marks(State.QUARANTINED, quarantine=True, reason="XID79", since="2025-01-01T12:00:00Z")
LIFT = Marks(State.HEALTHY, quarantine=False)


def node(
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
    annotation: str | None = None,
    state: str | None = None,
    rv: str = "7",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "gpu-node-1", "resourceVersion": rv, "labels": {"pool": "h100"}}
    if annotation is not None:
        meta["annotations"] = {QUARANTINE_ANNOTATION: annotation, "other/annotation": "keep"}
    if state is not None:
        meta["labels"][STATE_LABEL] = state
    spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24"}
    if taints is not None:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": meta, "spec": spec}


def ours(reason: str = "XID79", effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": TAINT_KEY, "value": reason, "effect": effect}


def owned(node_obj: dict[str, Any]) -> Ownership | None:
    return Ownership.parse((node_obj["metadata"].get("annotations") or {}).get(QUARANTINE_ANNOTATION))


def apply(node_obj: dict[str, Any], plan: NodePlan) -> dict[str, Any]:
    assert plan.patch is not None
    return dict(merge_patch(node_obj, plan.patch))


# --- quarantine --------------------------------------------------------------------------------


def test_new_quarantine_is_one_patch_with_taint_cordon_and_ownership() -> None:
    n = node(taints=list(FOREIGN))
    plan = plan_node(n, Q)
    ann = Ownership("XID79", taint=True, cordon=True, since="2025-01-01T12:00:00Z").to_json()
    assert plan.patch == {
        "metadata": {
            "labels": {STATE_LABEL: "Quarantined"},
            "annotations": {QUARANTINE_ANNOTATION: ann},
            "resourceVersion": "7",
        },
        "spec": {"taints": [*FOREIGN, ours()], "unschedulable": True},
    }
    assert plan.actions == ("taint", "cordon")
    assert (plan.lifted_by_others, plan.foreign_cordon) == ((), False)
    after = apply(n, plan)
    assert after["spec"]["podCIDR"] == "10.0.0.0/24"
    assert after["metadata"]["labels"]["pool"] == "h100"


def test_quarantine_on_an_untainted_node() -> None:
    plan = plan_node(node(), Q)
    assert plan.patch is not None
    assert plan.patch["spec"]["taints"] == [ours()]


def test_patch_always_carries_the_resource_version_it_was_computed_from() -> None:
    for n, marks in [(node(rv="123"), Q), (node(taints=[ours()], annotation="{}", rv="9"), LIFT)]:
        plan = plan_node(n, marks)
        assert plan.patch is not None
        assert plan.patch["metadata"]["resourceVersion"] == n["metadata"]["resourceVersion"]


def test_taint_effect_and_reason_length_follow_the_marks() -> None:
    long = "R" * 100
    plan = plan_node(node(), Marks(State.DRAINING, True, reason=long, effect="NoExecute"))
    assert plan.patch is not None
    (t,) = plan.patch["spec"]["taints"]
    assert t == {"key": TAINT_KEY, "value": "R" * 63, "effect": "NoExecute"}


def test_policy_without_cordon_only_taints() -> None:
    plan = plan_node(node(), Marks(State.QUARANTINED, True, reason="Thermal", cordon=False))
    assert plan.actions == ("taint",)
    assert plan.patch is not None
    assert "unschedulable" not in plan.patch["spec"]
    own = owned(apply(node(), plan))
    assert own is not None and own.taint and not own.cordon


def test_human_cordon_is_not_claimed() -> None:
    n = node(taints=list(FOREIGN), unschedulable=True)
    plan = plan_node(n, Q)
    assert plan.foreign_cordon
    assert plan.actions == ("taint",)
    assert plan.patch is not None
    assert "unschedulable" not in plan.patch["spec"]
    after = apply(n, plan)
    own = owned(after)
    assert own is not None and own.taint and not own.cordon
    assert after["spec"]["unschedulable"] is True


def test_lifting_never_uncordons_a_human_cordon() -> None:
    n = node(taints=list(FOREIGN), unschedulable=True)
    quarantined = apply(n, plan_node(n, Q))
    plan = plan_node(quarantined, LIFT)
    assert plan.actions == ("untaint",)
    assert plan.patch is not None
    assert "unschedulable" not in plan.patch["spec"]
    after = apply(quarantined, plan)
    assert after["spec"]["unschedulable"] is True
    assert after["spec"]["taints"] == FOREIGN
    assert QUARANTINE_ANNOTATION not in after["metadata"]["annotations"]


def test_someone_removed_our_taint_is_recorded_not_re_added() -> None:
    q = apply(node(taints=list(FOREIGN)), plan_node(node(taints=list(FOREIGN)), Q))
    q["spec"]["taints"] = list(FOREIGN)  # a human ran `kubectl taint ... gpuhealth.dev/unhealthy-`
    plan = plan_node(q, Q)
    assert plan.lifted_by_others == ("taint",)
    assert plan.actions == ()
    assert plan.patch is not None
    assert "spec" not in plan.patch  # neither taint nor cordon is touched
    after = apply(q, plan)
    own = owned(after)
    assert own is not None
    assert (own.taint, own.cordon, own.lifted_by_others) == (False, True, ("taint",))
    assert own.since == "2025-01-01T12:00:00Z"
    # Recorded once: the next plan has nothing to add.
    again = plan_node(after, Q)
    assert again.patch is None and again.lifted_by_others == ()


def test_someone_uncordoned_is_recorded_not_re_cordoned() -> None:
    q = apply(node(), plan_node(node(), Q))
    del q["spec"]["unschedulable"]  # kubectl uncordon
    plan = plan_node(q, Q)
    assert plan.lifted_by_others == ("cordon",)
    assert plan.patch is not None
    assert "spec" not in plan.patch
    after = apply(q, plan)
    own = owned(after)
    assert own is not None and own.taint and not own.cordon and own.lifted_by_others == ("cordon",)
    assert plan_node(after, Q).patch is None
    # ... and a later human cordon is not ours to lift.
    after["spec"]["unschedulable"] = True
    lifted = apply(after, plan_node(after, LIFT))
    assert lifted["spec"]["unschedulable"] is True


def test_both_lifted_by_others_accumulate() -> None:
    q = apply(node(), plan_node(node(), Q))
    q["spec"] = {"podCIDR": "10.0.0.0/24"}
    plan = plan_node(q, Q)
    assert plan.lifted_by_others == ("taint", "cordon")
    own = owned(apply(q, plan))
    assert own is not None and own.lifted_by_others == ("cordon", "taint")


def test_reason_change_retaints_and_keeps_the_episode_start() -> None:
    q = apply(node(taints=list(FOREIGN)), plan_node(node(taints=list(FOREIGN)), Q))
    plan = plan_node(q, Marks(State.DRAINING, True, reason="EccUncorrected", since="2025-01-01T13:00:00Z"))
    assert plan.actions == ("retaint",)
    after = apply(q, plan)
    assert after["spec"]["taints"] == [*FOREIGN, ours("EccUncorrected")]
    assert after["metadata"]["labels"][STATE_LABEL] == "Draining"
    own = owned(after)
    assert own is not None and own.reason == "EccUncorrected" and own.since == "2025-01-01T12:00:00Z"
    assert after["spec"]["unschedulable"] is True


def test_already_quarantined_node_is_a_no_op() -> None:
    q = apply(node(taints=list(FOREIGN)), plan_node(node(taints=list(FOREIGN)), Q))
    plan = plan_node(q, Q)
    assert plan == NodePlan(None)


def test_healthy_node_with_our_label_is_a_no_op() -> None:
    assert plan_node(node(taints=list(FOREIGN), state="Healthy"), LIFT) == NodePlan(None)


def test_state_label_change_alone_is_a_small_patch() -> None:
    plan = plan_node(node(state="Degraded"), Marks(State.HEALTHY, quarantine=False))
    assert plan.patch == {"metadata": {"labels": {STATE_LABEL: "Healthy"}, "resourceVersion": "7"}}
    assert plan.actions == ()


# --- lifting -----------------------------------------------------------------------------------


def test_lifting_removes_only_our_taint_our_cordon_and_the_annotation() -> None:
    n = node(taints=list(FOREIGN))
    q = apply(n, plan_node(n, Q))
    plan = plan_node(q, LIFT)
    assert plan.actions == ("untaint", "uncordon")
    assert plan.patch is not None
    assert plan.patch["spec"] == {"taints": FOREIGN, "unschedulable": None}
    assert plan.patch["metadata"]["annotations"] == {QUARANTINE_ANNOTATION: None}
    after = apply(q, plan)
    assert after["spec"] == {"podCIDR": "10.0.0.0/24", "taints": FOREIGN}
    assert after["metadata"]["annotations"] == {}
    assert after["metadata"]["labels"] == {"pool": "h100", STATE_LABEL: "Healthy"}


def test_lifting_the_last_taint_deletes_the_list() -> None:
    q = apply(node(), plan_node(node(), Q))
    plan = plan_node(q, LIFT)
    assert plan.patch is not None
    assert plan.patch["spec"]["taints"] is None
    assert "taints" not in apply(q, plan)["spec"]


def test_lifting_keeps_other_annotations() -> None:
    n = node(taints=[ours()], unschedulable=True, annotation=Ownership("XID79", True, True).to_json())
    after = apply(n, plan_node(n, LIFT))
    assert after["metadata"]["annotations"] == {"other/annotation": "keep"}
    assert "unschedulable" not in after["spec"]


def test_lifting_a_cordon_someone_already_lifted_does_nothing_to_it() -> None:
    n = node(taints=[ours()], unschedulable=False, annotation=Ownership("XID79", True, True).to_json())
    plan = plan_node(n, LIFT)
    assert plan.actions == ("untaint",)
    assert plan.patch is not None
    assert "unschedulable" not in plan.patch["spec"]


def test_unreadable_annotation_owns_the_taint_but_not_the_cordon() -> None:
    n = node(taints=[*FOREIGN, ours()], unschedulable=True, annotation="{not json")
    plan = plan_node(n, LIFT)
    assert plan.actions == ("untaint",)
    after = apply(n, plan)
    assert after["spec"]["unschedulable"] is True
    assert after["spec"]["taints"] == FOREIGN


# --- Ownership annotation ----------------------------------------------------------------------


def test_ownership_json_round_trip() -> None:
    own = Ownership("Thermal", taint=True, cordon=False, since="t", lifted_by_others=("cordon",))
    text = own.to_json()
    assert json.loads(text) == {
        "reason": "Thermal",
        "taint": True,
        "cordon": False,
        "since": "t",
        "liftedByOthers": ["cordon"],
    }
    assert Ownership.parse(text) == own
    assert "liftedByOthers" not in Ownership("x", True, True).to_json()


def test_ownership_records_a_taint_only_episode_and_old_records_read_as_cordon_mode() -> None:
    own = Ownership("XID79", taint=True, cordon=False, since="t", taint_only=True)
    assert json.loads(own.to_json())["taintOnly"] is True
    assert Ownership.parse(own.to_json()) == own
    # Written only when set: an episode in the default mode keeps the annotation it had before.
    assert "taintOnly" not in Ownership("x", True, True).to_json()
    assert Ownership.parse('{"reason":"x","taint":true,"cordon":true,"since":""}') == Ownership("x", True, True)


@pytest.mark.parametrize("text", ["[]", "null", "42", "{oops", '"str"'])
def test_ownership_parse_of_garbage_assumes_taint_only(text: str) -> None:
    assert Ownership.parse(text) == Ownership(reason="", taint=True, cordon=False)


@pytest.mark.parametrize("text", [None, ""])
def test_ownership_parse_of_nothing_is_none(text: str | None) -> None:
    assert Ownership.parse(text) is None


# --- plan_condition ----------------------------------------------------------------------------

NOW = "2025-01-01T12:00:00Z"
EARLIER = "2025-01-01T11:00:00Z"


def _cond_node(status: str, reason: str, message: str, transition: str = EARLIER) -> dict[str, Any]:
    cond = {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": EARLIER,
        "lastTransitionTime": transition,
    }
    ready = {"type": "Ready", "status": "True"}
    return {"status": {"conditions": [ready, cond]}}


def test_condition_added_when_missing() -> None:
    patch = plan_condition({"status": {}}, State.QUARANTINED, "XID79", "GPU 2: XID 79", NOW)
    assert patch == {
        "status": {
            "conditions": [
                {
                    "type": CONDITION_TYPE,
                    "status": "False",
                    "reason": "XID79",
                    "message": "GPU 2: XID 79",
                    "lastHeartbeatTime": NOW,
                    "lastTransitionTime": NOW,
                }
            ]
        }
    }


def test_condition_unchanged_is_none() -> None:
    assert plan_condition(_cond_node("False", "XID79", "m"), State.DRAINING, "XID79", "m", NOW) is None
    assert plan_condition(_cond_node("True", "Healthy", ""), State.HEALTHY, "", "", NOW) is None


def test_condition_message_change_keeps_the_transition_time() -> None:
    patch = plan_condition(_cond_node("False", "XID79", "old"), State.QUARANTINED, "XID79", "new", NOW)
    assert patch is not None
    (c,) = patch["status"]["conditions"]
    assert (c["message"], c["lastTransitionTime"], c["lastHeartbeatTime"]) == ("new", EARLIER, NOW)


def test_condition_status_change_sets_the_transition_time() -> None:
    patch = plan_condition(_cond_node("False", "XID79", "m"), State.RECOVERING, "XID79", "m", NOW)
    assert patch is not None
    (c,) = patch["status"]["conditions"]
    assert (c["status"], c["lastTransitionTime"]) == ("True", NOW)


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (State.HEALTHY, "True"),
        (State.DEGRADED, "True"),
        (State.RECOVERING, "True"),
        (State.QUARANTINED, "False"),
        (State.DRAINING, "False"),
        (State.AWAITING_REPAIR, "False"),
        (State.UNKNOWN, "Unknown"),
    ],
)
def test_condition_status_per_state(state: State, status: str) -> None:
    patch = plan_condition({}, state, "", "x" * 2000, NOW)
    assert patch is not None
    (c,) = patch["status"]["conditions"]
    assert c["status"] == status
    assert c["reason"] == str(state)  # the state stands in for an empty reason
    assert len(c["message"]) == 1024


def test_condition_as_stored_by_the_api_server_is_not_rewritten() -> None:
    """The API server drops empty reason/message strings; that must not look like a change (idle writes)."""
    stored = {
        "status": {
            "conditions": [
                {
                    "type": "GPUHealthy",
                    "status": "True",
                    "reason": "Healthy",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                }
            ]
        }
    }
    assert plan_condition(stored, State.HEALTHY, "", "", "2025-01-01T01:00:00Z") is None


# --- how the plan and the condition are written -----------------------------------------------------


def test_a_first_verdict_is_one_status_write_carrying_the_label_and_its_precondition() -> None:
    n = node()
    plan = plan_node(n, Marks(State.HEALTHY, quarantine=False))
    cond = plan_condition(n, State.HEALTHY, "", "", NOW)
    assert plan.patch is not None and cond is not None
    to_node, to_status = node_writes(plan.patch, cond)
    assert to_node is None
    assert to_status == {
        "metadata": {"labels": {STATE_LABEL: "Healthy"}, "resourceVersion": "7"},
        "status": cond["status"],
    }


def test_an_ownership_record_alone_rides_on_the_status_write() -> None:
    # Someone lifted our taint: the record changes (metadata only), the taint is not put back.
    n = node(taints=list(FOREIGN), annotation=Ownership("XID79", taint=True, cordon=False).to_json())
    plan = plan_node(n, Q)
    assert plan.patch is not None and "spec" not in plan.patch and plan.lifted_by_others == ("taint",)
    to_node, to_status = node_writes(plan.patch, {"status": {"conditions": []}})
    assert to_node is None and to_status is not None
    assert to_status["metadata"] == plan.patch["metadata"]


def test_a_taint_or_cordon_is_its_own_write_ahead_of_the_condition() -> None:
    # Spec is what the status subresource resets: a quarantine cannot ride on the condition.
    n = node(taints=list(FOREIGN))
    plan = plan_node(n, Q)
    cond = plan_condition(n, State.QUARANTINED, "XID79", "GPU 2: XID 79", NOW)
    assert plan.patch is not None and "spec" in plan.patch
    assert node_writes(plan.patch, cond) == (plan.patch, cond)


def test_without_a_condition_to_write_the_plan_goes_to_the_node() -> None:
    patch = plan_node(node(state="Degraded"), LIFT).patch
    assert node_writes(patch, None) == (patch, None)
    cond = plan_condition({"status": {}}, State.HEALTHY, "", "", NOW)
    assert node_writes(None, cond) == (None, cond)
    assert node_writes(None, None) == (None, None)


# --- taint-only mode (spec.actions.cordon: false) -------------------------------------------------

TAINT_ONLY = Marks(State.QUARANTINED, quarantine=True, reason="XID79", cordon=False, since="2025-01-01T12:00:00Z")


def test_taint_only_episode_is_recorded_as_such() -> None:
    plan = plan_node(node(), TAINT_ONLY)
    assert plan.actions == ("taint",)
    own = owned(apply(node(), plan))
    assert own == Ownership("XID79", taint=True, cordon=False, since="2025-01-01T12:00:00Z", taint_only=True)


def test_taint_only_never_cordons_on_a_later_pass() -> None:
    """A restarted operator (or any later pass) reads the record and the node stays uncordoned."""
    q = apply(node(), plan_node(node(), TAINT_ONLY))
    for marks in (TAINT_ONLY, replace(TAINT_ONLY, state=State.DRAINING), replace(TAINT_ONLY, reason="Ecc")):
        plan = plan_node(q, marks)
        assert "cordon" not in plan.actions
        if plan.patch is not None:
            q = apply(q, plan)
        assert not q["spec"].get("unschedulable")


def test_turning_taint_only_while_held_lifts_gpuhealths_own_cordon() -> None:
    q = apply(node(taints=list(FOREIGN)), plan_node(node(taints=list(FOREIGN)), Q))
    assert q["spec"]["unschedulable"] is True
    plan = plan_node(q, replace(Q, cordon=False))
    assert plan.actions == ("uncordon",)
    assert plan.lifted_by_others == ()
    after = apply(q, plan)
    assert "unschedulable" not in after["spec"]
    assert after["spec"]["taints"] == [*FOREIGN, ours()]
    assert owned(after) == Ownership("XID79", taint=True, cordon=False, since="2025-01-01T12:00:00Z", taint_only=True)
    assert plan_node(after, replace(Q, cordon=False)).patch is None


def test_turning_taint_only_while_held_keeps_a_cordon_gpuhealth_did_not_set() -> None:
    n = node(unschedulable=True)  # a human's cordon before the episode
    q = apply(n, plan_node(n, Q))
    plan = plan_node(q, replace(Q, cordon=False))
    assert "uncordon" not in plan.actions
    after = apply(q, plan) if plan.patch is not None else q
    assert after["spec"]["unschedulable"] is True
    # ... nor on return to service.
    assert apply(after, plan_node(after, LIFT))["spec"]["unschedulable"] is True


def test_turning_cordon_back_on_while_held_cordons() -> None:
    q = apply(node(), plan_node(node(), TAINT_ONLY))
    plan = plan_node(q, Q)
    assert plan.actions == ("cordon",)
    after = apply(q, plan)
    assert after["spec"]["unschedulable"] is True
    assert owned(after) == Ownership("XID79", taint=True, cordon=True, since="2025-01-01T12:00:00Z")
    # ... and that cordon is gpuhealth's to lift on return.
    lifted = apply(after, plan_node(after, LIFT))
    assert "unschedulable" not in lifted["spec"]


def test_turning_cordon_back_on_claims_no_human_cordon() -> None:
    q = apply(node(), plan_node(node(), TAINT_ONLY))
    q["spec"]["unschedulable"] = True  # a human cordons while the node is held taint-only
    plan = plan_node(q, Q)
    assert "cordon" not in plan.actions and plan.foreign_cordon
    after = apply(q, plan)
    own = owned(after)
    assert own is not None and not own.cordon and not own.taint_only
    assert apply(after, plan_node(after, LIFT))["spec"]["unschedulable"] is True


def test_turning_cordon_back_on_does_not_fight_a_human_who_lifted_ours() -> None:
    q = apply(node(), plan_node(node(), Q))
    del q["spec"]["unschedulable"]  # kubectl uncordon
    q = apply(q, plan_node(q, Q))  # recorded: lifted by others
    q = apply(q, plan_node(q, TAINT_ONLY))  # the policy turns taint-only ...
    plan = plan_node(q, Q)  # ... and back
    assert "cordon" not in plan.actions
    after = apply(q, plan) if plan.patch is not None else q
    assert not after["spec"].get("unschedulable")


def test_taint_only_lift_removes_the_taint_and_touches_no_cordon() -> None:
    q = apply(node(), plan_node(node(), TAINT_ONLY))
    q["spec"]["unschedulable"] = True  # someone else's cordon, placed during the episode
    plan = plan_node(q, LIFT)
    assert plan.actions == ("untaint",)
    after = apply(q, plan)
    assert after["spec"]["unschedulable"] is True
    assert QUARANTINE_ANNOTATION not in after["metadata"]["annotations"]


def test_noexecute_effect_chosen_while_held_retaints() -> None:
    q = apply(node(), plan_node(node(), TAINT_ONLY))
    plan = plan_node(q, replace(TAINT_ONLY, effect="NoExecute"))
    assert plan.actions == ("retaint",)
    assert apply(q, plan)["spec"]["taints"] == [ours(effect="NoExecute")]


def test_condition_message_says_a_taint_only_hold() -> None:
    assert condition_message("XID 79 on GPU 3", Q) == "XID 79 on GPU 3"
    assert condition_message("", LIFT) == ""
    held = condition_message("XID 79 on GPU 3", TAINT_ONLY)
    assert held.startswith("XID 79 on GPU 3") and "taint alone" in held and "not cordoned" in held
    assert "taint alone" not in condition_message("", replace(TAINT_ONLY, quarantine=False, state=State.HEALTHY))
