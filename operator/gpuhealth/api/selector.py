"""A policy's node selector (``spec.nodeSelector``): a Kubernetes label selector, matched against a
Node's labels without asking the API server, since the operator selects from its cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.policy_fields import PolicyError

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")  # matchExpressions[].operator


@dataclass(frozen=True)
class LabelSelector:
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.match_labels.items():
            if labels.get(k) != v:
                return False
        for key, op, values in self.match_expressions:
            present = key in labels
            if op == "In" and (not present or labels[key] not in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True


def parse_selector(raw: Any, path: str = "spec.nodeSelector") -> LabelSelector:
    if not raw:
        return LabelSelector()
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: must be a label selector")
    labels = raw.get("matchLabels") or {}
    exprs = []
    for i, e in enumerate(raw.get("matchExpressions") or []):
        op = e.get("operator")
        if op not in OPERATORS:
            raise PolicyError(f"{path}.matchExpressions[{i}].operator: invalid {op!r}")
        exprs.append((str(e.get("key")), op, tuple(e.get("values") or ())))
    return LabelSelector(dict(labels), tuple(exprs))
