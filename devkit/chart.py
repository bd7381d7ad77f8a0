"""Render the Helm chart and the kustomize manifests into comparable objects.

The chart (charts/gpuhealth) and manifests/ describe the same install; tests compare what each
renders, after dropping only the bookkeeping labels Helm adds to every object.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from devkit.tools import kube_env, run, tools_bin_dir

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "gpuhealth"
MANIFESTS = REPO / "manifests"
INSTALL_DOC = REPO / "docs" / "install.md"
KUBECTL = str(Path(sys.executable).parent / "kubectl")
HELM_LABELS = (
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
)

Key = tuple[str, str, str]  # kind, namespace, name


def helm_template(*args: str, namespace: str = "gpuhealth-system", crds: bool = False) -> list[dict[str, Any]]:
    out = run(
        "helm",
        "template",
        "gpuhealth",
        str(CHART),
        f"--namespace={namespace}",
        *(["--include-crds"] if crds else []),
        *args,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def kustomize(path: str) -> list[dict[str, Any]]:
    proc = subprocess.run([KUBECTL, "kustomize", str(MANIFESTS / path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"kustomize {path}: {proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def key(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def normalized(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without Helm's bookkeeping labels (release name, chart version, manager)."""
    meta = dict(obj["metadata"])
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in HELM_LABELS}
    if labels:
        meta["labels"] = labels
    else:
        meta.pop("labels", None)
    return {**obj, "metadata": meta}


def by_key(objs: Iterable[dict[str, Any]], skip_kinds: Sequence[str] = ()) -> dict[Key, dict[str, Any]]:
    return {key(o): normalized(o) for o in objs if o["kind"] not in skip_kinds}


def uninstall_block() -> str:
    """The shell block docs/install.md tells users to run to uninstall (between its uninstall markers)."""
    text = INSTALL_DOC.read_text()
    m = re.search(r"<!-- uninstall:begin[^>]*-->\s*```sh\n(.*?)```\s*<!-- uninstall:end -->", text, re.S)
    assert m, "docs/install.md has no uninstall block"
    return m.group(1)


def run_uninstall(kubeconfig: Path, kubectl_bin: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the documented uninstall, as a user would, with helm and kubectl on the PATH."""
    path = f"{tools_bin_dir()}:{Path(kubectl_bin).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env = {**kube_env(kubeconfig), "KUBECONFIG": str(kubeconfig), "PATH": path}
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", uninstall_block()],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
