"""The on-call docs stay true to the code: policy fields, examples, reasons and plugin commands."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.api.names import Signal
from gpuhealth.api.policy import parse_policy
from gpuhealth.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"


def yaml_blocks(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]


def policy_objects(path: Path) -> list[dict[str, Any]]:
    """Every policy in the doc's YAML blocks; a bare ``spec:`` snippet becomes a policy of its own."""
    out = []
    for i, block in enumerate(yaml_blocks(path)):
        if not isinstance(block, dict):
            continue
        if block.get("kind") == "GPUHealthPolicy":
            out.append(block)
        elif set(block) == {"spec"}:
            out.append({"metadata": {"name": f"snippet-{i}"}, "spec": block["spec"]})
    return out


def spec_fields(schema: dict[str, Any], path: str = "spec") -> Iterator[str]:
    """Documented paths of the CRD's spec: leaves, arrays of objects as ``path[]``, selectors whole."""
    props = schema.get("properties")
    if path == "spec.nodeSelector" or not props:
        yield path
        return
    for name, sub in props.items():
        child = f"{path}.{name}"
        if sub.get("type") == "array" and sub.get("items", {}).get("type") == "object":
            yield f"{child}[]"
        else:
            yield from spec_fields(sub, child)


def crd_spec() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "gpuhealthpolicies.yaml").read_text(encoding="utf-8"))
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]  # type: ignore[no-any-return]


def test_policy_doc_documents_every_field_of_the_crd() -> None:
    text = (DOCS / "policy.md").read_text(encoding="utf-8")
    fields = list(spec_fields(crd_spec()))
    assert len(fields) > 40
    missing = [f for f in fields if f"`{f}`" not in text]
    assert missing == []


def test_policy_doc_examples_parse_with_the_operators_parser() -> None:
    objs = policy_objects(DOCS / "policy.md")
    full = [o for o in objs if o.get("kind") == "GPUHealthPolicy"]
    assert {o["metadata"]["name"] for o in full} >= {"training-fleet", "inference-fleet"}
    assert len(objs) >= 8
    for obj in objs:
        parse_policy(obj)  # raises PolicyError naming the field


def test_full_examples_set_every_section() -> None:
    sections = set(crd_spec()["properties"])
    for obj in policy_objects(DOCS / "policy.md"):
        if obj["metadata"]["name"] in ("training-fleet", "inference-fleet"):
            assert set(obj["spec"]) == sections


@pytest.mark.parametrize(
    "reason",
    [str(s) for s in Signal]
    + [f"XID{c}" for c in (48, 62, 64, 74, 79, 92, 94, 95, 109, 119, 120, 154)]
    + ["QuarantineHeldBack", "BreakerOpen", "LiftedByOthers"],
)
def test_runbook_covers_each_reason(reason: str) -> None:
    text = (DOCS / "runbook.md").read_text(encoding="utf-8")
    assert re.search(rf"^##+ .*\b{reason}\b", text, re.MULTILINE), f"no runbook heading names {reason}"


@pytest.mark.parametrize("doc", ["runbook.md", "policy.md", "architecture.md"])
def test_docs_use_only_plugin_commands_that_exist(doc: str) -> None:
    text = (DOCS / doc).read_text(encoding="utf-8")
    used = set(re.findall(r"kubectl gpuhealth ([a-z-]+)", text))
    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr, arg-type]
    if doc == "runbook.md":
        assert {"status", "describe", "explain", "release", "pause", "resume"} <= used
    assert used <= commands, used - commands
