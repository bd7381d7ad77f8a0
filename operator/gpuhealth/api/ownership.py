"""The ``gpuhealth.dev/quarantine`` Node annotation: what gpuhealth placed on a Node, and what
someone else lifted. The operator writes it (actions/nodes.py) and the plugin shows it.

``taintOnly`` says the episode is held by gpuhealth's taint alone because the policy says not to
cordon (``spec.actions.cordon: false``): a later pass, a restarted operator included, reads it and
places no cordon; it is written only when true, so a record of the default mode is unchanged."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ownership:
    """Parsed ``gpuhealth.dev/quarantine`` annotation."""

    reason: str
    taint: bool
    cordon: bool
    since: str = ""
    lifted_by_others: tuple[str, ...] = ()
    taint_only: bool = False  # held under spec.actions.cordon: false (gpuhealth's taint alone)

    def to_json(self) -> str:
        d: dict[str, Any] = {
            "reason": self.reason,
            "taint": self.taint,
            "cordon": self.cordon,
            "since": self.since,
        }
        if self.lifted_by_others:
            d["liftedByOthers"] = list(self.lifted_by_others)
        if self.taint_only:
            d["taintOnly"] = True
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def parse(text: str | None) -> Ownership | None:
        if not text:
            return None
        try:
            d = json.loads(text)
            return Ownership(
                reason=str(d.get("reason", "")),
                taint=bool(d.get("taint")),
                cordon=bool(d.get("cordon")),
                since=str(d.get("since", "")),
                lifted_by_others=tuple(d.get("liftedByOthers") or ()),
                taint_only=bool(d.get("taintOnly")),
            )
        except (ValueError, AttributeError):
            # Unreadable: assume we own a taint (our key is ours by definition) but not the cordon.
            return Ownership(reason="", taint=True, cordon=False)
