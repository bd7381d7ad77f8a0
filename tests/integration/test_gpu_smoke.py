"""hack/gpu-smoke.sh on a clean checkout of this GPU-less machine: it must get as far as NVML.

The script builds a throwaway venv when the checkout has none. That venv once lacked packages the
agent imports (kubernetes, through the credential chain), so the smoke test died with an import
error on every fresh GPU host before it touched NVML. Here it installs the package itself into a
fresh venv (a minute or two, from the package index), runs the agent, and must end with the
documented "NVML unavailable" result and exit status 2, not an import error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXIT_NVML_UNAVAILABLE = 2


def _clean_checkout(dest: Path) -> Path:
    """What a clone has that the install needs: no .venv, no build outputs."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "operator", dest / "operator", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (dest / "hack").mkdir()
    shutil.copy2(ROOT / "hack" / "gpu-smoke.sh", dest / "hack" / "gpu-smoke.sh")
    return dest


def test_smoke_script_on_a_clean_checkout_reaches_nvml_and_reports_it_unavailable(tmp_path: Path) -> None:
    checkout = _clean_checkout(tmp_path / "clone")
    out = tmp_path / "out"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHON", "PYTHONPATH", "VIRTUAL_ENV", "GPUHEALTH_NVML_LIBRARY", "FAKE_NVML_SCENARIO")
    }
    # Without the venv's bin first on PATH, python3 is the machine's; force the fallback either way.
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    env.update(SMOKE_FRESH_VENV="1", SMOKE_OUT=str(out), NODE_NAME="smoke-node", TMPDIR=str(tmp_path))
    run = subprocess.run(
        ["bash", str(checkout / "hack" / "gpu-smoke.sh")],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    output = run.stdout + run.stderr
    assert "ModuleNotFoundError" not in output and "ImportError" not in output, output
    assert run.returncode == EXIT_NVML_UNAVAILABLE, output
    assert "throwaway venv" in run.stdout, output
    assert run.stdout.strip().splitlines()[-1].startswith("RESULT: NVML unavailable: "), output
    # The agent itself ran and said so in its report (not a crash before NVML).
    spec = json.loads((out / "report.json").read_text())
    assert spec["nvml"]["available"] is False and spec["devices"] == []
    assert spec["nodeName"] == "smoke-node"
    # The throwaway venv is removed on exit.
    assert not list(tmp_path.glob("gpuhealth-smoke-venv.*"))
