"""helm and promtool for the chart and alert-rule tests, built by ``hack/build-tools.sh``.

Like the control plane, they are built from Go modules on first use and cached outside the repo.
A test that needs one fails loudly when it cannot be built; it never skips.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from devkit.buildscript import built

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "hack" / "build-tools.sh"


class ToolError(RuntimeError):
    """helm or promtool could not be built or found."""


@functools.cache
def tools_bin_dir() -> Path:
    if env := os.environ.get("GPUHEALTH_TOOLS_DIR"):
        return Path(env)
    return built(BUILD_SCRIPT, ToolError)


def tool(name: str) -> Path:
    path = tools_bin_dir() / name
    if not os.access(path, os.X_OK):
        raise ToolError(f"{name} not found at {path}; run `bash hack/build-tools.sh`")
    return path


def kube_env(kubeconfig: Path) -> dict[str, str]:
    """The environment for a kubectl or helm run against the cluster of ``kubeconfig``: their
    discovery and HTTP caches (``KUBECACHEDIR``) in a ``kube-cache`` folder beside it. Left to them,
    both cache in ``$HOME/.kube/cache``, which with HOME unset is ``.kube/cache`` under the working
    directory: the repository, for a test run."""
    return {**os.environ, "KUBECACHEDIR": str(kubeconfig.parent / "kube-cache")}


def run(
    name: str, *args: str, cwd: Path | None = None, timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tool(name)), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False, env=env
    )
