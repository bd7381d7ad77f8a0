"""Which device plugin pod is restarted after a repair, and never one its DaemonSet would not start again."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.actions.plugin_restart import plugin_pod, restart_hint, tolerates, untolerated
from gpuhealth.api.names import GPU_OUT_TAINT_KEY
from gpuhealth.api.remediation import DevicePluginSettings

SETTINGS = DevicePluginSettings()


def pod(name: str, ns: str = "gpu-operator", labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    meta["labels"] = {"app": "nvidia-device-plugin-daemonset"} if labels is None else labels
    return {"metadata": meta, "spec": {"nodeName": "n1", **spec}}


def node(*taints: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "n1"}, "spec": {"taints": list(taints)}}


GPU_OUT = {"key": GPU_OUT_TAINT_KEY, "value": "gpu-2", "effect": "NoSchedule"}


def test_the_plugins_pod_on_the_node_is_picked_among_others() -> None:
    pods = [
        pod("workload", ns="ml", labels={"app": "nvidia-device-plugin-daemonset"}),  # not its namespace
        pod("gfd-x", labels={"app": "gpu-feature-discovery"}),
        pod("nvidia-device-plugin-daemonset-a1"),
    ]
    chosen, why = plugin_pod(pods, SETTINGS, node(), "n1")
    assert chosen is not None and chosen["metadata"]["name"] == "nvidia-device-plugin-daemonset-a1" and not why


def test_no_pod_or_only_one_being_deleted_is_no_restart_and_says_where_it_looked() -> None:
    leaving = pod("nvidia-device-plugin-daemonset-a1")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    for pods in ([], [leaving]):
        chosen, why = plugin_pod(pods, SETTINGS, node(), "n1")
        assert chosen is None
        assert why == (
            "no pod of the device plugin (namespace gpu-operator, labels app=nvidia-device-plugin-daemonset) "
            "runs on node n1"
        )


def test_two_matching_pods_are_not_guessed_between() -> None:
    chosen, why = plugin_pod([pod("dp-a1"), pod("dp-b2")], SETTINGS, node(), "n1")
    assert chosen is None and "more than one pod" in why and "dp-a1, dp-b2" in why


def test_a_pod_its_daemonset_would_not_start_again_is_not_deleted() -> None:
    chosen, why = plugin_pod([pod("dp-a1")], SETTINGS, node(GPU_OUT), "n1")
    assert chosen is None and f"does not tolerate the node's taint {GPU_OUT_TAINT_KEY}" in why
    tolerant = pod("dp-a1", tolerations=[{"key": GPU_OUT_TAINT_KEY, "operator": "Exists"}])
    assert plugin_pod([tolerant], SETTINGS, node(GPU_OUT), "n1")[0] is tolerant
    prefer = {"key": "team/x", "effect": "PreferNoSchedule"}  # the DaemonSet controller ignores it
    assert plugin_pod([pod("dp-a1")], SETTINGS, node(prefer), "n1")[0] is not None


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"operator": "Exists"}, True),  # tolerates everything
        ({"key": GPU_OUT_TAINT_KEY, "operator": "Exists"}, True),
        ({"key": GPU_OUT_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": GPU_OUT_TAINT_KEY, "value": "gpu-2"}, True),  # Equal is the default operator
        ({"key": GPU_OUT_TAINT_KEY, "value": "gpu-3", "operator": "Equal"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, False),
        ({"operator": "Equal"}, False),
    ],
)
def test_tolerations_match_as_kubernetes_matches_them(toleration: dict[str, str], expected: bool) -> None:
    assert tolerates(toleration, GPU_OUT) is expected
    assert (untolerated({"spec": {"tolerations": [toleration]}}, node(GPU_OUT)) == []) is expected


def test_the_hint_is_the_command_that_restarts_it() -> None:
    assert restart_hint(DevicePluginSettings("kube-system", {"name": "nvidia-device-plugin-ds"}), "n1") == (
        "kubectl delete pod -n kube-system -l name=nvidia-device-plugin-ds --field-selector spec.nodeName=n1"
    )
