"""A restart does not change a verdict: freshness at start-up from what the objects say, not memory.

An agent with a broken clock (2099) wrote its report and renewed its Lease, then went silent; the
running operator made the node Unknown. The operator is SIGKILLed and restarted. It must not take
the 2099 heartbeat and renewTime for "now" (it did: the node was Healthy again within seconds, with
an Event "Fresh report with no faults"), because the API server's own time of the agent's last
write (``metadata.managedFields``) says the agent has been silent since. Likewise a live agent whose
clock runs an hour behind must not look silent to the restarted operator. Neither node may get an
Event from the restart.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from devkit.cluster import LocalCluster
from devkit.k8s import (
    GPUHEALTH_NAMESPACE,
    Kube,
    OperatorProcess,
    ensure_namespace,
    healthy_spec,
    wait_for,
    xid_event,
)
from tests.integration.conftest import make_nodes, policy_spec

SILENCE_S = 5.0
LONG_SILENCE_S = 60.0  # the live agent's policy: far longer than the restart takes
BROKEN_CLOCK = "2099-01-01T00:00:00.123456Z"  # (a MicroTime with microseconds, as the agent writes one)
BEHIND = dt.timedelta(hours=1)
AGENT = {"app.kubernetes.io/managed-by": "gpuhealth-agent"}  # what the operator's Lease watch selects


def micro(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def renew(kube: Kube, node: str, renew_time: str) -> None:
    """Renew the node's Lease the way the agent does (merge patch, create when missing)."""
    api = client.CoordinationV1Api(kube.api)
    spec = {"holderIdentity": node, "leaseDurationSeconds": 20, "renewTime": renew_time}
    try:
        api.patch_namespaced_lease(
            node,
            GPUHEALTH_NAMESPACE,
            {"metadata": {"labels": AGENT}, "spec": spec},
            field_manager="gpuhealth-agent",
            _content_type="application/merge-patch+json",
        )
    except client.ApiException as e:
        if e.status != 404:
            raise
        body = {"metadata": {"name": node, "labels": AGENT}, "spec": {**spec, "acquireTime": renew_time}}
        api.create_namespaced_lease(GPUHEALTH_NAMESPACE, body, field_manager="gpuhealth-agent")


def event_names(kube: Kube, node: str) -> set[tuple[str, str]]:
    return {(e.metadata.name, e.reason) for e in kube.node_events(node)}


def settled_events(kube: Kube, node: str) -> set[tuple[str, str]]:
    """The node's Events once no more arrive (they are posted in the background)."""
    last: set[tuple[str, str]] = set()

    def same_twice() -> set[tuple[str, str]] | None:
        nonlocal last
        now = event_names(kube, node)
        stable, last = now == last and bool(now), now
        return now if stable else None

    return wait_for(same_twice, interval=1.0, what=f"{node}'s Events to settle")


@pytest.fixture
def leases(kube: Kube) -> Iterator[list[str]]:
    ensure_namespace(kube, GPUHEALTH_NAMESPACE)
    names: list[str] = []
    yield names
    for n in names:
        try:
            client.CoordinationV1Api(kube.api).delete_namespaced_lease(n, GPUHEALTH_NAMESPACE)
        except client.ApiException as e:
            if e.status != 404:
                raise


