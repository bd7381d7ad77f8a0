"""Pure text for `kubectl gpuhealth status`, and the helpers describe_text.py shares: tables, ages, colours.

Nothing here reads the environment or the terminal: callers pass ``color`` (True only when stdout is
a TTY and NO_COLOR is unset), so every output is testable as a plain string.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuhealth.api.names import State
from gpuhealth.api.timeutil import parse_time
from gpuhealth.cli import topology
from gpuhealth.cli.fleet import NO_VERDICT, Fleet, Row, Totals

RESET = "\x1b[0m"
STATE_COLORS: dict[str, str] = {
    State.HEALTHY: "\x1b[32m",  # green
    State.DEGRADED: "\x1b[33m",  # yellow
    State.RECOVERING: "\x1b[36m",  # cyan
    State.QUARANTINED: "\x1b[31m",  # red
    State.DRAINING: "\x1b[31m",  # red
    State.AWAITING_REPAIR: "\x1b[1;31m",  # bold red
    State.UNKNOWN: "\x1b[35m",  # magenta
}
WARNING_COLOR = "\x1b[33m"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def paint(text: str, code: str | None, color: bool) -> str:
    return f"{code}{text}{RESET}" if color and code and text else text


def paint_state(text: str, state: str, color: bool) -> str:
    return paint(text, STATE_COLORS.get(state), color)


def human_age(seconds: float | None) -> str:
    """kubectl's way of writing an age: 45s, 3m20s, 12m, 5h3m, 20h, 3d4h, 30d, 2y."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 730:
        return f"{d}d"
    return f"{d // 365}y"


def age_of(timestamp: Any, now: dt.datetime) -> str:
    t = parse_time(timestamp) if isinstance(timestamp, str) else None
    return "-" if t is None else human_age((now - t).total_seconds())


def format_hours(hours: float) -> str:
    return f"{hours:,.1f}" if hours >= 10 else f"{hours:,.2f}"


def format_money(amounts: Mapping[str, float]) -> str:
    return " + ".join(f"{v:,.2f} {k}" for k, v in sorted(amounts.items()))


Styler = Callable[[int, int, str], str]
"""(row index, column index, padded cell) -> the cell as printed (e.g. coloured)."""


