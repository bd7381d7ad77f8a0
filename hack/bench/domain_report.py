"""The domain storm's targets, its summary section and its docs block (``--phases domain``,
hack/bench/domain.py).

Pure. A run without the phase (every run filed before it) leaves its targets "not measured".
"""

from __future__ import annotations

from typing import Any

from hack.bench.targets import Target, _num, floor_latency, path, phase_block, phase_md, ratio_only

DOMAIN_KEY = "domain_storm"


def domain_targets_for(nodes: int) -> list[Target]:
    """Issue #35's target: a clique fault to the LAST member's taint of its 18-node domain, p99 <= 1 s (no
    timeouts); and every faulted domain out whole, no node outside them tainted. The same at every size."""
    del nodes  # one target for every fleet size
    return [
        ratio_only(
            "domain_p50",
            "Clique fault to the last member's taint of its NVLink domain, p50",
            lambda r: r[DOMAIN_KEY]["fault_to_last_taint_ms"]["p50"],
            floor_latency(path("floors", "domain"), "p50"),
            " ms",
        ),
        Target(
            "domain_p99",
            "Clique fault to the last member's taint of its NVLink domain, p99",
            "<= 1000 ms",
            lambda r: r[DOMAIN_KEY]["fault_to_last_taint_ms"]["p99"],
            lambda v, r: _num(v) and v <= 1000 and r[DOMAIN_KEY]["fault_to_last_taint_ms"]["timeouts"] == 0,
            " ms",
            floor_latency(path("floors", "domain"), "p99"),
        ),
        Target(
            "domain_whole",
            "Faulted domains out whole (every member tainted), nodes outside them tainted",
            "all, 0",
            lambda r: (
                f"{r[DOMAIN_KEY]['domains_whole']}/{r[DOMAIN_KEY]['shape']['faulted']}, "
                f"{r[DOMAIN_KEY]['tainted_outside']}"
            ),
            lambda v, r: (
                r[DOMAIN_KEY]["domains_whole"] == r[DOMAIN_KEY]["shape"]["faulted"]
                and r[DOMAIN_KEY]["tainted_outside"] == 0
            ),
        ),
    ]


def domain_line(res: dict[str, Any]) -> str:
    """The phase's detail, or "not measured" for runs without it."""
    d = res.get(DOMAIN_KEY)
    if not d:
        return "Domain storm: not measured in this run."
    sh, lat = d["shape"], d["fault_to_last_taint_ms"]
    back = d["recovery_s"]
    left = (
        " The faulted domains' pods were not all gone when the faults began (their drains ran beside the figure)."
        if d.get("pods_removed") is False
        else ""
    )
    quiet = d.get("operator_quiet_after_labels_s", "-")
    waited = (
        ""
        if quiet == "-"
        else " The faults began once the operator was quiet after the labels "
        + ("(it never was within 600 s)." if quiet is None else f"({quiet} s after them).")
    )
    between = d.get("operator_quiet_between_faults_s")
    if between and between.get("waits"):
        never = f", {between['never']} never quiet within 600 s" if between.get("never") else ""
        waited += (
            f" Each later fault waited for the operator to be quiet again after the domain before it "
            f"(p50 {between['p50']} s, max {between['max']} s{never})."
        )
    return (
        f"Domain storm: {sh['nodes']:,} nodes labelled into {sh['domains']} NVLink domains of {sh['domain_size']} "
        f"(`nvidia.com/gpu.clique`); {sh['faulted']} clique faults one at a time (a fabric health mask with "
        f"ROUTE_UNHEALTHY = 1 on one GPU of one member, written by the agent's publisher). Fault to the last "
        f"member's taint p50 {lat['p50']} ms, p90 {lat['p90']} ms, p99 {lat['p99']} ms, max {lat['max']} ms over "
        f"{lat['samples']} domains ({lat['timeouts']} timed out); to the first member's taint p50 "
        f"{lat['first_taint_p50']} ms, first to last p50 {lat['spread_p50']} ms; {d['domains_whole']} domains out "
        f"whole, {d['tainted_outside']} nodes outside them tainted; the routes healed, every member untainted "
        f"{'(not all)' if back is None else 'after ' + str(back) + ' s'} (probation 2 s)." + waited + left
    )


def domain_md(res: dict[str, Any]) -> list[str]:
    """The summary's section for the domain phase."""
    return phase_md("Domain storm (`--phases domain`)", res, domain_targets_for(res["nodes"]), domain_line(res))


DOMAIN_BEGIN = "<!-- bench-domain:begin (python -m hack.bench.docs) -->"
DOMAIN_END = "<!-- bench-domain:end -->"


def render_domain(*runs: tuple[str, dict[str, Any]]) -> str:
    """The docs block of filed runs with the domain phase (the newest of each fleet size, smallest first),
    each held to its targets; misses stay misses."""
    parts = [
        phase_block("", "", "the domain storm", rel, res, domain_targets_for(res["nodes"]), domain_line(res)).strip(
            "\n"
        )
        for rel, res in runs
    ]
    return "\n".join([DOMAIN_BEGIN, "\n\n".join(parts), DOMAIN_END])


def no_domain_run() -> str:
    return f"{DOMAIN_BEGIN}\nNo run of the domain storm is filed yet.\n{DOMAIN_END}"
