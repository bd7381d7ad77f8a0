"""The CRDs are generated from ``api/`` (``python -m hack.gen_crds``): the committed YAML is what the
generator makes of its templates (``operator/gpuhealth/api/crds/*.yaml.in``) and the API types, and no template copies
an enum or a default the API types declare."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_crds", ROOT / "hack" / "gen_crds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_crds", module)
    spec.loader.exec_module(module)
    return module


def test_the_committed_crds_are_what_the_generator_makes() -> None:
    problems = _generator().drift()
    assert not problems, "run: python -m hack.gen_crds\n" + "\n".join(problems)


def test_the_templates_copy_no_enum_or_default_value() -> None:
    """Every enum and every default (but an empty object's) is an expression over api/."""
    copied = []
    templates = sorted(_generator().TEMPLATES.glob("*.yaml.in"))
    assert templates, "no CRD template found where hack/gen_crds.py reads them"
    for tmpl in templates:
        for n, line in enumerate(tmpl.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"\b(enum|default): (?!\{\{ |\{\}|\{ *\})", line):
                copied.append(f"{tmpl.name}:{n}: {m.group(1)} is not generated: {line.strip()}")
    assert not copied, "\n".join(copied)


def test_a_new_api_value_changes_the_generated_crd() -> None:
    gen = _generator()
    template = (
        "enum: {{ enum(RecoveryAction) }}\ndefault: {{ dur(P.probation_s) }}\nx: {{ enum(Action, SILENCE_ACTIONS) }}\n"
    )
    assert gen.render(template) == (
        "enum: [None, Reset, Reboot, DrainP2P, DrainAndReset, RecoverImexDomain, BusReset, SystemReboot]\n"
        "default: 10m\n"
        "x: [observe, cordon]\n"
    )
