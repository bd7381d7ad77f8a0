"""Helpers shared by the wire-contract tests (test_contracts*.py): the two CRDs by file name, one
fixed time, an enum's values as a CRD declares them, and what counts as a field left unset."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

from devkit import crdschema
from devkit.crdschema import at

REPORT_CRD = "gpunodehealths.yaml"
POLICY_CRD = "gpuhealthpolicies.yaml"
T = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def unset(value: Any, default: Any) -> bool:
    """Whether a dataclass field holds nothing a test can check: None, its default, or empty."""
    return value is None or value == default or value == ()


def unset_fields(obj: Any, skip: Iterable[str] = ()) -> list[str]:
    """The names of the dataclass fields of ``obj`` (outside ``skip``) that hold nothing a test can check."""
    out = []
    for f in dataclasses.fields(obj):
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.name not in skip and unset(getattr(obj, f.name), default):
            out.append(f.name)
    return out


def crd_enum(filename: str, path: str) -> set[Any]:
    """The values the enum at ``path`` of ``crds/<filename>`` allows."""
    return set(at(crdschema.schema(filename), path)["enum"])
