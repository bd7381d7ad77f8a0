"""Render the newest filed cold ``make test`` (``results/build/coldstart-*.json``) into docs/development.md.

``python -m hack.coldstart.docs`` rewrites the marked block; ``--check`` fails if it is stale
(tests/unit/test_coldstart.py runs the check in ``make test``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from devkit.docblocks import check, stale_docs, write_docs
from hack.coldstart import REPO, RESULTS, newest

DOC = REPO / "docs" / "development.md"
BEGIN = "<!-- coldstart:begin (rendered by python -m hack.coldstart.docs from results/build/) -->"
END = "<!-- coldstart:end -->"

# What each piece is, in the order a reader meets them.
NAMES = {
    "control_plane": "control plane (kwok, etcd, kube-apiserver, -controller-manager, -scheduler)",
    "kueue": "Kueue's manager",
    "helm_promtool": "helm and promtool",
    "node_packages": "Debian packages of the real node (apt)",
    "containerd": "containerd",
    "kubelet": "kubelet",
    "pause_image": "pause image",
    "python_base": "Python base image (mmdebstrap)",
    "image": "gpuhealth's image (Dockerfile)",
    "nvidia_plugins": "NVIDIA's device plugin and GFD (one go build)",
    "nvidia_plugins_image": "their image",
}


def _mmss(s: float) -> str:
    return f"{int(s) // 60} min {int(s) % 60:02d} s"


# The run's two phases (hack/coldstart CpuSampler), as the block names them.
PHASES = {"build": "while the tools built", "tests": "while the tests ran"}


def _cpu(cpu: dict[str, dict[str, float]]) -> str:
    """How busy the CPUs were in each phase (runs filed before the sampler have none)."""
    parts = [f"{cpu[p]['busy']:.0%} {said} ({_mmss(cpu[p]['s'])})" for p, said in PHASES.items() if p in cpu]
    return f" The CPUs were busy {' and '.join(parts)}." if parts else ""


def _memory(least: dict[str, float], machine: dict[str, Any]) -> str:
    """The least memory left available in each phase (runs filed before it was sampled have none)."""
    parts = [f"{least[p]} GB {said}" for p, said in PHASES.items() if p in least]
    return f" Memory available at its lowest (of {machine['mem_gb']} GB): {' and '.join(parts)}." if parts else ""


def render(result: dict[str, Any] | None) -> str:
    if result is None:
        return f"{BEGIN}\nNo cold run is filed yet (`make coldstart`).\n{END}"
    m, tests = result["machine"], result.get("tests") or {}
    verdict = "met" if result["met"] else "**missed**"
    counts = ", ".join(f"{n} {w}" for w, n in (tests.get("counts") or {}).items()) or "no test summary"
    lines = [
        BEGIN,
        f"Cold `{result['command']}` at {result['commit']} on {result['date'][:10]} ({m['cpus']} CPUs, "
        f"{m['mem_gb']} GB; load {result['load_before'][0]:.1f} before): **{_mmss(result['wall_s'])}** "
        f"(exit {result['rc']}), against the {result['target_s'] // 60}-minute target: {verdict}. "
        f"Tests: {counts}"
        + (f" in {_mmss(tests['pytest_s'])} of pytest." if "pytest_s" in tests else ".")
        + (
            ""
            if result["node_packages_installed"]
            else " The real node's Debian packages were already installed (apt not counted)."
        )
        + (f" Caches: {result['caches']}." if result.get("caches") else "")
        + _cpu(result.get("cpu") or {})
        + _memory(result.get("least_available_gb") or {}, m),
        "",
        "| piece (as its build script timed itself; pieces overlap) | seconds |",
        "|---|---:|",
        *(
            f"| {NAMES[k]} | {v} |"
            for k, v in sorted(result["pieces_s"].items(), key=lambda kv: list(NAMES).index(kv[0]))
        ),
        END,
    ]
    return "\n".join(lines)


def rendered() -> dict[Path, list[str]]:
    return {DOC: [render(newest(RESULTS))]}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        return check(stale_docs(rendered()), "hack.coldstart.docs")
    write_docs(rendered())
    return 0


if __name__ == "__main__":
    sys.exit(main())
