"""Two people for disruptive steps (``approval: TwoPerson``, issue #54), on the real control plane.

Two people, Alice and Bob, are two service accounts with their own tokens (the API server
authenticates them: ``system:serviceaccount:gpuhealth-approvers:alice``), allowed to read reports and
patch Nodes, and each runs ``kubectl gpuhealth approve`` with a kubeconfig of their own. The shipped
admission policy is applied from manifests/base/approver-admission-policy.yaml itself (the file the
kustomization and, through its template, the chart install).

A DRA node whose GPU 3 reports an uncorrected ECC error, as in test_repeat_approval.py, under a
policy whose ``twoPersonSteps`` names ``GPUReset`` (so the reset KWOK completes is the guarded step):

- one approval runs nothing: Alice is recorded in ``status.remediation["3"].approvers``, ``describe``
  says "1 of 2 approvals (alice ...)", no Job;
- Alice again: the CLI refuses her; written by hand under another key, the API server accepts her
  own name and the operator counts her once: still no Job;
- Bob's approval runs exactly one reset Job (across a SIGKILL of the operator right after it was
  recorded), the ``StepApproved`` Event names both;
- a forged approver (Bob writing an approval that names Alice; anyone, the cluster admin too,
  rewriting Alice's recorded approval) is refused by the API server, whose message names it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.cluster import LocalCluster
from devkit.k8s import MANIFESTS, Kube, OperatorProcess, service_account_token, token_kubeconfig, wait_for
from devkit.rbac import refusal
from gpuhealth.api.remediation_status import approver_key
from tests.integration.conftest import make_nodes, policy_spec
from tests.integration.test_cli import ok, plugin, plugin_as
from tests.integration.test_device_quarantine import device, ecc
from tests.integration.test_remediation_ladder import job_done, ladder, start
from tests.integration.test_validation import _resets

POLICY_FILE = MANIFESTS / "base" / "approver-admission-policy.yaml"
NS = "gpuhealth-approvers"
ROLE = "gpuhealth-test-approver"
VAP = "gpuhealth-approver-identity"


def _user(name: str) -> str:
    return f"system:serviceaccount:{NS}:{name}"


ALICE, BOB = _user("alice"), _user("bob")


class Person:
    """Someone with a token of their own: the CLI as them, and a client as them."""

    def __init__(self, cluster: LocalCluster, kube: Kube, name: str, tmp: Path) -> None:
        self.user = _user(name)
        self.kubeconfig = token_kubeconfig(cluster, service_account_token(kube, NS, name), tmp / f"{name}.kubeconfig")
        self.kube = Kube(self.kubeconfig)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return plugin_as(self.kubeconfig, *args)

    def annotate(self, node: str, annotations: dict[str, Any]) -> None:
        self.kube.core.patch_node(node, {"metadata": {"annotations": annotations}})


def _approvers_rbac() -> list[dict[str, Any]]:
    """What a person who approves needs: read the report (the CLI shows what waits), patch the Node."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": ROLE},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
            {"apiGroups": ["gpuhealth.dev"], "resources": ["gpunodehealths"], "verbs": ["get"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": n, "namespace": NS} for n in ("alice", "bob")],
    }
    accounts = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": n, "namespace": NS}}
        for n in ("alice", "bob")
    ]
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, *accounts, role, binding]


