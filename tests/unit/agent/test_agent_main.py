"""The ``gpuhealth-agent`` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.agent.main import EXIT_NVML_UNAVAILABLE, build_parser, config_from_args, main
from gpuhealth.agent.transport import KubeTransport
from tests.unit.agent.agent_testlib import Scenario


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    code = exited.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().out


def test_once_dry_run_prints_the_spec(
    fake_nvml_lib: Path, scenario: Scenario, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario.write("gpu 4 temp 90", "gpu 6 lost 1")
    code, out = run_main(["--once", "--dry-run", "--node-name", "node-x", "--nvml-library", str(fake_nvml_lib)], capsys)
    assert code == 0
    spec = json.loads(out)
    assert spec["nodeName"] == "node-x" and spec["nvml"]["available"] is True
    assert len(spec["devices"]) == 8
    assert spec["devices"][4]["temperature"]["currentC"] == 90
    assert spec["devices"][6]["lost"] is True


def test_once_dry_run_without_nvml(
    scenario: Scenario, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-env")
    monkeypatch.setenv("GPUHEALTH_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
    code, out = run_main(["--once", "--dry-run"], capsys)
    assert code == EXIT_NVML_UNAVAILABLE
    spec = json.loads(out)
    assert spec["nodeName"] == "node-env"
    assert spec["nvml"]["available"] is False and spec["devices"] == []


def test_flags_and_env_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    monkeypatch.setenv("GPUHEALTH_DCGM_URL", "http://localhost:9400/metrics")
    args = build_parser().parse_args(["--interval", "5", "--heartbeat-interval", "20", "--metrics-port", "0"])
    config = config_from_args(args)
    assert (config.node_name, config.interval_s, config.heartbeat_interval_s) == ("from-env", 5.0, 20.0)
    assert config.dcgm_url == "http://localhost:9400/metrics" and config.metrics_port == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--interval", "0"])


def test_console_script_as_subprocess(fake_nvml_lib: Path, scenario: Scenario) -> None:
    env = {
        **os.environ,
        "GPUHEALTH_NVML_LIBRARY": str(fake_nvml_lib),
        "FAKE_NVML_SCENARIO": str(scenario.path),
    }
    result = subprocess.run(
        [sys.executable, "-m", "gpuhealth.agent.main", "--once", "--dry-run", "--node-name", "n"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert len(json.loads(result.stdout)["devices"]) == 8


class _StubCustomObjects:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def patch_cluster_custom_object(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("patch", args, kwargs))
        return {}

    def create_cluster_custom_object(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("create", args, kwargs))
        return {}


def test_kube_transport_sends_merge_patches() -> None:
    transport = KubeTransport(api_client=None)
    stub = _StubCustomObjects()
    transport._api = stub
    transport.patch("node-a", {"spec": {"heartbeatTime": "2026-11-30T00:00:00Z"}})
    transport.create({"metadata": {"name": "node-a"}})
    (op, args, kwargs), (op2, args2, _) = stub.calls
    assert op == "patch" and args[:4] == ("gpuhealth.dev", "v1alpha1", "gpunodehealths", "node-a")
    assert kwargs["_content_type"] == "application/merge-patch+json"
    assert op2 == "create" and args2[:3] == ("gpuhealth.dev", "v1alpha1", "gpunodehealths")
