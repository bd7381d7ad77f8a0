"""What `release`, `pause` and `resume` write, and when they refuse."""

from __future__ import annotations

import pytest

from gpuhealth.cli.changes import PAUSED_FROM_ANNOTATION, plan_pause, plan_release, plan_resume
from gpuhealth.cli.errors import EXIT_USAGE, Refused
from tests.unit.cli.objects import NOW, policy, report


def test_release_annotates_an_awaiting_repair_node_and_says_what_happens_next() -> None:
    plan = plan_release("n", report("n", "AwaitingRepair", reason="Flapping"), policy(safety={"probation": "15m"}), NOW)
    assert plan.patch == {"metadata": {"annotations": {"gpuhealth.dev/release": "2025-06-01T12:00:00Z"}}}
    text = "\n".join(plan.lines)
    assert "Recovering" in text and "probation (15m under policy train)" in text
    assert "kubectl gpuhealth describe n" in text
    assert plan.warnings == ()


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ("Healthy", "in service"),
        ("Quarantined", "by itself once its facts clear"),
        ("Draining", "by itself once its facts clear"),
        ("Recovering", "already on probation"),
        ("Unknown", "agent is silent"),
    ],
)
def test_release_refuses_other_states_unless_forced(state: str, words: str) -> None:
    with pytest.raises(Refused) as e:
        plan_release("n", report("n", state, reason="XID79"), policy(), NOW)
    assert e.value.exit_code == EXIT_USAGE
    msg = str(e.value)
    assert f"node n is {state}" in msg and "not AwaitingRepair" in msg and words in msg and "--force" in msg
    assert "\n" not in msg
    forced = plan_release("n", report("n", state), policy(), NOW, force=True)
    assert forced.patch is not None and "Forced" in forced.lines[1]


def test_release_refuses_a_node_without_verdict() -> None:
    with pytest.raises(Refused, match="no gpuhealth verdict"):
        plan_release("n", None, None, NOW)
    assert plan_release("n", None, None, NOW, force=True).patch is not None


def test_release_warns_when_nothing_will_act_on_it() -> None:
    rep = report("n", "AwaitingRepair")
    assert "Paused" in plan_release("n", rep, policy(mode="Paused"), NOW).warnings[0]
    assert "DryRun" in plan_release("n", rep, policy(mode="DryRun"), NOW).warnings[0]
    assert "no longer exists" in plan_release("n", rep, None, NOW).warnings[0]
    again = plan_release("n", rep, policy(), NOW, node_annotations={"gpuhealth.dev/release": "2025-06-01T11:00:00Z"})
    assert "already requested at 2025-06-01T11:00:00Z" in again.warnings[0]


def test_pause_remembers_the_mode_with_a_resource_version_precondition() -> None:
    plan = plan_pause(policy(mode="DryRun"))
    assert plan.patch == {
        "metadata": {"annotations": {PAUSED_FROM_ANNOTATION: "DryRun"}, "resourceVersion": "42"},
        "spec": {"mode": "Paused"},
    }
    assert "paused (was DryRun)" in plan.lines[0]
    enforce = plan_pause(policy())
    assert enforce.patch is not None and enforce.patch["metadata"]["annotations"][PAUSED_FROM_ANNOTATION] == "Enforce"


def test_pause_twice_is_a_no_op() -> None:
    plan = plan_pause(policy(mode="Paused", annotations={PAUSED_FROM_ANNOTATION: "DryRun"}))
    assert plan.patch is None and "already Paused" in plan.lines[0]


def test_resume_restores_the_remembered_mode_by_default() -> None:
    plan = plan_resume(policy(mode="Paused", annotations={PAUSED_FROM_ANNOTATION: "DryRun"}))
    assert plan.patch == {
        "metadata": {"annotations": {PAUSED_FROM_ANNOTATION: None}, "resourceVersion": "42"},
        "spec": {"mode": "DryRun"},
    }
    assert "mode DryRun (as before the pause)" in plan.lines[0]


