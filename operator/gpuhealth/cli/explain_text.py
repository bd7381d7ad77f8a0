"""Pure text for `kubectl gpuhealth explain`: one XID, from the model explain.py builds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _field(label: str, value: str, width: int = 18) -> str:
    return f"{(label + ':').ljust(width)} {value}".rstrip()


def render_explain(e: Mapping[str, Any]) -> str:
    name = str(e["name"])
    if e.get("mnemonic") and e["mnemonic"] != "UNKNOWN":
        name += f" ({e['mnemonic']})"
    lines = [
        f"XID {e['code']}: {name}",
        "",
        _field("Description", str(e["description"]), 18),
        _field("Immediate action", f"{e['immediateAction']}: {e['immediateActionText']}", 18),
        _field("Application error", "yes: usually caused by the application" if e["applicationError"] else "no", 18),
        _field("gpuhealth action", f"{e['defaultAction']}: {e['defaultActionText']}", 18),
        _field("What to do", str(e["whatToDo"]), 18),
    ]
    if e.get("notes"):
        lines += ["", "Notes:", *(f"  - {n}" for n in e["notes"])]
    return "\n".join(lines) + "\n"
