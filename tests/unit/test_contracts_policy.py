"""The policy contract bound to its one declaration, ``crds/gpuhealthpolicies.yaml``: the CRD's
``default`` of every field is the parser's default for it (the API server fills it in; a policy
read before that must mean the same), every action a policy field's enum allows is accepted there
and every other refused, and the action and scope vocabularies are the api types (the XID
catalog's default actions included).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from devkit import crdschema
from devkit.crdschema import at, declared_paths
from gpuhealth.api.names import SETTABLE_SCOPES, Action
from gpuhealth.api.policy import PolicyError, parse_policy
from gpuhealth.catalog import xid as xid_catalog
from tests.unit._contracts_support import POLICY_CRD


def test_the_catalogs_default_actions_are_the_policy_actions() -> None:
    """An XID's default action is applied as a policy action: the two vocabularies are one."""
    assert set(xid_catalog.DEFAULT_ACTIONS) == {str(a) for a in Action}, (
        "catalog/xid.py DEFAULT_ACTIONS vs api/names.py Action"
    )
    assert list(xid_catalog.DEFAULT_ACTIONS) == sorted(xid_catalog.DEFAULT_ACTIONS, key=lambda a: Action(a).severity), (
        "catalog/xid.py DEFAULT_ACTIONS is mildest first, as api/names.py Action.severity orders them"
    )


def _policy_paths(key: str) -> list[str]:
    return [p for p in declared_paths(at(crdschema.schema(POLICY_CRD), "spec"), "spec") if p.endswith(f".{key}")]


def _spec_with(path: str, value: Any) -> dict[str, Any]:
    """A policy spec holding ``value`` at ``path`` (list items get their required fields)."""
    spec: dict[str, Any] = {}
    node: Any = spec
    steps = path.removeprefix("spec.").split(".")
    for i, step in enumerate(steps):
        name = step.removesuffix("[]")
        last = i == len(steps) - 1
        if step.endswith("[]"):
            item: dict[str, Any] = {"code": 48} if name == "overrides" else {}
            node[name] = [item]
            node = item
        elif last:
            node[name] = value
        else:
            node = node.setdefault(name, {})
    return spec


def _parse(spec: Mapping[str, Any]) -> Any:
    return parse_policy({"metadata": {"name": "p"}, "spec": spec})


@pytest.mark.parametrize("path", _policy_paths("action"))
def test_every_action_a_policy_field_allows_is_accepted_and_no_other(path: str) -> None:
    allowed = set(at(crdschema.schema(POLICY_CRD), path)["enum"])
    assert allowed <= {str(a) for a in Action}, f"{path} allows actions api/names.py Action lacks"
    for action in Action:
        spec = _spec_with(path, str(action))
        if str(action) in allowed:
            _parse(spec)
        else:
            with pytest.raises(PolicyError, match=path.replace("[]", r"\[\d+\]").replace(".", r"\.")):
                _parse(spec)


@pytest.mark.parametrize("path", _policy_paths("scope"))
def test_every_scope_field_is_the_api_scope(path: str) -> None:
    assert set(at(crdschema.schema(POLICY_CRD), path)["enum"]) == {str(s) for s in SETTABLE_SCOPES}, f"{path} vs Scope"


def _defaults(s: Mapping[str, Any], path: str = "spec") -> Iterator[tuple[str, Any]]:
    for k, v in (s.get("properties") or {}).items():
        child = f"{path}.{k}"
        if "default" in v and not (isinstance(v["default"], dict) and not v["default"]):
            yield child, v["default"]
        if v.get("type") == "object":
            yield from _defaults(v, child)


@pytest.mark.parametrize(("path", "default"), list(_defaults(at(crdschema.schema(POLICY_CRD), "spec"))))
def test_the_crd_default_of_every_policy_field_is_the_parsers(path: str, default: Any) -> None:
    """The API server fills a CRD default in; a policy read before that (or by a test) must mean the
    same, so api/policy.py's default and the CRD's are one value."""
    parent = path.rpartition(".")[0]
    absent = _spec_with(parent + ".x", None) if parent != "spec" else {}
    if parent != "spec":
        node: Any = absent
        for step in parent.removeprefix("spec.").split("."):
            node = node[step]
        node.pop("x")
    assert _parse(_spec_with(path, default)) == _parse(absent), (
        f"crds/gpuhealthpolicies.yaml {path} defaults to {default!r}; api/policy.py parse_policy's default differs"
    )