def test_resume_defaults_to_enforce_and_mode_overrides() -> None:
    plan = plan_resume(policy(mode="Paused"))
    assert plan.patch is not None and plan.patch["spec"] == {"mode": "Enforce"}
    bogus = plan_resume(policy(mode="Paused", annotations={PAUSED_FROM_ANNOTATION: "Paused"}))
    assert bogus.patch is not None and bogus.patch["spec"] == {"mode": "Enforce"}
    forced = plan_resume(policy(mode="Paused", annotations={PAUSED_FROM_ANNOTATION: "DryRun"}), "Enforce")
    assert forced.patch is not None and forced.patch["spec"] == {"mode": "Enforce"}
    assert "(as asked)" in forced.lines[0]


def test_resume_of_a_policy_that_is_not_paused() -> None:
    assert plan_resume(policy()).patch is None
    assert plan_resume(policy(mode="DryRun"), "DryRun").patch is None
    with pytest.raises(Refused, match="not paused"):
        plan_resume(policy(mode="DryRun"), "Enforce")
    with pytest.raises(Refused, match="--mode"):
        plan_resume(policy(mode="Paused"), "Paused")


def _burn_in(result: str, held: bool = True) -> dict[str, object]:
    nv: dict[str, object] = {"trigger": "BurnIn", "episode": "2025-06-01T11:00:00Z", "level": 2, "result": result}
    if result != "Pending":
        nv["job"] = "gpuhealth-remediation/gpuhealth-validate-n-node-1234abcd"
    if result in ("Failed", "TimedOut", "Lost"):
        nv["findings"] = "GPU 5 pcie Fail (DCGM error 46)"
    if held:
        nv["held"] = True
    return nv


@pytest.mark.parametrize("result", ["Failed", "TimedOut", "Lost"])
def test_release_lifts_a_failed_burn_ins_hold_without_force(result: str) -> None:
    """docs/runbook.md BurnInFailed: repair what the findings name, then `kubectl gpuhealth release NODE`.
    The node reads Healthy (nothing wrong was known when it joined) but is held, not in service."""
    rep = report("n", "Healthy", inServiceGPUs=0, nodeValidation=_burn_in(result))
    plan = plan_release("n", rep, policy(), NOW)
    assert plan.patch == {"metadata": {"annotations": {"gpuhealth.dev/release": "2025-06-01T12:00:00Z"}}}
    text = "\n".join(plan.lines)
    assert "Forced" not in text and "lifts its burn-in taint gpuhealth.dev/burn-in" in text
    assert f"burn-in {result}" in text and "gpuhealth.dev/burn-in=requested" in text


def test_release_of_a_node_whose_burn_in_runs_says_so_and_asks_for_force() -> None:
    for result in ("Pending", "Running"):
        rep = report("n", "Healthy", inServiceGPUs=0, nodeValidation=_burn_in(result))
        with pytest.raises(Refused) as e:
            plan_release("n", rep, policy(), NOW)
        msg = str(e.value)
        assert f"held by its burn-in ({result};" in msg and "it is in service" not in msg
        assert "--force" in msg and "\n" not in msg
        forced = plan_release("n", rep, policy(), NOW, force=True)
        assert forced.patch is not None and "burn-in" in "\n".join(forced.lines)
    # A burn-in that passed holds nothing: the node is in service.
    passed = report("n", "Healthy", nodeValidation=_burn_in("Passed", held=False))
    with pytest.raises(Refused, match="it is in service"):
        plan_release("n", passed, policy(), NOW)


def test_release_of_a_quarantined_node_names_the_evidence_only_a_release_clears() -> None:
    """NICDown after a counter rose (or an XID) holds a Quarantined node until a release; the refusal says
    so and names --force, which docs/runbook.md's NICDown and P3 tell on-call to use."""
    with pytest.raises(Refused) as e:
        plan_release("n", report("n", "Quarantined", reason="NICDown"), policy(), NOW)
    msg = str(e.value)
    assert "a NIC counter's increase" in msg and "until a release" in msg and "--force" in msg
    forced = plan_release("n", report("n", "Quarantined", reason="NICDown"), policy(), NOW, force=True)
    assert "Recovering and the probation" in forced.lines[1]
