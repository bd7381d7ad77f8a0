"""Rendering the deployment manifests (manifests/) with the kustomize built into kubectl, for the
render-only unit tests and the control-plane tests alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from devkit.k8s import GPUHEALTH_NAMESPACE, MANIFESTS

REPO = MANIFESTS.parent
KUBECTL = str(Path(sys.executable).parent / "kubectl")
ENTRY_POINTS = (
    "crds",
    "base",
    "overlays/example",
    "overlays/example-monitoring",
    "overlays/example-sidecar",
    "overlays/example-kueue",
    "components/prometheus",
)
NS = GPUHEALTH_NAMESPACE
IMAGE = "ghcr.io/gpuhealth/gpuhealth:0.1.0"


def render(kustomization: str) -> list[dict[str, Any]]:
    """`kubectl kustomize` (kustomize built into kubectl, default load restrictions)."""
    proc = subprocess.run(
        [KUBECTL, "kustomize", str(MANIFESTS / kustomization)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"kustomize {kustomization}: {proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)}"
    return hits[0]


def pod_from_template(workload: dict[str, Any], name: str) -> dict[str, Any]:
    tmpl = workload["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": dict(tmpl["metadata"].get("labels") or {})},
        "spec": tmpl["spec"],
    }
