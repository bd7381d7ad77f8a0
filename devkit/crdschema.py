"""The CRDs' OpenAPI schemas as test data: load them, check an object against them, and build the
fullest object they allow.

The wire contracts (what the agent writes into a GPUNodeHealth, what the operator writes into its
status, what a GPUHealthPolicy may say) are declared once, in ``crds/``. The code on each side is
bound to that declaration by tests, not by hand-kept copies: an object the code emits is checked
property by property against the schema (:func:`violations`), and :func:`fullest` builds an
object with every property the schema declares set, so a test that slims, parses or round-trips
it covers a field the day it is added to the CRD, without anyone extending a fixture.

Only what the CRDs here use is understood: ``type``, ``properties``, ``items``, ``enum``,
``minimum``/``maximum``, ``maxLength``, ``format: date-time``, ``x-kubernetes-int-or-string``,
``additionalProperties`` and ``x-kubernetes-preserve-unknown-fields`` (an object that keeps
unknown fields still has every *declared* field checked).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "crds"
CHART_CRDS = ROOT / "charts" / "gpuhealth" / "crds"
TIME = "2026-01-01T00:00:00Z"


def crd(filename: str) -> dict[str, Any]:
    """The CRD in ``crds/<filename>``, a copy the caller may change (parsed once per file content)."""
    return copy.deepcopy(_parsed((CRDS / filename).read_text(encoding="utf-8")))


@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> dict[str, Any]:
    # The C loader where PyYAML has it: the contract tests read the report's CRD hundreds of times.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    doc: dict[str, Any] = yaml.load(text, Loader=loader)
    return doc


def schema(filename: str, version: str = "v1alpha1") -> dict[str, Any]:
    """The openAPIV3Schema of ``version`` in ``crds/<filename>``."""
    for v in crd(filename)["spec"]["versions"]:
        if v["name"] == version:
            s: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return s
    raise KeyError(f"crds/{filename} has no version {version}")


def at(s: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """The sub-schema at a dotted path (``spec.devices[].ecc``); KeyError names the missing step."""
    node: Mapping[str, Any] = s
    for step in path.split("."):
        name = step.removesuffix("[]")
        props = node.get("properties") or {}
        if name not in props:
            raise KeyError(f"{path}: the schema declares no property {name!r}")
        node = props[name]
        if step.endswith("[]"):
            node = node.get("items") or {}
    return node


def _type_ok(s: Mapping[str, Any], value: Any) -> bool:
    if s.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    kind = s.get("type")
    if kind is None:
        return True
    return {
        "object": lambda v: isinstance(v, Mapping),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }[str(kind)](value)


def violations(s: Mapping[str, Any], value: Any, path: str = "") -> Iterator[str]:
    """Every way ``value`` breaks schema ``s``: undeclared properties, wrong types, values outside
    an enum or a bound. Each message names the field path."""
    where = path or "(root)"
    if not _type_ok(s, value):
        yield f"{where}: {value!r} is not of type {s.get('type')}"
        return
    if "enum" in s and value not in s["enum"]:
        yield f"{where}: {value!r} is not one of the schema's enum {s['enum']}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in s and value < s["minimum"]:
            yield f"{where}: {value} is below the schema's minimum {s['minimum']}"
        if "maximum" in s and value > s["maximum"]:
            yield f"{where}: {value} is above the schema's maximum {s['maximum']}"
    if isinstance(value, str) and "maxLength" in s and len(value) > s["maxLength"]:
        yield f"{where}: {len(value)} characters, the schema allows {s['maxLength']}"
    if isinstance(value, list):
        if "maxItems" in s and len(value) > s["maxItems"]:
            yield f"{where}: {len(value)} items, the schema allows {s['maxItems']}"
        for i, item in enumerate(value):
            yield from violations(s.get("items") or {}, item, f"{path}[{i}]")
    if isinstance(value, Mapping):
        props = s.get("properties") or {}
        extra = s.get("additionalProperties")
        for key, sub in value.items():
            child = f"{path}.{key}" if path else str(key)
            if key in props:
                yield from violations(props[key], sub, child)
            elif isinstance(extra, Mapping):
                yield from violations(extra, sub, child)
            elif not props and (s.get("x-kubernetes-preserve-unknown-fields") or extra is True):
                continue  # a free-form object: nothing is declared inside it
            else:
                yield f"{child}: the schema declares no such property (declared: {sorted(props)})"
        for key in s.get("required") or []:
            if key not in value:
                yield f"{path}.{key}: required by the schema, missing"


def fullest(s: Mapping[str, Any], path: str = "", overrides: Mapping[str, Any] | None = None) -> Any:
    """A value with every declared property set: objects with all their properties, one item per
    array, the first enum value, a bound's inner edge. ``overrides`` maps a field path (as
    :func:`violations` spells it, items as ``[]``) to the value to use there instead."""
    overrides = overrides or {}
    if path in overrides:
        return overrides[path]
    if "enum" in s:
        return s["enum"][0]
    kind = s.get("type")
    if s.get("x-kubernetes-int-or-string"):
        return 1
    if kind == "object":
        props = s.get("properties") or {}
        return {k: fullest(v, f"{path}.{k}" if path else k, overrides) for k, v in props.items()}
    if kind == "array":
        return [fullest(s.get("items") or {}, f"{path}[]", overrides)]
    if kind == "integer":
        lo, hi = s.get("minimum"), s.get("maximum")
        value = 1 if lo is None else int(lo) + 1
        return value if hi is None else min(value, int(hi))
    if kind == "number":
        return 1.5
    if kind == "boolean":
        return True
    if kind == "string":
        if s.get("format") == "date-time":
            return TIME
        return "x"
    return None


def declared_paths(s: Mapping[str, Any], path: str = "") -> Iterator[str]:
    """Every leaf field path the schema declares (items as ``[]``)."""
    kind = s.get("type")
    if kind == "object" and s.get("properties"):
        for k, v in s["properties"].items():
            yield from declared_paths(v, f"{path}.{k}" if path else k)
    elif kind == "array":
        yield from declared_paths(s.get("items") or {}, f"{path}[]")
    else:
        yield path
