"""The real node's ``nvidia`` runtime (devkit/nvidia_runc.py) edits only what asks for GPUs, as the
legacy nvidia-container-runtime does, and always hands the call to runc with its own arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devkit import nvidia_runc


def config(*env: str) -> dict[str, object]:
    return {"process": {"env": ["PATH=/usr/bin", *env]}, "mounts": [{"destination": "/proc", "type": "proc"}]}


def test_a_container_that_asks_for_gpus_gets_the_library_where_the_toolkit_puts_it() -> None:
    c = config("NVIDIA_VISIBLE_DEVICES=all")
    assert nvidia_runc.inject(c, "/lib/fake.so", "/scn", "/out")
    mounts = {m["destination"]: m for m in c["mounts"]}  # type: ignore[attr-defined]
    lib = mounts["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]
    assert lib["source"] == "/lib/fake.so" and "ro" in lib["options"]
    assert "ro" in mounts[nvidia_runc.SCENARIO_TARGET]["options"]
    assert f"FAKE_NVML_SCENARIO={nvidia_runc.SCENARIO_TARGET}/scenario" in c["process"]["env"]  # type: ignore[index]


@pytest.mark.parametrize("env", [(), ("NVIDIA_VISIBLE_DEVICES=",), ("NVIDIA_VISIBLE_DEVICES=void",)])
def test_other_containers_are_left_as_they_are(env: tuple[str, ...]) -> None:
    c = config(*env)
    before = json.dumps(c)
    assert not nvidia_runc.inject(c, "/lib/fake.so", "/scn", "/out")
    assert json.dumps(c) == before


def test_bundle_is_found_as_runc_is_given_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert nvidia_runc.bundle_of(["create", "--bundle", "/b", "id"]) == "/b"
    assert nvidia_runc.bundle_of(["create", "--bundle=/c", "id"]) == "/c"
    monkeypatch.chdir(tmp_path)
    assert nvidia_runc.bundle_of(["create", "id"]) == str(tmp_path)
