"""The MIG fleet's targets, its summary section and its docs block (``--phases mig``, hack/bench/mig.py).

Pure. A run without the phase (every run filed before it) leaves its targets "not measured".
"""

from __future__ import annotations

from typing import Any

from hack.bench.details import floor_storm, startup_line, storm_cpu
from hack.bench.targets import LARGE_FLEET_NODES, Target, _num, floor_figure, latency, path, phase_block, phase_md

MIG_KEY = "mig"


def mig_targets_for(nodes: int) -> list[Target]:
    """Issue #23's MIG targets: a GPU fault to the last of its MIG devices' rules p50 <= 200 ms and p99 <= 1 s;
    a storm at the device storm's rate in GPUs (each with all its rules); every rule well formed; the
    operator's peak RSS with the MIG slices at the core run's limit for the size. The fault and the storm
    also against their no-logic floors (issue #52: a rule for each MIG device, hack/bench/floors.py)."""
    rss_max = 400 if nodes >= LARGE_FLEET_NODES else 250
    return [
        *latency(
            "mig",
            "MIG fault to the GPU's last DeviceTaintRule",
            path(MIG_KEY, "fault_to_last_rule_ms"),
            floor=path("floors", "mig"),
        ),
        Target(
            "mig_storm_rate",
            "MIG storm (GPUs on distinct nodes at once, every MIG device's rule)",
            ">= 20 GPUs/s",
            lambda r: r[MIG_KEY]["storm"]["gpus_per_s"],
            lambda v, r: _num(v) and v >= 20 and r[MIG_KEY]["storm"]["gpus_complete"] == r[MIG_KEY]["storm"]["gpus"],
            " GPUs/s",
            floor_figure(path("floors", "mig_storm"), "per_s"),
            higher=True,
        ),
        Target(
            "mig_rules",
            "MIG rules without driver, pool and device, or on a device of no faulted GPU",
            "0",
            lambda r: r[MIG_KEY]["rule_check"]["problems"],
            lambda v, r: _num(v) and v == 0,
        ),
        Target(
            "mig_recovery",
            "MIG GPUs reset: seconds to every rule deleted",
            "every rule",
            lambda r: r[MIG_KEY]["recovery"]["seconds_to_all_rules_deleted"],
            lambda v, r: _num(v),
            " s",
        ),
        Target(
            "mig_operator_rss",
            "Operator peak RSS with the MIG slices",
            f"<= {rss_max} MB",
            lambda r: r[MIG_KEY]["operator_peak_rss_mb"],
            lambda v, r: _num(v) and v <= rss_max,
            " MB",
        ),
    ]


def mig_line(res: dict[str, Any]) -> str:
    """The phase's detail, or "not measured" for runs without it."""
    m = res.get(MIG_KEY)
    if not m:
        return "MIG fleet: not measured in this run."
    sh, d, s, c, rec = m["shape"], m["fault_to_last_rule_ms"], m["storm"], m["rule_check"], m["recovery"]
    startup = (res.get("operator") or {}).get("startup_s")
    back = rec["seconds_to_all_rules_deleted"]
    of = f" of {res['nodes']:,}" if sh["nodes"] != res.get("nodes", sh["nodes"]) else ""
    return (
        f"MIG fleet: {sh['nodes']:,}{of} nodes x {sh['gpus_per_node']} GPUs x {sh['mig_devices_per_gpu']} "
        f"{sh['profile']} MIG devices = {sh['devices']:,} DRA devices; operator start-up to every node evaluated "
        f"{startup} s. Uncorrected ECC to the GPU's last of {sh['mig_devices_per_gpu']} rules p50 {d['p50']} ms, "
        f"p90 {d['p90']} ms, p99 {d['p99']} ms, max {d['max']} ms over {d['samples']} GPUs ({d['timeouts']} timed "
        f"out; to the first rule p50 {d['first_rule_p50']} ms); storm of {s['gpus']} GPUs: {s['rules']}/"
        f"{s['rules_expected']} rules in {s['seconds']} s ({s['gpus_per_s']} GPUs/s, {s['rules_per_s']} rules/s; "
        f"reports published in {s['publish_s']} s), each report write to its GPU's last rule p50 "
        f"{s['report_to_last_rule_ms_p50']} ms, max {s['report_to_last_rule_ms_max']} ms; {c['rules']} rules "
        f"checked, {c['problems']} malformed or misplaced; node taints {d['nodes_tainted'] + s['nodes_tainted']}; "
        f"{rec['gpus']} GPUs reset, every rule deleted "
        f"{'(not all)' if back is None else 'after ' + str(back) + ' s'} ({rec['rules_left']} rules left); "
        f"operator peak RSS {m['operator_peak_rss_mb']} MB ({m['operator_peak_rss_mb_in_phase']} MB in the phase)."
        + storm_cpu(s)
        + floor_storm(res, "mig_storm")
    )


def mig_md(res: dict[str, Any]) -> list[str]:
    """The summary's section for the mig phase."""
    return phase_md("MIG fleet (`--phases mig`)", res, mig_targets_for(res["nodes"]), mig_line(res))


MIG_BEGIN = "<!-- bench-mig:begin (python -m hack.bench.docs) -->"
MIG_END = "<!-- bench-mig:end -->"


def render_mig(*runs: tuple[str, dict[str, Any]]) -> str:
    """The docs block of filed runs with the mig phase (the newest of each fleet size, smallest first),
    each held to its size's targets, with what its start-up waited on where the run measured it;
    misses stay misses."""
    parts = []
    for rel, res in runs:
        line = mig_line(res)
        if (res.get("operator") or {}).get("startup_profile"):
            line += "\n\n" + startup_line(res)
        block = phase_block("", "", "the MIG fleet", rel, res, mig_targets_for(res["nodes"]), line)
        parts.append(block.strip("\n"))
    return "\n".join([MIG_BEGIN, "\n\n".join(parts), MIG_END])


def no_mig_run() -> str:
    return f"{MIG_BEGIN}\nNo run of the MIG fleet is filed yet.\n{MIG_END}"
