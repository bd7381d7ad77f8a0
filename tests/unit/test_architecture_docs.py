"""docs/architecture.md cannot go stale: its layer table names every module of ``gpuhealth`` (and no
module that is gone), and every file its "Where do I change X?" table points at exists.

A module added without a word in the architecture is invisible to the next reader; a row pointing
at a file that moved sends them to the wrong place. Both fail here, naming the module or file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "gpuhealth"
DOC = ROOT / "docs" / "architecture.md"
_NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_/]*)`")


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(title)
    end = text.find("\n#", start + len(title))
    return text[start : end if end != -1 else len(text)]


def layer_table(text: str) -> dict[str, set[str]]:
    """Each row of the layer table: layer -> the module names its ``modules`` cell gives in backticks
    (a data file such as ``xid_catalog.json`` is not a module name)."""
    rows: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not re.fullmatch(r"`\w+`", cells[0]):
            continue
        rows[cells[0].strip("`")] = set(_NAME.findall(cells[1]))
    return rows


def modules() -> dict[str, set[str]]:
    """Each layer (sub-package, or a top-level module) -> its modules, as paths under the layer."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        if rel.name == "__init__":
            continue
        if len(rel.parts) == 1:
            out.setdefault(rel.name, set())
        else:
            out.setdefault(rel.parts[0], set()).add("/".join(rel.parts[1:]))
    return out


def missing_and_stale(rows: dict[str, set[str]], actual: dict[str, set[str]]) -> list[str]:
    problems = []
    for layer, names in sorted(actual.items()):
        if layer not in rows:
            problems.append(f"docs/architecture.md's layer table has no row for operator/gpuhealth/{layer}")
            continue
        for name in sorted(names - rows[layer]):
            problems.append(
                f"docs/architecture.md's layer table does not name operator/gpuhealth/{layer}/{name}.py: "
                f"add `{name}` to the modules of the `{layer}` row"
            )
        for name in sorted(rows[layer] - names):
            problems.append(
                f"docs/architecture.md's `{layer}` row names `{name}`, but operator/gpuhealth/{layer}/{name}.py "
                "does not exist: take it off, or rename it"
            )
    return problems


def test_the_layer_table_names_every_module() -> None:
    problems = missing_and_stale(layer_table(_section("## Package layering")), modules())
    assert not problems, "\n".join(problems)


def test_the_check_names_the_missing_and_the_stale_module() -> None:
    rows = {"cli": {"main", "gone"}, "workload": set()}
    actual = {"cli": {"main", "miglayout"}, "workload": set(), "api": {"names"}}
    assert missing_and_stale(rows, actual) == [
        "docs/architecture.md's layer table has no row for operator/gpuhealth/api",
        "docs/architecture.md's layer table does not name operator/gpuhealth/cli/miglayout.py: "
        "add `miglayout` to the modules of the `cli` row",
        "docs/architecture.md's `cli` row names `gone`, but operator/gpuhealth/cli/gone.py does not exist: "
        "take it off, or rename it",
    ]


def test_every_file_the_where_to_change_table_names_exists() -> None:
    table = _section("### Where do I change X?")
    missing = []
    for token in re.findall(r"`([^`\s]+)`", table):
        if "/" not in token:
            continue
        if not any((base / token).exists() for base in (ROOT, PACKAGE)):
            missing.append(token)
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", table):
        if not (DOC.parent / link).exists():
            missing.append(f"docs/{link}")
    assert not missing, f"docs/architecture.md 'Where do I change X?' names files that do not exist: {missing}"