def shown(value: Any, default: str = "-") -> str:
    """A value as `describe` shows it: ``default`` for nothing, yes or no for a boolean."""
    if value is None or value == "" or value == []:
        return default
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def field(label: str, value: str, width: int = 14) -> str:
    """``Label:  value``, the label padded to ``width`` (describe's and explain's sections)."""
    return f"{(label + ':').ljust(width)} {value}".rstrip()


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    style: Styler | None = None,
    indent: str = "",
) -> list[str]:
    """Left-aligned columns, 3 spaces apart; widths come from the plain text, ``style`` applies after padding."""
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))
    out = [indent + "   ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    for n, r in enumerate(rows):
        cells = []
        for i, cell in enumerate(r):
            padded = cell.ljust(widths[i]) if i < len(r) - 1 else cell
            cells.append(style(n, i, padded) if style else padded)
        out.append((indent + "   ".join(cells)).rstrip())
    return out


# -- status ------------------------------------------------------------------------------------------


def _state_cell(r: Row) -> str:
    if not r.state:
        return "-"
    if r.burn_in_hold:
        return f"{r.state} (burn-in hold)"
    return f"{r.state} (DryRun)" if r.dry_run else r.state


def _policy_cell(r: Row) -> str:
    if not r.policy:
        return "-"
    if r.policy_mode and r.policy_mode != "Enforce":
        return f"{r.policy} ({r.policy_mode})"
    return r.policy


def _gpus_cell(r: Row) -> str:
    healthy = "?" if r.healthy_gpus is None else str(r.healthy_gpus)
    total = "?" if r.total_gpus is None else str(r.total_gpus)
    return "-" if r.healthy_gpus is None and r.total_gpus is None else f"{healthy}/{total}"


def skew_text(offset_s: int) -> str:
    """A clock offset as on-call reads it: ``+600s (ahead)``, ``-3600s (behind)``."""
    return f"{offset_s:+d}s ({'ahead' if offset_s > 0 else 'behind'})"


def status_rows(fleet: Fleet, wide: bool = False) -> tuple[list[str], list[list[str]]]:
    headers = ["NODE", "STATE", "REASON", "GPUS", "SINCE", "POLICY"]
    ladder = any(r.ladders or r.validating for r in fleet.rows)
    if ladder:
        headers.append("LADDER")
    skew = any(r.clock_skew_s is not None for r in fleet.rows)
    if skew:
        headers.append("CLOCK-SKEW")
    if wide:
        headers += ["LAST-XID", "TAINT", "CORDONED", "GPU-HOURS", "COST"]
    rows = []
    for r in fleet.rows:
        name = r.node if r.node_exists else f"{r.node} (no Node)"
        row = [name, _state_cell(r), r.reason or "-", _gpus_cell(r), human_age(r.age_s), _policy_cell(r)]
        if ladder:
            row.append(r.ladder)
        if skew:
            row.append("-" if r.clock_skew_s is None else skew_text(r.clock_skew_s))
        if wide:
            row += [
                r.last_xid or "-",
                r.taint or "-",
                "yes" if r.cordoned else "no (taint only)" if r.tainted else "no",
                "-" if r.gpu_hours is None else format_hours(r.gpu_hours),
                "-" if r.cost is None else format_money({r.currency: r.cost}),
            ]
        rows.append(row)
    return headers, rows


def footer(t: Totals) -> list[str]:
    if t.nodes == 0:
        return []
    counts = ", ".join(f"{n} {'no verdict' if s == NO_VERDICT else s}" for s, n in t.by_state.items())
    lines = [f"{t.nodes} node{'s' if t.nodes != 1 else ''}: {counts}"]
    lines.append(f"GPUs: {t.gpus_healthy} healthy of {t.gpus_total}")
    if t.out_nodes:
        per_state = ", ".join(f"{s} {format_hours(h)}" for s, h in t.out_gpu_hours_by_state.items())
        line = (
            f"Held out of service: {t.out_nodes} node{'s' if t.out_nodes != 1 else ''}, {t.out_gpus} GPUs, "
            f"{format_hours(t.out_gpu_hours)} GPU-hours ({per_state})"
        )
        if t.out_cost:
            line += f" = {format_money(t.out_cost)}"
        if t.unpriced_nodes:
            line += f"; {t.unpriced_nodes} node{'s' if t.unpriced_nodes != 1 else ''} without spec.cost.gpuHourly"
        lines.append(line)
    else:
        lines.append("Held out of service: none")
    if t.out_gpus_slow:
        lines.append(
            f"Of the GPUs held out: {t.out_gpus_slow} slow, not broken (maxSlow), "
            f"{max(0, t.out_gpus - t.out_gpus_slow)} broken"
        )
    if t.unknown_nodes:
        line = (
            f"Unknown (agent silent, not counted above): {t.unknown_nodes} node"
            f"{'s' if t.unknown_nodes != 1 else ''}, {t.unknown_gpus} GPUs, "
            f"{format_hours(t.unknown_gpu_hours)} GPU-hours unobserved"
        )
        if t.unknown_cost:
            line += f" = {format_money(t.unknown_cost)}"
        lines.append(line)
    if any(t.ladders.values()):
        lines.append(
            f"Repair ladders: {t.ladders.get('inFlight', 0)} GPU resets in flight, "
            f"{t.ladders.get('handedOff', 0)} handed off to the node remediator, "
            f"{t.ladders.get('awaitingApproval', 0)} waiting for approval, "
            f"{t.ladders.get('exhausted', 0)} exhausted (replace the GPU)"
        )
    if t.dry_run_nodes:
        lines.append(f"DryRun verdicts (no Node changed, not counted): {t.dry_run_nodes}")
    return lines


def render_status(fleet: Fleet, color: bool = False, wide: bool = False) -> str:
    if not fleet.rows:
        return "No GPU nodes found (label nvidia.com/gpu.present=true) and no GPUNodeHealth reports.\n"
    headers, rows = status_rows(fleet, wide)

    def style(n: int, col: int, cell: str) -> str:
        return paint_state(cell, fleet.rows[n].state, color) if col == 1 else cell

    lines = table(headers, rows, style)
    return "\n".join([*lines, "", *footer(fleet.totals), *topology.footer(fleet.rows)]) + "\n"
