"""Every NVML GPU recovery action has its own report value, the CRD admits it and the operator judges it.

The enum grows with NVML (13 added RECOVER_IMEX_DOMAIN, BUS_RESET and SYSTEM_REBOOT); a value the
agent cannot name is omitted from the report, so a new one must fail here, loudly, rather than
quietly vanish on the GPUs that need it.
"""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
import yaml

from gpuhealth.agent.nvml_source import NvmlSource
from gpuhealth.api.names import Scope
from gpuhealth.api.recovery import RECOVERY, RecoveryAction
from gpuhealth.evaluation.scope import xid_scope
from tests.unit.agent.agent_testlib import Scenario

CRD = Path(__file__).resolve().parents[3] / "crds" / "gpunodehealths.yaml"
PREFIX = "NVML_GPU_RECOVERY_ACTION_"
RECOVERY_ACTIONS = {r.nvml: r.action for r in RECOVERY.values()}


def _nvml_actions() -> dict[str, int]:
    return {name: int(getattr(pynvml, name)) for name in dir(pynvml) if name.startswith(PREFIX)}


def _crd_enum() -> list[str]:
    doc = yaml.safe_load(CRD.read_text())
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    enum: list[str] = spec["properties"]["devices"]["items"]["properties"]["recoveryAction"]["enum"]
    return enum


def test_the_agent_maps_every_recovery_action_the_installed_pynvml_names() -> None:
    actions = _nvml_actions()
    assert len(actions) >= 8, f"pynvml names only {sorted(actions)}"
    missing = {name: value for name, value in actions.items() if value not in RECOVERY_ACTIONS}
    assert not missing, (
        f"api/recovery.py RECOVERY lacks {missing}: give each a row (then regenerate the CRDs: hack/gen_crds.py)"
    )


def test_recovery_actions_get_distinct_report_values() -> None:
    values = list(RECOVERY_ACTIONS.values())
    assert len(values) == len(set(values)), "two NVML actions folded into one report value"


def test_the_crd_knows_every_report_value() -> None:
    assert set(_crd_enum()) == set(RECOVERY_ACTIONS.values())


@pytest.mark.parametrize(
    ("name", "scope"),
    [
        ("NONE", Scope.NODE),  # nothing to do on the GPU: an XID 154 with None observes, at node scope
        ("GPU_RESET", Scope.DEVICE),
        ("DRAIN_AND_RESET", Scope.DEVICE),
        ("BUS_RESET", Scope.DEVICE),
        ("DRAIN_P2P", Scope.NODE),
        ("NODE_REBOOT", Scope.NODE),
        ("SYSTEM_REBOOT", Scope.NODE),
        ("RECOVER_IMEX_DOMAIN", Scope.DOMAIN),  # every node of its NVLink domain (evaluation/domains.py)
    ],
)
def test_scope_of_each_nvml_action(name: str, scope: Scope) -> None:
    value = int(getattr(pynvml, PREFIX + name))
    assert xid_scope(154, RECOVERY_ACTIONS[value]) == scope
    # The driver's numeric spelling in the XID 154 message means the same action.
    assert RecoveryAction.parse(hex(value)) == RECOVERY_ACTIONS[value]
    assert RecoveryAction[name] == RECOVERY_ACTIONS[value]  # the members are named as NVML names them


def test_each_action_is_read_through_pynvml(fake_nvml_lib: Path, scenario: Scenario) -> None:
    actions = sorted(_nvml_actions().values())
    scenario.write(f"gpus {len(actions) + 1}", *(f"gpu {i} recovery_action {v}" for i, v in enumerate(actions)))
    scenario.add(f"gpu {len(actions)} recovery_action 99")
    src = NvmlSource(str(fake_nvml_lib))
    try:
        devices = src.sample().devices
    finally:
        src.close()
    assert [d.recovery_action for d in devices[: len(actions)]] == [RECOVERY_ACTIONS[v] for v in actions]
    # A value newer than the map is unknown: omitted, and not a NotSupported query either.
    assert devices[-1].recovery_action is None and "recoveryAction" not in devices[-1].unsupported
