"""The package layering as a checked contract (run by ``make test``): no import cycle between
gpuhealth's modules, and no layer importing one above it.

Layers, low to high: ``api`` and ``catalog`` (the contract, facts about pods, NVIDIA's data), ``drain``
(the drain planner, which pods hold a device, Kueue), ``evaluation`` (assess, decide), ``kube`` and
``actions`` (the API door, Node patch planning), ``controller``. The ``agent`` stays self-contained (the
agent image stays small): it may use only the contract (``api``: names, time format) and the ``kube``
credential chain and error taxonomy, never the operator's layers; so does the workload helper (``api``
only). The ``cli`` reads the contract, talks through ``kube`` and shows what the operator acts on
through the same pure mappings (``drain`` for the pods of a device, ``actions`` for the devices of a
GPU). Imports under ``TYPE_CHECKING`` count: a cycle for the type checker is a knot for the reader too.

Inside ``controller`` the rooms follow the data: ``state`` (store, the slim shapes it keeps, tallies,
breaker) < ``intake`` (watches, the feeders that put what they bring into the store and queue the
nodes it touches, the queue) < ``act`` (the writes) < ``process`` (Kopf, runtime, leadership);
a room imports only rooms before it and the shared modules directly under ``controller``
(``metrics``, ``backoff``), which import no room.

The tooling is held to the same rules: ``devkit`` (what the tools and the tests share) imports neither
``hack`` nor ``tests``; no module of ``hack`` imports ``tests``; each tool under ``hack`` (bench, chaos,
demo, memprobe, cluster) imports only ``devkit``, the product and itself (the memory probe, the
bench's in-process probe, also the bench's fleet shapes); and ``devkit`` and ``hack`` together have
no import cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "operator"
PACKAGE = "gpuhealth"

# package -> the packages it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
    "api": set(),
    "catalog": set(),
    "drain": {"api", "catalog"},
    "evaluation": {"api", "catalog", "drain"},
    "kube": {"api"},
    "actions": {"api", "catalog", "drain", "evaluation"},
    "controller": {"api", "catalog", "drain", "evaluation", "kube", "actions"},
    "agent": {"api", "kube"},
    "cli": {"api", "catalog", "drain", "actions", "kube"},
    "workload": {"api"},
}

# controller room -> the rooms it may import; "" is the shared modules directly under controller/
ROOMS: dict[str, set[str]] = {
    "": set(),
    "state": {""},
    "intake": {"", "state"},
    "act": {"", "state", "intake"},
    "process": {"", "intake", "state", "act"},
}


def module_imports(root: Path, package: str = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` under ``root`` -> the modules of ``package`` it imports."""
    return package_imports(root, (package,))


