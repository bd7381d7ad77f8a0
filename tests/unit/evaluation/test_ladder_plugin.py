"""The repair ladder on the device-plugin route: a GPU held out with no DeviceTaintRule climbs it, and a
repaired GPU the device plugin still withholds gets the plugin restarted and returns only once the
Node's allocatable shows it (pure decisions; settings parsed, refusals naming the field)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from gpuhealth.api.devices import DeviceState
from gpuhealth.api.policy import PolicyError, parse_policy
from gpuhealth.api.remediation import DevicePluginSettings, Step, StepKind
from gpuhealth.api.remediation_status import LadderRecord, Phase, PluginRestart
from gpuhealth.evaluation.ladder import GPU, Observed, advance, awaits_plugin, repaired, restart_blocked

T = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
STEPS = (Step(StepKind.GPU_RESET, 60.0, 2), Step(StepKind.NODE_REBOOT, 600.0, 1), Step(StepKind.REPLACE))
COUNTS = "allocatable nvidia.com/gpu 7 of 8"


def gpu(**kw: Any) -> GPU:
    base: dict[str, Any] = dict(
        index=2,
        uuid="GPU-2",
        state=DeviceState.RECOVERING,
        reason="XID48",
        since=T,
        drained=True,
        taint_rule="",
        facts_clean=True,
        plugin=True,
    )
    base.update(kw)
    return GPU(**base)


def succeeded(**kw: Any) -> LadderRecord:
    return LadderRecord(
        index=2, step=StepKind.GPU_RESET, phase=Phase.SUCCEEDED, reason="XID48", uuid="GPU-2", since=T, finished=T, **kw
    )


def withheld(**kw: Any) -> Observed:
    base: dict[str, Any] = dict(plugin_withheld=True, plugin_counts=COUNTS, probation_over=True, plugin_timeout_s=60.0)
    return Observed(**{**base, **kw})


def later(s: float) -> dt.datetime:
    return T + dt.timedelta(seconds=s)


def test_a_gpu_held_out_on_the_plugin_route_reaches_its_reset_without_a_rule() -> None:
    ready = gpu(state=DeviceState.QUARANTINED, facts_clean=False)
    move = advance(None, ready, STEPS, Observed(may_start=True), T)
    assert move.start == StepKind.GPU_RESET and move.record is not None and move.record.phase == Phase.PENDING
    # Neither a rule nor the plugin route: nothing holds it, no reset.
    assert advance(None, replace(ready, plugin=False), STEPS, Observed(may_start=True), T).record is None


def test_a_repaired_gpu_the_plugin_withholds_restarts_the_plugin_after_its_probation() -> None:
    move = advance(succeeded(), gpu(), STEPS, withheld(), later(5))
    rec = move.record
    assert rec is not None and rec.phase == Phase.RESTARTING_PLUGIN and move.restart_plugin
    assert rec.plugin == PluginRestart(started=later(5))
    ((type_, reason, msg),) = move.events
    assert (type_, reason) == ("Normal", "RestartingDevicePlugin") and COUNTS in msg and "GPU 2 (GPU-2)" in msg


@pytest.mark.parametrize(
    "obs",
    [
        withheld(probation_over=False),  # still on probation: it waits like any repaired GPU
        replace(withheld(), plugin_withheld=False),  # the plugin offers it: no restart is needed
    ],
)
def test_no_restart_on_probation_or_when_the_plugin_offers_the_gpu(obs: Observed) -> None:
    move = advance(succeeded(), gpu(), STEPS, obs, later(5))
    assert move.record == succeeded() and not move.restart_plugin and not move.events


def test_a_dra_gpu_never_restarts_a_plugin() -> None:
    move = advance(succeeded(), gpu(plugin=False, taint_rule="r"), STEPS, withheld(), later(5))
    assert move.record == succeeded() and not move.restart_plugin


def test_restart_false_says_the_gpu_stays_withheld_and_deletes_nothing() -> None:
    move = advance(succeeded(), gpu(), STEPS, withheld(plugin_restart=False), later(5))
    rec = move.record
    assert rec is not None and rec.phase == Phase.RESTARTING_PLUGIN and not move.restart_plugin
    assert rec.plugin is not None and rec.plugin.blocked == "spec.remediation.devicePlugin.restart is false"
    ((type_, reason, msg),) = move.events
    assert (type_, reason) == ("Warning", "DevicePluginNotRestarted")
    assert "stays withheld until the device plugin's pod on the node restarts" in msg and msg == rec.message
    assert advance(rec, gpu(), STEPS, withheld(), later(600)) == type(move)(rec)  # no timeout Event on top


def test_a_pod_recorded_but_not_deleted_is_deleted_after_a_restart() -> None:
    rec = replace(
        succeeded(),
        phase=Phase.RESTARTING_PLUGIN,
        plugin=PluginRestart(started=later(5), pod="gpu-operator/dp-a1", uid="u1"),
    )
    move = advance(rec, gpu(), STEPS, withheld(), later(6))
    assert move.restart_plugin and move.record == rec and not move.events
    done = replace(rec, plugin=replace(rec.plugin or PluginRestart(), deleted=True))
    assert not advance(done, gpu(), STEPS, withheld(), later(6)).restart_plugin  # recorded done: never again


def test_allocatable_not_back_within_the_timeout_warns_once() -> None:
    rec = replace(
        succeeded(),
        phase=Phase.RESTARTING_PLUGIN,
        plugin=PluginRestart(started=later(5), pod="gpu-operator/dp-a1", uid="u1", deleted=True),
    )
    assert advance(rec, gpu(), STEPS, withheld(), later(60)).record == rec  # within the 60s
    move = advance(rec, gpu(), STEPS, withheld(), later(66))
    timed = move.record
    assert timed is not None and timed.plugin is not None and timed.plugin.timed_out
    ((type_, reason, msg),) = move.events
    assert (type_, reason) == ("Warning", "DevicePluginWithholdsGPU") and "gpu-operator/dp-a1" in msg and COUNTS in msg
    assert not advance(timed, gpu(), STEPS, withheld(), later(600)).events


def test_the_gpu_returning_ends_the_record_with_one_event_and_its_mttr() -> None:
    rec = replace(
        succeeded(fault_since=T - dt.timedelta(seconds=100)),
        phase=Phase.RESTARTING_PLUGIN,
        plugin=PluginRestart(started=later(5), pod="gpu-operator/dp-a1", uid="u1", deleted=True),
    )
    obs = Observed(plugin_counts="allocatable nvidia.com/gpu 8 of 8")
    move = advance(rec, gpu(state=DeviceState.IN_SERVICE), STEPS, obs, later(20))
    assert move.record is None and move.back_in_service == 120.0
    assert [(r, "8 of 8" in m) for _, r, m in move.events] == [("DevicePluginOffersGPU", True)]


def test_a_relapse_while_the_plugin_restarts_fails_the_attempt() -> None:
    rec = replace(succeeded(), phase=Phase.RESTARTING_PLUGIN, plugin=PluginRestart(started=later(5)))
    move = advance(rec, gpu(state=DeviceState.QUARANTINED, since=later(10)), STEPS, withheld(), later(11))
    assert move.record is not None and move.record.phase == Phase.READY and move.record.plugin is None
    assert move.record.history[-1].result == "Relapsed"


def test_what_holds_a_repaired_gpu_back() -> None:
    restarting = replace(succeeded(), phase=Phase.RESTARTING_PLUGIN)
    assert awaits_plugin(succeeded(), True) and awaits_plugin(restarting, True)
    assert not awaits_plugin(succeeded(), False) and not awaits_plugin(restarting, False)
    assert not awaits_plugin(replace(succeeded(), phase=Phase.RUNNING), True)
    assert repaired(restarting) and repaired(succeeded()) and not repaired(replace(succeeded(), phase=Phase.READY))


def test_a_blocked_restart_keeps_its_reason_and_a_hint() -> None:
    rec = replace(succeeded(), phase=Phase.RESTARTING_PLUGIN, plugin=PluginRestart(started=later(5)))
    move = restart_blocked(rec, "no pod of the device plugin runs", "kubectl delete pod ...", COUNTS)
    assert move.record is not None and move.record.plugin is not None
    assert move.record.plugin.blocked == "no pod of the device plugin runs" and not move.record.plugin.deleted
    assert "(kubectl delete pod ...)" in move.events[0][2]


def test_device_plugin_settings_default_to_the_gpu_operator_and_refusals_name_the_field() -> None:
    s = parse_policy({"metadata": {"name": "p"}, "spec": {}}).remediation.device_plugin
    assert s == DevicePluginSettings() and s.namespace == "gpu-operator"
    assert s.selector == "app=nvidia-device-plugin-daemonset" and s.restart and s.return_timeout_s == 300.0
    mine = parse_policy(
        {
            "metadata": {"name": "p"},
            "spec": {
                "remediation": {
                    "devicePlugin": {
                        "namespace": "kube-system",
                        "matchLabels": {"name": "nvidia-device-plugin-ds"},
                        "returnTimeout": "2m",
                    }
                }
            },
        }
    ).remediation.device_plugin
    assert (mine.namespace, mine.selector) == ("kube-system", "name=nvidia-device-plugin-ds")
    assert mine.return_timeout_s == 120
    for bad, field in (({"matchLabels": {}}, "matchLabels"), ({"returnTimeout": "0s"}, "returnTimeout")):
        with pytest.raises(PolicyError, match=rf"spec\.remediation\.devicePlugin\.{field}"):
            parse_policy({"metadata": {"name": "p"}, "spec": {"remediation": {"devicePlugin": bad}}})
