"""The verdict a validation pod leaves in its termination message: NVIDIA's DCGM diagnostic, read.

A validation Job (``spec.validation``) hands its result back the way Kubernetes lets a Job do it:
the container's termination message (``terminationMessagePath``, at most 4 KiB, read from the pod's
``status.containerStatuses[].state.terminated.message``). Two shapes are accepted:

- the whole JSON of ``dcgmi diag -r <level> -i <gpus> --json``: ``"DCGM Diagnostic"`` ->
  ``test_categories[{category, tests[{name, results[{status, warnings, error_id, entity_group,
  entity_id | gpu_id | entities}]}]}]`` and ``"Overall Result": "Pass" | "Fail"`` at the top (the
  key names are DCGM's own, ``nvvs/include/NvvsJsonStrings.h`` in NVIDIA/DCGM: ``test_categories``,
  ``category``, ``tests``, ``name``, ``results``, ``status``, ``warnings``, ``warning``,
  ``error_id``, ``gpu_id``, ``entities``, ``entity_group``, ``entity_id``, ``Overall Result``);
- the compact summary the default Job's wrapper writes when the whole JSON does not fit in 4 KiB
  (``actions/validation_jobs.py``): ``{"format": "gpuhealth.dev/dcgm-diag-summary/v1", "overall":
  "Pass" | "Fail", "exitCode": N, "warnings": ["..."], "errorIds": [N, ...]}``.

Anything else (empty, cut off at 4 KiB, not JSON, no overall result) is a failure with a reason that
says so: silence or garbage is never a pass. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUMMARY_FORMAT = "gpuhealth.dev/dcgm-diag-summary/v1"
TERMINATION_MESSAGE_LIMIT = 4096  # bytes: what the kubelet keeps of a termination message
MAX_FINDINGS_CHARS = 1024  # what the ladder record keeps of the findings


@dataclass(frozen=True)
class Failure:
    """One test that did not pass, on one GPU when DCGM says which."""

    test: str
    status: str  # Fail (or Warn, kept as a finding but not a failure)
    gpu: int | None = None
    error_id: int | None = None
    warning: str = ""

    def describe(self) -> str:
        where = f"GPU {self.gpu} " if self.gpu is not None else ""
        code = f" (DCGM error {self.error_id})" if self.error_id is not None else ""
        text = f": {self.warning}" if self.warning else ""
        return f"{where}{self.test} {self.status}{code}{text}"


@dataclass(frozen=True)
class DiagResult:
    """What the validation says: passed, and if not, why (each failing test, or a reason of its own)."""

    passed: bool
    reason: str  # "Passed", "Failed" or why the result could not be read ("Unreadable", "NoResult")
    failures: tuple[Failure, ...] = ()
    detail: str = ""

    def findings(self) -> str:
        """One line for the ladder record, an Event and ``describe`` (bounded)."""
        text = "; ".join(f.describe() for f in self.failures if f.status == "Fail") or self.detail
        return text[:MAX_FINDINGS_CHARS]

    def failed_gpus(self) -> frozenset[int]:
        return frozenset(f.gpu for f in self.failures if f.status == "Fail" and f.gpu is not None)


def _unreadable(detail: str) -> DiagResult:
    return DiagResult(False, "Unreadable", detail=detail)


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().isdigit():
        return int(v.strip())
    return None


def _gpus_of(result: Mapping[str, Any]) -> list[int | None]:
    """The GPUs one result is about: ``entity_id`` of a GPU entity, ``gpu_id``, or ``entities``."""
    group = str(result.get("entity_group") or "GPU")
    if "entity_id" in result and group.upper() == "GPU":
        return [_int_or_none(result.get("entity_id"))]
    if "gpu_id" in result:
        return [_int_or_none(result.get("gpu_id"))]
    ids = result.get("gpu_ids")
    if isinstance(ids, list) and ids:
        return [_int_or_none(i) for i in ids]
    ents = result.get("entities")
    if isinstance(ents, list) and ents:
        out = [
            _int_or_none(e.get("entity_id"))
            for e in ents
            if isinstance(e, Mapping) and str(e.get("entity_group") or "GPU").upper() == "GPU"
        ]
        return out or [None]
    return [None]


def _warnings_of(result: Mapping[str, Any]) -> list[tuple[str, int | None]]:
    raw = result.get("warnings")
    out: list[tuple[str, int | None]] = []
    if isinstance(raw, list):
        for w in raw:
            if isinstance(w, Mapping):
                out.append((str(w.get("warning") or w.get("info") or ""), _int_or_none(w.get("error_id"))))
            elif isinstance(w, str):
                out.append((w, None))
    elif isinstance(raw, str) and raw:
        out.append((raw, None))
    if not out and "error_id" in result:
        out.append(("", _int_or_none(result.get("error_id"))))
    return out or [("", None)]


def _from_full(doc: Mapping[str, Any]) -> DiagResult:
    diag = doc.get("DCGM Diagnostic")
    if not isinstance(diag, Mapping):
        return _unreadable('no "DCGM Diagnostic" object in the result')
    overall = doc.get("Overall Result", diag.get("Overall Result"))
    failures: list[Failure] = []
    categories = diag.get("test_categories")
    if not isinstance(categories, list):
        return _unreadable('"DCGM Diagnostic" has no test_categories list')
    for cat in categories:
        if not isinstance(cat, Mapping):
            continue
        for test in cat.get("tests") or []:
            if not isinstance(test, Mapping):
                continue
            name = str(test.get("name") or cat.get("category") or "?")
            for r in test.get("results") or []:
                if not isinstance(r, Mapping):
                    continue
                status = str(r.get("status") or "").capitalize()
                if status not in ("Fail", "Warn"):
                    continue
                for gpu in _gpus_of(r):
                    for text, code in _warnings_of(r):
                        failures.append(Failure(name, status, gpu, code, text.strip()))
    return _verdict(overall, failures)


def _verdict(overall: Any, failures: list[Failure]) -> DiagResult:
    if overall not in ("Pass", "Fail"):
        return _unreadable(f'no "Overall Result" Pass or Fail in the result (got {overall!r})')
    failing = [f for f in failures if f.status == "Fail"]
    if overall == "Pass" and not failing:
        return DiagResult(True, "Passed", tuple(failures))
    detail = "" if failing else 'the diagnostic says "Overall Result": "Fail" without a failing test'
    return DiagResult(False, "Failed", tuple(failures), detail=detail)


def _from_summary(doc: Mapping[str, Any]) -> DiagResult:
    codes = [c for c in (_int_or_none(x) for x in doc.get("errorIds") or []) if c is not None]
    texts = [str(w) for w in doc.get("warnings") or [] if str(w).strip()]
    failures = [Failure("diag", "Fail", None, codes[i] if i < len(codes) else None, t) for i, t in enumerate(texts)]
    failures += [Failure("diag", "Fail", None, c, "") for c in codes[len(texts) :]]
    exit_code = _int_or_none(doc.get("exitCode"))
    result = _verdict(doc.get("overall"), failures)
    if result.passed and exit_code not in (None, 0):
        return DiagResult(False, "Failed", detail=f"dcgmi exited {exit_code} although its result says Pass")
    return result


def parse_termination_message(message: str | None) -> DiagResult:
    """The verdict in a validation pod's termination message (either shape; see the module docstring)."""
    text = (message or "").strip()
    if not text:
        return DiagResult(False, "NoResult", detail="the validation pod left no result in its termination message")
    try:
        doc = json.loads(text)
    except ValueError:
        cut = len(text.encode()) >= TERMINATION_MESSAGE_LIMIT - 16
        why = "cut off at the 4 KiB termination-message limit" if cut else "not JSON"
        return _unreadable(f"the validation result is {why}: {text[:80]!r}")
    if not isinstance(doc, Mapping):
        return _unreadable("the validation result is not a JSON object")
    if doc.get("format") == SUMMARY_FORMAT:
        return _from_summary(doc)
    return _from_full(doc)