def package_imports(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module of ``packages`` under ``root`` -> the modules of those packages it imports (a package's
    own ``__init__`` is no layer: importing it alone does not count)."""
    modules = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for package in packages
        for p in (root / package).rglob("*.py")
    }

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            for n in names:
                target = resolve(n) if n.split(".")[0] in packages else None
                if target and target != mod and target not in packages:
                    deps.add(target)
        graph[mod] = deps
    return graph


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: Mapping[str, set[str]], allowed: Mapping[str, set[str]]) -> list[str]:
    out = []
    for mod, deps in sorted(graph.items()):
        mine = layer_of(mod)
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if theirs != mine and theirs not in allowed.get(mine, set()):
                out.append(f"{mod} imports {dep} ({mine} may not import {theirs})")
    return out


def room_of(module: str) -> str | None:
    """``gpuhealth.controller.<room>.<module>`` -> room; a shared ``gpuhealth.controller.<module>`` -> "";
    outside controller -> None."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "controller":
        return None
    return parts[2] if len(parts) > 3 else ""


def backward_room_imports(graph: Mapping[str, set[str]], rooms: Mapping[str, set[str]]) -> list[str]:
    out = []
    for mod, deps in sorted(graph.items()):
        mine = room_of(mod)
        if mine is None:
            continue
        for dep in sorted(deps):
            theirs = room_of(dep)
            if theirs is not None and theirs != mine and theirs not in rooms.get(mine, set()):
                out.append(f"{mod} imports {dep} (controller room {mine or 'shared'!r} may not import {theirs!r})")
    return out


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_gpuhealth_has_no_import_cycle() -> None:
    graph = module_imports(ROOT)
    assert len(graph) > 40  # the walk found the package
    assert cycles(graph) == []


def test_no_layer_imports_one_above_it() -> None:
    graph = module_imports(ROOT)
    assert {layer_of(m) for m in graph} <= set(ALLOWED) | {PACKAGE}, "a new package needs a place in ALLOWED"
    assert upward_imports(graph, ALLOWED) == []


def test_controller_rooms_import_only_rooms_before_them() -> None:
    graph = module_imports(ROOT)
    found = {room_of(m) for m in graph} - {None}
    assert found == set(ROOMS), "a new controller room needs a place in ROOMS"
    assert backward_room_imports(graph, ROOMS) == []


def test_the_room_checker_fires_on_a_backward_import() -> None:
    graph = {
        "gpuhealth.controller.intake.watch": {"gpuhealth.controller.act.writer", "gpuhealth.controller.metrics"},
        "gpuhealth.controller.metrics": {"gpuhealth.controller.state.store"},
        "gpuhealth.controller.act.writer": {"gpuhealth.controller.intake.watch", "gpuhealth.api.names"},
    }
    assert backward_room_imports(graph, ROOMS) == [
        "gpuhealth.controller.intake.watch imports gpuhealth.controller.act.writer "
        "(controller room 'intake' may not import 'act')",
        "gpuhealth.controller.metrics imports gpuhealth.controller.state.store "
        "(controller room 'shared' may not import 'state')",
    ]


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    """A package with a cycle (controller.a <-> controller.b, one side under TYPE_CHECKING) and an
    upward import (api -> controller)."""
    pkg = tmp_path / PACKAGE
    for sub in ("api", "controller"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "api" / "names.py").write_text("from gpuhealth.controller.a import X\n")
    (pkg / "controller" / "a.py").write_text("from gpuhealth.controller import b\nX = 1\n")
    (pkg / "controller" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpuhealth.controller.a import X\n"
    )
    return tmp_path


def test_the_checker_fires_on_a_cycle_and_an_upward_import(synthetic: Path) -> None:
    graph = module_imports(synthetic)
    assert graph["gpuhealth.controller.a"] == {"gpuhealth.controller.b"}
    assert cycles(graph) == [["gpuhealth.controller.a", "gpuhealth.controller.b"]]
    assert upward_imports(graph, ALLOWED) == [
        "gpuhealth.api.names imports gpuhealth.controller.a (api may not import controller)"
    ]


# -- the tooling: devkit, hack (and tests, which may import both) ---------------------------------------

TOOLING = ("devkit", "hack", "tests")
# tool (hack.<tool>) -> the other tools it may import
TOOLS: dict[str, set[str]] = {
    "bench": set(),
    "chaos": set(),
    "demo": set(),
    "memprobe": {"bench"},
    "fleetprobe": {"memprobe"},
    "cluster": set(),
    "gen_xid_docs": set(),
    "gen_metrics_docs": set(),
    "gen_crds": set(),
    "coldstart": set(),
    "latency": set(),
}


def tooling_imports(repo: Path, packages: tuple[str, ...] = TOOLING) -> dict[str, set[str]]:
    """Each module of ``packages`` under ``repo`` -> the modules of those packages it imports."""
    return package_imports(repo, packages)


def tooling_violations(graph: Mapping[str, set[str]], tools: Mapping[str, set[str]] = TOOLS) -> list[str]:
    out = []
    for mod, deps in sorted(graph.items()):
        top = mod.split(".")[0]
        for dep in sorted(deps):
            dtop = dep.split(".")[0]
            if top == "devkit" and dtop in ("hack", "tests"):
                out.append(f"{mod} imports {dep} (devkit imports neither hack nor tests)")
            elif top == "hack" and dtop == "tests":
                out.append(f"{mod} imports {dep} (hack never imports tests: share it through devkit)")
            elif top == "hack" and dtop == "hack" and len(mod.split(".")) > 1 and len(dep.split(".")) > 1:
                mine, theirs = mod.split(".")[1], dep.split(".")[1]
                if mine != theirs and theirs not in tools.get(mine, set()):
                    out.append(f"{mod} imports {dep} (hack.{mine} may not import hack.{theirs})")
    return out


def test_the_tooling_keeps_its_layers() -> None:
    graph = tooling_imports(REPO)
    assert any(m.startswith("devkit.") for m in graph) and any(m.startswith("hack.bench.") for m in graph)
    tools = {m.split(".")[1] for m in graph if m.startswith("hack.") and m.count(".") >= 1}
    assert tools <= set(TOOLS), f"a new tool under hack/ needs a place in TOOLS: {sorted(tools - set(TOOLS))}"
    assert tooling_violations(graph) == []


def test_devkit_and_hack_have_no_import_cycle() -> None:
    graph = tooling_imports(REPO, ("devkit", "hack"))
    assert cycles(graph) == []


def test_the_tooling_checker_fires() -> None:
    graph = {
        "devkit.k8s": {"tests.unit.builders"},
        "hack.bench.drain": {"hack.chaos.podorder", "devkit.k8s"},
        "hack.memprobe.mig": {"hack.bench.mig"},
        "hack.chaos.run": {"tests.support"},
    }
    assert tooling_violations(graph) == [
        "devkit.k8s imports tests.unit.builders (devkit imports neither hack nor tests)",
        "hack.bench.drain imports hack.chaos.podorder (hack.bench may not import hack.chaos)",
        "hack.chaos.run imports tests.support (hack never imports tests: share it through devkit)",
    ]