@pytest.fixture(scope="module")
def people(cluster: LocalCluster, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Person]]:
    """Alice and Bob, and the shipped admission policy in force."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(POLICY_FILE))
    for obj in _approvers_rbac():
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(obj))
    tmp = tmp_path_factory.mktemp("approvers")
    folks = {"alice": Person(cluster, kube, "alice", tmp), "bob": Person(cluster, kube, "bob", tmp)}
    # An admission policy is enforced a moment after it is created: wait until a forged approval (the
    # admin's, naming Alice, on no real node: a server-side dry run) is refused by it.
    probe = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "vap-probe", "annotations": {approver_key(ALICE): ALICE}},
    }
    wait_for(
        lambda: (
            VAP in cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False).stderr
        ),
        what="the approver admission policy in force",
    )
    yield folks


def _two_person(kube: Kube, cluster: LocalCluster, group: str) -> str:
    node = start(kube, cluster, group)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            remediation={"enabled": True, "approval": "TwoPerson", "twoPersonSteps": ["GPUReset"]},
        ),
    )
    kube.put_report(node, ecc(3))
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "PendingApproval", timeout=30, what="the reset waits")
    wait_for(lambda: device(kube, node, 3).get("drained") is True, timeout=30, what="GPU 3 drained")
    assert "approvals of 2 different people" in ladder(kube, node, 3)["message"]
    return node


def _approvers(kube: Kube, node: str) -> list[str]:
    return [a["by"] for a in ladder(kube, node, 3).get("approvers") or []]


def _approvals_on(kube: Kube, node: str) -> list[str]:
    return [k for k in (kube.node(node)["metadata"].get("annotations") or {}) if k.startswith("gpuhealth.dev/approver")]


def test_one_person_runs_nothing_two_run_exactly_one_step(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, people: dict[str, Person]
) -> None:
    alice, bob = people["alice"], people["bob"]
    node = _two_person(kube, cluster, group)

    # One approval: recorded (who, when), the annotation removed, and nothing runs.
    out = ok(alice.cli("approve", node, "--gpu", "3"))
    assert f"{approver_key(ALICE, 3)}={ALICE}" in out
    wait_for(
        lambda: _approvers(kube, node) == [ALICE] and not _approvals_on(kube, node), timeout=30, what="Alice recorded"
    )
    record = ladder(kube, node, 3)
    assert record["phase"] == "PendingApproval" and "1 of 2 approvals" in record["message"]
    assert record["approvers"][0]["at"], "when gpuhealth recorded it"
    assert not _resets(kube, node), "one approval runs nothing"
    text = ok(plugin(cluster, "describe", node))
    assert f"Approvals: 1 of 2 approvals ({ALICE} at " in text
    wait_for(lambda: kube.node_events(node, "ApprovalRecorded"), timeout=20, what="the first approval announced")

    # The same person again: the CLI refuses; written under another key, it counts once.
    again = alice.cli("approve", node, "--gpu", "3")
    assert again.returncode == 2 and "already approved GPU 3's waiting step" in again.stderr, again.stderr
    alice.annotate(node, {"gpuhealth.dev/approver-gpu-3.again": ALICE, approver_key(ALICE): ALICE})
    wait_for(lambda: not _approvals_on(kube, node), timeout=30, what="Alice's second approval consumed")
    assert _approvers(kube, node) == [ALICE] and ladder(kube, node, 3)["phase"] == "PendingApproval"
    assert not _resets(kube, node), "the same person twice counts once"

    # A second person: exactly one reset, across a SIGKILL right after the approval was recorded.
    out = ok(bob.cli("approve", node, "--gpu", "3"))
    assert "approved so far by " + ALICE in out
    wait_for(lambda: ladder(kube, node, 3).get("job"), timeout=30, what="the approved reset recorded")
    wait_for(lambda: kube.node_events(node, "StepApproved"), timeout=30, what="the approval announced")
    operator.kill()
    operator.start()
    wait_for(lambda: _resets(kube, node) and job_done(_resets(kube, node)[0], "Complete"), timeout=60, what="reset")
    wait_for(lambda: not _approvals_on(kube, node), timeout=30, what="Bob's annotation removed once consumed")
    assert len(_resets(kube, node)) == 1, "two people run exactly one step"
    assert _approvers(kube, node) == [ALICE, BOB]
    (approved,) = [e.message for e in kube.await_events(node, "StepApproved")]
    assert f"approved by {ALICE} (at " in approved and f" and {BOB} (at " in approved and "2 of 2" in approved
    text = ok(plugin(cluster, "describe", node))
    assert f"Approvals: approved by {ALICE} at " in text and BOB in text


def test_a_forged_approver_is_refused_by_the_api_server(
    cluster: LocalCluster, kube: Kube, group: str, people: dict[str, Person]
) -> None:
    alice, bob = people["alice"], people["bob"]
    (node,) = make_nodes(cluster, group, 1)  # no policy: the operator leaves its annotations alone

    # The API server type-checked the shipped policy against Node and found nothing to warn of.
    def checked() -> dict[str, Any] | None:
        vap = json.loads(cluster.kubectl("get", f"validatingadmissionpolicy/{VAP}", "-o", "json").stdout)
        return (vap.get("status") or {}).get("typeChecking")

    wait_for(lambda: checked() is not None, what="the policy's type check")
    assert not (checked() or {}).get("expressionWarnings"), checked()

    # Bob writes an approval that names Alice.
    forged = approver_key(ALICE, 3)
    msg = refusal(bob.annotate, node, {forged: ALICE})
    assert f"ValidatingAdmissionPolicy '{VAP}'" in msg
    assert f"{BOB} may not write {forged}={ALICE}" in msg
    # Alice's own approval is accepted; nobody else, the cluster admin included, may rewrite it.
    alice.annotate(node, {approver_key(ALICE): ALICE})
    msg = refusal(bob.annotate, node, {approver_key(ALICE): BOB})
    assert f"{BOB} may not write {approver_key(ALICE)}={BOB} (recorded by {ALICE})" in msg
    admin = refusal(kube.core.patch_node, node, {"metadata": {"annotations": {approver_key(ALICE): "admin"}}})
    assert VAP in admin and f"{approver_key(ALICE)}=admin (recorded by {ALICE})" in admin
    annotations = kube.node(node)["metadata"]["annotations"]
    assert annotations[approver_key(ALICE)] == ALICE and forged not in annotations
    # Other writes to a Node carrying Alice's approval are not in the way (a label, by the admin).
    kube.core.patch_node(node, {"metadata": {"labels": {"example.com/touched": "yes"}}})
    # Removing an approval is not checked (the operator removes each one it recorded).
    bob.annotate(node, {approver_key(ALICE): None})
    assert approver_key(ALICE) not in (kube.node(node)["metadata"].get("annotations") or {})
