"""Pure text for `kubectl gpuhealth explain`: one XID, from the model explain.py builds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuhealth.cli.render import field


def render_explain(e: Mapping[str, Any]) -> str:
    name = str(e["name"])
    if e.get("mnemonic") and e["mnemonic"] != "UNKNOWN":
        name += f" ({e['mnemonic']})"
    lines = [
        f"XID {e['code']}: {name}",
        "",
        field("Description", str(e["description"]), 18),
        field("Immediate action", f"{e['immediateAction']}: {e['immediateActionText']}", 18),
        field("Application error", "yes: usually caused by the application" if e["applicationError"] else "no", 18),
        field("gpuhealth action", f"{e['defaultAction']}: {e['defaultActionText']}", 18),
        field("What to do", str(e["whatToDo"]), 18),
    ]
    if e.get("notes"):
        lines += ["", "Notes:", *(f"  - {n}" for n in e["notes"])]
    return "\n".join(lines) + "\n"