def test_a_restart_keeps_verdicts_whatever_the_agents_clocks_say(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, leases: list[str]
) -> None:
    skewed, witness = make_nodes(cluster, group, 2)
    (behind,) = make_nodes(cluster, f"{group}-b", 1)
    leases += [skewed, behind]

    # A live agent whose clock is an hour behind: one report, then a Lease renewal every second. It
    # stops just before the operator dies, so that no renewal seen live after the restart can hide
    # how the restarted operator judged what it listed (a real agent renews every 30 s).
    stop = threading.Event()

    def behind_agent() -> None:
        while not stop.is_set():
            renew(kube, behind, micro(dt.datetime.now(dt.UTC) - BEHIND))
            stop.wait(1.0)

    kube.put_report(behind, healthy_spec(heartbeatTime=micro(dt.datetime.now(dt.UTC) - BEHIND)))
    agent = threading.Thread(target=behind_agent, daemon=True)
    agent.start()
    try:
        # The broken clock: a report and a Lease from 2099, then silence. Unknown after agentSilence.
        kube.put_report(skewed, healthy_spec(heartbeatTime=BROKEN_CLOCK))
        renew(kube, skewed, BROKEN_CLOCK)
        # The policies come after the agents' first writes, as on a node whose agent runs before any
        # policy selects it. Applied first, an operator that passed a node (seen longer than
        # agentSilence ago) before its report arrived made it Unknown for "no report", then Healthy
        # on the report, then Unknown again: that first episode satisfied the wait below, and the
        # second one's AgentSilent, posted after the Events were read, was blamed on the restart.
        kube.apply_policy(group, policy_spec(group, rules={"agentSilence": {"after": f"{SILENCE_S:.0f}s"}}))
        long_silence = {"agentSilence": {"after": f"{LONG_SILENCE_S:.0f}s"}}
        kube.apply_policy(f"{group}-b", policy_spec(f"{group}-b", rules=long_silence))

        # Unknown as judged from the agent's own report (its skew is recorded from that report alone),
        # and that verdict's AgentSilent Event ("no heartbeat from the agent for ..."). One read of the
        # object for the whole condition: under load the operator may pass the node before its reports
        # watch brings the report (Unknown, "no GPUNodeHealth report"), then Healthy on the report, then
        # Unknown for the silence; a state read from one of those and the skew from the next matched
        # the Healthy one in between.
        def silent_from_its_report() -> bool:
            status = kube.report(skewed).get("status") or {}
            return (
                status.get("state") == "Unknown"
                and status.get("reason") == "AgentSilent"
                and "clockSkew" in status
                and str(status.get("message", "")).startswith("no heartbeat from the agent")
            )

        wait_for(silent_from_its_report, timeout=30, what="the silent node Unknown from its agent's report")
        wait_for(lambda: kube.state(behind) == "Healthy", what="the live node Healthy")
        wait_for(
            lambda: any("no heartbeat from the agent" in e.message for e in kube.node_events(skewed, "AgentSilent")),
            what="AgentSilent on the silent node, for its agent's silence",
        )
        verdict = kube.report(skewed)["status"]["since"]

        # The witness: fresh when the operator dies, silent by the time it is back. Its verdict turning
        # Unknown is the sign that the restarted operator has judged the fleet from what it listed.
        kube.put_report(witness, healthy_spec())
        written = time.monotonic()
        wait_for(lambda: kube.state(witness) == "Healthy", what="the witness Healthy")
        before = {n: settled_events(kube, n) for n in (skewed, behind)}
        assert kube.state(skewed) == "Unknown" and kube.state(behind) == "Healthy"
        # The Events read above are those of one verdict: had the running operator moved it meanwhile,
        # what it posted would look like the restart's doing.
        assert kube.report(skewed)["status"]["since"] == verdict, "the verdict moved before the restart"

        stop.set()
        agent.join(5)
        operator.kill()
        time.sleep(max(0.0, written + SILENCE_S + 1 - time.monotonic()))  # the witness goes silent meanwhile
        operator.start()
        wait_for(lambda: kube.state(witness) == "Unknown", timeout=30, what="the restarted operator's verdicts")

        # Over a window of several sweeps (--tick=1): neither verdict moves (the live agent renewed
        # well within its agentSilence), and the restart announces nothing for either node.
        window = time.monotonic() + 10.0
        while time.monotonic() < window:
            assert kube.state(skewed) == "Unknown", "a restart made the silent node with a 2099 clock fresh"
            assert kube.state(behind) == "Healthy", "a restart made a live agent with a clock behind look silent"
            time.sleep(0.25)
        assert kube.report(skewed)["status"]["reason"] == "AgentSilent"
        for n in (skewed, behind):
            new = [e for e in kube.node_events(n) if (e.metadata.name, e.reason) not in before[n]]
            said = [(e.reason, e.message, e.reporting_instance, str(e.event_time or e.first_timestamp)) for e in new]
            assert not new, f"the restart announced something for {n}: {said}"
    finally:
        stop.set()
        agent.join(5)


def clock_skew_count(operator: OperatorProcess) -> float:
    """This operator process's ``gpuhealth_invalid_input_total{kind="ClockSkew"}`` (0 when absent)."""
    for line in operator.metrics().splitlines():
        if line.startswith('gpuhealth_invalid_input_total{kind="ClockSkew"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_skew_present_at_start_up_is_announced_once_and_not_again_after_a_restart(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    """A node whose clock is ten minutes ahead wrote its report before the operator started: the
    operator's first pass announces the episode (one ``ClockSkew`` Event, the metric, the offset in
    the status for describe and status), and an operator SIGKILLed and restarted finds the episode in
    the status and announces nothing."""
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group, rules={"agentSilence": {"after": "10m"}}))
    operator.kill()
    ahead = dt.timedelta(minutes=10)
    kube.put_report(node, healthy_spec(heartbeatTime=micro(dt.datetime.now(dt.UTC) + ahead)))
    operator.start()

    wait_for(lambda: kube.node_events(node, "ClockSkew"), timeout=30, what="the ClockSkew Event after start-up")
    record = kube.report(node)["status"]["clockSkew"]
    assert 590 <= record["offsetSeconds"] <= 610, record
    assert "ahead of the operator's" in kube.node_events(node, "ClockSkew")[0].message
    assert clock_skew_count(operator) == 1.0
    first = settled_events(kube, node)
    assert [r for _, r in first].count("ClockSkew") == 1

    operator.kill()
    # While it is down the agent writes again (its clock still ahead) with a new XID: the status's
    # lastXid moving is the sign that the restarted operator has passed the node.
    xid = xid_event(13, gpu=0)
    kube.put_report(node, healthy_spec(heartbeatTime=micro(dt.datetime.now(dt.UTC) + ahead), xids=[xid]))
    operator.start()
    wait_for(lambda: kube.report(node)["status"].get("lastXid") == "13 (GPU 0)", timeout=30, what="the restarted pass")
    assert [r for _, r in settled_events(kube, node)].count("ClockSkew") == 1, "a restart announced the episode again"
    assert clock_skew_count(operator) == 0.0
    assert kube.report(node)["status"]["clockSkew"]["since"] == record["since"]
